/**
 * The whole stack on one machine, each part its own process on loopback:
 * etcd and nats-server (the host's), a KV relay with one pool (also fed from
 * a NATS JetStream stream), a router mirroring it, N Encode workers
 * registering in etcd, the demo token worker, an encode hop routing over the
 * workers it finds in etcd and forwarding to the token worker, and the image
 * API. Every mmgate role is `node bin/mmgate.js serve -c <dir>/<role>.yaml`
 * (the router: `router -c`), with a fresh CA, server certificate and token.
 *
 * Roles start in dependency order, each serving before the next that needs
 * it starts: etcd and nats-server; then together the relay, the Encode
 * workers, the token worker and the image API; then the router and the hop,
 * which counts as up once it has admitted every Encode worker. They stop in
 * the reverse: the entry points (hop, images) first, then the router, the
 * token worker, the Encode workers, the relay, and nats-server and etcd
 * last. Tests drive the same stack through `kill`, `start` and `address` to
 * break it on purpose.
 */
import { fileURLToPath } from "node:url";
import { createClient } from "@connectrpc/connect";
import { EncodeHopService, MemberState } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { rootUrl } from "../paths.js";
import { channelDefaults, createChannel } from "../rpc/index.js";
import { makeCertificates, makeToken, type StackCertificates } from "./certs.js";
import { ROLE_GRACE_MS, roleConfig, roleSubcommand, writeRoleConfig, type CommonSettings, type Peers, type RoleKind } from "./configs.js";
import { prepareDir, removePidFile, stackLayout, writePidFile, type StackLayout } from "./layout.js";
import {
  adminReady,
  etcdCommand,
  etcdHealthy,
  freePort,
  logOffset,
  natsGreets,
  natsServerCommand,
  RoleStartError,
  spawnLogged,
  terminate,
  waitServing,
  waitUntil,
  type ExitStatus,
  type Proc,
} from "./processes.js";
import { writeSamples } from "./samples.js";

/** Log levels a stack runs its roles at: it reads each role's "mmgate serving" line, logged at info. */
export const STACK_LOG_LEVELS = ["info", "debug", "trace"] as const;
export type StackLogLevel = (typeof STACK_LOG_LEVELS)[number];

/** Encode workers a stack may run. */
export const MIN_WORKERS = 1;
export const MAX_WORKERS = 16;

export interface StackOptions {
  /** The state directory (created; an earlier stack's entries in it are removed). */
  readonly dir: string;
  /** Encode workers, 1..16. */
  readonly workers: number;
  /** Serve TLS with a fresh CA (and call every role over it); false: cleartext h2c. */
  readonly tls: boolean;
  /** The roles' log level (info by default). */
  readonly logLevel?: StackLogLevel;
  /** Added to each process's environment (after the MMGATE_* variables of this one are dropped). */
  readonly env?: Readonly<Record<string, string>>;
  /** Stops the start: what started is stopped, and startStack rejects. */
  readonly signal?: AbortSignal;
  /** Given the stack before its first role starts, so that a signal handler can killAll() a start in progress. */
  readonly onCreated?: (stack: Stack) => void;
  /** Told what is starting, for a person watching. */
  readonly onProgress?: (message: string) => void;
  /** Told when a role exits that neither stop() nor kill() ended (it crashed, or someone else killed it). */
  readonly onRoleExit?: (role: RoleInfo, status: ExitStatus) => void;
  /**
   * How long one role may take to serve (60 s by default: many processes start at
   * once on few cores, through tsx while dist/ is stale). One that exits fails at once.
   */
  readonly startTimeoutMs?: number;
  /** `shutdown.graceMs` of the mmgate roles (3000 by default); stop() sends SIGKILL 5 s after it. */
  readonly graceMs?: number;
  /**
   * The Encode workers' etcd lease TTL in seconds (`encodeWorker.register.leaseTtlSeconds`, 10 by
   * default): how long a worker that dies without draining stays registered. etcd raises a TTL
   * under its minimum (2 s with its default election timeout) to that minimum.
   */
  readonly leaseTtlSeconds?: number;
}

