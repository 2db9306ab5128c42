import * as http2 from "node:http2";
import type { TLSSocket } from "node:tls";
import { Counter } from "prom-client";
import type { Registry } from "prom-client";
import type { HostConfig } from "./config/index.js";

export type ConnectionLimits = HostConfig["connections"];

/**
 * Why the server closed a connection, the `reason` label of
 * `mmgate_connections_closed_total`; client_certificate: mutual TLS
 * refused its certificate, or its lack of one (client-auth.ts).
 */
export type CloseReason = "idle" | "keepalive_timeout" | "ping_abuse" | "handshake_timeout" | "over_limit" | "client_certificate";

const REASONS: readonly CloseReason[] = ["idle", "keepalive_timeout", "ping_abuse", "handshake_timeout", "over_limit", "client_certificate"];

/** Counts connections the server closed, by reason. */
export function connectionMetrics(registry: Registry): (reason: CloseReason) => void {
  const closed = new Counter({
    name: "mmgate_connections_closed_total",
    help: "Connections the server closed on its own, by reason.",
    labelNames: ["reason"],
    registers: [registry],
  });
  for (const reason of REASONS) closed.labels(reason).inc(0);
  return (reason) => closed.labels(reason).inc();
}

function unrefTimer(ms: number, fn: () => void): NodeJS.Timeout {
  const timer = setTimeout(fn, ms);
  timer.unref();
  return timer;
}

/**
 * Time limits on the connections of the HTTP/2 listener, as gRPC servers
 * have them:
 *
 * - handshake: a connection must finish its TLS handshake (the TLS server's
 *   own `handshakeTimeout`, set by the caller) and send the HTTP/2 preface
 *   and SETTINGS within `handshakeTimeoutMs`, or it is destroyed;
 * - idle: a session with no open stream for `idleTimeoutMs` is closed with
 *   GOAWAY; one with open streams is never cut by it;
 * - keepalive: a session silent for `keepaliveTimeMs` gets a PING, and is
 *   destroyed when no ack comes within `keepaliveTimeoutMs`;
 * - ping policing: a PING sooner than `minPingIntervalMs` after the previous
 *   one is a strike (a new stream starts the count over); more than `maxPingStrikes`
 *   in a row get GOAWAY ENHANCE_YOUR_CALM ("too_many_pings");
 * - `maxConnections`: Node's own cap, which drops a connection over it at once.
 *
 * Every timer is unref'd and cleared when its session closes.
 */
export function guardConnections(
  server: http2.Http2Server | http2.Http2SecureServer,
  limits: ConnectionLimits,
  registry: Registry,
): (reason: CloseReason) => void {
  const count = connectionMetrics(registry);
  if (limits.maxConnections > 0) {
    server.maxConnections = limits.maxConnections;
    server.on("drop", () => count("over_limit"));
  }
  server.on("tlsClientError", (err: NodeJS.ErrnoException, _socket: TLSSocket) => {
    if (err.code === "ERR_TLS_HANDSHAKE_TIMEOUT") count("handshake_timeout");
  });
  server.on("session", (session: http2.ServerHttp2Session) => guardSession(session, limits, count));
  return count;
}

