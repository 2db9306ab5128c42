import type { Server as HttpServer } from "node:http";
import type * as http2 from "node:http2";
import type { Socket } from "node:net";

/** What every HTTP/2 client sends first (RFC 9113 §3.4); nothing in HTTP/1.1 starts with it. */
const HTTP2_PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

export interface ProtocolSplitOptions {
  /** A connection that has not shown its protocol within this is destroyed; 0: no limit. */
  readonly decideWithinMs: number;
  /** Called when a connection is destroyed for not showing its protocol in time. */
  readonly onTimeout: () => void;
}

/** What `splitCleartextProtocols` hands back. */
export interface ProtocolSplit {
  /**
   * Destroys the connections that have not shown their protocol yet: they
   * hold no request, and would keep the listener from closing until
   * `decideWithinMs` (a client pool's spare connection, say).
   */
  destroyUndecided(): void;
}

/**
 * Serves HTTP/1.1 and HTTP/2 with prior knowledge (h2c) on one cleartext
 * listener. The HTTP/2 server stays the listener; its own connection
 * handler is moved behind a check of each connection's first bytes: the
 * HTTP/2 preface goes on to it, anything else to `http1`. The bytes read to
 * decide are put back (`unshift`) first; Node's HTTP/2 session and HTTP/1.1
 * parser both take data already buffered on the socket before reading on.
 *
 * Returns undefined, changing nothing, when the HTTP/2 server's connection
 * handler is not where this Node.js version keeps it.
 */
export function splitCleartextProtocols(
  server: http2.Http2Server,
  http1: HttpServer,
  options: ProtocolSplitOptions,
): ProtocolSplit | undefined {
  const listeners = server.listeners("connection");
  // Node registers its handler in the constructor, before any of ours.
  const http2Handler = listeners[0];
  if (typeof http2Handler !== "function") return undefined;
  const undecided = new Set<Socket>();
  server.removeListener("connection", http2Handler as (...args: unknown[]) => void);
  server.prependListener("connection", (socket: Socket) => {
    const chunks: Buffer[] = [];
    let seen = 0;
    let timer: NodeJS.Timeout | undefined;
    // The socket may fail (a reset) before it showed anything; that is the end of it.
    const onError = () => finish();
    const finish = () => {
      undecided.delete(socket);
      socket.removeListener("close", finish);
      socket.removeListener("readable", onReadable);
      socket.removeListener("error", onError);
      socket.removeListener("end", onEnd);
      if (timer !== undefined) clearTimeout(timer);
    };
    const handOver = (isHttp2: boolean) => {
      finish();
      if (chunks.length > 0) socket.unshift(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, seen));
      if (isHttp2) (http2Handler as (socket: Socket) => void).call(server, socket);
      else http1.emit("connection", socket);
    };
    const onReadable = () => {
      let chunk: Buffer | null;
      while ((chunk = socket.read() as Buffer | null) !== null) {
        chunks.push(chunk);
        seen += chunk.length;
        // Compare what arrived so far with the preface: one differing byte decides.
        const start = seen - chunk.length;
        if (start < HTTP2_PREFACE.length) {
          const n = Math.min(chunk.length, HTTP2_PREFACE.length - start);
          if (!chunk.subarray(0, n).equals(HTTP2_PREFACE.subarray(start, start + n))) return handOver(false);
        }
        if (seen >= HTTP2_PREFACE.length) return handOver(true);
      }
    };
    // A client that half-closes before the preface is done: HTTP/1.1 answers it (400) or closes.
    const onEnd = () => handOver(false);
    undecided.add(socket);
    socket.once("close", finish);
    socket.on("readable", onReadable);
    socket.on("error", onError);
    socket.once("end", onEnd);
    if (options.decideWithinMs > 0) {
      timer = setTimeout(() => {
        finish();
        options.onTimeout();
        socket.destroy();
      }, options.decideWithinMs);
      timer.unref();
    }
  });
  return {
    destroyUndecided() {
      for (const socket of undecided) socket.destroy();
    },
  };
}