/** One process of the stack, as it is now. */
export interface RoleInfo {
  /** `etcd`, `nats`, `relay`, `router`, `encoder-1`…, `token-worker`, `hop`, `images`. */
  readonly name: string;
  readonly kind: RoleKind;
  /** 127.0.0.1:PORT: the gRPC listener (etcd: its client port, nats: its client port). */
  readonly address: string;
  /** The admin HTTP listener (/metrics, /readyz); "" for etcd and nats. */
  readonly adminAddress: string;
  /** How a client names it: https:// or http:// (mmgate and etcd), nats://. */
  readonly url: string;
  /** The current (or last) process id. */
  readonly pid: number;
  readonly running: boolean;
  readonly logFile: string;
  /** The mmgate config file; "" for etcd and nats. */
  readonly configFile: string;
}

/** How stop() ended each process, in the order it stopped them. */
export interface StopReport {
  readonly roles: readonly { readonly name: string; readonly pid: number; readonly result: "exited" | "killed" | "gone"; readonly ms: number }[];
  /** Every process exited on SIGTERM (or was gone already). */
  readonly clean: boolean;
}

export interface RoleStartOptions {
  /**
   * Listen on a new port the kernel picks, instead of the role's last one. The
   * config files of the roles that call it still name the old one (an Encode
   * worker re-registers in etcd under its new address; a router, a hop's
   * downstream, every role's etcd or NATS do not follow).
   */
  readonly newPort?: boolean;
}

export interface Stack {
  readonly dir: string;
  readonly tls: boolean;
  readonly workers: number;
  /** The bearer token every role requires for mutating and admin methods. */
  readonly token: string;
  readonly tokenFile: string;
  /** The CA's PEM file; "" with TLS off. */
  readonly caFile: string;
  /** The sample multimodal request and router events, and where the suggested images command writes. */
  readonly requestFile: string;
  readonly eventsFile: string;
  readonly imagesDir: string;
  /** Every role, in start order. */
  readonly roles: readonly RoleInfo[];
  role(name: string): RoleInfo;
  /** A role's 127.0.0.1:PORT. */
  address(name: string): string;
  /**
   * Sends `signal` (SIGKILL by default) to a role. For signals that end a
   * process it resolves once the process exited; a role killed here is not
   * reported to onRoleExit.
   */
  kill(name: string, signal?: NodeJS.Signals): Promise<void>;
  /**
   * Starts a stopped role again with its config file, on its last port unless
   * `newPort`; resolves once it serves. etcd and nats-server start on their
   * data directories (JetStream's streams survive a restart of nats-server).
   */
  start(name: string, options?: RoleStartOptions): Promise<RoleInfo>;
  /**
   * Starts one more mmgate role, `name` of `kind`: its config made as the
   * stack's own roles' are from `peers` (TLS, token, logs, shutdown), then
   * changed by `adjust` (another pool's size, a relay reached through a
   * proxy); resolves once it serves. It belongs to the stack from then on:
   * stopped with it, in its kind's turn.
   */
  extend(name: string, kind: RoleKind, peers: Peers, adjust?: (config: Record<string, unknown>) => Record<string, unknown>): Promise<RoleInfo>;
  /** Drains and stops every process in order (idempotent: later calls get the same report). */
  stop(): Promise<StopReport>;
  /** SIGKILLs every process at once and waits for them (a second Ctrl-C). */
  killAll(): Promise<void>;
}

interface RoleState {
  readonly name: string;
  readonly kind: RoleKind;
  readonly configFile: string;
  readonly logFile: string;
  address: string;
  adminAddress: string;
  proc: Proc | undefined;
  /** The stack ended this process (stop, kill): not a crash to report. */
  expectedExit: boolean;
  /** etcd's peer port. */
  peerPort?: number;
  /** Where the current process's lines begin in the log. */
  logStart: number;
}

const MMGATE_BIN = fileURLToPath(new URL("bin/mmgate.js", rootUrl));

