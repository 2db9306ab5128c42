import { readFileSync } from "node:fs";
import type { SecureClientSessionOptions } from "node:http2";
import { isIP } from "node:net";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import type { Registry } from "prom-client";
import { hostPort, splitHostPort } from "../server/index.js";
import { ChannelTls } from "./channel-tls.js";
import { ChannelConfigError, type ChannelOptions } from "./config.js";
import { createLeanGrpcTransport, type DirectCallHooks } from "./lean-transport.js";
import { GuardedSessionManager } from "./session.js";
import { callRecorder, clientMetrics, metricsInterceptor } from "./metrics.js";
import { applyCallContext, outboundInterceptors, stripProtocolHeaders, withDeadlines } from "./outbound.js";
import { tracingEnabled } from "../telemetry/index.js";

/** What a channel needs besides its settings. */
export interface ChannelDeps {
  /** Where `grpc_client_handled_total` and `grpc_client_handling_seconds` go; no metrics without it. */
  readonly registry?: Registry;
  /** Further client interceptors, run inside the channel's own (closest to the wire). */
  readonly interceptors?: readonly Interceptor[];
  /** The clock of CallContext.deadline; `performance.now()` by default. */
  readonly now?: () => number;
  /** Where a reload of the channel's TLS files (certFile, keyFile, caFile) is logged; not logged without it. */
  readonly logger?: Pick<Logger, "info" | "warn">;
}

/**
 * A connect Transport to one `HOST:PORT` over one HTTP/2 connection (opened
 * on the first call, reopened after a failure), which can be closed.
 */
export interface Channel extends Transport {
  readonly target: string;
  /** Calls started and not yet ended. */
  readonly inFlight: number;
  readonly closed: boolean;
  /**
   * Refuses new calls (UNAVAILABLE), waits for the calls in flight to end,
   * then closes the connection. A stream that is neither read to its end
   * nor cancelled through its signal keeps this waiting.
   */
  close(): Promise<void>;
  /** Refuses new calls and closes the connection now, ending every open call with `reason` (CANCELED by default). */
  abort(reason?: Error): void;
}

/**
 * The one token a file holds (a mounted Secret), surrounding white space
 * dropped. Throws an Error saying what is wrong (unreadable, empty, more
 * than one word), for the caller to name its setting.
 */
export function readTokenFile(path: string): string {
  let text: string;
  try {
    text = readFileSync(path, "utf8").trim();
  } catch (err) {
    throw new Error(`cannot read ${path}: ${(err as Error).message}`, { cause: err });
  }
  if (text === "" || /\s/.test(text)) throw new Error(`${path} must hold one token (non-empty, no white space inside)`);
  return text;
}

/** The channel's own credential (token or tokenFile), or undefined; an unreadable or empty file is a ChannelConfigError. */
function channelToken(options: ChannelOptions): string | undefined {
  if (options.token !== "") return options.token;
  if (options.tokenFile === "") return undefined;
  try {
    return readTokenFile(options.tokenFile);
  } catch (err) {
    throw new ChannelConfigError("tokenFile", (err as Error).message);
  }
}

/** Sends the channel's credential (`authorization`'s value) on every call, replacing one the caller passed on. */
function bearerInterceptor(value: string): Interceptor {
  return (next) => (req) => {
    req.header.set("authorization", value);
    return next(req);
  };
}

/**
 * A gRPC channel to `target` (`HOST:PORT` or `[IPv6]:PORT`): cleartext
 * HTTP/2 (h2c, prior knowledge), or TLS with `options.tls`. Every call gets
 * deadline propagation and `x-request-id` from the CallContext in its
 * `contextValues` (see withCallContext), and client metrics when
 * `deps.registry` is given, and the channel's own credential when `token`
 * or `tokenFile` is set; with `certFile` and `keyFile` it presents that
 * certificate to peers that ask for one (mutual TLS). Throws
 * ChannelConfigError when the CA, certificate, key or token file cannot be
 * used, and a RangeError for a target that is not HOST:PORT.
 */
