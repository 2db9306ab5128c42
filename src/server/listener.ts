import { readFileSync } from "node:fs";
import { createServer as createHttp1Server } from "node:http";
import type { Server as HttpServer, IncomingMessage, ServerResponse } from "node:http";
import * as http2 from "node:http2";
import type { AddressInfo, Socket } from "node:net";
import type { Logger } from "pino";
import type { Registry } from "prom-client";
import { splitCleartextProtocols } from "./cleartext-http1.js";
import type { ProtocolSplit } from "./cleartext-http1.js";
import type { MmgateConfig } from "./config/index.js";
import { ConfigError, splitHostPort } from "./config/index.js";
import { guardConnections, http1ServerTimeouts } from "./connections.js";
import { MAX_TIMER_MS } from "../util/index.js";

export type NodeRequest = http2.Http2ServerRequest | IncomingMessage;
export type NodeResponse = http2.Http2ServerResponse | ServerResponse;
/** What the listener calls for every request, HTTP/2 and HTTP/1.1 alike. */
export type RequestHandler = (req: NodeRequest, res: NodeResponse) => void;

export interface ListenerOptions {
  readonly config: MmgateConfig;
  /** True when `config.tls` names a certificate: HTTP/2 and HTTP/1.1 over TLS, told apart by ALPN. */
  readonly tls: boolean;
  readonly logger: Logger;
  readonly registry: Registry;
  readonly onRequest: RequestHandler;
  /** Fired when draining began: a session opened after it is closed at once. */
  readonly drainingSignal: AbortSignal;
}

function formatAddress(info: AddressInfo): string {
  return info.family === "IPv6" ? `[${info.address}]:${info.port}` : `${info.address}:${info.port}`;
}

/** Reads a PEM file named by a config field; failures name the field. */
function readTlsFile(field: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    throw new ConfigError(`${field}: cannot read ${path}: ${(err as Error).message}`);
  }
}

/** Binds `server` to `address` (`HOST:PORT`); resolves with the address bound. */
export function bindServer(server: http2.Http2Server | http2.Http2SecureServer | HttpServer, address: string): Promise<string> {
  const { host, port } = splitHostPort(address);
  return new Promise((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException) => {
      err.message = `cannot listen on ${address}: ${err.code ?? err.message}`;
      reject(err);
    };
    server.once("error", onError);
    server.listen(port, host, () => {
      server.off("error", onError);
      resolve(formatAddress(server.address() as AddressInfo));
    });
  });
}

/** Stops a server taking connections; resolves once the last one it holds closed. */
export function closeServer(server: { close(cb: (err?: Error) => void): unknown }): Promise<void> {
  return new Promise((resolve) => server.close(() => resolve()));
}

/**
 * The gRPC port: one HTTP/2 server (over TLS when configured) that owns
 * the port, plus, in cleartext, an HTTP/1.1 server that never listens
 * itself and is handed the connections that do not open with the HTTP/2
 * preface. It knows every socket and session, so that a drain can send
 * GOAWAY to each and the grace's end can cut what is left, and it puts
 * the connection guards (handshake, idle, keepalive, PING, the cap) on
 * them.
 */
export class Listener {
  /** The HTTP/2 server: the port's owner, and the one the lean path takes streams from. */
  readonly server: http2.Http2Server | http2.Http2SecureServer;
  /** Cleartext HTTP/1.1 on the same port; over TLS the HTTP/2 server's own allowHTTP1 serves it. */
  private readonly http1: HttpServer | undefined;
  // Raw sockets too: a connection that never sends the HTTP/2 preface (or
  // never finishes its TLS handshake) has no session, and would otherwise
  // keep the listener from closing after the grace.
  private readonly sockets = new Set<Socket>();
  private readonly sessions = new Set<http2.ServerHttp2Session>();
  private readonly protocolSplit: ProtocolSplit | undefined;

