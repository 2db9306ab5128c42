import type { IncomingMessage, ServerResponse } from "node:http";
import type { Http2ServerRequest, Http2ServerResponse } from "node:http2";
import type { Logger } from "pino";
import { Counter, Histogram } from "prom-client";
import type { Registry } from "prom-client";
import type { HttpRoute } from "./module.js";
import { peerOf } from "./rpc-observer.js";

type NodeReq = Http2ServerRequest | IncomingMessage;
type NodeRes = Http2ServerResponse | ServerResponse;

/** The error body plain HTTP answers of the host use (the shape OpenAI's API has). */
export function httpErrorBody(message: string, type: string, code: string | null = null): string {
  return JSON.stringify({ error: { message, type, param: null, code } });
}

/** Counts and times the plain HTTP requests of the gRPC port: routes and preflights. */
export class HttpRequestMetrics {
  private readonly requests: Counter<"route" | "status">;
  private readonly duration: Histogram<"route">;

  constructor(registry: Registry) {
    this.requests = new Counter({
      name: "mmgate_http_requests_total",
      help: "Plain HTTP requests on the gRPC port (module routes, CORS preflights), by route and HTTP status.",
      labelNames: ["route", "status"],
      registers: [registry],
    });
    this.duration = new Histogram({
      name: "mmgate_http_request_duration_seconds",
      help: "Time from a plain HTTP request's arrival to the end of its response, by route.",
      labelNames: ["route"],
      buckets: [0.005, 0.025, 0.1, 0.5, 1, 2.5, 10, 30, 60, 120, 300],
      registers: [registry],
    });
  }

  record(route: string, status: number, seconds: number): void {
    this.requests.labels(route, String(status)).inc();
    this.duration.labels(route).observe(seconds);
  }
}

export interface HttpRouteTableOptions {
  readonly routes: readonly HttpRoute[];
  readonly logger: Logger;
  readonly metrics: HttpRequestMetrics;
  readonly draining: () => boolean;
  /** Fires when the server's grace is over: every route's signal fires with it. */
  readonly shutdownSignal: AbortSignal;
  readonly readMaxBytes: number;
  /** False refuses the request with 403: a browser page from an origin CORS does not allow. */
  readonly originAllowed?: (headers: NodeReq["headers"]) => boolean;
}

/**
 * The modules' plain HTTP routes, matched on method and path: an exact path
 * first, else the longest prefix route (`path` ending in `/*`). Each
 * request is logged once (`http request finished`) and counted, whether the
 * handler answered, threw, or the client went away.
 */
export class HttpRouteTable {
  private readonly byPath = new Map<string, HttpRoute[]>();
  /** Prefix routes by their prefix (the path without its `*`). */
  private readonly byPrefix = new Map<string, HttpRoute[]>();
  /** Longest first, so the most specific prefix wins. */
  private readonly prefixes: string[];

  constructor(private readonly options: HttpRouteTableOptions) {
    for (const route of options.routes) {
      const prefix = prefixOf(route.path);
      const table = prefix === undefined ? this.byPath : this.byPrefix;
      const key = prefix ?? route.path;
      const list = table.get(key) ?? [];
      if (list.some((r) => r.method === route.method)) throw new Error(`HTTP route ${route.method} ${route.path} is registered twice`);
      list.push(route);
      table.set(key, list);
    }
    this.prefixes = [...this.byPrefix.keys()].sort((a, b) => b.length - a.length);
  }

  get size(): number {
    return this.byPath.size + this.byPrefix.size;
  }

  /** "METHOD /path" of every route, for the start-up log. */
  get paths(): string[] {
    return [...this.byPath.values(), ...this.byPrefix.values()].flat().map((r) => `${r.method} ${r.path}`);
  }

  /** The routes serving `path`, and for a prefix route what follows the prefix. */
  private match(path: string): { candidates: HttpRoute[]; rest?: string } | undefined {
    const exact = this.byPath.get(path);
    if (exact !== undefined) return { candidates: exact };
    // An empty rest is not a match: "/a/" names nothing under "/a/*".
    const prefix = this.prefixes.find((p) => path.length > p.length && path.startsWith(p));
    return prefix === undefined ? undefined : { candidates: this.byPrefix.get(prefix)!, rest: path.slice(prefix.length) };
  }

