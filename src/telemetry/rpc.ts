import type { Context, Span, TextMapGetter, TextMapSetter } from "@opentelemetry/api";
import { context, propagation, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace } from "@opentelemetry/api";
import { Code, ConnectError } from "@connectrpc/connect";
import type { ContextValues, Interceptor, StreamResponse, UnaryResponse } from "@connectrpc/connect";
import { ATTR_SERVER_ADDRESS, ATTR_SERVER_PORT, RPC_CONNECT_ERROR_CODE, RPC_GRPC_STATUS_CODE, RPC_METHOD, RPC_SERVICE, RPC_SYSTEM } from "./attributes.js";
import { TRACE_CONTEXT_HEADERS } from "./spans.js";
import { state } from "./state.js";


const headerGetter: TextMapGetter<Headers> = {
  get: (carrier, key) => carrier.get(key) ?? undefined,
  keys: (carrier) => [...carrier.keys()],
};
const headerSetter: TextMapSetter<Headers> = { set: (carrier, key, value) => carrier.set(key, value) };

/** gRPC and gRPC-Web calls are "grpc"; the Connect protocol (and connect's in-process transport) "connect_rpc". */
function rpcSystemOf(contentType: string | null): "grpc" | "connect_rpc" {
  return contentType !== null && contentType.startsWith("application/grpc") ? "grpc" : "connect_rpc";
}

/** The codes a server span counts as its own failure (the gRPC conventions' list); a client span fails on every code. */
const SERVER_ERRORS = new Set<Code>([Code.Unknown, Code.DeadlineExceeded, Code.Unimplemented, Code.Internal, Code.Unavailable, Code.DataLoss]);

/** connect's "not_found" style names, for rpc.connect_rpc.error_code. */
function connectCodeName(code: Code): string {
  return Code[code].replace(/[A-Z]/g, (c, at: number) => (at === 0 ? c.toLowerCase() : `_${c.toLowerCase()}`));
}

/** Records a call's end on its span: the status code, failed or not, then ends it. */
function finish(span: Span, system: "grpc" | "connect_rpc", server: boolean, error: unknown): void {
  let code: Code | 0 = 0;
  if (error !== undefined) code = ConnectError.from(error).code;
  if (system === "grpc") span.setAttribute(RPC_GRPC_STATUS_CODE, code);
  else if (code !== 0) span.setAttribute(RPC_CONNECT_ERROR_CODE, connectCodeName(code));
  if (code !== 0 && (!server || SERVER_ERRORS.has(code))) {
    span.setStatus({ code: SpanStatusCode.ERROR, message: ConnectError.from(error).rawMessage.slice(0, 500) });
  }
  span.end();
}

/**
 * A server stream's messages, each one asked for inside `ctx` (a handler's
 * generator body runs when its next message is asked for, so the span must
 * be current then, not only when the handler was called; a client's stream
 * needs no context: `ctx` undefined); `done` is told
 * how the stream ended: its end, an error, or a consumer that stopped.
 */
function inContext<T>(ctx: Context | undefined, source: AsyncIterable<T>, done: (error: unknown) => void): AsyncIterable<T> {
  const within = <R>(fn: () => R): R => (ctx === undefined ? fn() : context.with(ctx, fn));
  return {
    [Symbol.asyncIterator](): AsyncIterator<T> {
      const it = source[Symbol.asyncIterator]();
      let ended = false;
      const end = (error: unknown) => {
        if (ended) return;
        ended = true;
        done(error);
      };
      return {
        async next(): Promise<IteratorResult<T>> {
          try {
            const result = await within(() => it.next());
            if (result.done === true) end(undefined);
            return result;
          } catch (error) {
            end(error);
            throw error;
          }
        },
        async return(value?: unknown): Promise<IteratorResult<T>> {
          // The consumer stopped early (the client left, or an error was written instead).
          end(new ConnectError("the stream was not read to its end", Code.Canceled));
          return (await within(() => it.return?.(value))) ?? { done: true, value: undefined as T };
        },
        async throw(error?: unknown): Promise<IteratorResult<T>> {
          end(error);
          if (it.throw === undefined) throw error;
          return within(() => it.throw!(error));
        },
      };
    },
  };
}

/** Told of each server span as it starts, with the call's context values (the host stores the ids for its RPC log line). */
export type ServerSpanHook = (span: Span, values: ContextValues) => void;

/**
 * The host's server interceptor while tracing is on (it is not installed
 * otherwise): a SERVER span per call, child of the caller's traceparent,
 * current while the handler runs (and while each message of a server
 * stream is made), so that the handler's spans, outbound calls and log
 * lines belong to it. Outermost, so its status is the one the call
 * interceptor mapped, as the client gets it.
 */
export function serverTracingInterceptor(onSpan?: ServerSpanHook): Interceptor {
  return (next) => async (req) => {
    const parent = propagation.extract(ROOT_CONTEXT, req.header, headerGetter);
    const system = rpcSystemOf(req.header.get("content-type"));
    const span = state.tracer.startSpan(
      `${req.service.typeName}/${req.method.name}`,
      { kind: SpanKind.SERVER, attributes: { [RPC_SYSTEM]: system, [RPC_SERVICE]: req.service.typeName, [RPC_METHOD]: req.method.name } },
      parent,
    );
    onSpan?.(span, req.contextValues);
    const ctx = trace.setSpan(parent, span);
    let res: UnaryResponse | StreamResponse;
    try {
      res = await context.with(ctx, next, undefined, req);
    } catch (error) {
      finish(span, system, true, error);
      throw error;
    }
    if (!res.stream) {
      finish(span, system, true, undefined);
      return res;
    }
    return { ...res, message: inContext(ctx, res.message, (error) => finish(span, system, true, error)) };
  };
}

/**
 * The outbound interceptor while tracing is on: a CLIENT span per call,
 * child of the current span, and the call's traceparent, tracestate and
 * baggage taken from it, replacing any the caller passed on from its own
 * inbound call (so the next process's span is this span's child).
 */
export function clientTracingInterceptor(): Interceptor {
  return (next) => async (req) => {
    const parent = context.active();
    const system = rpcSystemOf(req.header.get("content-type"));
    let address: string | undefined;
    let port: number | undefined;
    try {
      const url = new URL(req.url);
      address = url.hostname;
      port = url.port !== "" ? Number(url.port) : url.protocol === "https:" ? 443 : 80;
    } catch {
      // connect's in-process transport has no address worth naming.
    }
    const span = state.tracer.startSpan(
      `${req.service.typeName}/${req.method.name}`,
      {
        kind: SpanKind.CLIENT,
        attributes: {
          [RPC_SYSTEM]: system,
          [RPC_SERVICE]: req.service.typeName,
          [RPC_METHOD]: req.method.name,
          ...(address !== undefined ? { [ATTR_SERVER_ADDRESS]: address, [ATTR_SERVER_PORT]: port } : {}),
        },
      },
      parent,
    );
    const ctx = trace.setSpan(parent, span);
    for (const name of TRACE_CONTEXT_HEADERS) req.header.delete(name);
    propagation.inject(ctx, req.header, headerSetter);
    let res: UnaryResponse | StreamResponse;
    try {
      res = await next(req);
    } catch (error) {
      finish(span, system, false, error);
      throw error;
    }
    if (!res.stream) {
      finish(span, system, false, undefined);
      return res;
    }
    return { ...res, message: inContext(undefined, res.message, (error) => finish(span, system, false, error)) };
  };
}
