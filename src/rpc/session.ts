import type { ClientHttp2Stream, ClientSessionRequestOptions, Http2Session, OutgoingHttpHeaders } from "node:http2";
import { Http2SessionManager } from "@connectrpc/connect-node";

/**
 * connect-node's HTTP/2 session manager, with every session it hands out
 * given an "error" listener of its own.
 *
 * connect-node 2.1.2 destroys a session that receives GOAWAY while it has
 * no open stream with an error Node emits later, when the socket closes; if
 * the manager has left that session by then (a new call reconnected), no
 * one listens and the error is an uncaught exception that ends the process
 * (connectrpc/connect-es#1768). A peer that drains sends exactly that
 * GOAWAY, so without this one peer's ordinary shutdown could take down every
 * process that calls it. The listener only keeps the error from being
 * uncaught: calls on the session fail on their own, and the manager's own
 * listener, while attached, still sees it.
 */
export class GuardedSessionManager extends Http2SessionManager {
  private readonly guarded = new WeakSet<Http2Session>();

  override async request(method: string, path: string, headers: OutgoingHttpHeaders, options: Omit<ClientSessionRequestOptions, "signal">): Promise<ClientHttp2Stream> {
    const stream = await super.request(method, path, headers, options);
    const session = stream.session;
    if (session !== undefined && !this.guarded.has(session)) {
      this.guarded.add(session);
      session.on("error", ignoreSessionError);
    }
    return stream;
  }
}

function ignoreSessionError(): void {
  // Seen by the calls on the session and by the manager; nothing to add here.
}
