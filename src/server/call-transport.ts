import type { ServerHttp2Stream } from "node:http2";
import { Socket } from "node:net";
import type { ContextValues } from "@connectrpc/connect";
import { PacedWrites } from "./paced-writes.js";
import type { MethodMetrics } from "./metrics.js";
import { rpcRecordKey } from "./rpc-observer.js";

/**
 * What a handler may learn about the transport of its call, on either
 * request path (the lean path and connect's): the HTTP/2 stream, the
 * connection and the client's address. Undefined for a call the host did
 * not observe (a handler invoked directly, in-process).
 */
export interface CallTransport {
  /** The call's HTTP/2 stream; undefined over HTTP/1.1. */
  readonly stream: ServerHttp2Stream | undefined;
  /** The connection (an HTTP/2 session or an HTTP/1.1 socket), to compare by identity. */
  readonly connection: object | undefined;
  /** The client's IP address, without the port. */
  readonly peerAddress: string | undefined;
}

/** The transport of the call `ctx` belongs to. */
export function callTransportOf(ctx: { readonly values: ContextValues }): CallTransport | undefined {
  const via = ctx.values.get(rpcRecordKey)?.transport;
  if (via === undefined) return undefined;
  if (isSocket(via)) return { stream: undefined, connection: via, peerAddress: via.remoteAddress };
  const session = via.session;
  return { stream: via, connection: session, peerAddress: session?.socket?.remoteAddress };
}

/**
 * Paces the writes of the call's HTTP/2 stream (paced-writes.ts), so that
 * the handler waits for its own backlog rather than the transport waiting
 * on 'drain'; undefined over HTTP/1.1 or without a transport.
 */
export function pacedWritesOf(ctx: { readonly values: ContextValues }): PacedWrites | undefined {
  const via = ctx.values.get(rpcRecordKey)?.transport;
  return via === undefined || isSocket(via) ? undefined : PacedWrites.of(via);
}

/**
 * Whole messages written straight onto a call's HTTP/2 stream
 * (PacedWrites.writeDirect), each counted as a message the call sent, and
 * the backlog that paces them.
 */
export interface DirectMessages {
  /** Bytes written and not yet taken by HTTP/2. */
  readonly backlog: number;
  /** Resolves once the backlog is below `bytes` (or the stream closed). */
  whenBelow(bytes: number): Promise<void>;
  /** Writes one length-prefixed message; false when the stream is gone or ending. */
  write(envelope: Buffer): boolean;
}

/**
 * Direct message writes for the call of `ctx` (HTTP/2 only; undefined over
 * HTTP/1.1 or without a transport). The handler must only write once the
 * transport sent the response headers (after its first message) and while
 * the transport waits for its next message, and the bytes must be messages
 * in the call's own format.
 */
export function directMessagesOf(ctx: { readonly values: ContextValues }): DirectMessages | undefined {
  const record = ctx.values.get(rpcRecordKey);
  const via = record?.transport;
  if (record === undefined || via === undefined || isSocket(via)) return undefined;
  const paced = PacedWrites.of(via);
  const series = record.series;
  return {
    get backlog() {
      return paced.backlog;
    },
    whenBelow: (bytes) => paced.whenBelow(bytes),
    write(envelope) {
      if (!paced.writeDirect(envelope)) return false;
      countSent(series);
      return true;
    },
  };
}

/**
 * Messages written directly, counted once a turn per method: a counter's
 * increment hashes its labels, which would cost as much as the write.
 */
const unsent = new Map<MethodMetrics, number>();

function countSent(series: MethodMetrics): void {
  if (unsent.size === 0) setImmediate(flushSent);
  unsent.set(series, (unsent.get(series) ?? 0) + 1);
}

function flushSent(): void {
  for (const [series, count] of unsent) series.sent(count);
  unsent.clear();
}

/** An HTTP/1.1 request's socket (TLS ones included), as opposed to an HTTP/2 stream. */
function isSocket(via: ServerHttp2Stream | Socket): via is Socket {
  return via instanceof Socket;
}
