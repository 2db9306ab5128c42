import { setMaxListeners } from "node:events";
import { readFileSync } from "node:fs";
import type { Server as HttpServer, IncomingMessage, ServerResponse } from "node:http";
import * as http2 from "node:http2";
import type { AddressInfo, Socket } from "node:net";
import type { DescMethod } from "@bufbuild/protobuf";
import type { ConnectRouter, Interceptor } from "@connectrpc/connect";
import { Code, ConnectError, createContextValues } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import { createAdminServer } from "./admin-http.js";
import { AdminService, adminService } from "./admin-service.js";
import { bearerAuthInterceptor } from "./auth.js";
import type { MmgateConfig } from "./config.js";
import { ConfigError, splitHostPort } from "./config.js";
import { Health, HealthRegistry, ServingStatus, healthService } from "./health.js";
import { RpcMetrics } from "./metrics.js";
import type { ModuleInstance, ServiceBinding, ServiceModule } from "./module.js";
import { addReflection, reflectionServices } from "./reflection.js";
import { RpcObserver, recordStatusInterceptor, rpcRecordKey } from "./rpc-observer.js";

export interface HostOptions {
  config: MmgateConfig;
  /** Every known module; `config.services` says which of them run. */
  modules: readonly ServiceModule[];
  logger: Logger;
  version: string;
}

type NodeReq = http2.Http2ServerRequest | IncomingMessage;
type NodeRes = http2.Http2ServerResponse | ServerResponse;

/** A running server: its addresses, health, and the way to stop it. */
export interface Host {
  /** Bound gRPC address, `HOST:PORT`. */
  readonly address: string;
  /** Bound admin address, or "" when the admin listener is off. */
  readonly adminAddress: string;
  readonly health: HealthRegistry;
  readonly metrics: RpcMetrics;
  /** Fully qualified names of the services served, reflection and health included. */
  readonly serviceNames: readonly string[];
  readonly startedAt: number;
  readonly config: MmgateConfig;
  /** Drains, waits up to the grace, then closes everything. Idempotent. */
  shutdown(): Promise<void>;
  /** Resolves when shutdown completed. */
  readonly closed: Promise<void>;
}


function formatAddress(info: AddressInfo): string {
  return info.family === "IPv6" ? `[${info.address}]:${info.port}` : `${info.address}:${info.port}`;
}

/** Reads a PEM file named by a config field; failures name the field. */
function readTlsFile(field: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    throw new ConfigError(`${field}: cannot read ${path}: ${(err as Error).message}`);
  }
}

function listen(server: http2.Http2Server | http2.Http2SecureServer | HttpServer, address: string): Promise<string> {
  const { host, port } = splitHostPort(address);
  return new Promise((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException) => {
      err.message = `cannot listen on ${address}: ${err.code ?? err.message}`;
      reject(err);
    };
    server.once("error", onError);
    server.listen(port, host, () => {
      server.off("error", onError);
      resolve(formatAddress(server.address() as AddressInfo));
    });
  });
}

function closeServer(server: { close(cb: (err?: Error) => void): unknown }): Promise<void> {
  return new Promise((resolve) => server.close(() => resolve()));
}

/**
 * gRPC clients expect a gRPC status for an unknown method, not an HTTP 404:
 * a trailers-only response, sent at once (a bidi client may wait for headers
 * before it half-closes). The request body is still read to its end, so the
 * stream closes cleanly rather than being reset, and nothing is written to a
 * stream the client already reset.
 */
function unknownMethod(req: NodeReq, res: NodeRes): void {
  const path = (req.url ?? "").split("?", 1)[0] ?? "";
  const message = `unknown method ${path.slice(0, 200)}`;
  const contentType = req.headers["content-type"] ?? "";
  req.resume();
  req.on("error", () => undefined);
  if (res.destroyed || res.writableEnded) return;
  try {
    if (contentType.startsWith("application/grpc")) {
      const headers = {
        "content-type": contentType,
        "grpc-status": String(Code.Unimplemented),
        "grpc-message": encodeURIComponent(message),
      };
      if ("stream" in res) {
        if (res.stream.destroyed || res.stream.closed) return;
        res.stream.respond({ ":status": 200, ...headers }, { endStream: true });
      } else {
        res.writeHead(200, headers).end();
      }
      return;
    }
    res.writeHead(404, { "content-type": "application/json" });
    res.end(JSON.stringify({ code: "unimplemented", message }));
  } catch {
    // The client went away between the check and the write: nothing to answer.
  }
}

