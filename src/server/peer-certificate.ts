/**
 * The client certificate a connection's TLS handshake verified, as the
 * calls on it see it (`peerCertificateKey`). It is read from the socket
 * once per connection, on its first call, and kept beside the HTTP/2
 * session (or the HTTP/1.1 socket) in a WeakMap: a session's certificate
 * cannot change (HTTP/2 forbids renegotiation), and a call pays one lookup.
 */
import type { Http2Session } from "node:http2";
import type { PeerCertificate } from "node:tls";
import { TLSSocket } from "node:tls";
import type { ContextValues } from "@connectrpc/connect";
import { peerCertificateKey } from "./caller.js";
import type { NodeRequest } from "./listener.js";

/** null: looked at, and there is none. */
const seen = new WeakMap<object, PeerCertificate | null>();

/** The verified client certificate of a connection: its HTTP/2 session or its HTTP/1.1 (TLS) socket. */
export function peerCertificateOf(connection: object | undefined): PeerCertificate | undefined {
  if (connection === undefined) return undefined;
  let certificate = seen.get(connection);
  if (certificate === undefined) {
    certificate = verifiedCertificate(connection) ?? null;
    seen.set(connection, certificate);
  }
  return certificate ?? undefined;
}

/** Sets `peerCertificateKey` for a call on `connection` when its client presented a certificate that verified. */
export function setPeerCertificate(values: ContextValues, connection: object | undefined): void {
  const certificate = peerCertificateOf(connection);
  if (certificate !== undefined) values.set(peerCertificateKey, certificate);
}

/** The connection a request of the compatibility layer came on: its HTTP/2 session, or its HTTP/1.1 socket. */
export function connectionOf(req: NodeRequest): object | undefined {
  return "stream" in req ? req.stream.session : req.socket;
}

function verifiedCertificate(connection: object): PeerCertificate | undefined {
  try {
    // An HTTP/2 session's `socket` is a proxy of its TLS socket (and throws once the session let it go).
    const socket = connection instanceof TLSSocket ? connection : (connection as Partial<Http2Session>).socket;
    // `authorized` is only ever true when a certificate was asked for and verified against the client CA.
    if (!(socket instanceof TLSSocket) || !socket.authorized) return undefined;
    const certificate = socket.getPeerCertificate();
    return certificate !== null && certificate.raw !== undefined ? certificate : undefined;
  } catch {
    return undefined;
  }
}