export function createChannel(target: string, options: ChannelOptions, deps: ChannelDeps = {}): Channel {
  const valid = hostPort.safeParse(target);
  if (!valid.success) throw new RangeError(`channel target "${target}": ${valid.error.issues[0]?.message ?? "expected HOST:PORT"}`);
  const { host } = splitHostPort(target);
  const nodeOptions: SecureClientSessionOptions = {};
  if (options.tls) {
    if (options.caFile !== "" || options.certFile !== "") {
      const credentials = new ChannelTls(options, target, deps);
      // connect-node hands these options to http2.connect for each connection
      // it opens, which copies them, reading this getter: a new connection
      // gets the credentials of the moment (re-read when their files
      // changed), an open one keeps those it has.
      Object.defineProperty(nodeOptions, "secureContext", { enumerable: true, get: () => credentials.secureContext() });
    }
    // No SNI for an IP address (TLS forbids it); the certificate is still checked against the address.
    if (options.serverName !== "") nodeOptions.servername = options.serverName;
    else if (isIP(host) !== 0) nodeOptions.servername = "";
  }
  const baseUrl = `${options.tls ? "https" : "http"}://${target}`;
  // Guarded: a peer's GOAWAY on an idle session must not become an uncaught exception (session.ts).
  const session = new GuardedSessionManager(
    baseUrl,
    {
      ...(options.keepaliveIntervalMs > 0 ? { pingIntervalMs: options.keepaliveIntervalMs, pingTimeoutMs: options.keepaliveTimeoutMs } : {}),
      idleConnectionTimeoutMs: options.idleConnectionTimeoutMs,
    },
    nodeOptions,
  );

  let inFlight = 0;
  let closed = false;
  let closing: Promise<void> | undefined;
  let drained: (() => void) | undefined;
  // Innermost: sees every call that reaches the wire; connect aborts the call's signal when the call ends, whichever way.
  const track: Interceptor = (next) => (req) => {
    // A call that starts already aborted (its inbound deadline passed, its
    // caller gave up) never fires "abort" again: it is not in flight.
    if (req.signal.aborted) return next(req);
    inFlight++;
    req.signal.addEventListener(
      "abort",
      () => {
        inFlight--;
        if (inFlight === 0) drained?.();
      },
      { once: true },
    );
    return next(req);
  };
  const metrics = deps.registry ? clientMetrics(deps.registry) : undefined;
  const extra = metrics ? [metricsInterceptor(metrics)] : [];
  const token = channelToken(options);
  const authorization = token === undefined ? undefined : `Bearer ${token}`;
  const credentials = authorization === undefined ? [] : [bearerInterceptor(authorization)];
  const interceptors = outboundInterceptors(extra, [...credentials, ...(deps.interceptors ?? []), track]);
  // With only the channel's own interceptors (no caller's, tracing off), the
  // lean transport does their work in place: the same headers, status,
  // metrics and in-flight count, without a chain of wrappers per call.
  const direct: DirectCallHooks | undefined =
    (deps.interceptors ?? []).length === 0 && !tracingEnabled()
      ? {
          decorate(header, values) {
            applyCallContext(values, header);
            if (authorization !== undefined) header.authorization = authorization;
          },
          begin(method, startsAborted) {
            const record = metrics ? callRecorder(metrics, method) : undefined;
            if (startsAborted) return (code) => record?.(code);
            inFlight++;
            return (code) => {
              record?.(code);
              inFlight--;
              if (inFlight === 0) drained?.();
            };
          },
          error: (error) => stripProtocolHeaders(error) as ConnectError,
        }
      : undefined;
  const connectTransport = createGrpcTransport({
    baseUrl,
    sessionManager: session,
    readMaxBytes: options.maxReceiveMessageBytes,
    writeMaxBytes: options.maxSendMessageBytes,
    interceptors,
  });
  const transport = withDeadlines(
    options.leanPath
      ? createLeanGrpcTransport({
          baseUrl,
          session,
          interceptors,
          readMaxBytes: options.maxReceiveMessageBytes,
          writeMaxBytes: options.maxSendMessageBytes,
          fallback: connectTransport,
          direct,
        })
      : connectTransport,
    { defaultTimeoutMs: options.defaultTimeoutMs, ...(deps.now ? { now: deps.now } : {}) },
  );
  const refused = () => new ConnectError(`channel to ${target} is closed`, Code.Unavailable);

  return {
    target,
    get inFlight() {
      return inFlight;
    },
    get closed() {
      return closed;
    },
    unary(...args) {
      return closed ? Promise.reject(refused()) : transport.unary(...args);
    },
    stream(...args) {
      return closed ? Promise.reject(refused()) : transport.stream(...args);
    },
    close() {
      closed = true;
      closing ??= (async () => {
        if (inFlight > 0) await new Promise<void>((resolve) => (drained = resolve));
        session.abort(refused());
      })();
      return closing;
    },
    abort(reason) {
      closed = true;
      session.abort(reason ?? new ConnectError(`channel to ${target} was aborted`, Code.Canceled));
    },
  };
}
