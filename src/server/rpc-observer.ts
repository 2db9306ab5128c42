import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from "node:http";
import type { Http2ServerRequest, Http2ServerResponse, ServerHttp2Stream } from "node:http2";
import type { Socket } from "node:net";
import { randomUUID } from "node:crypto";
import type { DescMethod } from "@bufbuild/protobuf";
import { Code, createContextKey } from "@connectrpc/connect";
import type { ContextValues } from "@connectrpc/connect";
import { codeFromHttpStatus, codeToString } from "@connectrpc/connect/protocol-connect";
import type { Logger } from "pino";
import type { MethodMetrics, RpcMetrics, RpcType } from "./metrics.js";
import { isConnectionHeader } from "../wire/index.js";
import { StatusSniffer, bodyStatusFormat } from "./status-sniffer.js";

/** What the host learns about one RPC while it runs. */
export interface RpcRecord {
  readonly requestId: string;
  readonly service: string;
  readonly method: string;
  readonly type: RpcType;
  /** Set by the interceptor when the handler (or the host) decides the status. */
  code?: Code;
  /** The error message that went with `code` (a failed call's, for its log line). */
  error?: string;
  /** The method's series, for the message counters the interceptor feeds. */
  readonly series: MethodMetrics;
  /**
   * Where the call arrived: its HTTP/2 stream, or the socket of an HTTP/1.1
   * request. Handlers read it through call-transport.ts (stream limits per
   * connection and per peer, paced writes).
   */
  readonly transport?: ServerHttp2Stream | Socket;
  /** The authenticated caller's name (never a key), set by the auth interceptor; absent for anonymous calls. */
  caller?: string;
  /** The call's server span, while tracing is on: its RPC log line names it. */
  traceId?: string;
  spanId?: string;
}

/** Records `error`'s status as the call's, unless one is recorded already. */
export function recordStatus(record: RpcRecord | undefined, error: { code: Code; rawMessage: string }): void {
  if (record === undefined || record.code !== undefined) return;
  record.code = error.code;
  record.error = error.rawMessage;
}

/** The request's protocol, as its content type names it. */
export type RpcProtocol = "grpc" | "grpc-web" | "connect";

export function protocolOf(contentType: string | undefined): RpcProtocol {
  if (contentType === undefined || !contentType.startsWith("application/grpc")) return "connect";
  return contentType.startsWith("application/grpc-web") ? "grpc-web" : "grpc";
}

/** "address:port" of the client ("[address]:port" for IPv6); undefined when the socket is gone. */
export function peerOf(socket: { remoteAddress?: string | undefined; remotePort?: number | undefined } | undefined | null): string | undefined {
  const address = socket?.remoteAddress;
  if (address === undefined) return undefined;
  return address.includes(":") ? `[${address}]:${socket?.remotePort ?? 0}` : `${address}:${socket?.remotePort ?? 0}`;
}

export const rpcRecordKey = createContextKey<RpcRecord | undefined>(undefined, { description: "mmgate rpc record" });

/**
 * The request id the host logged for this call (the client's x-request-id,
 * or the one it generated), for handlers that put it in responses.
 */
export function requestIdOf(ctx: { values: ContextValues; requestHeader: Headers }): string {
  return ctx.values.get(rpcRecordKey)?.requestId ?? requestIdFrom({ "x-request-id": ctx.requestHeader.get("x-request-id") ?? undefined });
}

const REQUEST_ID = /^[A-Za-z0-9._:@/+=-]{1,128}$/;

/** A client's x-request-id when it is sane, else a fresh one. */
function requestIdFrom(headers: IncomingHttpHeaders): string {
  const given = headers["x-request-id"];
  return typeof given === "string" && REQUEST_ID.test(given) ? given : randomUUID();
}

/** `headers` without the names HTTP/2 forbids; the same object when it has none. */
function withoutConnectionHeaders(headers: Record<string, unknown>): Record<string, unknown> {
  let out: Record<string, unknown> | undefined;
  for (const name of Object.keys(headers)) {
    if (isConnectionHeader(name.toLowerCase(), String(headers[name]))) {
      out ??= { ...headers };
      delete out[name];
    }
  }
  return out ?? headers;
}

