/**
 * A TCP proxy that delivers what the server sends at a fixed byte rate (a
 * token bucket), as a slow link between datacenters would: the client's
 * bytes go through as they come; the server's wait in the proxy, and once a
 * little is waiting the proxy stops reading from the server, so TCP and then
 * HTTP/2 flow control hold the server back at the link's rate.
 */
import { listenTcpProxy } from "./tcp-proxy.js";

export interface ThrottledProxyOptions {
  /** Where connections go: `HOST:PORT`. */
  readonly target: string;
  /** Bytes per second from the server to the client. */
  readonly bytesPerSecond: number;
  /** How often the bucket refills (default 10 ms). */
  readonly tickMs?: number;
}

export interface ThrottledProxy {
  /** `127.0.0.1:PORT`, to connect to instead of the target. */
  readonly addr: string;
  /** Bytes delivered to clients so far. */
  readonly delivered: () => number;
  close(): Promise<void>;
}

/** Server bytes the proxy holds before it stops reading from the server: 64 KiB, or 50 ms of the rate when more (a tick must find enough to send). */
const MIN_HOLD_BYTES = 64 * 1024;

export async function startThrottledProxy(options: ThrottledProxyOptions): Promise<ThrottledProxy> {
  const { bytesPerSecond, tickMs = 10 } = options;
  const perTick = (bytesPerSecond * tickMs) / 1000;
  const holdBytes = Math.max(MIN_HOLD_BYTES, bytesPerSecond / 20);
  let delivered = 0;

  const listener = await listenTcpProxy(
    () => options.target,
    ({ client, upstream }) => {
      const held: Buffer[] = [];
      let heldBytes = 0;
      let ending: ReturnType<typeof setInterval> | undefined;
      // Refilled by the time that passed, so that a late timer (a busy event loop) does not lower the rate,
      // up to a second's worth: the link's average holds through a stall of this process (the link's model,
      // not the link), its bursts stay short otherwise.
      let tokens = 0;
      let refilled = performance.now();
      const cap = Math.max(perTick * 4, bytesPerSecond);
      const tick = setInterval(() => {
        const now = performance.now();
        tokens = Math.min(cap, tokens + ((now - refilled) * bytesPerSecond) / 1000);
        refilled = now;
        while (tokens >= 1 && held.length > 0) {
          const first = held[0]!;
          const take = Math.min(first.byteLength, Math.floor(tokens));
          const piece = take === first.byteLength ? held.shift()! : first.subarray(0, take);
          if (take < first.byteLength) held[0] = first.subarray(take);
          tokens -= take;
          heldBytes -= take;
          delivered += take;
          client.write(piece);
        }
        if (heldBytes < holdBytes / 4 && upstream.isPaused()) upstream.resume();
      }, tickMs);
      upstream.on("data", (chunk: Buffer) => {
        held.push(chunk);
        heldBytes += chunk.byteLength;
        if (heldBytes >= holdBytes) upstream.pause();
      });
      client.pipe(upstream);
      client.on("close", () => {
        clearInterval(tick);
        clearInterval(ending);
      });
      // The server's end reaches the client once what it sent before has (the link keeps its order).
      upstream.on("end", () => {
        ending = setInterval(() => {
          if (heldBytes > 0) return;
          clearInterval(ending);
          client.end();
        }, tickMs);
      });
    },
  );
  return { addr: listener.addr, delivered: () => delivered, close: () => listener.close() };
}
