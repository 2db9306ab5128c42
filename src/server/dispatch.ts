import type { IncomingMessage, ServerResponse } from "node:http";
import * as http2 from "node:http2";
import type { DescMethod, DescService } from "@bufbuild/protobuf";
import type { ConnectRouter, Interceptor } from "@connectrpc/connect";
import { Code, ConnectError, createContextValues } from "@connectrpc/connect";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import { Counter } from "prom-client";
import type { AccessControl } from "./access/index.js";
import { authInterceptor } from "./auth.js";
import { callInterceptor } from "./call-interceptor.js";
import type { MmgateConfig } from "./config/index.js";
import { splitHostPort } from "./config/index.js";
import { CorsPolicy } from "./cors.js";
import { Health } from "./health.js";
import { HttpRequestMetrics, HttpRouteTable } from "./http-routes.js";
import { jsonOptions } from "./json-options.js";
import { LeanPath } from "./lean/index.js";
import type { Listener, NodeRequest, NodeResponse, RequestHandler } from "./listener.js";
import type { RpcMetrics } from "./metrics.js";
import type { ErrorMapper, HostStatusDecorator, HttpRoute, LocalRoutes } from "./module.js";
import { connectionOf, setPeerCertificate } from "./peer-certificate.js";
import { addReflection } from "./reflection.js";
import { HostAllowList } from "./request-host.js";
import type { RpcObserver } from "./rpc-observer.js";
import { peerOf, rpcRecordKey } from "./rpc-observer.js";
import type { ShutdownSignals } from "./shutdown.js";
import { serverTracingInterceptor, traceHttpRoute, tracingEnabled } from "../telemetry/index.js";

