import { createRouterTransport } from "@connectrpc/connect";
import type { ConnectRouter, Interceptor, Transport } from "@connectrpc/connect";
import type { Registry } from "prom-client";
import { clientMetrics, metricsInterceptor } from "./metrics.js";
import { outboundInterceptors, withDeadlines } from "./outbound.js";

export interface InProcessOptions {
  /**
   * Registers the services to call, as the host registers them on its router
   * (a module passes `ctx.localRoutes.routes`). Called at the first call, not
   * before; if it throws, that call fails and the next one tries again.
   */
  readonly routes: (router: ConnectRouter) => void;
  /** Handler-side interceptors (the host's own: auth, observation), read at the first call. */
  readonly interceptors?: Interceptor[] | (() => Interceptor[]);
  /** Largest request message a handler reads (the host's maxReceiveMessageBytes); unlimited by default. */
  readonly readMaxBytes?: number;
  /** Largest response message a handler writes (the host's maxSendMessageBytes); unlimited by default. */
  readonly writeMaxBytes?: number;
  /** Deadline of a call that sets none; 0 (default) means none. */
  readonly defaultTimeoutMs?: number;
  /** Client metrics go here when set, as for a channel. */
  readonly registry?: Registry;
}

/**
 * A Transport to services hosted in this process, with no socket in
 * between: connect's router transport, with the same outbound behaviour as
 * a channel (deadline propagation, `x-request-id` from the CallContext,
 * optional client metrics). Requests are serialized as on the wire, so a
 * handler sees what it would see from a remote client.
 */
export function inProcessTransport(options: InProcessOptions): Transport {
  let inner: Transport | undefined;
  // Built at the first call: a module creates its transport before the
  // host's routes exist, and uses it once they are live.
  const transport = (): Transport => {
    if (inner) return inner;
    const interceptors = typeof options.interceptors === "function" ? options.interceptors() : options.interceptors;
    const router = {
      ...(interceptors ? { interceptors } : {}),
      ...(options.readMaxBytes !== undefined ? { readMaxBytes: options.readMaxBytes } : {}),
      ...(options.writeMaxBytes !== undefined ? { writeMaxBytes: options.writeMaxBytes } : {}),
    };
    const extra = options.registry ? [metricsInterceptor(clientMetrics(options.registry))] : [];
    inner = createRouterTransport(options.routes, { router, transport: { interceptors: outboundInterceptors(extra) } });
    return inner;
  };
  // A failure to build (the routes are not live yet) rejects the call, as
  // any transport failure does; it never throws at the call site.
  const lazy: Transport = {
    unary: (...args) => {
      try {
        return transport().unary(...args);
      } catch (error) {
        return Promise.reject(error as Error);
      }
    },
    stream: (...args) => {
      try {
        return transport().stream(...args);
      } catch (error) {
        return Promise.reject(error as Error);
      }
    },
  };
  return withDeadlines(lazy, { defaultTimeoutMs: options.defaultTimeoutMs ?? 0 });
}
