import { setMaxListeners } from "node:events";
import { readFileSync } from "node:fs";
import { createServer as createHttp1Server } from "node:http";
import type { Server as HttpServer, IncomingMessage, ServerResponse } from "node:http";
import * as http2 from "node:http2";
import type { AddressInfo, Socket } from "node:net";
import type { DescMethod, DescService } from "@bufbuild/protobuf";
import type { ConnectRouter, Interceptor } from "@connectrpc/connect";
import { Code, ConnectError, createContextValues } from "@connectrpc/connect";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import { Counter, Gauge } from "prom-client";
import { createAdminServer } from "./admin-http.js";
import { splitCleartextProtocols } from "./cleartext-http1.js";
import { adminServerTimeouts, guardConnections, http1ServerTimeouts } from "./connections.js";
import { CorsPolicy } from "./cors.js";
import { HttpRequestMetrics, HttpRouteTable } from "./http-routes.js";
import { AdminService, adminService } from "./admin-service.js";
import { bearerAuthInterceptor } from "./auth.js";
import type { MmgateConfig } from "./config/index.js";
import { ConfigError, splitHostPort } from "./config/index.js";
import { delay, MAX_TIMER_MS, settleWithin } from "../util/index.js";
import { FastPath } from "./fast-path.js";
import { jsonOptions } from "./json-options.js";
import { callInterceptor } from "./call-interceptor.js";
import { Health, HealthRegistry, Readiness, ServingStatus, healthService } from "./health.js";
import { RpcMetrics } from "./metrics.js";
import type { ErrorMapper, HostStatusDecorator, LocalRoutes, ModuleHealth, ModuleInstance, ServiceBinding, ServiceModule } from "./module.js";
import { planModules } from "./module-plan.js";
import { Supervisor } from "./supervisor.js";
import { addReflection, reflectionServices } from "./reflection.js";
import { HostAllowList } from "./request-host.js";
import { peerOf, RpcObserver, rpcRecordKey } from "./rpc-observer.js";
import { serverTracingInterceptor, shutdownTracing, traceHttpRoute, tracingEnabled } from "../telemetry/index.js";

export interface HostOptions {
  config: MmgateConfig;
  /** Every known module; `config.modules` says which of them run. */
  modules: readonly ServiceModule[];
  logger: Logger;
  version: string;
}

type NodeReq = http2.Http2ServerRequest | IncomingMessage;

/** How long an HTTP/1.1 connection answered before its request body was read may linger, discarding that body. */
const UNREAD_BODY_LINGER_MS = 2000;

/** How long supervised tasks get to return once their signal fired. */
const TASK_STOP_MS = 5000;

interface BuiltModule {
  readonly module: ServiceModule;
  readonly served: boolean;
  readonly supervisor: Supervisor;
  readonly health: ModuleHealth & { follow(services: readonly string[]): void };
  instance: ModuleInstance;
}
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
 * A request answered by the host itself, before any handler: an unknown
 * method, or a request refused for its authority. gRPC clients (and
 * gRPC-Web) expect a gRPC status, not an HTTP error: a trailers-only
 * response, sent at once (a bidi client may wait for headers before it
 * half-closes). Others get the HTTP status and a Connect-shaped JSON body.
 * The request body is still read to its end, so the stream closes cleanly
 * rather than being reset, and nothing is written to a stream the client
 * already reset.
 */
