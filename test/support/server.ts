/**
 * Test harness: starts the real server (in-process or as a child process) on
 * ephemeral ports and hands out connect and @grpc/grpc-js clients. Every
 * server and client it creates is closed by `close()`.
 */
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import type { Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { pino } from "pino";
import type { Host, ServiceModule } from "../../src/server/index.js";
import { resolveConfig, startHost } from "../../src/server/index.js";

/**
 * How long a spawned server gets to log "mmgate serving": a guard against a
 * hang, not a measure. Loaded hard (both suites' workers spawning
 * processes on two cores), three servers starting at once took over 20 s.
 */
const SERVER_START_TIMEOUT_MS = 45_000;

export const repoRoot = fileURLToPath(new URL("../../", import.meta.url));
export const protoRoot = `${repoRoot}proto`;

export type GrpcClient = grpc.Client & Record<string, (...args: unknown[]) => unknown>;

const loaderOptions: protoLoader.Options = {
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [protoRoot],
};

/** A @grpc/grpc-js client for `serviceFullName`, loaded from `proto/<protoFile>`. */
export function grpcJsClient(
  addr: string,
  protoFile: string,
  serviceFullName: string,
  options?: grpc.ClientOptions,
  credentials: grpc.ChannelCredentials = grpc.credentials.createInsecure(),
): GrpcClient {
  const definition = grpc.loadPackageDefinition(protoLoader.loadSync(protoFile, loaderOptions));
  let node: unknown = definition;
  for (const part of serviceFullName.split(".")) node = (node as Record<string, unknown>)[part];
  if (typeof node !== "function") throw new Error(`service ${serviceFullName} not found in ${protoFile}`);
  const Ctor = node as unknown as new (address: string, creds: grpc.ChannelCredentials, opts?: grpc.ClientOptions) => GrpcClient;
  return new Ctor(addr, credentials, options);
}

/** Calls a grpc-js unary method and resolves with the response or rejects with the ServiceError. */
export function grpcUnary<T = Record<string, unknown>>(
  client: GrpcClient,
  method: string,
  request: unknown,
  options: { metadata?: grpc.Metadata; deadline?: Date } = {},
): Promise<T> {
  const fn = client[method];
  if (typeof fn !== "function") throw new Error(`no method ${method}`);
  return new Promise((resolve, reject) => {
    fn.call(client, request, options.metadata ?? new grpc.Metadata(), { deadline: options.deadline }, (err: grpc.ServiceError | null, res: T) =>
      err ? reject(err) : resolve(res),
    );
  });
}

/** Collects a grpc-js server stream; resolves with the messages or rejects with the error (messages in `err.received`). */
export function grpcServerStream<T = Record<string, unknown>>(
  client: GrpcClient,
  method: string,
  request: unknown,
  options: { metadata?: grpc.Metadata; deadline?: Date; onMessage?: (msg: T, call: grpc.ClientReadableStream<T>) => void } = {},
): Promise<T[]> {
  const fn = client[method];
  if (typeof fn !== "function") throw new Error(`no method ${method}`);
  const call = fn.call(client, request, options.metadata ?? new grpc.Metadata(), { deadline: options.deadline }) as grpc.ClientReadableStream<T>;
  const received: T[] = [];
  return new Promise((resolve, reject) => {
    call.on("data", (msg: T) => {
      received.push(msg);
      options.onMessage?.(msg, call);
    });
    call.on("error", (err: grpc.ServiceError & { received?: T[] }) => {
      err.received = received;
      reject(err);
    });
    call.on("end", () => resolve(received));
  });
}

interface Closable {
  close(): void;
}

class ClientTracker {
  private readonly clients: Closable[] = [];
  track<T extends Closable>(client: T): T {
    this.clients.push(client);
    return client;
  }
  closeAll(): void {
    for (const c of this.clients.splice(0)) c.close();
  }
}

export interface TestServer {
  /** `127.0.0.1:PORT` of the gRPC listener. */
  readonly addr: string;
  readonly baseUrl: string;
  /** `127.0.0.1:PORT` of the admin HTTP listener. */
  readonly adminAddr: string;
  /** connect-node gRPC transport. */
  readonly transport: Transport;
  /** connect-node Connect-protocol transport over HTTP/2. */
  readonly connectTransport: Transport;
  readonly grpcWebTransport: Transport;
  grpcClient(protoFile: string, serviceFullName: string, options?: grpc.ClientOptions): GrpcClient;
  close(): Promise<void>;
}

export interface InProcessServer extends TestServer {
  readonly host: Host;
}

export interface StartOptions {
  /** Modules to run (all of them are enabled). */
  modules?: readonly ServiceModule[];
  /** Raw config merged over the test defaults (ephemeral ports, silent logs). */
  config?: Record<string, unknown>;
  /** Receives the JSON log lines when set; logs are silent otherwise. */
  logLines?: string[];
}

function transports(addr: string) {
  const baseUrl = `http://${addr}`;
  return {
    baseUrl,
    transport: createGrpcTransport({ baseUrl }),
    connectTransport: createConnectTransport({ baseUrl, httpVersion: "2" }),
    grpcWebTransport: createGrpcWebTransport({ baseUrl, httpVersion: "2" }),
  };
}

/**
 * `MMGATE_TEST_RPC_PATH=connect` runs every server the tests start (in this
 * process or as a child) with the host's lean request path off, so that the
 * same suite proves both paths answer alike (`npm run test:connect-path`).
 */
export const connectPathOnly = process.env.MMGATE_TEST_RPC_PATH === "connect";

/** Starts the host in this process on ephemeral ports. */
export async function startServer(options: StartOptions = {}): Promise<InProcessServer> {
  const modules = options.modules ?? [];
  const given = options.config ?? {};
  const raw = {
    listen: "127.0.0.1:0",
    adminListen: "127.0.0.1:0",
    modules: modules.map((m) => m.name),
    ...given,
    ...(connectPathOnly ? { rpc: { ...(given["rpc"] as object | undefined), leanPath: false } } : {}),
  };
  const config = resolveConfig(raw, modules);
  const lines = options.logLines;
  const logger = lines
    ? pino({ level: "info" }, { write: (line: string) => void lines.push(line.trimEnd()) })
    : pino({ level: "silent" });
  const host = await startHost({ config, modules, logger, version: "test" });
  const clients = new ClientTracker();
  return {
    host,
    addr: host.address,
    adminAddr: host.adminAddress,
    ...transports(host.address),
    grpcClient: (protoFile, service, opts) => clients.track(grpcJsClient(host.address, protoFile, service, opts)),
    async close() {
      clients.closeAll();
      await host.shutdown();
    },
  };
}

export interface ChildServer extends TestServer {
  readonly process: ChildProcess;
  /** Every stdout line so far (JSON logs). */
  readonly stdout: string[];
  readonly stderr: string[];
  /** Resolves with the exit code (or the signal name) when the process ends. */
  readonly exited: Promise<number | string>;
}

/**
 * Runs `node [nodeArgs] bin/mmgate.js serve` with the given extra args and
 * env on ephemeral ports.
 */
export async function startChildServer(args: string[] = [], env: Record<string, string> = {}, nodeArgs: string[] = []): Promise<ChildServer> {
  const child = spawn(
    process.execPath,
    [...nodeArgs, `${repoRoot}bin/mmgate.js`, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", ...args],
    {
      cwd: repoRoot,
      env: { ...process.env, ...(connectPathOnly ? { MMGATE_RPC__LEAN_PATH: "false" } : {}), ...env },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  const stdout: string[] = [];
  const stderr: string[] = [];
  createInterface({ input: child.stderr! }).on("line", (l) => stderr.push(l));
  const exited = new Promise<number | string>((resolve) =>
    child.once("exit", (code, signal) => resolve(code ?? signal ?? "unknown")),
  );
  const ready = new Promise<{ address: string; adminAddress: string }>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (line) => {
      stdout.push(line);
      try {
        const entry = JSON.parse(line) as { msg?: string; address?: string; adminAddress?: string };
        if (entry.msg === "mmgate serving" && entry.address) resolve({ address: entry.address, adminAddress: entry.adminAddress ?? "" });
      } catch {
        /* not a log line */
      }
    });
    void exited.then((code) => reject(new Error(`server exited (${code}) before serving:\n${stderr.join("\n")}`)));
    setTimeout(() => reject(new Error(`server did not start within ${SERVER_START_TIMEOUT_MS / 1000} s:\n${stderr.join("\n")}`)), SERVER_START_TIMEOUT_MS).unref();
  });
  let where: { address: string; adminAddress: string };
  try {
    where = await ready;
  } catch (err) {
    child.kill("SIGKILL");
    throw err;
  }
  const clients = new ClientTracker();
  return {
    process: child,
    stdout,
    stderr,
    exited,
    addr: where.address,
    adminAddr: where.adminAddress,
    ...transports(where.address),
    grpcClient: (protoFile, service, opts) => clients.track(grpcJsClient(where.address, protoFile, service, opts)),
    async close() {
      clients.closeAll();
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGTERM");
        const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
        await exited;
        clearTimeout(timer);
      }
    },
  };
}
