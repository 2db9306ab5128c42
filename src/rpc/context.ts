import { createContextKey, createContextValues } from "@connectrpc/connect";
import type { ContextValues, HandlerContext } from "@connectrpc/connect";
import { requestIdOf } from "../server/index.js";
import { TRACE_CONTEXT_HEADERS } from "../telemetry/index.js";
import { requestHeaderValue } from "../wire/index.js";

/**
 * What an outbound call carries over from the call that caused it. Passed
 * in connect's `contextValues` call option under `callContextKey`.
 */
export interface CallContext {
  /** Sent as `x-request-id` (unless the caller sets that header itself). */
  readonly requestId?: string;
  /**
   * Absolute deadline on the `performance.now()` clock: the outbound call's
   * `grpc-timeout` is never longer than the time left until it, and a call
   * made after it fails at once with DEADLINE_EXCEEDED.
   */
  readonly deadline?: number;
  /**
   * Metadata passed on from the inbound call (its credentials, its trace
   * context): each is sent unless the caller set that header itself, and a
   * channel's own credential replaces `authorization`.
   */
  readonly headers?: Readonly<Record<string, string>>;
}

export const callContextKey = createContextKey<CallContext>({}, { description: "mmgate outbound call context" });

/** `contextValues` carrying `context` (into `values` when given). */
export function withCallContext(context: CallContext, values: ContextValues = createContextValues()): ContextValues {
  return values.set(callContextKey, context);
}

/**
 * The call context of a downstream call made while handling `ctx`: the
 * inbound request id (the client's, or the one the host generated) and the
 * inbound deadline, if the client set one. Pass `ctx.signal` as the call's
 * `signal` too, so that cancellation follows.
 */
export function callContextOf(ctx: Pick<HandlerContext, "values" | "requestHeader" | "timeoutMs">, now: () => number = performance.now.bind(performance)): CallContext {
  const remaining = ctx.timeoutMs();
  return remaining === undefined ? { requestId: requestIdOf(ctx) } : { requestId: requestIdOf(ctx), deadline: now() + remaining };
}

/** `contextValues` for a downstream call made while handling `ctx` (see callContextOf). */
export function outboundContextValues(ctx: Pick<HandlerContext, "values" | "requestHeader" | "timeoutMs">): ContextValues {
  return withCallContext(callContextOf(ctx));
}

/**
 * The context metadata every hop passes on: W3C trace context and baggage
 * (x-request-id travels as the request id). While tracing is on, the client
 * span's own context replaces what was passed on (telemetry's client
 * interceptor), so the next process's spans are its children.
 */
export const CONTEXT_HEADERS: readonly string[] = TRACE_CONTEXT_HEADERS;

/** Headers that belong to one connection or to the protocol, never passed on whatever a config says. */
const NEVER_PASSED_ON = /^(:|grpc-|content-|connect-|te$|host$|connection$|keep-alive$|proxy-|transfer-encoding$|upgrade$|trailer$|accept-encoding$|user-agent$|x-request-id$)/;

/** Whether `name` may be listed as context metadata to pass on (a lower-case header name that is not a protocol one). */
export function isPassOnHeaderName(name: string): boolean {
  return /^[a-z0-9][a-z0-9._-]*$/.test(name) && !NEVER_PASSED_ON.test(name);
}

/**
 * The inbound call's metadata to pass on: `names` (the context headers and
 * any configured extra), and its `authorization` when `authorization` is
 * true (one token domain: the caller's credential opens the next hop too).
 */
export function passedOnHeaders(ctx: Pick<HandlerContext, "requestHeader">, names: readonly string[], authorization: boolean): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of names) {
    const value = requestHeaderValue(ctx, name);
    if (value !== null) out[name] = value;
  }
  if (authorization) {
    const value = requestHeaderValue(ctx, "authorization");
    if (value !== null) out["authorization"] = value;
  }
  return out;
}