  constructor(options: ListenerOptions) {
    const { config, onRequest } = options;
    this.server = this.createHttp2Server(options);
    // Cleartext HTTP/1.1 (curl, browsers' fetch, Connect and gRPC-Web
    // clients, the OpenAI SDKs) on the same port: connections that do not
    // open with the HTTP/2 preface go to this server. Over TLS, ALPN decides
    // and the HTTP/2 server's own allowHTTP1 serves them.
    this.http1 = options.tls ? undefined : createHttp1Server(http1ServerTimeouts(config.connections), onRequest);
    this.trackConnections(config.limits.connectionWindowBytes, options.drainingSignal);
    // Handshake, idle, keepalive and PING limits, and the connection cap.
    const countClosed = guardConnections(this.server, config.connections, options.registry);
    this.protocolSplit = this.http1
      ? splitCleartextProtocols(this.server as http2.Http2Server, this.http1, {
          decideWithinMs: config.connections.handshakeTimeoutMs,
          onTimeout: () => countClosed("handshake_timeout"),
        })
      : undefined;
    if (this.http1 && !this.protocolSplit) options.logger.warn("this Node.js does not let HTTP/1.1 share the cleartext port: it serves HTTP/2 (h2c) only");
    if (this.http1) {
      // The HTTP/1.1 server never listens itself (connections are handed to
      // it), but its header timeout and idle-connection tracking start on
      // "listening".
      this.http1.emit("listening");
    }
  }

  /** Binds the port; resolves with the address bound, `HOST:PORT`. */
  listen(address: string): Promise<string> {
    return bindServer(this.server, address);
  }

  get openSessions(): number {
    return this.sessions.size;
  }

  get openSockets(): number {
    return this.sockets.size;
  }

  /** Closes the HTTP/1.1 connections that wait for their next request (while draining, after each response). */
  closeIdleHttp1Connections(): void {
    this.http1?.closeIdleConnections();
  }

  /**
   * Stops taking connections and asks the open ones to finish: GOAWAY to
   * every HTTP/2 session (open streams may finish), idle HTTP/1.1
   * connections closed. Resolves once the last connection closed.
   */
  drain(): Promise<void> {
    const closed = closeServer(this.server);
    // Idle HTTP/1.1 connections, and connections that have not sent a
    // byte, would hold the listener open until their timeouts.
    this.closeIdleHttp1Connections();
    this.protocolSplit?.destroyUndecided();
    // GOAWAY: clients open no new streams here; open ones may finish.
    for (const session of this.sessions) session.close();
    return closed;
  }

  /** Every connection, HTTP/2 or not yet: what keeps the listener from closing. */
  destroyConnections(): void {
    for (const session of this.sessions) session.destroy();
    for (const socket of this.sockets) socket.destroy();
  }

  /** Stops the HTTP/1.1 server's timeout checks (it never listened itself). */
  async closeHttp1(): Promise<void> {
    if (this.http1) await closeServer(this.http1);
  }

  /**
   * Closes everything at once, for a start-up that failed part way:
   * connections clients opened meanwhile (they got 503s) would otherwise
   * keep the listener from closing.
   */
  async abandon(): Promise<void> {
    this.destroyConnections();
    await closeServer(this.server);
    await this.closeHttp1();
  }

  private createHttp2Server(options: ListenerOptions): http2.Http2Server | http2.Http2SecureServer {
    const { config, onRequest } = options;
    const settings: http2.Settings = {
      initialWindowSize: config.limits.streamWindowBytes,
      maxConcurrentStreams: config.limits.maxConcurrentStreams,
    };
    if (!options.tls) return http2.createServer({ settings, maxSessionMemory: 64 }, onRequest);
    return http2.createSecureServer(
      {
        cert: readTlsFile("tls.certFile", config.tls.certFile),
        key: readTlsFile("tls.keyFile", config.tls.keyFile),
        allowHTTP1: true,
        settings,
        maxSessionMemory: 64,
        // 0 turns connections.handshakeTimeoutMs off; Node's TLS default is 120 s.
        handshakeTimeout: config.connections.handshakeTimeoutMs || MAX_TIMER_MS,
      },
      onRequest,
    );
  }

  private trackConnections(connectionWindowBytes: number, drainingSignal: AbortSignal): void {
    this.server.on("connection", (socket: Socket) => {
      this.sockets.add(socket);
      socket.once("close", () => this.sockets.delete(socket));
    });
    this.server.on("session", (session) => {
      this.sessions.add(session);
      session.once("close", () => this.sessions.delete(session));
      // A wider connection window keeps large streamed frames flowing.
      session.once("localSettings", () => {
        try {
          session.setLocalWindowSize(connectionWindowBytes);
        } catch {
          /* the session closed already */
        }
      });
      if (drainingSignal.aborted) session.close();
    });
  }
}
