/**
 * Mutual TLS on the listener (`tls.clientAuth`, `tls.clientCaFile`): which
 * TLS options ask for a client certificate, and the check that turns a
 * connection away once its handshake is done, before HTTP/2 or HTTP/1.1
 * sees a byte of it.
 *
 * Node verifies a client certificate against the CA during the handshake
 * but leaves the verdict to JavaScript (`socket.authorized`), and its own
 * `rejectUnauthorized` can only refuse every connection without a verified
 * certificate, which is "require". "request" needs a finer rule: no
 * certificate is let in (anonymous), a certificate that does not verify
 * (unknown CA, expired, not a client certificate) is refused, rather than
 * served as if the client had sent none. So the host applies both rules
 * itself, in one place, which also lets it log and count each refusal.
 */
import type { Http2SecureServer } from "node:http2";
import type { TLSSocket } from "node:tls";

export type ClientAuth = "none" | "request" | "require";

/** A listener whose client check cannot be put in place: serving without it would let unverified clients in. */
export class ClientAuthSetupError extends Error {
  override readonly name = "ClientAuthSetupError";
  readonly code = "CLIENT_AUTH_UNSUPPORTED" as const;
}

/** The TLS server options of a mode: ask for a certificate, and let enforceClientAuth do the refusing. */
export function clientAuthOptions(mode: ClientAuth): { requestCert: boolean; rejectUnauthorized: boolean } {
  return { requestCert: mode !== "none", rejectUnauthorized: false };
}

/**
 * Why a connection is refused (Node's verification error code, e.g.
 * CERT_HAS_EXPIRED), or undefined when it may be served. "require" asks
 * for a certificate as well as a verdict: Node calls a resumed TLS 1.3
 * session without one authorized, and a client turned away for having no
 * certificate may hold a ticket from that handshake.
 */
export function refusal(socket: Pick<TLSSocket, "authorized" | "authorizationError" | "getPeerCertificate">, mode: ClientAuth): string | undefined {
  if (mode === "none") return undefined;
  const presented = Object.keys(socket.getPeerCertificate() ?? {}).length > 0;
  if (!presented) return mode === "request" ? undefined : "NO_CERTIFICATE";
  return socket.authorized ? undefined : String(socket.authorizationError ?? "UNVERIFIED");
}

/**
 * Puts the check in front of the server's own connection listener (the one
 * that starts HTTP/2 or HTTP/1.1 on a connection): a refused connection is
 * destroyed and never reaches it. Throws a ClientAuthSetupError when that
 * listener is not where this Node.js keeps it, so that the server does not
 * start without the check.
 */
export function enforceClientAuth(server: Http2SecureServer, mode: ClientAuth, onRefused: (socket: TLSSocket, reason: string) => void): void {
  if (mode === "none") return;
  const listeners = server.listeners("secureConnection");
  const serve = listeners[0];
  if (listeners.length !== 1 || typeof serve !== "function") {
    throw new ClientAuthSetupError("this Node.js does not let the host check client certificates before serving a connection: tls.clientAuth cannot be enforced");
  }
  server.removeListener("secureConnection", serve as (...args: unknown[]) => void);
  server.on("secureConnection", (socket: TLSSocket) => {
    const reason = refusal(socket, mode);
    if (reason === undefined) {
      (serve as (socket: TLSSocket) => void).call(server, socket);
      return;
    }
    onRefused(socket, reason);
    socket.destroy();
  });
}
