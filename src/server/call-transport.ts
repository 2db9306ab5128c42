import type { ServerHttp2Stream } from "node:http2";
import { Socket } from "node:net";
import type { ContextValues } from "@connectrpc/connect";
import { PacedWrites } from "./paced-writes.js";
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

/** An HTTP/1.1 request's socket (TLS ones included), as opposed to an HTTP/2 stream. */
function isSocket(via: ServerHttp2Stream | Socket): via is Socket {
  return via instanceof Socket;
}
