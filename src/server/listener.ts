import { createServer as createHttp1Server } from "node:http";
import type { Server as HttpServer, IncomingMessage, ServerResponse } from "node:http";
import * as http2 from "node:http2";
import type { AddressInfo, Socket } from "node:net";
import type { Logger } from "pino";
import type { Registry } from "prom-client";
import { clientAuthOptions, enforceClientAuth } from "./client-auth.js";
import { splitCleartextProtocols } from "./cleartext-http1.js";
import type { ProtocolSplit } from "./cleartext-http1.js";
import type { MmgateConfig } from "./config/index.js";
import { ConfigError, splitHostPort } from "./config/index.js";
import { guardConnections, http1ServerTimeouts } from "./connections.js";
import { peerOf } from "./rpc-observer.js";
import { TlsReloader } from "./tls-reload.js";
import { expiresAt, filesStamp, loadTlsFiles, MAX_TIMER_MS, TlsFileError, tlsMetrics } from "../util/index.js";
import type { TlsFields, TlsFiles, TlsMaterial } from "../util/index.js";

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

const TLS_FIELDS: TlsFields = { certFile: "tls.certFile", keyFile: "tls.keyFile", caFile: "tls.clientCaFile" };

function tlsFilesOf(config: MmgateConfig): TlsFiles {
  return { certFile: config.tls.certFile, keyFile: config.tls.keyFile, caFile: config.tls.clientCaFile };
}

/** Reads and checks the listener's TLS files; a file that cannot be used is a config error naming its field. */
function loadServerTls(files: TlsFiles): TlsMaterial {
  try {
    return loadTlsFiles(files, TLS_FIELDS);
  } catch (err) {
    if (err instanceof TlsFileError) throw new ConfigError(err.message);
    throw err;
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
    // The files' stamp before they are read: a change while they are read is seen by the reloader.
    const tlsStamp = options.tls ? filesStamp(tlsFilesOf(config)) : "";
    const tlsMaterial = options.tls ? loadServerTls(tlsFilesOf(config)) : undefined;
    this.server = this.createHttp2Server(options, tlsMaterial);
    // Cleartext HTTP/1.1 (curl, browsers' fetch, Connect and gRPC-Web
    // clients, the OpenAI SDKs) on the same port: connections that do not
    // open with the HTTP/2 preface go to this server. Over TLS, ALPN decides
    // and the HTTP/2 server's own allowHTTP1 serves them.
    this.http1 = options.tls ? undefined : createHttp1Server(http1ServerTimeouts(config.connections), onRequest);
    this.trackConnections(config.limits.connectionWindowBytes, options.drainingSignal);
    // Handshake, idle, keepalive and PING limits, and the connection cap.
    const countClosed = guardConnections(this.server, config.connections, options.registry);
    // Registered on every listener, so that dashboards and alerts find the names; series once TLS is on.
    const metrics = tlsMetrics(options.registry, options.tls ? "server" : undefined);
    if (tlsMaterial !== undefined) {
      const server = this.server as http2.Http2SecureServer;
      enforceClientAuth(server, config.tls.clientAuth, (socket, reason) => {
        countClosed("client_certificate");
        options.logger.info({ peer: peerOf(socket), reason, clientAuth: config.tls.clientAuth }, "TLS connection refused: its client certificate did not verify");
      });
      this.watchTlsFiles(server, options, tlsMaterial, tlsStamp, metrics);
    }
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

  private createHttp2Server(options: ListenerOptions, tls: TlsMaterial | undefined): http2.Http2Server | http2.Http2SecureServer {
    const { config, onRequest } = options;
    const settings: http2.Settings = {
      initialWindowSize: config.limits.streamWindowBytes,
      maxConcurrentStreams: config.limits.maxConcurrentStreams,
    };
    if (tls === undefined) return http2.createServer({ settings, maxSessionMemory: 64 }, onRequest);
    if (tls.leaf !== undefined && expiresAt(tls.leaf) <= Date.now()) {
      options.logger.warn({ certFile: config.tls.certFile, validTo: tls.leaf.validTo }, "the TLS certificate has expired: clients that check it refuse to connect");
    }
    return http2.createSecureServer(
      {
        cert: tls.cert,
        key: tls.key,
        // The CA of client certificates: verified during the handshake, refused or let in by enforceClientAuth.
        ...(tls.ca !== undefined ? { ca: tls.ca } : {}),
        ...clientAuthOptions(config.tls.clientAuth),
        allowHTTP1: true,
        settings,
        maxSessionMemory: 64,
        // 0 turns connections.handshakeTimeoutMs off; Node's TLS default is 120 s.
        handshakeTimeout: config.connections.handshakeTimeoutMs || MAX_TIMER_MS,
      },
      onRequest,
    );
  }

  /**
   * Rotation: changed certificate, key or client CA files go into use for
   * new connections (tls-reload.ts), from the moment the port is bound
   * until the server closes.
   */
  private watchTlsFiles(server: http2.Http2SecureServer, options: ListenerOptions, material: TlsMaterial, stamp: string, metrics: ReturnType<typeof tlsMetrics>): void {
    const reloader = new TlsReloader(
      {
        files: tlsFilesOf(options.config),
        fields: TLS_FIELDS,
        intervalMs: options.config.tls.reloadIntervalMs,
        // setSecureContext keeps the server's other settings (ALPN, requestCert); only the context is new.
        apply: (m) => server.setSecureContext({ cert: m.cert, key: m.key, ...(m.ca !== undefined ? { ca: m.ca } : {}) }),
        logger: options.logger,
        metrics,
      },
      material,
      stamp,
    );
    server.once("listening", () => reloader.start());
    server.once("close", () => reloader.stop());
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
