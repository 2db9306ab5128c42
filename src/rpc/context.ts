import { createContextKey, createContextValues } from "@connectrpc/connect";
import type { ContextValues, HandlerContext } from "@connectrpc/connect";
import { requestIdOf } from "../server/index.js";

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