/** "RESOURCE_EXHAUSTED" style names, as grpc-status documentation spells them. */
export function codeName(code: Code | 0): string {
  // connect spells it "canceled"; gRPC's status names spell it CANCELLED.
  return code === 0 ? "OK" : code === Code.Canceled ? "CANCELLED" : codeToString(code).toUpperCase();
}

function rpcType(method: DescMethod): RpcType {
  switch (method.methodKind) {
    case "unary":
      return "unary";
    case "server_streaming":
      return "server_stream";
    case "client_streaming":
      return "client_stream";
    case "bidi_streaming":
      return "bidi_stream";
  }
}

/** A grpc-message trailer's text (percent-encoded on the wire). */
function decodeGrpcMessage(value: string): string {
  try {
    return decodeURIComponent(value);
  } catch {
    return value;
  }
}

type NodeReq = Http2ServerRequest | IncomingMessage;

/** One call between `RpcObserver.open` and `close`. */
export interface ObservedCall {
  readonly record: RpcRecord;
  readonly path: string;
  readonly series: MethodMetrics;
  readonly started: number;
  readonly protocol: RpcProtocol;
  /** The client's address and port, when known. */
  readonly peer: string | undefined;
}
type NodeRes = Http2ServerResponse | ServerResponse;

/**
 * Observes every request at the HTTP level, so that requests which never
 * reach a handler (unknown methods, oversized or malformed messages) are
 * logged and counted too. The status is what went on the wire: the gRPC
 * trailers, or the status the gRPC-Web and Connect protocols put in the
 * body; else the one the host or interceptor recorded; else CANCELLED for a
 * response cut short.
 */
export class RpcObserver {
  private readonly methods = new Map<string, { service: string; method: string; type: RpcType }>();
  private readonly records = new WeakMap<object, RpcRecord>();

  constructor(
    private readonly logger: Logger,
    private readonly metrics: RpcMetrics,
    /**
     * The `caller` label of a call's handled series, from the name its
     * record holds: a bounded set of values (see AccessControl.callerLabel).
     */
    private readonly callerLabel: (name: string | undefined) => string = (name) => (name === undefined ? "anonymous" : "other"),
  ) {}

  register(methods: Iterable<DescMethod>): void {
    for (const m of methods) {
      this.methods.set(`/${m.parent.typeName}/${m.name}`, { service: m.parent.typeName, method: m.name, type: rpcType(m) });
    }
  }

  /**
   * Opens the record of one call to `path`: its request id (the client's
   * x-request-id when sane) and its method's series, started. `close`
   * finishes it. Both paths of the host (connect's and the lean one) use
   * this pair, so their logs and metrics cannot differ.
   */
  open(path: string, headers: IncomingHttpHeaders, peer: string | undefined, transport?: ServerHttp2Stream | Socket): ObservedCall {
    const known = this.methods.get(path);
    const service = known?.service ?? "unknown";
    const method = known?.method ?? "unknown";
    const type = known?.type ?? "unknown";
    const series = this.metrics.forMethod(service, method, type);
    const record: RpcRecord = { requestId: requestIdFrom(headers), service, method, type, series, transport };
    series.started();
    return { record, path, series, started: performance.now(), protocol: protocolOf(headers["content-type"]), peer };
  }

  /** Counts and logs a call opened with `open`, ended with `code`. */
  close(call: ObservedCall, code: Code | 0): void {
    const { record } = call;
    const seconds = (performance.now() - call.started) / 1000;
    const name = codeName(code);
    call.series.handled(name, seconds, this.callerLabel(record.caller));
    this.logger.info(
      {
        service: record.service,
        method: record.service === "unknown" ? call.path.slice(0, 200) : record.method,
        code: name,
        durationMs: Math.round(seconds * 1e6) / 1e3,
        requestId: record.requestId,
        protocol: call.protocol,
        peer: call.peer,
        caller: record.caller,
        // The message of a failed call, when the host learned it.
        error: code === 0 ? undefined : record.error,
        trace_id: record.traceId,
        span_id: record.spanId,
      },
      "rpc finished",
    );
  }

