import type { ConnectRouter, Interceptor, Transport } from "@connectrpc/connect";
import { Code, ConnectError, createRouterTransport } from "@connectrpc/connect";

/** A transport to this process's own services that exists before they do. */
export interface LocalTransport extends Transport {
  /** The host's interceptors (status record, drain, error mapping, auth), set once. */
  setInterceptors(interceptors: Interceptor[]): void;
}

/**
 * An in-memory transport to the routes `routes()` returns once the host has
 * built them (connect's router transport: no TCP, no HTTP/2, the same
 * handlers and interceptors). Calls made before answer UNAVAILABLE.
 */
export function lazyRouterTransport(
  routes: () => ((router: ConnectRouter) => void) | undefined,
  limits: { readMaxBytes: number; writeMaxBytes: number },
): LocalTransport {
  let interceptors: Interceptor[] = [];
  let inner: Transport | undefined;
  const get = (): Transport => {
    if (inner) return inner;
    const register = routes();
    if (!register) throw new ConnectError("in-process services are not serving yet", Code.Unavailable);
    inner = createRouterTransport(register, {
      transport: { readMaxBytes: limits.readMaxBytes, writeMaxBytes: limits.writeMaxBytes },
      router: { interceptors, readMaxBytes: limits.readMaxBytes, writeMaxBytes: limits.writeMaxBytes },
    });
    return inner;
  };
  return {
    setInterceptors(list) {
      interceptors = list;
    },
    unary(method, signal, timeoutMs, header, input, contextValues) {
      return get().unary(method, signal, timeoutMs, header, input, contextValues);
    },
    stream(method, signal, timeoutMs, header, input, contextValues) {
      return get().stream(method, signal, timeoutMs, header, input, contextValues);
    },
  };
}