  /** Serves the request when its path is a route's and returns true; false leaves it to the RPC router. */
  serve(req: NodeReq, res: NodeRes): boolean {
    const path = (req.url ?? "").split("?", 1)[0] ?? "";
    const matched = this.match(path);
    if (matched === undefined) return false;
    const { candidates, rest } = matched;
    const route = candidates.find((r) => r.method === req.method);
    const name = route?.name ?? candidates[0]!.name;
    const started = performance.now();
    // Read now: once the client is gone its socket no longer knows it.
    const peer = peerOf(req.socket);
    res.once("close", () => {
      const seconds = (performance.now() - started) / 1000;
      // A response cut before it ended is logged with the status it had begun, or 499 (client closed).
      const status = res.writableFinished || res.headersSent ? res.statusCode : 499;
      this.options.metrics.record(name, status, seconds);
      this.options.logger.info(
        {
          route: name,
          method: req.method,
          status,
          durationMs: Math.round(seconds * 1e6) / 1e3,
          protocol: `http/${req.httpVersion}`,
          peer,
          complete: res.writableFinished,
        },
        "http request finished",
      );
    });
    if (route === undefined) {
      const allow = candidates.map((r) => r.method).join(", ");
      answer(res, 405, httpErrorBody(`${path} takes ${allow}, not ${String(req.method)}`, "invalid_request_error", "method_not_allowed"), { allow });
      req.resume();
      return true;
    }
    if (this.options.originAllowed && !this.options.originAllowed(req.headers)) {
      answer(
        res,
        403,
        httpErrorBody(`requests from origin ${String(req.headers["origin"]).slice(0, 200)} are not allowed (see cors.allowedOrigins)`, "invalid_request_error", "origin_not_allowed"),
      );
      req.resume();
      return true;
    }
    if (this.options.draining()) {
      answer(res, 503, httpErrorBody("the server is shutting down; retry on another instance", "server_error", "unavailable"), {
        "retry-after": "1",
      });
      req.resume();
      return true;
    }
    // One controller a request, tied to the server's shutdown by a listener
    // removed when the response closes (AbortSignal.any on a signal that
    // lives as long as the server keeps memory on Node 20).
    const controller = new AbortController();
    const shutdown = this.options.shutdownSignal;
    const onShutdown = () => controller.abort(shutdown.reason);
    if (shutdown.aborted) onShutdown();
    else shutdown.addEventListener("abort", onShutdown, { once: true });
    res.once("close", () => {
      shutdown.removeEventListener("abort", onShutdown);
      if (!res.writableFinished) controller.abort(new Error("the client closed the connection"));
    });
    const signal = controller.signal;
    const logger = this.options.logger.child({ route: name });
    route.handle(req, res, { signal, readMaxBytes: this.options.readMaxBytes, logger, pathRest: rest }).catch((err: unknown) => {
      logger.error({ err }, "http route failed");
      if (!res.headersSent && !res.destroyed) {
        answer(res, 500, httpErrorBody("internal error", "server_error", "internal"));
      } else if (!res.writableEnded) {
        // Part of the answer is out: cut it, so the client cannot take it for whole.
        res.destroy();
      }
    });
    return true;
  }
}

/**
 * The prefix of a prefix route ("/v1/models/*" → "/v1/models/"), undefined
 * for an exact one. A `*` anywhere else is refused rather than taken
 * literally, so that a pattern never silently becomes an exact path.
 */
function prefixOf(path: string): string | undefined {
  const star = path.indexOf("*");
  if (star === -1) return undefined;
  if (star !== path.length - 1 || !path.endsWith("/*")) throw new Error(`HTTP route path ${path}: only a trailing "/*" is a pattern`);
  return path.slice(0, -1);
}

function answer(res: NodeRes, status: number, body: string, headers: Record<string, string> = {}): void {
  if (res.headersSent || res.destroyed) return;
  try {
    (res as ServerResponse).writeHead(status, { "content-type": "application/json", ...headers }).end(body);
  } catch {
    // The client went away between the check and the write: nothing to answer.
  }
}