/**
 * Once a response has ended, a request body the handler did not read to its
 * end (it failed early, or ended a stream the client was still feeding) is
 * cut with RST_STREAM(NO_ERROR), as HTTP/2 allows after a complete response.
 * Left alone, its unread data is never consumed, and the paused stream keeps
 * the whole connection open even after the client has closed it. The cut
 * waits for the trailers, which carry the gRPC status.
 */
function releaseUnreadRequest(req: NodeReq, res: NodeRes): void {
  if (!("stream" in res)) return;
  const stream = res.stream;
  const response = res as unknown as {
    addTrailers: (headers: Record<string, unknown>) => void;
    end: (...args: unknown[]) => unknown;
  };
  let trailers = false;
  const addTrailers = response.addTrailers.bind(res);
  response.addTrailers = (headers) => {
    trailers = true;
    addTrailers(headers);
  };
  const end = response.end.bind(res);
  response.end = (...args) => {
    const result = end(...args);
    if (!req.readableEnded && !stream.destroyed) {
      stream.once(trailers ? "wantTrailers" : "finish", () =>
        setImmediate(() => {
          if (!stream.destroyed) stream.destroy();
        }),
      );
    }
    return result;
  };
}

/** Refuses new RPCs once the server drains; health stays reachable so probes see NOT_SERVING. */
function drainInterceptor(draining: () => boolean): Interceptor {
  return (next) => async (req) => {
    if (draining() && req.service.typeName !== Health.typeName) {
      throw new ConnectError("server is shutting down", Code.Unavailable);
    }
    return next(req);
  };
}

/**
 * Starts the server: binds the listener, starts the configured modules,
 * registers their services plus health and reflection, and serves gRPC,
 * gRPC-Web and Connect on one HTTP/2 port (h2c, or TLS with HTTP/1.1 too).
 */
