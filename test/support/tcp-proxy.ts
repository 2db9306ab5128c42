/**
 * What the test proxies share: a loopback listener whose every client
 * connection is paired with a new connection to a target, both tracked so
 * that close() ends them all; what passes between them is the proxy's own.
 */
import * as net from "node:net";

export interface TcpProxyListener {
  /** `127.0.0.1:PORT`, to connect to instead of the target. */
  readonly addr: string;
  close(): Promise<void>;
}

/** A connected pair: the client's socket, the target's, and `end()`, which destroys both. */
export interface ProxiedConnection {
  readonly client: net.Socket;
  readonly upstream: net.Socket;
  readonly end: () => void;
}

/**
 * Listens on loopback; each connection gets an upstream connection to
 * `target()` (asked per connection) and is handed to `serve`. An error or
 * close on the client ends both.
 */
export async function listenTcpProxy(target: () => string, serve: (pair: ProxiedConnection) => void): Promise<TcpProxyListener> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const [host, port] = splitTarget(target());
    const upstream = net.connect(port, host);
    sockets.add(client);
    sockets.add(upstream);
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on("error", end);
    upstream.on("error", end);
    client.on("close", end);
    serve({ client, upstream, end });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address() as net.AddressInfo;
  return {
    addr: `127.0.0.1:${address.port}`,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** `HOST:PORT` (`[v6]:PORT` too) as host and port. */
function splitTarget(target: string): [string, number] {
  const at = target.lastIndexOf(":");
  return [target.slice(0, at).replace(/^\[|\]$/g, ""), Number(target.slice(at + 1))];
}
