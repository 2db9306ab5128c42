import type { Attributes, AttributeValue, Context, Span, TextMapGetter } from "@opentelemetry/api";
import { context, propagation, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import {
  ATTR_ERROR_TYPE,
  ATTR_HTTP_REQUEST_METHOD,
  ATTR_HTTP_RESPONSE_STATUS_CODE,
  ATTR_HTTP_ROUTE,
  ATTR_NETWORK_PROTOCOL_VERSION,
  ATTR_SERVER_ADDRESS,
  ATTR_SERVER_PORT,
  ATTR_URL_FULL,
  ATTR_URL_PATH,
  ATTR_URL_SCHEME,
} from "./attributes.js";
import { state } from "./state.js";

/** The W3C headers that carry a trace's context between processes. */
export const TRACE_CONTEXT_HEADERS: readonly string[] = ["traceparent", "tracestate", "baggage"];

/**
 * One span of mmgate's, with the context it is current in. Made only while
 * tracing is on: every `open…` function returns undefined otherwise, so a
 * call site costs one boolean when it is off (`span?.end()`).
 */
export class TraceSpan {
  private ended = false;
  /** The context with this span current: what work under it runs in. */
  readonly context: Context;

  constructor(readonly span: Span, parent: Context) {
    this.context = trace.setSpan(parent, span);
  }

  /** Sets an attribute while the span is open (afterwards the SDK would warn; nothing changes). */
  set(key: string, value: AttributeValue | undefined): this {
    if (value !== undefined && !this.ended) this.span.setAttribute(key, value);
    return this;
  }

  /** Runs `fn` with this span current, so spans and outbound calls made in it are its children. */
  run<T>(fn: () => T): T {
    return context.with(this.context, fn);
  }

  /** Marks the span failed (once ended, nothing changes). */
  fail(error: unknown, type?: string): this {
    if (this.ended) return this;
    this.span.setStatus({ code: SpanStatusCode.ERROR, message: messageOf(error) });
    this.span.setAttribute(ATTR_ERROR_TYPE, type ?? errorType(error));
    return this;
  }

  /** Ends the span, failed when `error` is given; later calls do nothing. */
  end(error?: unknown): void {
    if (this.ended) return;
    if (error !== undefined) this.fail(error);
    this.ended = true;
    this.span.end();
  }
}

function messageOf(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).slice(0, 500);
}

function errorType(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code;
    return typeof code === "string" ? code : error.name;
  }
  return "_OTHER";
}

/** A span under the current one (a root when there is none); undefined while tracing is off. */
export function openSpan(name: string, attributes?: Attributes, kind: SpanKind = SpanKind.INTERNAL, parent?: Context): TraceSpan | undefined {
  if (!state.enabled) return undefined;
  const from = parent ?? context.active();
  return new TraceSpan(state.tracer.startSpan(name, { kind, ...(attributes ? { attributes } : {}) }, from), from);
}

/**
 * Runs `fn` inside a span of its own, ended when `fn` settles (failed when
 * it throws). With tracing off, `fn` runs as it is, with `undefined`.
 */
export async function inSpan<T>(name: string, attributes: Attributes | undefined, fn: (span: TraceSpan | undefined) => Promise<T>): Promise<T> {
  if (!state.enabled) return fn(undefined);
  const span = openSpan(name, attributes)!;
  try {
    const result = await span.run(() => fn(span));
    span.end();
    return result;
  } catch (error) {
    span.end(error);
    throw error;
  }
}

/** Runs `fn` with `span` current, or as it is when there is no span (tracing off). */
export function within<T>(span: TraceSpan | undefined, fn: () => T): T {
  return span === undefined ? fn() : span.run(fn);
}

/**
 * `source`, ending `span` when it ends: read to its end (OK), failed (the
 * error), or left early (cancelled). For a stream whose reading outlives
 * the call that opened it (a downstream call the hop relays).
 */
export function spanningStream<T>(span: TraceSpan, source: AsyncIterable<T>): AsyncIterable<T> {
  return {
    [Symbol.asyncIterator](): AsyncIterator<T> {
      const it = source[Symbol.asyncIterator]();
      return {
        async next(): Promise<IteratorResult<T>> {
          try {
            const result = await it.next();
            if (result.done === true) span.end();
            return result;
          } catch (error) {
            span.end(error);
            throw error;
          }
        },
        async return(value?: unknown): Promise<IteratorResult<T>> {
          span.set("mmgate.stream.left_early", true).end();
          return (await it.return?.(value)) ?? { done: true, value: undefined as T };
        },
      };
    },
  };
}

/** `inSpan` for synchronous work (hashing a tensor, say). */
export function inSpanSync<T>(name: string, attributes: Attributes | undefined, fn: () => T): T {
  if (!state.enabled) return fn();
  const span = openSpan(name, attributes)!;
  try {
    const result = span.run(fn);
    span.end();
    return result;
  } catch (error) {
    span.end(error);
    throw error;
  }
}

/** The trace context of `ctx` as W3C headers (traceparent, and tracestate and baggage when they have content). */
export function traceHeaders(ctx: Context): Record<string, string> {
  const headers: Record<string, string> = {};
  propagation.inject(ctx, headers);
  return headers;
}

/** Query parameters whose values are credentials (signed object-store URLs): never put in a span. */
const SECRET_QUERY = new Set(["awsaccesskeyid", "signature", "sig", "x-goog-signature", "x-goog-credential", "x-amz-signature", "x-amz-credential", "x-amz-security-token", "token", "key", "api_key", "apikey"]);