/** Stop order: each group after the one before has exited; a group stops in parallel. */
const STOP_ORDER: readonly (readonly RoleKind[])[] = [["hop", "images"], ["router"], ["token-worker"], ["encoder"], ["relay"], ["nats"], ["etcd"]];

/** After a role's own grace, how long stop() waits before SIGKILL. */
const KILL_AFTER_GRACE_MS = 5000;

/** This process's environment without MMGATE_* (a user's MMGATE_AUTH_TOKEN or MMGATE_LISTEN would beat the config files). */
function childEnv(extra: Readonly<Record<string, string>> | undefined): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) if (!key.startsWith("MMGATE_")) env[key] = value;
  return { ...env, ...extra };
}

class RunningStack implements Stack {
  readonly dir: string;
  readonly tokenFile: string;
  readonly requestFile: string;
  readonly eventsFile: string;
  readonly imagesDir: string;
  readonly caFile: string;
  private readonly states: RoleState[] = [];
  private stopping: Promise<StopReport> | undefined;
  /** stop() or killAll() began: exits are no longer crashes, the pid file no longer kept. */
  private ended = false;
  private readonly env: NodeJS.ProcessEnv;
  private readonly common: CommonSettings;
  private readonly startTimeoutMs: number;
  private readonly onExit = () => {
    // This process is ending without stop(): leave nothing running.
    for (const state of this.states) if (state.proc !== undefined && state.proc.exitStatus() === undefined) this.signal(state, "SIGKILL");
  };

  constructor(
    private readonly layout: StackLayout,
    private readonly options: StackOptions,
    readonly token: string,
    certs: StackCertificates | undefined,
  ) {
    this.dir = layout.dir;
    this.tokenFile = layout.tokenFile;
    this.requestFile = layout.requestFile;
    this.eventsFile = layout.eventsFile;
    this.imagesDir = layout.imagesDir;
    this.caFile = certs?.caFile ?? "";
    this.env = childEnv(options.env);
    this.startTimeoutMs = options.startTimeoutMs ?? 60_000;
    this.common = {
      token,
      ...(certs ? { tls: certs } : {}),
      logLevel: options.logLevel ?? "info",
      graceMs: options.graceMs ?? ROLE_GRACE_MS,
      ...(options.leaseTtlSeconds !== undefined ? { leaseTtlSeconds: options.leaseTtlSeconds } : {}),
    };
    process.on("exit", this.onExit);
  }

  get tls(): boolean {
    return this.options.tls;
  }

  get workers(): number {
    return this.options.workers;
  }

  get roles(): readonly RoleInfo[] {
    return this.states.map((s) => this.info(s));
  }

  private info(s: RoleState): RoleInfo {
    const scheme = s.kind === "nats" ? "nats" : s.kind === "etcd" || !this.options.tls ? "http" : "https";
    return {
      name: s.name,
      kind: s.kind,
      address: s.address,
      adminAddress: s.adminAddress,
      url: `${scheme}://${s.address}`,
      pid: s.proc?.pid ?? -1,
      running: s.proc !== undefined && s.proc.exitStatus() === undefined,
      logFile: s.logFile,
      configFile: s.configFile,
    };
  }

  private state(name: string): RoleState {
    const found = this.states.find((s) => s.name === name);
    if (found === undefined) throw new Error(`no role ${JSON.stringify(name)} in this stack (roles: ${this.states.map((s) => s.name).join(", ")})`);
    return found;
  }

  role(name: string): RoleInfo {
    return this.info(this.state(name));
  }

  address(name: string): string {
    return this.state(name).address;
  }

  private signal(state: RoleState, signal: NodeJS.Signals): void {
    if (state.proc === undefined || state.proc.exitStatus() !== undefined) return;
    try {
      process.kill(state.proc.pid, signal);
    } catch {
      /* gone meanwhile */
    }
  }

  private savePids(): void {
    const roles: Record<string, number> = {};
    for (const s of this.states) if (s.proc !== undefined && s.proc.exitStatus() === undefined) roles[s.name] = s.proc.pid;
    writePidFile(this.layout, { pid: process.pid, startedAt: new Date().toISOString(), roles });
  }

