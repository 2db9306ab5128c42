import type { OutgoingHttpHeaders } from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";
import type { ContextValues, Interceptor, Transport } from "@connectrpc/connect";
import { clientTracingInterceptor, tracingEnabled } from "../telemetry/index.js";
import { observeStream } from "../util/index.js";
import { callContextKey } from "./context.js";

/**
 * Sends the call context's request id as `x-request-id`, and its passed-on
 * headers, unless the caller set them itself: on a request's Headers, or on
 * its headers in node form (lower-case names).
 */
export function applyCallContext(values: ContextValues | undefined, header: Headers | OutgoingHttpHeaders): void {
  if (values === undefined) return;
  const { requestId, headers } = values.get(callContextKey);
  const web = header instanceof Headers ? header : undefined;
  const node = header as OutgoingHttpHeaders;
  const has = (name: string) => (web ? web.has(name) : node[name] !== undefined);
  if (requestId !== undefined && requestId !== "" && !has("x-request-id")) {
    if (web) web.set("x-request-id", requestId);
    else node["x-request-id"] = requestId;
  }
  if (headers === undefined) return;
  for (const [name, value] of Object.entries(headers)) {
    if (has(name)) continue;
    if (web) web.set(name, value);
    else node[name] = value;
  }
}

const requestIdInterceptor: Interceptor = (next) => (req) => {
  applyCallContext(req.contextValues, req.header);
  return next(req);
};

/** Headers that belong to the transport, not to the application, in an error's metadata. */
function isProtocolHeader(name: string): boolean {
  return name.startsWith("grpc-") || name.startsWith("content-") || name === "date";
}

/** `error` with only application metadata (see errorMetadataInterceptor). */
export function stripProtocolHeaders(error: unknown): unknown {
  if (error instanceof ConnectError) {
    for (const name of [...error.metadata.keys()]) if (isProtocolHeader(name)) error.metadata.delete(name);
  }
  return error;
}

/**
 * Leaves only application metadata on a failed call's ConnectError. connect
 * puts every response header and trailer there, and a handler that rethrows
 * a downstream error would otherwise send the downstream's content-type and
 * grpc-status as its own response headers (which breaks the response for a
 * Connect or gRPC-Web caller).
 */
const errorMetadataInterceptor: Interceptor = (next) => async (req) => {
  let res;
  try {
    res = await next(req);
  } catch (error) {
    throw stripProtocolHeaders(error);
  }
  if (!res.stream) return res;
  return { ...res, message: observeStream(res.message, { error: stripProtocolHeaders }) };
};

export interface DeadlineOptions {
  /** Deadline of a call that sets none; 0 means none. */
  readonly defaultTimeoutMs: number;
  /** The clock of CallContext.deadline. */
  readonly now?: () => number;
}

/**
 * Applies deadlines before the transport builds the request, because
 * connect derives both `grpc-timeout` and the call's timer from the
 * `timeoutMs` it is given (an interceptor runs too late to change either).
 * The effective timeout is the caller's `timeoutMs` (≤ 0: none), else the
 * default, and never longer than the time left until the inbound deadline
 * in the call context. A call whose inbound deadline has passed starts with
 * its signal already aborted, so it fails with DEADLINE_EXCEEDED (and is
 * counted) without leaving the process.
 */
export function withDeadlines(inner: Transport, options: DeadlineOptions): Transport {
  const now = options.now ?? performance.now.bind(performance);
  const effective = (signal: AbortSignal | undefined, timeoutMs: number | undefined, values: Parameters<Transport["unary"]>[5]) => {
    let timeout = timeoutMs === undefined ? (options.defaultTimeoutMs > 0 ? options.defaultTimeoutMs : undefined) : timeoutMs > 0 ? timeoutMs : undefined;
    const deadline = values?.get(callContextKey).deadline;
    if (deadline !== undefined) {
      const remaining = Math.floor(deadline - now());
      if (remaining <= 0) {
        const expired = AbortSignal.abort(new ConnectError("the inbound deadline has passed", Code.DeadlineExceeded));
        return { signal: expired, timeout: undefined };
      }
      timeout = timeout === undefined ? remaining : Math.min(timeout, remaining);
    }
    return { signal, timeout };
  };
  return {
    unary(method, signal, timeoutMs, header, input, contextValues) {
      const e = effective(signal, timeoutMs, contextValues);
      // connect turns a timeoutMs ≤ 0 into "none", and `undefined` into its own default (unset here).
      return inner.unary(method, e.signal, e.timeout ?? 0, header, input, contextValues);
    },
    stream(method, signal, timeoutMs, header, input, contextValues) {
      const e = effective(signal, timeoutMs, contextValues);
      return inner.stream(method, e.signal, e.timeout ?? 0, header, input, contextValues);
    },
  };
}

/**
 * Client interceptors every outbound transport gets, outermost first: error
 * metadata, `extra` (e.g. metrics), request id, the client span while
 * tracing is on (inside the request id's, so the span's trace context
 * replaces one passed on from the inbound call; looked at once, when the
 * transport is made), `inner`.
 */
export function outboundInterceptors(extra: readonly Interceptor[], inner: readonly Interceptor[] = []): Interceptor[] {
  return [errorMetadataInterceptor, ...extra, requestIdInterceptor, ...(tracingEnabled() ? [clientTracingInterceptor()] : []), ...inner];
}
