/**
 * A TCP load balancer in front of several servers, as a deployment puts one
 * in front of its replicas: each new connection goes to the next target in
 * turn, and its bytes pass both ways untouched. It balances connections,
 * not requests (an HTTP/2 client sends every call over one connection), so
 * a test that wants a call to reach the next replica opens a new
 * connection for it. `targets()` says where each connection went.
 */
import { listenTcpProxy } from "./tcp-proxy.js";

export interface RoundRobinProxy {
  /** `127.0.0.1:PORT`, to connect to instead of the targets. */
  readonly addr: string;
  /** The index of the target each accepted connection went to, in order. */
  readonly targets: () => readonly number[];
  close(): Promise<void>;
}

export async function startRoundRobinProxy(targets: readonly string[]): Promise<RoundRobinProxy> {
  if (targets.length === 0) throw new Error("a round-robin proxy needs a target");
  const chosen: number[] = [];
  let next = 0;
  const pick = (): string => {
    const index = next;
    next = (next + 1) % targets.length;
    chosen.push(index);
    return targets[index]!;
  };
  const listener = await listenTcpProxy(pick, ({ client, upstream, end }) => {
    client.pipe(upstream);
    upstream.pipe(client);
    upstream.on("close", end);
  });
  return { addr: listener.addr, targets: () => [...chosen], close: () => listener.close() };
}