/** How long an HTTP/1.1 connection answered before its request body was read may linger, discarding that body. */
const UNREAD_BODY_LINGER_MS = 2000;

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
function answerWithStatus(req: NodeRequest, res: NodeResponse, code: Code, httpStatus: number, message: string): void {
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

function unknownMethodMessage(req: NodeRequest): string {
  const path = (req.url ?? "").split("?", 1)[0] ?? "";
  return `unknown method ${path.slice(0, 200)}`;
}

/**
 * The last word on a request whose handling threw: nothing one request
 * carries may reach the process's uncaught-exception handler. The client
 * gets INTERNAL if nothing was sent yet, else its stream is cut.
 */
function failRequest(req: NodeRequest, res: NodeResponse, err: unknown, logger: Logger): void {
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
function releaseUnreadRequest(req: NodeRequest, res: NodeResponse): void {
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
  leanPath: LeanPath,
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
      taken = !passOn(headers) && leanPath.serve(stream, headers);
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

export interface DispatchOptions {
  readonly config: MmgateConfig;
  readonly tls: boolean;
  readonly logger: Logger;
  readonly metrics: RpcMetrics;
  readonly observer: RpcObserver;
  readonly signals: ShutdownSignals;
  /** Who may call what: the auth interceptor's verdicts. */
  readonly access: AccessControl;
}

/** A service connect routes: a module's binding, or one of the host's own. */
export interface RoutedService {
  readonly service: DescService;
  readonly implementation: object;
  /** A receive limit of the service's own (capped by the host's), applied on both request paths. */
  readonly readMaxBytes?: number | undefined;
}

/** A service's own receive limit as both request paths apply it: at most the host's. */
function ownReadLimit(service: RoutedService, hostLimit: number): number | undefined {
  return service.readMaxBytes !== undefined ? Math.min(service.readMaxBytes, hostLimit) : undefined;
}

/** What `Dispatch.bind` serves. */
export interface RouteTable {
  readonly services: readonly RoutedService[];
  /** The services reflection describes (it adds its own). */
  readonly reflected: readonly DescService[];
  /** The modules' plain HTTP routes. */
  readonly httpRoutes: readonly HttpRoute[];
  readonly mapperFor: (typeName: string) => ErrorMapper | undefined;
  readonly decoratorFor: (typeName: string) => HostStatusDecorator | undefined;
}

/** Everything a request is routed with, once bound. */
interface Routing {
  readonly adapter: ReturnType<typeof connectNodeAdapter>;
  readonly cors: CorsPolicy;
  readonly httpRoutes: HttpRouteTable;
  readonly httpMetrics: HttpRequestMetrics;
  readonly refusedRequests: Counter<"reason">;
  readonly listener: Listener;
}

/**
 * Where a request goes: the authority check, CORS, the modules' plain HTTP
 * routes, then connect (gRPC, gRPC-Web, Connect) with the host's
 * interceptors, or, for the HTTP/2 streams it takes, the lean path with the
 * same interceptors. `onRequest` is the per-request boundary the listener
 * calls; until `bind` it answers 503.
 */
export class Dispatch {
  /** The authorities requests may name (`server.allowedHosts`, or what the listener's address implies). */
  readonly hosts: HostAllowList;
  /** The process's own services for in-process calls (`ctx.localRoutes`). */
  readonly localRoutes: LocalRoutes;
  // Until the modules are up, requests get UNAVAILABLE rather than hanging.
  private handle: RequestHandler = (_req, res) => {
    res.writeHead(503).end();
  };
  // Bound once the routes exist; an in-process call before that answers UNAVAILABLE.
  private liveRoutes: ((router: ConnectRouter) => void) | undefined = undefined;
  private liveInterceptors: Interceptor[] = [];
  private routing: Routing | undefined = undefined;

  /** The per-request boundary: whatever a request makes throw ends there. */
  readonly onRequest: RequestHandler = (req, res) => {
    try {
      this.handle(req, res);
    } catch (err) {
      failRequest(req, res, err, this.options.logger);
    }
  };

  constructor(private readonly options: DispatchOptions) {
    const { config } = options;
    this.hosts = HostAllowList.forListener(config.server.allowedHosts, splitHostPort(config.listen).host, config.advertiseAddress);
    this.localRoutes = {
      routes: (router) => {
        if (!this.liveRoutes) throw new ConnectError("in-process services are not serving yet", Code.Unavailable);
        this.liveRoutes(router);
      },
      interceptors: () => this.liveInterceptors,
      readMaxBytes: config.limits.maxReceiveMessageBytes,
      writeMaxBytes: config.limits.maxSendMessageBytes,
    };
  }

  /**
   * Makes the routes live: the interceptors, connect's adapter with every
   * service and reflection, the plain HTTP routes, CORS, and the lean path
   * in front of the HTTP/2 compatibility layer. From here requests are
   * served, and in-process calls too.
   */
  bind(table: RouteTable, listener: Listener): void {
    const { config, logger, metrics, signals, tls } = this.options;
    // Looked at once: with tracing off nothing is added to any call's path.
    const tracing = tracingEnabled();
    const interceptors = this.interceptors(table, tracing);
    const registerRoutes = (router: ConnectRouter) => {
      for (const s of table.services) {
        const limit = ownReadLimit(s, config.limits.maxReceiveMessageBytes);
        router.service(s.service, s.implementation, limit !== undefined ? { readMaxBytes: limit } : {});
      }
      addReflection(router, table.reflected, signals.drainingSignal);
    };
    const adapter = this.connectAdapter(interceptors, registerRoutes);
    const cors = new CorsPolicy(config.cors, tls);
    const httpMetrics = new HttpRequestMetrics(metrics.registry);
    const httpRoutes = new HttpRouteTable({
      routes: table.httpRoutes.map((route) => (tracing ? traceHttpRoute(route, tls) : route)),
      logger,
      metrics: httpMetrics,
      draining: () => signals.isDraining,
      shutdownSignal: signals.graceOverSignal,
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
    const routing: Routing = { adapter, cors, httpRoutes, httpMetrics, refusedRequests, listener };
    this.routing = routing;
    this.handle = (req, res) => this.route(routing, req, res);
    if (config.rpc.leanPath) this.routeLeanPath(table.services, interceptors, routing);
    this.liveRoutes = registerRoutes;
    this.liveInterceptors = interceptors;
  }

  /** What the start-up log says of the routing. */
  describe(): { httpRoutes: string[] | undefined; cors: readonly string[] | undefined; allowedHosts: string[] } {
    const { httpRoutes, cors } = this.routing ?? {};
    return {
      httpRoutes: httpRoutes && httpRoutes.size > 0 ? httpRoutes.paths : undefined,
      cors: cors?.enabled ? this.options.config.cors.allowedOrigins : undefined,
      allowedHosts: this.hosts.describe(),
    };
  }

  /**
   * The host's interceptors, for connect and the lean path alike: the call
   * interceptor (draining, error mapping, the RPC log), then auth when any
   * of auth.token, auth.keysFile or auth.certificates is set, with the
   * tracing interceptor outermost when tracing is on.
   */
  private interceptors(table: RouteTable, tracing: boolean): Interceptor[] {
    const { access, logger, signals } = this.options;
    const interceptors: Interceptor[] = [
      callInterceptor({
        // Not while shutdown.delayMs lasts: health says NOT_SERVING, calls are still taken.
        draining: () => signals.isDraining,
        exempt: new Set([Health.typeName]),
        mapperFor: table.mapperFor,
        decoratorFor: table.decoratorFor,
        logger,
      }),
    ];
    if (access.enabled) interceptors.push(authInterceptor(access));
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
    return interceptors;
  }

  /** connect-node's handler for every service; an unknown method is answered UNIMPLEMENTED by the host. */
  private connectAdapter(interceptors: Interceptor[], registerRoutes: (router: ConnectRouter) => void): ReturnType<typeof connectNodeAdapter> {
    const { config, observer, signals, tls } = this.options;
    const compressMinBytes = config.rpc.responseCompressionMinBytes;
    return connectNodeAdapter({
      jsonOptions,
      readMaxBytes: config.limits.maxReceiveMessageBytes,
      writeMaxBytes: config.limits.maxSendMessageBytes,
      ...(config.limits.maxTimeoutMs > 0 ? { maxTimeoutMs: config.limits.maxTimeoutMs } : {}),
      // connect compresses from 1 KiB by default; here only when configured.
      compressMinBytes: compressMinBytes > 0 ? compressMinBytes : Number.MAX_SAFE_INTEGER,
      shutdownSignal: signals.graceOverSignal,
      interceptors,
      routes(router: ConnectRouter) {
        registerRoutes(router);
        const methods: DescMethod[] = [];
        for (const h of router.handlers) methods.push(h.method);
        observer.register(methods);
      },
      contextValues: (req) => {
        const values = createContextValues().set(rpcRecordKey, observer.recordFor(req));
        // The client certificate the handshake verified (mutual TLS), for authentication and the services.
        if (tls) setPeerCertificate(values, connectionOf(req));
        return values;
      },
      fallback: (req, res) => {
        const record = observer.recordFor(req);
        if (record) {
          record.code = Code.Unimplemented;
          record.error = unknownMethodMessage(req);
        }
        answerWithStatus(req, res as unknown as NodeResponse, Code.Unimplemented, 404, unknownMethodMessage(req));
      },
    });
  }

  /** One request through the compatibility layer (HTTP/1.1, and HTTP/2 streams the lean path declined). */
  private route(routing: Routing, req: NodeRequest, res: NodeResponse): void {
    const { logger, observer, signals } = this.options;
    // Before anything reads the authority (connect builds a URL of it), and
    // for every protocol, route and preflight alike.
    const verdict = this.hosts.check(req.headers);
    if (!verdict.ok) {
      routing.refusedRequests.labels(verdict.reason).inc();
      logger.info({ reason: verdict.reason, peer: peerOf(req.socket), path: req.url?.slice(0, 200) }, "request refused");
      // A body still arriving is not read: the connection (HTTP/1.1) or the stream is let go once the answer is out.
      releaseUnreadRequest(req, res);
      const badAuthority = verdict.reason === "bad_authority";
      answerWithStatus(req, res, badAuthority ? Code.InvalidArgument : Code.PermissionDenied, badAuthority ? 400 : 403, verdict.message);
      return;
    }
    if (req.method === "OPTIONS") {
      // A CORS preflight (or any OPTIONS) is answered here: it is not an RPC.
      const answer = routing.cors.preflight(req.headers);
      req.resume();
      // An empty body, said outright (no chunked encoding); a 204 carries no Content-Length at all.
      res.writeHead(answer.status, answer.status === 204 ? answer.headers : { ...answer.headers, "content-length": "0" }).end();
      routing.httpMetrics.record("cors.preflight", answer.status, 0);
      logger.debug({ origin: req.headers["origin"], path: req.url?.slice(0, 200), outcome: answer.outcome }, "cors preflight");
      return;
    }
    routing.cors.decorate(req.headers, res);
    if (req.httpVersionMajor === 1) {
      // HTTP/1.1 keeps connections alive; while draining, ask the client to
      // close, and close what went idle once its response is out.
      if (signals.isDraining) res.setHeader("connection", "close");
      res.once("finish", () => {
        if (signals.isDraining) setImmediate(() => routing.listener.closeIdleHttp1Connections());
      });
    }
    releaseUnreadRequest(req, res);
    if (routing.httpRoutes.serve(req, res)) return;
    observer.begin(req, res);
    routing.adapter(req, res);
  }

  /** Puts the lean path in front of the HTTP/2 compatibility layer (`rpc.leanPath`). */
  private routeLeanPath(services: readonly RoutedService[], interceptors: Interceptor[], routing: Routing): void {
    const { config, logger, metrics, observer, signals, tls } = this.options;
    const compressMinBytes = config.rpc.responseCompressionMinBytes;
    const leanPath = new LeanPath({
      interceptors,
      observer,
      taken: metrics.leanPathCalls,
      readMaxBytes: config.limits.maxReceiveMessageBytes,
      writeMaxBytes: config.limits.maxSendMessageBytes,
      maxTimeoutMs: config.limits.maxTimeoutMs > 0 ? config.limits.maxTimeoutMs : undefined,
      shutdownSignal: signals.graceOverSignal,
      tls,
      // A client that accepts a compressed answer gets it from connect.
      declineCompressible: compressMinBytes > 0,
    });
    // A service's own receive limit applies as connect applies it: at most the host's.
    for (const s of services) leanPath.addService(s.service, s.implementation, ownReadLimit(s, config.limits.maxReceiveMessageBytes));
    // A browser's call gets its CORS headers from the compatibility layer.
    // A refused authority is answered there too.
    const passOn = (headers: http2.IncomingHttpHeaders) => (routing.cors.enabled && headers["origin"] !== undefined) || !this.hosts.check(headers).ok;
    const onError = (err: unknown) => logger.error({ err }, "request handling failed");
    if (!routeStreams(routing.listener.server, leanPath, passOn, onError)) {
      logger.warn("this Node.js does not let the lean request path take HTTP/2 streams: every call goes through connect");
    }
  }
}