  /** Records a new process of `state` and reports its exit unless the stack ended it. */
  private adopt(state: RoleState, proc: Proc): void {
    state.proc = proc;
    state.expectedExit = false;
    this.savePids();
    void proc.exited.then((status) => {
      if (state.proc !== proc || this.ended) return;
      this.savePids();
      if (!state.expectedExit) this.options.onRoleExit?.(this.info(state), status);
    });
  }

  addRole(name: string, kind: RoleKind): RoleState {
    const state: RoleState = {
      name,
      kind,
      configFile: kind === "etcd" || kind === "nats" ? "" : this.layout.configFile(name),
      logFile: this.layout.logFile(name),
      address: "",
      adminAddress: "",
      proc: undefined,
      expectedExit: false,
      logStart: 0,
    };
    this.states.push(state);
    return state;
  }

  /** Writes a role's config file from what its peers are. */
  writeConfig(state: RoleState, peers: Peers): void {
    writeRoleConfig(state.configFile, state.name, state.kind, roleConfig(state.kind, this.common, peers));
  }

  async launch(state: RoleState, newPort = true): Promise<void> {
    if (state.proc !== undefined && state.proc.exitStatus() === undefined) throw new Error(`${state.name} is running (pid ${state.proc.pid})`);
    const offset = logOffset(state.logFile);
    state.logStart = offset;
    const signal = this.options.signal;
    if (state.kind === "etcd") {
      const command = etcdCommand();
      if (newPort || state.address === "") {
        state.address = `127.0.0.1:${await freePort()}`;
        do state.peerPort = await freePort();
        while (`127.0.0.1:${state.peerPort}` === state.address);
      }
      const endpoint = `http://${state.address}`;
      const peer = `http://127.0.0.1:${state.peerPort}`;
      const proc = spawnLogged(
        command,
        [
          "--name", "stack",
          "--data-dir", this.layout.etcdDir,
          "--listen-client-urls", endpoint,
          "--advertise-client-urls", endpoint,
          "--listen-peer-urls", peer,
          "--initial-advertise-peer-urls", peer,
          "--initial-cluster", `stack=${peer}`,
          "--log-level", "warn",
        ],
        { logFile: state.logFile, env: this.env },
      );
      this.adopt(state, proc);
      await waitUntil(state.name, proc, state.logFile, offset, () => etcdHealthy(endpoint), this.startTimeoutMs, signal);
      return;
    }
    if (state.kind === "nats") {
      const command = natsServerCommand();
      if (newPort || state.address === "") state.address = `127.0.0.1:${await freePort()}`;
      const port = Number(state.address.split(":")[1]);
      // JetStream on, its store in the state dir, for a JetStream ingest to use.
      const proc = spawnLogged(command, ["--addr", "127.0.0.1", "--port", String(port), "--name", "mmgate-stack", "-js", "-sd", this.layout.natsDir], {
        logFile: state.logFile,
        env: this.env,
      });
      this.adopt(state, proc);
      await waitUntil(state.name, proc, state.logFile, offset, () => natsGreets(port), this.startTimeoutMs, signal);
      return;
    }
    const listen = newPort || state.address === "" ? [] : ["--listen", state.address, ...(state.adminAddress !== "" ? ["--admin-listen", state.adminAddress] : [])];
    const proc = spawnLogged(process.execPath, [MMGATE_BIN, roleSubcommand(state.kind), "-c", state.configFile, ...listen], {
      logFile: state.logFile,
      env: this.env,
      cwd: this.layout.dir,
    });
    this.adopt(state, proc);
    const where = await waitServing(state.name, proc, state.logFile, offset, this.startTimeoutMs, signal);
    state.address = where.address;
    state.adminAddress = where.adminAddress;
    // Serving is not ready: the router, say, first mirrors the relay's pools.
    if (where.adminAddress !== "") await waitUntil(state.name, proc, state.logFile, offset, () => adminReady(where.adminAddress), this.startTimeoutMs, signal);
  }