function guardSession(session: http2.ServerHttp2Session, limits: ConnectionLimits, count: (reason: CloseReason) => void): void {
  const timers = new Set<NodeJS.Timeout>();
  const later = (ms: number, fn: () => void): NodeJS.Timeout => {
    const timer = unrefTimer(ms, () => {
      timers.delete(timer);
      fn();
    });
    timers.add(timer);
    return timer;
  };
  const cancel = (timer: NodeJS.Timeout | undefined) => {
    if (timer === undefined) return;
    clearTimeout(timer);
    timers.delete(timer);
  };
  const gone = () => session.closed || session.destroyed;
  session.once("close", () => {
    for (const timer of timers) clearTimeout(timer);
    timers.clear();
  });

  // Handshake: the client's preface ends with its SETTINGS frame.
  if (limits.handshakeTimeoutMs > 0) {
    const handshake = later(limits.handshakeTimeoutMs, () => {
      if (session.destroyed) return;
      count("handshake_timeout");
      session.destroy();
    });
    session.once("remoteSettings", () => cancel(handshake));
  }

  // Idle: armed whenever the last open stream closes.
  let openStreams = 0;
  let idle: NodeJS.Timeout | undefined;
  const armIdle = () => {
    if (limits.idleTimeoutMs === 0) return;
    idle = later(limits.idleTimeoutMs, () => {
      idle = undefined;
      if (gone() || openStreams > 0) return;
      count("idle");
      session.close();
    });
  };
  armIdle();

  // Ping policing.
  let lastPing: number | undefined;
  let strikes = 0;

  session.on("stream", (stream: http2.ServerHttp2Stream) => {
    openStreams += 1;
    // As grpc-core does when it sends headers: the PING count starts over.
    strikes = 0;
    lastPing = undefined;
    cancel(idle);
    idle = undefined;
    stream.once("close", () => {
      openStreams -= 1;
      if (openStreams === 0 && !gone()) armIdle();
    });
  });

  if (limits.minPingIntervalMs > 0) {
    session.on("ping", () => {
      const now = performance.now();
      if (lastPing !== undefined && now - lastPing < limits.minPingIntervalMs) strikes += 1;
      else strikes = 0;
      lastPing = now;
      if (strikes <= limits.maxPingStrikes || gone()) return;
      count("ping_abuse");
      try {
        session.goaway(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM, 0, Buffer.from("too_many_pings"));
      } catch {
        /* the session is going away already */
      }
      session.close();
      // Streams still open do not keep an abusive client connected.
      later(limits.keepaliveTimeoutMs, () => {
        if (!session.destroyed) session.destroy();
      });
    });
  }

  // Keepalive: Node's session timeout fires after that long without activity.
  if (limits.keepaliveTimeMs > 0) {
    let awaitingAck = false;
    session.setTimeout(limits.keepaliveTimeMs);
    session.on("timeout", () => {
      if (awaitingAck || gone()) return;
      const deadline = later(limits.keepaliveTimeoutMs, () => {
        if (session.destroyed) return;
        count("keepalive_timeout");
        session.destroy();
      });
      awaitingAck = true;
      let sent = false;
      try {
        sent = session.ping((err) => {
          awaitingAck = false;
          cancel(deadline);
          // Silent again from here: the next PING is a full period away.
          if (!err && !session.destroyed) session.setTimeout(limits.keepaliveTimeMs);
        });
      } catch {
        /* the session closed meanwhile */
      }
      if (!sent) {
        // Too many PINGs outstanding, or the session is closing: nothing to wait for.
        awaitingAck = false;
        cancel(deadline);
      }
    });
  }
}

/** Options of the admin HTTP/1.1 server that bound how long a client may take. */
export function adminServerTimeouts(admin: HostConfig["admin"]): {
  headersTimeout: number;
  requestTimeout: number;
  keepAliveTimeout: number;
  connectionsCheckingInterval: number;
} {
  return {
    headersTimeout: admin.headersTimeoutMs,
    requestTimeout: admin.requestTimeoutMs,
    keepAliveTimeout: admin.keepAliveTimeoutMs,
    connectionsCheckingInterval: checkingInterval(admin.headersTimeoutMs, admin.requestTimeoutMs),
  };
}

/**
 * Options of the HTTP/1.1 server behind the cleartext gRPC port, from the
 * same connection limits as HTTP/2: each request's headers must arrive
 * within `handshakeTimeoutMs`, and a keep-alive connection with no request
 * is closed after `idleTimeoutMs`. A whole request has no time limit, as an
 * HTTP/2 stream has none: a server stream (Connect, gRPC-Web) may run for
 * hours; the client's deadline bounds a call.
 */
export function http1ServerTimeouts(limits: ConnectionLimits): {
  headersTimeout: number;
  requestTimeout: number;
  keepAliveTimeout: number;
  connectionsCheckingInterval: number;
} {
  return {
    headersTimeout: limits.handshakeTimeoutMs,
    requestTimeout: 0,
    keepAliveTimeout: limits.idleTimeoutMs,
    connectionsCheckingInterval: checkingInterval(limits.handshakeTimeoutMs),
  };
}

/**
 * Node checks an HTTP/1.1 server's headers and request timeouts on an
 * interval: a fraction of the shortest one set, so that a limit is
 * enforced close to its value.
 */
function checkingInterval(...timeoutsMs: number[]): number {
  const set = timeoutsMs.filter((ms) => ms > 0);
  return set.length === 0 ? 30_000 : Math.max(10, Math.min(1000, Math.floor(Math.min(...set) / 4)));
}
