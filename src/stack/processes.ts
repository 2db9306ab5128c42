/**
 * The processes of a stack: each one spawned in a process group of its own
 * (so a Ctrl-C at the terminal reaches only `mmgate stack up`, which stops
 * them in order), its stdout and stderr appended to its log file, and told
 * apart from an earlier run of the same role by its pid. An mmgate role is
 * up once its log has the "mmgate serving" line (pino's JSON, with the
 * process's pid and the bound addresses); etcd once its /health answers;
 * nats-server once it greets a client.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { closeSync, existsSync, openSync, readFileSync, readSync, fstatSync } from "node:fs";
import { connect as tcpConnect, createServer } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";

/** A role that could not start; the stack prints its log's last lines. */
export class RoleStartError extends Error {
  override readonly name = "RoleStartError";
  constructor(
    /** The role, e.g. "hop". */
    readonly role: string,
    message: string,
    /** Its log file ("" when it has none). */
    readonly logFile: string,
    /** The last lines of that log written by this start. */
    readonly logTail: readonly string[],
  ) {
    super(`${role}: ${message}`);
  }
}

/** A program the stack needs that is not installed. */
export class MissingToolError extends Error {
  override readonly name = "MissingToolError";
  constructor(
    readonly command: string,
    readonly debianPackage: string,
  ) {
    super(`${command} is not installed: the stack runs the host's ${command} (Debian: apt-get install ${debianPackage})`);
  }
}

/** How a process ended. */
export interface ExitStatus {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
}

/** One running (or ended) process of the stack. */
export interface Proc {
  readonly child: ChildProcess;
  readonly pid: number;
  /** Resolves when the process has exited; never rejects. */
  readonly exited: Promise<ExitStatus>;
  /** Its status once it exited; undefined while it runs. */
  exitStatus(): ExitStatus | undefined;
}

export interface SpawnLoggedOptions {
  /** Appended to (created 0600), stdout and stderr alike. */
  readonly logFile: string;
  readonly env: NodeJS.ProcessEnv;
  readonly cwd?: string;
}

/** Starts `command args` in a process group of its own with its output appended to `logFile`. */
export function spawnLogged(command: string, args: readonly string[], options: SpawnLoggedOptions): Proc {
  const fd = openSync(options.logFile, "a", 0o600);
  let child: ChildProcess;
  try {
    child = spawn(command, [...args], { cwd: options.cwd, env: options.env, stdio: ["ignore", fd, fd], detached: true });
  } finally {
    closeSync(fd);
  }
  let status: ExitStatus | undefined;
  const exited = new Promise<ExitStatus>((resolve) => {
    child.once("exit", (code, signal) => {
      status = { code, signal };
      resolve(status);
    });
    // A spawn that fails (ENOENT) emits error, and exit only sometimes.
    child.once("error", () => {
      status ??= { code: -1, signal: null };
      resolve(status);
    });
  });
  if (child.pid === undefined) {
    // spawn could not even start it; `error` follows on the next tick.
    return { child, pid: -1, exited, exitStatus: () => status ?? { code: -1, signal: null } };
  }
  return { child, pid: child.pid, exited, exitStatus: () => status };
}

/** Whether process `pid` exists (EPERM: it does, as another user's). */
export function pidAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** A process's command line (Linux /proc), or undefined where it cannot be read. */
export function commandLine(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "latin1").split("\0").join(" ").trim();
  } catch {
    return undefined;
  }
}

/**
 * Sends SIGTERM and waits for the exit; SIGKILL after `graceMs`. Resolves
 * with "exited" (it stopped by itself), "killed" (it needed SIGKILL) or
 * "gone" (it had already exited).
 */
export async function terminate(proc: Proc, graceMs: number): Promise<"exited" | "killed" | "gone"> {
  if (proc.exitStatus() !== undefined) return "gone";
  try {
    process.kill(proc.pid, "SIGTERM");
  } catch {
    /* already gone */
  }
  const timer = new AbortController();
  const inTime = await Promise.race([proc.exited.then(() => true), sleep(graceMs, false, { signal: timer.signal }).catch(() => false)]);
  timer.abort();
  if (inTime) return "exited";
  try {
    process.kill(proc.pid, "SIGKILL");
  } catch {
    /* gone meanwhile */
  }
  await proc.exited;
  return "killed";
}

/** A TCP port on 127.0.0.1 that was free a moment ago. */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === "string") throw new Error("no free port on 127.0.0.1");
  return address.port;
}