  /** Waits until the hop lists `count` admitted Encode workers (it checks each as it joins). */
  async hopAdmits(count: number): Promise<void> {
    const hop = this.state("hop");
    const channel = createChannel(hop.address, { ...channelDefaults, tls: this.options.tls, caFile: this.caFile, defaultTimeoutMs: 2000 });
    try {
      const client = createClient(EncodeHopService, channel);
      const headers = { authorization: `Bearer ${this.token}` };
      let admitted = 0;
      await waitUntil(
        hop.name,
        hop.proc!,
        hop.logFile,
        hop.logStart,
        async () => {
          const status = await client.getStatus({}, { headers });
          admitted = status.members.filter((m) => m.state === MemberState.ADMITTED).length;
          if (admitted < count) throw new Error(`${admitted} of ${count} Encode workers admitted`);
        },
        this.startTimeoutMs,
        this.options.signal,
      );
    } finally {
      await channel.close();
    }
  }

  async kill(name: string, signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    const state = this.state(name);
    const proc = state.proc;
    if (proc === undefined || proc.exitStatus() !== undefined) return;
    const ends = signal === "SIGKILL" || signal === "SIGTERM" || signal === "SIGINT" || signal === "SIGQUIT";
    if (ends) state.expectedExit = true;
    this.signal(state, signal);
    if (ends) await proc.exited;
  }

  async start(name: string, options: RoleStartOptions = {}): Promise<RoleInfo> {
    if (this.ended) throw new Error("the stack is stopping or stopped");
    const state = this.state(name);
    await this.launch(state, options.newPort === true);
    return this.info(state);
  }

  async extend(name: string, kind: RoleKind, peers: Peers, adjust: (config: Record<string, unknown>) => Record<string, unknown> = (c) => c): Promise<RoleInfo> {
    if (this.ended) throw new Error("the stack is stopping or stopped");
    if (kind === "etcd" || kind === "nats") throw new Error(`stack: extend runs mmgate roles, not ${kind}`);
    if (this.states.some((s) => s.name === name)) throw new Error(`stack: a role ${JSON.stringify(name)} exists already`);
    const state = this.addRole(name, kind);
    writeRoleConfig(state.configFile, name, kind, adjust(roleConfig(kind, this.common, peers)));
    await this.launch(state);
    return this.info(state);
  }

  stop(): Promise<StopReport> {
    this.ended = true;
    this.stopping ??= this.stopInOrder();
    return this.stopping;
  }

  private async stopInOrder(): Promise<StopReport> {
    const report: { name: string; pid: number; result: "exited" | "killed" | "gone"; ms: number }[] = [];
    const grace = this.common.graceMs + KILL_AFTER_GRACE_MS;
    for (const kinds of STOP_ORDER) {
      const group = this.states.filter((s) => kinds.includes(s.kind) && s.proc !== undefined);
      await Promise.all(
        group.map(async (s) => {
          const started = Date.now();
          s.expectedExit = true;
          const result = await terminate(s.proc!, grace);
          report.push({ name: s.name, pid: s.proc!.pid, result, ms: Date.now() - started });
        }),
      );
    }
    // Roles added but never started (a start that failed early) have nothing to stop.
    removePidFile(this.layout);
    process.off("exit", this.onExit);
    return { roles: report, clean: report.every((r) => r.result !== "killed") };
  }

  async killAll(): Promise<void> {
    this.ended = true;
    for (const s of this.states) {
      s.expectedExit = true;
      this.signal(s, "SIGKILL");
    }
    await Promise.all(this.states.map((s) => s.proc?.exited));
    removePidFile(this.layout);
    process.off("exit", this.onExit);
  }
}

function checkOptions(options: StackOptions): void {
  if (!Number.isInteger(options.workers) || options.workers < MIN_WORKERS || options.workers > MAX_WORKERS) {
    throw new RangeError(`workers must be an integer from ${MIN_WORKERS} to ${MAX_WORKERS}, not ${options.workers}`);
  }
  if (options.leaseTtlSeconds !== undefined && (!Number.isInteger(options.leaseTtlSeconds) || options.leaseTtlSeconds < 1 || options.leaseTtlSeconds > 86400)) {
    throw new RangeError(`leaseTtlSeconds must be an integer from 1 to 86400, not ${options.leaseTtlSeconds}`);
  }
  if (options.logLevel !== undefined && !STACK_LOG_LEVELS.includes(options.logLevel)) {
    throw new RangeError(`logLevel must be one of ${STACK_LOG_LEVELS.join(", ")}: the stack reads each role's "mmgate serving" line, logged at info`);
  }
}