/** A URL as `url.full` may show it: no user info, and the values of credential parameters replaced. */
export function redactedUrl(url: URL): string {
  const out = new URL(url.href);
  if (out.username !== "" || out.password !== "") {
    out.username = "REDACTED";
    out.password = "REDACTED";
  }
  for (const name of [...out.searchParams.keys()]) if (SECRET_QUERY.has(name.toLowerCase())) out.searchParams.set(name, "REDACTED");
  return out.href;
}

/** An HTTP client call's span, and the headers that carry it to the server. */
export class HttpClientSpan extends TraceSpan {
  /** traceparent (and tracestate, baggage) for the request. */
  readonly headers: Record<string, string>;

  constructor(span: Span, parent: Context) {
    super(span, parent);
    this.headers = traceHeaders(this.context);
  }

  /** The response's status: 4xx and 5xx mark the span failed, as the HTTP client conventions say. */
  status(code: number): this {
    this.span.setAttribute(ATTR_HTTP_RESPONSE_STATUS_CODE, code);
    if (code >= 400) this.fail(`HTTP ${code}`, String(code));
    return this;
  }
}

/**
 * A CLIENT span for one HTTP request (a provider's API call, a media
 * fetch), with the stable HTTP conventions; undefined while tracing is off.
 * The caller adds `headers` to its request and ends the span.
 */
export function openHttpClientSpan(method: string, url: URL, attributes?: Attributes): HttpClientSpan | undefined {
  if (!state.enabled) return undefined;
  const parent = context.active();
  const port = url.port !== "" ? Number(url.port) : url.protocol === "https:" ? 443 : 80;
  const span = state.tracer.startSpan(
    method,
    {
      kind: SpanKind.CLIENT,
      attributes: {
        [ATTR_HTTP_REQUEST_METHOD]: method,
        [ATTR_URL_FULL]: redactedUrl(url),
        [ATTR_SERVER_ADDRESS]: url.hostname,
        [ATTR_SERVER_PORT]: port,
        ...attributes,
      },
    },
    parent,
  );
  return new HttpClientSpan(span, parent);
}

type NodeHeaders = Record<string, string | string[] | undefined>;
const nodeHeaderGetter: TextMapGetter<NodeHeaders> = {
  get: (carrier, key) => carrier[key],
  keys: (carrier) => Object.keys(carrier),
};

/** The remote parent a request's W3C headers name (the root context when they name none). */
export function extractContext(headers: NodeHeaders): Context {
  return propagation.extract(ROOT_CONTEXT, headers, nodeHeaderGetter);
}

/** What `traceHttpRoute` needs of a plain HTTP route (the host's HttpRoute). */
interface RouteLike<Req, Res, Ctx> {
  readonly method: string;
  readonly path: string;
  handle(req: Req, res: Res, ctx: Ctx): Promise<void>;
}

interface NodeRequest {
  readonly headers: NodeHeaders;
  readonly url?: string | undefined;
  readonly httpVersion: string;
}
interface NodeResponse {
  readonly statusCode: number;
  readonly headersSent: boolean;
  readonly writableFinished: boolean;
  once(event: "close", listener: () => void): unknown;
}

/**
 * The same route, its requests served inside a SERVER span whose parent is
 * the caller's traceparent: the route's own calls (the OpenAI routes' call
 * of their RPC) become its children. 5xx marks it failed; a response cut
 * short is 499, as the host's log line says.
 */
export function traceHttpRoute<Req extends NodeRequest, Res extends NodeResponse, Ctx, R extends RouteLike<Req, Res, Ctx>>(route: R, tls: boolean): R {
  const handle = route.handle.bind(route);
  return {
    ...route,
    handle(req: Req, res: Res, ctx: Ctx): Promise<void> {
      const parent = extractContext(req.headers);
      const span = new TraceSpan(
        state.tracer.startSpan(
          `${route.method} ${route.path}`,
          {
            kind: SpanKind.SERVER,
            attributes: {
              [ATTR_HTTP_REQUEST_METHOD]: route.method,
              [ATTR_HTTP_ROUTE]: route.path,
              [ATTR_URL_PATH]: (req.url ?? "").split("?", 1)[0]!.slice(0, 500),
              [ATTR_URL_SCHEME]: tls ? "https" : "http",
              [ATTR_NETWORK_PROTOCOL_VERSION]: req.httpVersion,
            },
          },
          parent,
        ),
        parent,
      );
      res.once("close", () => {
        const status = res.writableFinished || res.headersSent ? res.statusCode : 499;
        span.span.setAttribute(ATTR_HTTP_RESPONSE_STATUS_CODE, status);
        // Server spans: only 5xx is the server's failure.
        if (status >= 500) span.fail(`HTTP ${status}`, String(status));
        span.end();
      });
      return span.run(() => handle(req, res, ctx));
    },
  };
}

/**
 * Sets an attribute on the current span (inside a server interceptor or a
 * handler: the call's server span); nothing while tracing is off.
 */
export function setCurrentSpanAttribute(key: string, value: AttributeValue): void {
  if (!state.enabled) return;
  trace.getSpan(context.active())?.setAttribute(key, value);
}

/**
 * pino's mixin while tracing is on: the current span's ids on every log
 * line written inside it.
 */
export function traceLogFields(): Record<string, string> {
  const span = trace.getSpan(context.active());
  if (span === undefined) return {};
  const { traceId, spanId } = span.spanContext();
  return trace.isSpanContextValid(span.spanContext()) ? { trace_id: traceId, span_id: spanId } : {};
}