function answerWithStatus(req: NodeReq, res: NodeRes, code: Code, httpStatus: number, message: string): void {
  const contentType = req.headers["content-type"] ?? "";
  req.resume();
  req.on("error", () => undefined);
  if (res.destroyed || res.writableEnded) return;
  try {
    if (contentType.startsWith("application/grpc")) {
      const headers = {
        "content-type": contentType,
        "grpc-status": String(code),
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
    res.writeHead(httpStatus, { "content-type": "application/json" });
    res.end(JSON.stringify({ code: codeToString(code), message }));
  } catch {
    // The client went away between the check and the write: nothing to answer.
  }
}

function unknownMethodMessage(req: NodeReq): string {
  const path = (req.url ?? "").split("?", 1)[0] ?? "";
  return `unknown method ${path.slice(0, 200)}`;
}

/**
 * The last word on a request whose handling threw: nothing one request
 * carries may reach the process's uncaught-exception handler. The client
 * gets INTERNAL if nothing was sent yet, else its stream is cut.
 */
function failRequest(req: NodeReq, res: NodeRes, err: unknown, logger: Logger): void {
  logger.error({ err, path: req.url?.slice(0, 200), method: req.method }, "request handling failed");
  if (!res.headersSent && !res.destroyed) {
    answerWithStatus(req, res, Code.Internal, 500, "internal error");
  } else if (!res.writableEnded) {
    res.destroy();
  }
}

/**
 * Once a response has ended, a request body the handler did not read to its
 * end (it was over the size limit, the handler failed early, or it ended a
 * stream the client was still feeding) is cut with RST_STREAM(NO_ERROR), as
 * HTTP/2 allows after a complete response, for every protocol; over HTTP/1.1
 * the connection is closed instead. Left alone, the unread data is never
 * consumed: the stream stalls on flow control, holds its buffers, keeps the
 * connection open after the client has closed it, and a client still
 * sending never sees the answer it was given.
 */
function releaseUnreadRequest(req: NodeReq, res: NodeRes): void {
  if (!("stream" in res)) {
    // HTTP/1.1: a connection whose request body is left unread is closed
    // rather than drained, and the response says so (`Connection: close`),
    // so a client's pool never sends its next request on it. The socket is
    // half-closed first, its unread bytes discarded, so a client still
    // sending reads the answer rather than a reset; it is destroyed after
    // UNREAD_BODY_LINGER_MS at the latest.
    const socket = req.socket;
    const writeHead = res.writeHead.bind(res) as (...args: unknown[]) => ServerResponse;
    (res as { writeHead: (...args: unknown[]) => ServerResponse }).writeHead = (...args) => {
      // `complete`: the whole body arrived (read or not; Node discards an unread rest itself).
      if (!(req as IncomingMessage).complete && !res.headersSent) res.setHeader("connection", "close");
      return writeHead(...args);
    };
    res.once("finish", () => {
      if ((req as IncomingMessage).complete) return;
      req.resume();
      socket.end();
      setTimeout(() => socket.destroy(), UNREAD_BODY_LINGER_MS).unref();
    });
    return;
  }
  const stream = res.stream;
  // The compatibility layer always waits for trailers, so "wantTrailers"
  // fires for every protocol once the response body is out; the trailers
  // (the gRPC status, or none for gRPC-Web and Connect) go out on the same
  // tick, and END_STREAM with them. Only then is the stream cut: cut on
  // "finish", END_STREAM would not have left yet and the client would see
  // a reset instead of its response.
  stream.once("wantTrailers", () =>
    setImmediate(() => {
      if (!req.readableEnded && !stream.destroyed) stream.destroy();
    }),
  );
}

/**
 * Puts the lean path in front of the HTTP/2 compatibility layer: every new
 * stream is offered to it first (unless `passOn` says it must go to the
 * compatibility layer, which refuses or serves it), and what it declines goes on to the compatibility
 * layer's listener (and so to connect) unchanged. Returns false, changing
 * nothing, when that listener is not where this Node.js version keeps it.
 */
function routeStreams(
  server: http2.Http2Server | http2.Http2SecureServer,
  fastPath: FastPath,
  passOn: (headers: http2.IncomingHttpHeaders) => boolean,
  onError: (err: unknown) => void,
): boolean {
  const listeners = server.listeners("stream");
  const compat = listeners[0];
  if (listeners.length !== 1 || typeof compat !== "function") return false;
  server.removeListener("stream", compat as (...args: unknown[]) => void);
  server.on("stream", (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, flags: number, rawHeaders: string[]) => {
    let taken: boolean;
    try {
      taken = !passOn(headers) && fastPath.serve(stream, headers);
    } catch (err) {
      // Nothing one request carries may reach the uncaught-exception handler.
      onError(err);
      if (!stream.destroyed) stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
      return;
    }
    if (!taken) (compat as (...args: unknown[]) => void).call(server, stream, headers, flags, rawHeaders);
  });
  return true;
}

/**
 * Starts the server: binds the listener, starts the configured modules,
 * registers their services plus health and reflection, and serves gRPC,
 * gRPC-Web, Connect and the modules' plain HTTP routes on one port: HTTP/2
 * and HTTP/1.1 both, told apart by the HTTP/2 preface in cleartext and by
 * ALPN over TLS.
 */
export async function startHost(options: HostOptions): Promise<Host> {
  const { config, logger } = options;
  // A cycle or an unknown requirement is a config error before anything binds.
  const plan = planModules(options.modules, config.modules);
  const startedAt = Date.now();
  const health = new HealthRegistry();
  const metrics = new RpcMetrics();
  const observer = new RpcObserver(logger, metrics);
  const drainController = new AbortController();
  const abortController = new AbortController();
  // Every open call listens on these two: they legitimately have thousands.
  setMaxListeners(0, drainController.signal, abortController.signal);

  const tls = config.tls.certFile !== "";
  const hosts = HostAllowList.forListener(config.server.allowedHosts, splitHostPort(config.listen).host, config.advertiseAddress);
  const settings: http2.Settings = {
    initialWindowSize: config.limits.streamWindowBytes,
    maxConcurrentStreams: config.limits.maxConcurrentStreams,
  };
  // Until the modules are up, requests get UNAVAILABLE rather than hanging.
  let handle: (req: NodeReq, res: NodeRes) => void = (_req, res) => {
    res.writeHead(503).end();
  };
  // The per-request boundary: whatever a request makes throw ends there.
  const onRequest = (req: NodeReq, res: NodeRes) => {
    try {
      handle(req, res);
    } catch (err) {
      failRequest(req, res, err, logger);
    }
  };
  const server = tls
    ? http2.createSecureServer(
        {
          cert: readTlsFile("tls.certFile", config.tls.certFile),
          key: readTlsFile("tls.keyFile", config.tls.keyFile),
          allowHTTP1: true,
          settings,
          maxSessionMemory: 64,
          // 0 turns connections.handshakeTimeoutMs off; Node's TLS default is 120 s.
          handshakeTimeout: config.connections.handshakeTimeoutMs || MAX_TIMER_MS,
        },
        onRequest,
      )
    : http2.createServer({ settings, maxSessionMemory: 64 }, onRequest);
  // Cleartext HTTP/1.1 (curl, browsers' fetch, Connect and gRPC-Web
  // clients, the OpenAI SDKs) on the same port: connections that do not
  // open with the HTTP/2 preface go to this server. Over TLS, ALPN decides
  // and the HTTP/2 server's own allowHTTP1 serves them.
  const http1 = tls ? undefined : createHttp1Server(http1ServerTimeouts(config.connections), onRequest);

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
  // Handshake, idle, keepalive and PING limits, and the connection cap.
  const countClosed = guardConnections(server, config.connections, metrics.registry);
  const protocolSplit = http1
    ? splitCleartextProtocols(server as http2.Http2Server, http1, {
        decideWithinMs: config.connections.handshakeTimeoutMs,
        onTimeout: () => countClosed("handshake_timeout"),
      })
    : undefined;
  if (http1 && !protocolSplit) logger.warn("this Node.js does not let HTTP/1.1 share the cleartext port: it serves HTTP/2 (h2c) only");
  if (http1) {
    // The HTTP/1.1 server never listens itself (connections are handed to
    // it), but its header timeout and idle-connection tracking start on
    // "listening".
    http1.emit("listening");
  }

  const address = await listen(server, config.listen);
  const advertised = config.advertiseAddress || address;

  const readiness = new Readiness(health, (module, ready, reason) =>
    logger.info({ module, ready, reason }, ready ? "module ready" : "module not ready"),
  );
  // Bound once the routes exist; a call before that answers UNAVAILABLE.
  let liveRoutes: ((router: ConnectRouter) => void) | undefined = undefined;
  let liveInterceptors: Interceptor[] = [];
  const localRoutes: LocalRoutes = {
    routes: (router) => {
      if (!liveRoutes) throw new ConnectError("in-process services are not serving yet", Code.Unavailable);
      liveRoutes(router);
    },
    interceptors: () => liveInterceptors,
    readMaxBytes: config.limits.maxReceiveMessageBytes,
    writeMaxBytes: config.limits.maxSendMessageBytes,
  };
  const built: BuiltModule[] = [];
  const closeModules = async () => {
    for (const { module, instance } of [...built].reverse()) {
      try {
        await instance.close?.();
      } catch (err) {
        logger.error({ err, module: module.name }, "module failed to close");
      }
    }
  };
  const stopTasks = (timeoutMs: number) => Promise.all(built.map((b) => b.supervisor.stop(timeoutMs)));
  /** Every connection, HTTP/2 or not yet: what keeps the listener from closing. */
  const destroyConnections = () => {
    for (const session of sessions) session.destroy();
    for (const socket of sockets) socket.destroy();
  };
  /** Undoes a start-up that failed part way. */
  const failStart = async () => {
    drainController.abort();
    await stopTasks(1000);
    await closeModules();
    destroyConnections();
    await closeServer(server);
    if (http1) await closeServer(http1);
  };
  let bindings: ServiceBinding[];
  try {
    const exportsByName = new Map<string, unknown>();
    for (const { module, served } of plan) {
      const moduleLogger = logger.child({ module: module.name });
      const supervisor = new Supervisor(module.name, moduleLogger, metrics.registry);
      const moduleHealth = readiness.forModule(module.name);
      const deps: Record<string, unknown> = {};
      for (const [key, dep] of Object.entries(module.requires ?? {})) deps[key] = exportsByName.get(dep.name);
      // The instance is stored before anything can throw, so that a failing
      // create() of a later module still stops this one's tasks.
      const entry: BuiltModule = { module, served, supervisor, health: moduleHealth, instance: { services: [] } };
      built.push(entry);
      entry.instance = await module.create({
        config: config.sections[module.name],
        deps,
        logger: moduleLogger,
        metrics: metrics.registry,
        health: moduleHealth,
        tasks: supervisor,
        drainSignal: drainController.signal,
        advertisedAddress: advertised,
        localRoutes,
      });
      exportsByName.set(module.name, entry.instance.exports);
    }
    bindings = built.filter((b) => b.served).flatMap((b) => [...b.instance.services]);
    const seen = new Set<string>();
    for (const b of bindings) {
      if (seen.has(b.service.typeName)) throw new Error(`service ${b.service.typeName} is registered twice`);
      seen.add(b.service.typeName);
    }
  } catch (err) {
    // Whatever started is stopped again: tasks, timers, the listener, and
    // connections clients opened meanwhile (they got 503s), which would
    // otherwise keep the listener from closing.
    await failStart();
    throw err;
  }
  const routed = [...bindings.map((b) => b.service), Health, AdminService];
  const serviceNames = [...routed, ...reflectionServices].map((s) => s.typeName).sort();
  // The host's own services are always SERVING; a module's follow its readiness.
  for (const s of [Health, AdminService, ...reflectionServices]) health.set(s.typeName, ServingStatus.SERVING);
  for (const b of built) if (b.served) b.health.follow(b.instance.services.map((s) => s.service.typeName));

  const mappers = new Map<string, ErrorMapper>();
  const decorators = new Map<string, HostStatusDecorator>();
  for (const b of built) {
    const mapError = b.module.mapError;
    if (mapError) for (const s of b.instance.services) mappers.set(s.service.typeName, mapError);
    const decorate = b.module.decorateHostStatus;
    if (decorate) for (const s of b.instance.services) decorators.set(s.service.typeName, decorate);
  }

  const interceptors: Interceptor[] = [
    callInterceptor({
      // Not while shutdown.delayMs lasts: health says NOT_SERVING, calls are still taken.
      draining: () => drainController.signal.aborted,
      exempt: new Set([Health.typeName]),
      mapperFor: (typeName) => mappers.get(typeName),
      decoratorFor: (typeName) => decorators.get(typeName),
      logger,
    }),
  ];
  if (config.auth.token !== "") interceptors.push(bearerAuthInterceptor(config.auth.token));
  // Looked at once: with tracing off nothing is added to any call's path.
  const tracing = tracingEnabled();
  if (tracing) {
    // Outermost: the span sees the status the call interceptor mapped; the RPC log line names the span.
    interceptors.unshift(
      serverTracingInterceptor((span, values) => {
        const record = values.get(rpcRecordKey);
        if (record === undefined) return;
        span.setAttribute("mmgate.request_id", record.requestId);
        ({ traceId: record.traceId, spanId: record.spanId } = span.spanContext());
      }),
    );
  }
  const served: { service: DescService; implementation: object; readMaxBytes?: number }[] = [
    ...bindings,
    { service: Health, implementation: healthService(health, drainController.signal) },
    {
      service: AdminService,
      implementation: adminService({
        version: options.version,
        startedAt,
        config,
        health,
        drain: () => {
          logger.info({ reason: "AdminService.Drain" }, "shutdown requested");
          void shutdownOnce();
        },
      }),
    },
  ];
  const registerRoutes = (router: ConnectRouter) => {
    for (const s of served) {
      const limit = s.readMaxBytes !== undefined ? Math.min(s.readMaxBytes, config.limits.maxReceiveMessageBytes) : undefined;
      router.service(s.service, s.implementation, limit !== undefined ? { readMaxBytes: limit } : {});
    }
    addReflection(router, routed, drainController.signal);
  };

  const compressMinBytes = config.rpc.responseCompressionMinBytes;
  const adapter = connectNodeAdapter({
    jsonOptions,
    readMaxBytes: config.limits.maxReceiveMessageBytes,
    writeMaxBytes: config.limits.maxSendMessageBytes,
    ...(config.limits.maxTimeoutMs > 0 ? { maxTimeoutMs: config.limits.maxTimeoutMs } : {}),
    // connect compresses from 1 KiB by default; here only when configured.
    compressMinBytes: compressMinBytes > 0 ? compressMinBytes : Number.MAX_SAFE_INTEGER,
    shutdownSignal: abortController.signal,
    interceptors,
    routes(router: ConnectRouter) {
      registerRoutes(router);
      const methods: DescMethod[] = [];
      for (const h of router.handlers) methods.push(h.method);
      observer.register(methods);
    },
    contextValues: (req) => createContextValues().set(rpcRecordKey, observer.recordFor(req)),
    fallback: (req, res) => {
      const record = observer.recordFor(req);
      if (record) {
        record.code = Code.Unimplemented;
        record.error = unknownMethodMessage(req);
      }
      answerWithStatus(req, res as unknown as NodeRes, Code.Unimplemented, 404, unknownMethodMessage(req));
    },
  });
  const cors = new CorsPolicy(config.cors, tls);
  const httpMetrics = new HttpRequestMetrics(metrics.registry);
  const httpRoutes = new HttpRouteTable({
    routes: built.filter((b) => b.served).flatMap((b) => (b.instance.httpRoutes ?? []).map((route) => (tracing ? traceHttpRoute(route, tls) : route))),
    logger,
    metrics: httpMetrics,
    draining: () => drainController.signal.aborted,
    shutdownSignal: abortController.signal,
    readMaxBytes: config.limits.maxReceiveMessageBytes,
    // A browser page from another origin may send a form (no preflight) to a
    // route that spends quota: refused unless CORS lets that origin in.
    originAllowed: (headers) => cors.admits(headers),
  });
  const refusedRequests = new Counter({
    name: "mmgate_requests_refused_total",
    help: "Requests refused before routing for the authority they name: bad_authority (unusable Host or :authority), host_not_allowed (not in server.allowedHosts).",
    labelNames: ["reason"],
    registers: [metrics.registry],
  });
  handle = (req, res) => {
    // Before anything reads the authority (connect builds a URL of it), and
    // for every protocol, route and preflight alike.
    const verdict = hosts.check(req.headers);
    if (!verdict.ok) {
      refusedRequests.labels(verdict.reason).inc();
      logger.info({ reason: verdict.reason, peer: peerOf(req.socket), path: req.url?.slice(0, 200) }, "request refused");
      // A body still arriving is not read: the connection (HTTP/1.1) or the stream is let go once the answer is out.
      releaseUnreadRequest(req, res);
      const badAuthority = verdict.reason === "bad_authority";
      answerWithStatus(req, res, badAuthority ? Code.InvalidArgument : Code.PermissionDenied, badAuthority ? 400 : 403, verdict.message);
      return;
    }
    if (req.method === "OPTIONS") {
      // A CORS preflight (or any OPTIONS) is answered here: it is not an RPC.
      const answer = cors.preflight(req.headers);
      req.resume();
      // An empty body, said outright (no chunked encoding); a 204 carries no Content-Length at all.
      res.writeHead(answer.status, answer.status === 204 ? answer.headers : { ...answer.headers, "content-length": "0" }).end();
      httpMetrics.record("cors.preflight", answer.status, 0);
      logger.debug({ origin: req.headers["origin"], path: req.url?.slice(0, 200), outcome: answer.outcome }, "cors preflight");
      return;
    }
    cors.decorate(req.headers, res);
    if (req.httpVersionMajor === 1) {
      // HTTP/1.1 keeps connections alive; while draining, ask the client to
      // close, and close what went idle once its response is out.
      if (drainController.signal.aborted) res.setHeader("connection", "close");
      res.once("finish", () => {
        if (drainController.signal.aborted) setImmediate(() => http1?.closeIdleConnections());
      });
    }
    releaseUnreadRequest(req, res);
    if (httpRoutes.serve(req, res)) return;
    observer.begin(req, res);
    adapter(req, res);
  };
  if (config.rpc.fastPath) {
    const fastPath = new FastPath({
      interceptors,
      observer,
      taken: metrics.leanPathCalls,
      readMaxBytes: config.limits.maxReceiveMessageBytes,
      writeMaxBytes: config.limits.maxSendMessageBytes,
      maxTimeoutMs: config.limits.maxTimeoutMs > 0 ? config.limits.maxTimeoutMs : undefined,
      shutdownSignal: abortController.signal,
      tls,
      // A client that accepts a compressed answer gets it from connect.
      declineCompressible: compressMinBytes > 0,
    });
    // A service with a receive limit of its own is left to connect, which applies it.
    for (const s of served) if (s.readMaxBytes === undefined) fastPath.addService(s.service, s.implementation);
    // A browser's call gets its CORS headers from the compatibility layer.
    // A refused authority is answered there too.
    const passOn = (headers: http2.IncomingHttpHeaders) => (cors.enabled && headers["origin"] !== undefined) || !hosts.check(headers).ok;
    const onError = (err: unknown) => logger.error({ err }, "request handling failed");
    if (!routeStreams(server, fastPath, passOn, onError)) logger.warn("this Node.js does not let the lean request path take HTTP/2 streams: every call goes through connect");
  }
  liveRoutes = registerRoutes;
  liveInterceptors = interceptors;

  let admin: HttpServer | undefined;
  let adminAddress = "";
  try {
    if (config.adminListen !== "") {
      admin = createAdminServer(metrics.registry, health, adminServerTimeouts(config.admin));
      adminAddress = await listen(admin, config.adminListen);
    }
    // The routes are live: modules may now register, watch and call each other.
    for (const b of built) await b.instance.start?.();
  } catch (err) {
    await failStart();
    if (admin?.listening) await closeServer(admin);
    throw err;
  }
  readiness.markStarted();

  logger.info(
    {
      address,
      adminAddress: adminAddress || undefined,
      tls,
      protocols: tls ? "h2, http/1.1 (ALPN)" : "h2c, http/1.1",
      httpRoutes: httpRoutes.size > 0 ? httpRoutes.paths : undefined,
      cors: cors.enabled ? config.cors.allowedOrigins : undefined,
      allowedHosts: hosts.describe(),
      modules: plan.map((p) => (p.served ? p.module.name : `${p.module.name} (dependency, not served)`)),
      notReady: Object.fromEntries(readiness.pending()),
      version: options.version,
    },
    "mmgate serving",
  );
  if (hosts.allowsAny && config.server.allowedHosts.length === 0) {
    logger.info({ listen: config.listen }, "the listener is not on loopback: requests naming any host are served (list the names clients use in server.allowedHosts to check them)");
  }
  if (config.auth.token === "") {
    logger.warn("no auth token configured: mutating and admin methods are open to every client (AdminService.Drain is refused until one is)");
  }

  let resolveClosed!: () => void;
  const closed = new Promise<void>((r) => (resolveClosed = r));
  let shutdownPromise: Promise<void> | undefined;
  // A drain is visible to Prometheus while the admin listener lasts (to the
  // end of the shutdown), so that an alert can tell a stuck one by its age.
  const draining = new Gauge({
    name: "mmgate_draining",
    help: "1 from SIGTERM (or shutdown) until the process stops: health NOT_SERVING, then GOAWAY and the grace; 0 while serving.",
    registers: [metrics.registry],
  });
  draining.set(0);
  const drainStarted = new Gauge({
    name: "mmgate_drain_started_timestamp_seconds",
    help: "When the drain began (Unix seconds); 0 while serving.",
    registers: [metrics.registry],
  });
  drainStarted.set(0);
  new Gauge({
    name: "mmgate_shutdown_grace_seconds",
    help: "How long a drain may take: shutdown.delayMs plus shutdown.graceMs, in seconds (calls still running then are cancelled).",
    registers: [metrics.registry],
  }).set((config.shutdown.delayMs + config.shutdown.graceMs) / 1000);

  async function shutdown(): Promise<void> {
    const { graceMs, delayMs } = config.shutdown;
    draining.set(1);
    drainStarted.set(Date.now() / 1000);
    health.drain();
    if (delayMs > 0) {
      // Health says NOT_SERVING already; calls are still taken until peers have seen it.
      logger.info({ delayMs }, "not serving: still taking calls while peers notice");
      await delay(delayMs);
    }
    logger.info({ graceMs, openSessions: sessions.size }, "draining");
    drainController.abort();
    const listenerClosed = closeServer(server);
    // Idle HTTP/1.1 connections, and connections that have not sent a
    // byte, would hold the listener open until their timeouts.
    http1?.closeIdleConnections();
    protocolSplit?.destroyUndecided();
    // GOAWAY: clients open no new streams here; open ones may finish.
    for (const session of sessions) session.close();
    // Modules drain alongside the listener (revoke leases, end subscribers
    // with their status); both get the same grace.
    const graceController = new AbortController();
    const moduleDrains = Promise.all(
      built.map(async ({ module, instance }) => {
        try {
          await instance.drain?.(graceController.signal);
        } catch (err) {
          logger.error({ err, module: module.name }, "module failed to drain");
        }
      }),
    );
    const drained = await settleWithin(Promise.all([listenerClosed, moduleDrains]), graceMs);
    graceController.abort();
    if (!drained) {
      logger.warn({ openSessions: sessions.size, openSockets: sockets.size }, "grace period over: cancelling the calls still running");
      abortController.abort(new ConnectError("server shut down", Code.Unavailable));
      await delay(50);
      destroyConnections();
      await listenerClosed;
    }
    // Stops the HTTP/1.1 server's timeout checks (it never listened itself).
    if (http1) await closeServer(http1);
    await stopTasks(TASK_STOP_MS);
    await closeModules();
    if (admin) {
      admin.closeAllConnections();
      await closeServer(admin);
    }
    // The last spans (the drain's own calls included) go out before the process exits.
    await shutdownTracing();
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
    shutdown: shutdownOnce,
  };

  /** Hoisted: AdminService.Drain starts the same shutdown. */
  function shutdownOnce(): Promise<void> {
    shutdownPromise ??= shutdown();
    return shutdownPromise;
  }
}