/**
 * Starts a stack in `options.dir` and resolves once every role serves and
 * the hop has admitted every Encode worker. On any failure everything
 * started so far is stopped and the error (a RoleStartError names the role
 * and carries its log's last lines; a MissingToolError the Debian package;
 * a StackBusyError a directory whose stack still runs) is thrown.
 */
export async function startStack(options: StackOptions): Promise<Stack> {
  checkOptions(options);
  // Check the tools first: nothing is written or started for a stack that cannot run.
  etcdCommand();
  natsServerCommand();
  const layout = stackLayout(options.dir);
  const killed = prepareDir(layout);
  const progress = options.onProgress ?? (() => undefined);
  if (killed.length > 0) progress(`killed ${killed.length} leftover process(es) of an earlier stack in ${layout.dir}: ${killed.join(", ")}`);
  const certs = options.tls ? makeCertificates(layout.tlsDir) : undefined;
  const token = makeToken(layout.tokenFile);
  writeSamples(layout.requestFile, layout.eventsFile);
  const stack = new RunningStack(layout, options, token, certs);
  options.onCreated?.(stack);
  // The owner is known from the start, so a second start in this directory is refused at once.
  writePidFile(layout, { pid: process.pid, startedAt: new Date().toISOString(), roles: {} });

  const etcd = stack.addRole("etcd", "etcd");
  const nats = stack.addRole("nats", "nats");
  const relay = stack.addRole("relay", "relay");
  const router = stack.addRole("router", "router");
  const encoders = Array.from({ length: options.workers }, (_, i) => stack.addRole(`encoder-${i + 1}`, "encoder"));
  const tokenWorker = stack.addRole("token-worker", "token-worker");
  const hop = stack.addRole("hop", "hop");
  const images = stack.addRole("images", "images");
  /** Starts `roles` at once; a failure waits for the others, so that none is left half-started. */
  const together = async (roles: readonly RoleState[]) => {
    const results = await Promise.allSettled(roles.map((r) => stack.launch(r)));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === "rejected");
    if (failed !== undefined) throw failed.reason;
  };
  const step = async (label: string, work: () => Promise<void>) => {
    if (options.signal?.aborted) throw new RoleStartError(label, "start interrupted", "", []);
    const started = Date.now();
    progress(`starting ${label}`);
    await work();
    progress(`${label} up (${((Date.now() - started) / 1000).toFixed(1)} s)`);
  };
  const encodersLabel = options.workers === 1 ? "encoder-1" : `encoder-1..${options.workers}`;
  try {
    await step("etcd and nats-server", () => together([etcd, nats]));
    const etcdEndpoint = `http://${etcd.address}`;
    // What needs only etcd and NATS starts together (the Encode workers register as they come up)...
    await step(`relay, ${encodersLabel}, token-worker and images`, () => {
      stack.writeConfig(relay, { natsAddress: nats.address });
      encoders.forEach((e, i) => stack.writeConfig(e, { etcdEndpoint, encoderIndex: i + 1 }));
      stack.writeConfig(tokenWorker, {});
      stack.writeConfig(images, {});
      return together([relay, ...encoders, tokenWorker, images]);
    });
    // ...then what needs those: the router mirrors the relay, the hop forwards to the token worker and routes over the workers.
    await step("router and hop", async () => {
      stack.writeConfig(router, { relayAddress: relay.address });
      stack.writeConfig(hop, { etcdEndpoint, tokenWorkerAddress: tokenWorker.address });
      await together([router, hop]);
      await stack.hopAdmits(options.workers);
    });
  } catch (err) {
    progress("stopping what started");
    await stack.stop();
    throw err;
  }
  return stack;
}