/** Whether something accepts TCP connections on 127.0.0.1:`port`. */
export function portInUse(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = tcpConnect({ host: "127.0.0.1", port });
    socket.setTimeout(1000, () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

/** The log's text from byte `offset` on. */
function readFrom(file: string, offset: number): string {
  let fd: number;
  try {
    fd = openSync(file, "r");
  } catch {
    return "";
  }
  try {
    const size = fstatSync(fd).size;
    if (size <= offset) return "";
    const buffer = Buffer.alloc(size - offset);
    const read = readSync(fd, buffer, 0, buffer.length, offset);
    return buffer.subarray(0, read).toString("utf8");
  } finally {
    closeSync(fd);
  }
}

/** The size of `file` (0 when missing): where the next start's lines begin. */
export function logOffset(file: string): number {
  let fd: number;
  try {
    fd = openSync(file, "r");
  } catch {
    return 0;
  }
  try {
    return fstatSync(fd).size;
  } finally {
    closeSync(fd);
  }
}

/** The last `lines` lines of `file` from byte `offset` on. */
export function logTail(file: string, offset = 0, lines = 20): string[] {
  return readFrom(file, offset)
    .split("\n")
    .filter((line) => line.trim() !== "")
    .slice(-lines);
}

/** Where an mmgate process serves, from its "mmgate serving" log line. */
export interface ServingAddresses {
  readonly address: string;
  readonly adminAddress: string;
}

/**
 * Waits for `proc`'s "mmgate serving" line in its log (written from
 * `offset` on, and carrying its pid). Rejects with a RoleStartError when it
 * exits first, or after `timeoutMs`.
 */
export async function waitServing(role: string, proc: Proc, logFile: string, offset: number, timeoutMs: number, signal?: AbortSignal): Promise<ServingAddresses> {
  const end = Date.now() + timeoutMs;
  let scanned = 0;
  let partial = "";
  for (;;) {
    const text = readFrom(logFile, offset + scanned);
    scanned += Buffer.byteLength(text, "utf8");
    const lines = (partial + text).split("\n");
    partial = lines.pop() ?? "";
    for (const line of lines) {
      if (!line.includes('"mmgate serving"')) continue;
      try {
        const entry = JSON.parse(line) as { msg?: string; pid?: number; address?: string; adminAddress?: string };
        if (entry.msg === "mmgate serving" && entry.pid === proc.pid && typeof entry.address === "string") {
          return { address: entry.address, adminAddress: entry.adminAddress ?? "" };
        }
      } catch {
        /* not a JSON log line */
      }
    }
    const status = proc.exitStatus();
    if (status !== undefined) {
      throw new RoleStartError(role, `exited (${describeExit(status)}) before serving`, logFile, logTail(logFile, offset));
    }
    if (signal?.aborted) throw new RoleStartError(role, "start interrupted", logFile, logTail(logFile, offset));
    if (Date.now() > end) throw new RoleStartError(role, `not serving after ${Math.round(timeoutMs / 1000)} s`, logFile, logTail(logFile, offset));
    await sleep(50);
  }
}

/** `code 2`, `signal SIGKILL`. */
export function describeExit(status: ExitStatus): string {
  return status.signal !== null ? `signal ${status.signal}` : `code ${status.code ?? "?"}`;
}

/**
 * Retries `check` every `intervalMs` until it resolves; rejects with a
 * RoleStartError once `proc` exits or `timeoutMs` passes.
 */
export async function waitUntil(role: string, proc: Proc, logFile: string, offset: number, check: () => Promise<void>, timeoutMs: number, signal?: AbortSignal): Promise<void> {
  const end = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    const status = proc.exitStatus();
    if (status !== undefined) throw new RoleStartError(role, `exited (${describeExit(status)}) before it answered`, logFile, logTail(logFile, offset));
    try {
      await check();
      return;
    } catch (err) {
      last = err;
    }
    if (signal?.aborted) throw new RoleStartError(role, "start interrupted", logFile, logTail(logFile, offset));
    if (Date.now() > end) {
      throw new RoleStartError(role, `not answering after ${Math.round(timeoutMs / 1000)} s (${last instanceof Error ? last.message : String(last)})`, logFile, logTail(logFile, offset));
    }
    await sleep(50);
  }
}

/** The etcd executable on PATH, or a MissingToolError naming the Debian package. */
export function etcdCommand(): string {
  if (spawnSync("etcd", ["--version"], { stdio: "ignore" }).status === 0) return "etcd";
  throw new MissingToolError("etcd", "etcd-server");
}

/** The nats-server executable: on PATH, or where Debian installs it (/usr/sbin, not on every PATH). */
export function natsServerCommand(): string {
  for (const command of ["nats-server", "/usr/sbin/nats-server"]) {
    if (command.startsWith("/") && !existsSync(command)) continue;
    if (spawnSync(command, ["--version"], { stdio: "ignore" }).status === 0) return command;
  }
  throw new MissingToolError("nats-server", "nats-server");
}

/** Resolves when an mmgate process's admin listener answers /readyz with 200 (every module ready). */
export async function adminReady(adminAddress: string): Promise<void> {
  const response = await fetch(`http://${adminAddress}/readyz`, { signal: AbortSignal.timeout(1000) });
  const body = (await response.text()).trim();
  if (response.status !== 200) throw new Error(`/readyz ${response.status}${body !== "" ? `: ${body.slice(0, 200)}` : ""}`);
}

/** Resolves when etcd's /health on `endpoint` says true. */
export async function etcdHealthy(endpoint: string): Promise<void> {
  const response = await fetch(`${endpoint}/health`, { signal: AbortSignal.timeout(1000) });
  const body = (await response.json()) as { health?: string };
  if (body.health !== "true") throw new Error(`etcd /health: ${JSON.stringify(body)}`);
}

/** Resolves when a client on 127.0.0.1:`port` receives nats-server's INFO line. */
export function natsGreets(port: number): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const socket = tcpConnect({ host: "127.0.0.1", port });
    let received = "";
    const done = (error?: Error) => {
      socket.destroy();
      if (error === undefined) resolve();
      else reject(error);
    };
    socket.setTimeout(1000, () => done(new Error("no INFO from nats-server")));
    socket.on("error", done);
    socket.on("data", (chunk: Buffer) => {
      received += chunk.toString("latin1");
      if (received.startsWith("INFO ")) done();
    });
    socket.on("close", () => done(new Error("nats-server closed the connection")));
  });
}