export async function startHost(options: HostOptions): Promise<Host> {
  const { config, logger } = options;
  const startedAt = Date.now();
  const health = new HealthRegistry();
  const metrics = new RpcMetrics();
  const observer = new RpcObserver(logger, metrics);
  const drainController = new AbortController();
  const abortController = new AbortController();
  // Every open call listens on these two: they legitimately have thousands.
  setMaxListeners(0, drainController.signal, abortController.signal);

  const tls = config.tls.certFile !== "";
  const settings: http2.Settings = {
    initialWindowSize: config.limits.streamWindowBytes,
    maxConcurrentStreams: config.limits.maxConcurrentStreams,
  };
  // Until the modules are up, requests get UNAVAILABLE rather than hanging.
  let handle: (req: NodeReq, res: NodeRes) => void = (_req, res) => {
    res.writeHead(503).end();
  };
  const onRequest = (req: NodeReq, res: NodeRes) => handle(req, res);
  const server = tls
    ? http2.createSecureServer(
        {
          cert: readTlsFile("tls.certFile", config.tls.certFile),
          key: readTlsFile("tls.keyFile", config.tls.keyFile),
          allowHTTP1: true,
          settings,
          maxSessionMemory: 64,
        },
        onRequest,
      )
    : http2.createServer({ settings, maxSessionMemory: 64 }, onRequest);

  // Raw sockets too: a connection that never sends the HTTP/2 preface (or
  // never finishes its TLS handshake) has no session, and would otherwise
  // keep the listener from closing after the grace.
  const sockets = new Set<Socket>();
  server.on("connection", (socket: Socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
  });
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (session) => {
    sessions.add(session);
    session.once("close", () => sessions.delete(session));
    // A wider connection window keeps large streamed frames flowing.
    session.once("localSettings", () => {
      try {
        session.setLocalWindowSize(config.limits.connectionWindowBytes);
      } catch {
        /* the session closed already */
      }
    });
    if (drainController.signal.aborted) session.close();
  });

  const address = await listen(server, config.listen);
  const advertised = config.advertiseAddress || address;

  const instances: { name: string; instance: ModuleInstance }[] = [];
  const closeModules = async () => {
    for (const { name, instance } of instances.reverse()) {
      try {
        await instance.close?.();
      } catch (err) {
        logger.error({ err, module: name }, "module failed to close");
      }
    }
  };
  const enabled = options.modules.filter((m) => config.services.includes(m.name));
  let bindings: ServiceBinding[];
  try {
    for (const module of enabled) {
      const instance = await module.create({
        config: config.modules[module.name],
        root: config as unknown as Record<string, unknown>,
        logger: logger.child({ module: module.name }),
        metrics: metrics.registry,
        health,
        drainSignal: drainController.signal,
        advertisedAddress: advertised,
      });
      instances.push({ name: module.name, instance });
    }
    bindings = instances.flatMap((i) => [...i.instance.services]);
    const seen = new Set<string>();
    for (const b of bindings) {
      if (seen.has(b.service.typeName)) throw new Error(`service ${b.service.typeName} is registered twice`);
      seen.add(b.service.typeName);
    }
  } catch (err) {
    // Whatever started is stopped again: timers, sockets, the listener.
    await closeModules();
    await closeServer(server);
    throw err;
  }
  const routed = [...bindings.map((b) => b.service), Health, AdminService];
  const serviceNames = [...routed, ...reflectionServices].map((s) => s.typeName).sort();
  for (const name of serviceNames) health.set(name, ServingStatus.SERVING);

  const interceptors: Interceptor[] = [recordStatusInterceptor, drainInterceptor(() => health.isDraining)];
  if (config.auth.token !== "") interceptors.push(bearerAuthInterceptor(config.auth.token));

  const adapter = connectNodeAdapter({
    readMaxBytes: config.limits.maxReceiveMessageBytes,
    writeMaxBytes: config.limits.maxSendMessageBytes,
    ...(config.limits.maxTimeoutMs > 0 ? { maxTimeoutMs: config.limits.maxTimeoutMs } : {}),
    shutdownSignal: abortController.signal,
    interceptors,
    routes(router: ConnectRouter) {
      for (const b of bindings) router.service(b.service, b.implementation);
      router.service(Health, healthService(health, drainController.signal));
      router.service(AdminService, adminService({ version: options.version, startedAt, config, health }));
      addReflection(router, routed, drainController.signal);
      const methods: DescMethod[] = [];
      for (const h of router.handlers) methods.push(h.method);
      observer.register(methods);
    },
    contextValues: (req) => createContextValues().set(rpcRecordKey, observer.recordFor(req)),
    fallback: (req, res) => {
      const record = observer.recordFor(req);
      if (record) record.code = Code.Unimplemented;
      unknownMethod(req, res as unknown as NodeRes);
    },
  });
  handle = (req, res) => {
    // HTTP/1.1 (TLS only) keeps connections alive; while draining, ask the client to close.
    if (drainController.signal.aborted && req.httpVersionMajor === 1) res.setHeader("connection", "close");
    releaseUnreadRequest(req, res);
    observer.begin(req, res);
    adapter(req, res);
  };

  let admin: HttpServer | undefined;
  let adminAddress = "";
  if (config.adminListen !== "") {
    admin = createAdminServer(metrics.registry, health);
    try {
      adminAddress = await listen(admin, config.adminListen);
    } catch (err) {
      await closeModules();
      await closeServer(server);
      throw err;
    }
  }

  logger.info(
    { address, adminAddress: adminAddress || undefined, tls, services: config.services, version: options.version },
    "mmgate serving",
  );
  if (config.auth.token === "") {
    logger.warn("no auth token configured: mutating and admin methods are open to every client");
  }

  let resolveClosed!: () => void;
  const closed = new Promise<void>((r) => (resolveClosed = r));
  let shutdownPromise: Promise<void> | undefined;

  async function shutdown(): Promise<void> {
    const graceMs = config.shutdown.graceMs;
    logger.info({ graceMs, openSessions: sessions.size }, "draining");
    health.drain();
    drainController.abort();
    const listenerClosed = closeServer(server);
    // GOAWAY: clients open no new streams here; open ones may finish.
    for (const session of sessions) session.close();
    let timer: NodeJS.Timeout | undefined;
    const graceOver = new Promise<"grace">((r) => (timer = setTimeout(() => r("grace"), graceMs)));
    const outcome = await Promise.race([listenerClosed.then(() => "drained" as const), graceOver]);
    clearTimeout(timer);
    if (outcome === "grace") {
      logger.warn({ openSessions: sessions.size, openSockets: sockets.size }, "grace period over: cancelling the calls still running");
      abortController.abort(new ConnectError("server shut down", Code.Unavailable));
      await new Promise((r) => setTimeout(r, 50));
      for (const session of sessions) session.destroy();
      for (const socket of sockets) socket.destroy();
      await listenerClosed;
    }
    await closeModules();
    if (admin) {
      admin.closeAllConnections();
      await closeServer(admin);
    }
    logger.info("stopped");
    resolveClosed();
  }

  return {
    address,
    adminAddress,
    health,
    metrics,
    serviceNames,
    startedAt,
    config,
    closed,
    shutdown() {
      shutdownPromise ??= shutdown();
      return shutdownPromise;
    },
  };
}
