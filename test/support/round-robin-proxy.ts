/**
 * A TCP load balancer in front of several servers, as a deployment puts one
 * in front of its replicas: each new connection goes to the next target in
 * turn, and its bytes pass both ways untouched. It balances connections,
 * not requests (an HTTP/2 client sends every call over one connection), so
 * a test that wants a call to reach the next replica opens a new
 * connection for it. `targets()` says where each connection went.
 */
import * as net from "node:net";

export interface RoundRobinProxy {
  /** `127.0.0.1:PORT`, to connect to instead of the targets. */
  readonly addr: string;
  /** The index of the target each accepted connection went to, in order. */
  readonly targets: () => readonly number[];
  close(): Promise<void>;
}

export async function startRoundRobinProxy(targets: readonly string[]): Promise<RoundRobinProxy> {
  if (targets.length === 0) throw new Error("a round-robin proxy needs a target");
  const sockets = new Set<net.Socket>();
  const chosen: number[] = [];
  let next = 0;

  const server = net.createServer((client) => {
    const index = next;
    next = (next + 1) % targets.length;
    chosen.push(index);
    const [host, port] = splitTarget(targets[index]!);
    const upstream = net.connect(port, host);
    sockets.add(client);
    sockets.add(upstream);
    client.pipe(upstream);
    upstream.pipe(client);
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on("error", end);
    upstream.on("error", end);
    client.on("close", end);
    upstream.on("close", end);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address() as net.AddressInfo;
  return {
    addr: `127.0.0.1:${address.port}`,
    targets: () => [...chosen],
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

function splitTarget(target: string): [string, number] {
  const at = target.lastIndexOf(":");
  return [target.slice(0, at).replace(/^\[|\]$/g, ""), Number(target.slice(at + 1))];
}
