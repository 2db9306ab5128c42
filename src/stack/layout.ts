/**
 * The state directory of a stack and what lives in it:
 *
 *   stack.pid           the running stack: its owner's pid and each role's
 *   token               the bearer token (0600)
 *   tls/                ca.pem, ca.key, server.pem, server.key (keys 0600)
 *   <role>.yaml         each mmgate role's config file (0600)
 *   logs/<role>.log     each process's stdout and stderr
 *   etcd/, nats/        etcd's data dir, nats-server's JetStream store
 *   request.json, events.jsonl, images/   the sample inputs and outputs of the commands to try
 *
 * A start refuses a directory whose stack is still running, and otherwise
 * removes what an earlier stack left: its leftover processes (a stack killed
 * with SIGKILL leaves its roles running, each in a process group of its own)
 * and these entries, nothing else.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { commandLine, pidAlive } from "./processes.js";

export interface StackLayout {
  readonly dir: string;
  readonly pidFile: string;
  readonly tokenFile: string;
  readonly tlsDir: string;
  readonly logsDir: string;
  readonly etcdDir: string;
  readonly natsDir: string;
  readonly requestFile: string;
  readonly eventsFile: string;
  readonly imagesDir: string;
  configFile(role: string): string;
  logFile(role: string): string;
}

export function stackLayout(dir: string): StackLayout {
  const root = resolve(dir);
  return {
    dir: root,
    pidFile: join(root, "stack.pid"),
    tokenFile: join(root, "token"),
    tlsDir: join(root, "tls"),
    logsDir: join(root, "logs"),
    etcdDir: join(root, "etcd"),
    natsDir: join(root, "nats"),
    requestFile: join(root, "request.json"),
    eventsFile: join(root, "events.jsonl"),
    imagesDir: join(root, "images"),
    configFile: (role) => join(root, `${role}.yaml`),
    logFile: (role) => join(root, "logs", `${role}.log`),
  };
}

/** What stack.pid holds. */
export interface PidFile {
  /** The process that runs the stack (`mmgate stack up`, or a test). */
  readonly pid: number;
  readonly startedAt: string;
  /** Each role's current pid. */
  readonly roles: Readonly<Record<string, number>>;
}

export function readPidFile(layout: StackLayout): PidFile | undefined {
  try {
    const parsed = JSON.parse(readFileSync(layout.pidFile, "utf8")) as Partial<PidFile>;
    if (typeof parsed.pid !== "number") return undefined;
    return { pid: parsed.pid, startedAt: String(parsed.startedAt ?? ""), roles: typeof parsed.roles === "object" && parsed.roles !== null ? parsed.roles : {} };
  } catch {
    return undefined;
  }
}

export function writePidFile(layout: StackLayout, content: PidFile): void {
  writeFileSync(layout.pidFile, `${JSON.stringify(content, null, 2)}\n`, { mode: 0o600 });
}

export function removePidFile(layout: StackLayout): void {
  rmSync(layout.pidFile, { force: true });
}

/** A directory whose stack is still running. */
export class StackBusyError extends Error {
  override readonly name = "StackBusyError";
  constructor(
    readonly dir: string,
    readonly ownerPid: number,
  ) {
    super(`a stack is still running in ${dir} (pid ${ownerPid}): stop it first (kill -INT ${ownerPid}), or use another --dir`);
  }
}

/** Whether `pid` is the live owner of a stack: running, and (where /proc says) a node process. */
function liveOwner(pid: number): boolean {
  if (pid === process.pid) return true;
  if (!pidAlive(pid)) return false;
  const cmd = commandLine(pid);
  return cmd === undefined || /node/.test(cmd);
}

/** The entries a stack writes, which a fresh start removes. */
function ownEntry(name: string): boolean {
  return ["stack.pid", "token", "tls", "logs", "etcd", "nats", "request.json", "events.jsonl", "images"].includes(name) || /^[a-z][a-z0-9-]*\.yaml$/.test(name);
}

/**
 * Makes `layout.dir` ready for a new stack: refuses it while its stack runs
 * (StackBusyError); otherwise kills the leftover processes an earlier stack
 * listed (only those whose command line names this directory) and removes
 * its entries. Returns the pids it killed.
 */
export function prepareDir(layout: StackLayout): number[] {
  const previous = readPidFile(layout);
  if (previous !== undefined && liveOwner(previous.pid)) throw new StackBusyError(layout.dir, previous.pid);
  const killed: number[] = [];
  for (const pid of Object.values(previous?.roles ?? {})) {
    if (!pidAlive(pid)) continue;
    // A pid reused since by an unrelated process is left alone.
    if (!commandLine(pid)?.includes(layout.dir)) continue;
    try {
      process.kill(pid, "SIGKILL");
      killed.push(pid);
    } catch {
      /* gone meanwhile */
    }
  }
  if (existsSync(layout.dir)) {
    for (const name of readdirSync(layout.dir)) {
      if (ownEntry(name)) rmSync(join(layout.dir, name), { recursive: true, force: true });
    }
  }
  mkdirSync(layout.dir, { recursive: true });
  for (const sub of [layout.logsDir, layout.etcdDir, layout.natsDir]) mkdirSync(sub, { recursive: true, mode: 0o700 });
  return killed;
}