  /** Starts observing a request of connect's path; returns the record its handler will see. */
  begin(req: NodeReq, res: NodeRes): RpcRecord {
    const path = (req.url ?? "").split("?", 1)[0] ?? "";
    const call = this.open(path, req.headers, peerOf(req.socket), "stream" in req ? req.stream : req.socket);
    const record = call.record;
    this.records.set(req, record);
    res.setHeader("x-request-id", record.requestId);

    let trailerStatus: string | undefined;
    // connect-node reports the gRPC status in the trailers it adds.
    const addTrailers = res.addTrailers.bind(res) as (headers: Record<string, unknown>) => void;
    (res as { addTrailers: (headers: Record<string, unknown>) => void }).addTrailers = (headers) => {
      const status = headers["grpc-status"];
      if (typeof status === "string") trailerStatus = status;
      const message = headers["grpc-message"];
      if (typeof message === "string" && status !== "0") record.error ??= decodeGrpcMessage(message);
      addTrailers(withoutConnectionHeaders(headers));
    };
    // A handler's connection-specific header would make Node refuse the
    // response (or throw out of the trailer callback): dropped, as the lean path does.
    const writeHead = res.writeHead.bind(res) as (...args: unknown[]) => unknown;
    (res as { writeHead: (...args: unknown[]) => unknown }).writeHead = (...args) => {
      const last = args.length - 1;
      if (last > 0 && typeof args[last] === "object" && args[last] !== null && !Array.isArray(args[last])) {
        args[last] = withoutConnectionHeaders(args[last] as Record<string, unknown>);
      }
      return writeHead(...args);
    };
    // gRPC-Web and Connect put it in the body.
    const sniffer = new StatusSniffer(bodyStatusFormat(req.headers["content-type"]));
    if (sniffer.watchesBody) {
      const write = res.write.bind(res) as (...args: unknown[]) => boolean;
      const end = res.end.bind(res) as (...args: unknown[]) => unknown;
      const see = (chunk: unknown) => {
        if (chunk instanceof Uint8Array) sniffer.write(chunk);
      };
      (res as { write: (...args: unknown[]) => boolean }).write = (...args) => {
        see(args[0]);
        return write(...args);
      };
      (res as { end: (...args: unknown[]) => unknown }).end = (...args) => {
        if (typeof args[0] !== "function") see(args[0]);
        return end(...args);
      };
    }

    let done = false;
    const finish = (closed: boolean) => {
      if (done) return;
      done = true;
      // On a reset the compatibility layer may report "finish" before
      // "close", with no trailers sent: that is a response cut short too.
      const closedEarly = closed || (trailerStatus === undefined && "stream" in res && (res.stream.rstCode ?? 0) !== 0);
      let code: Code | 0 | undefined;
      if (closedEarly) {
        // The response never completed (the client reset it, the grace cut
        // it): whatever status connect meant to send, the client saw none.
        code = record.code ?? Code.Canceled;
      } else {
        const headerStatus = res.getHeader("grpc-status");
        if (trailerStatus !== undefined) code = Number(trailerStatus) as Code | 0;
        else if (typeof headerStatus === "string") code = Number(headerStatus) as Code | 0;
        else code = sniffer.status(res.statusCode);
        code ??= record.code ?? (res.statusCode === 200 ? 0 : codeFromHttpStatus(res.statusCode));
        // A status the host answered without the interceptor (an unknown
        // method, a malformed request): its message is in the body.
        if (code !== 0 && record.error === undefined && sniffer.watchesBody) record.error = sniffer.message();
      }
      this.close(call, code);
    };
    res.once("finish", () => finish(false));
    res.once("close", () => finish(!res.writableFinished));
    return record;
  }

  recordFor(req: NodeReq): RpcRecord | undefined {
    return this.records.get(req);
  }
}
