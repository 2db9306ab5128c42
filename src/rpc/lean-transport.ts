import type { ClientHttp2Stream, IncomingHttpHeaders, OutgoingHttpHeaders } from "node:http2";
import { constants as h2 } from "node:http2";
import type { DescMessage, DescMethod, DescMethodStreaming, DescMethodUnary } from "@bufbuild/protobuf";
import { create, isMessage } from "@bufbuild/protobuf";
import type { ContextValues, Interceptor, StreamRequest, StreamResponse, Transport, UnaryRequest, UnaryResponse } from "@connectrpc/connect";
import { Code, ConnectError, createContextValues } from "@connectrpc/connect";
import type { Http2SessionManager } from "@connectrpc/connect-node";
import { compressionBrotli, compressionGzip } from "@connectrpc/connect-node";
import type { Compression } from "@connectrpc/connect/protocol";
import { requestHeader, validateResponse, validateTrailer } from "@connectrpc/connect/protocol-grpc";
import { observeStream } from "../util/index.js";
import { OneMessage } from "./one-message.js";
import type { EnvelopeSink } from "../wire/index.js";
import {
  byteLengthOf,
  compressedEnvelopeError,
  EncodedFrames,
  EncodedMessage,
  encodedResponsesKey,
  encodeEnvelope,
  ENVELOPE_HEADER_BYTES,
  EnvelopeReader,
  FLAG_COMPRESSED,
  framedResponsesKey,
  h2ResetError,
  incompleteEnvelopeError,
  parseMessage,
  serializeMessage,
  webHeadersOf,
  writeEnvelope,
  writeLimitError,
} from "../wire/index.js";

/**
 * A gRPC client transport for unary and server-streaming calls that talks
 * to the HTTP/2 stream itself: one frame out, frames in, parsed as the
 * caller reads them. It runs the interceptors (their chains made once, not
 * per call), deadline and signal handling as connect's gRPC transport does
 * (`runUnaryCall`, `runStreamingCall`: the call's signal aborts when the
 * call ends, whichever way), sends the same request headers and reports the
 * same errors, but without connect's per-call async-iterable pipeline and
 * with one abort controller per call, which is most of a small call's
 * client-side cost. Client and bidi streams go to
 * `fallback` (connect's transport on the same session).
 *
 * It never asks for compressed responses (tensors and frames barely
 * compress, and compressing costs the server); a server that compresses
 * anyway with gzip or br is still understood.
 */
export interface LeanTransportOptions {
  readonly baseUrl: string;
  readonly session: Http2SessionManager;
  readonly interceptors: readonly Interceptor[];
  readonly readMaxBytes: number;
  readonly writeMaxBytes: number;
  /** Applied when a call gives no timeout, as connect's defaultTimeoutMs. */
  readonly defaultTimeoutMs?: number | undefined;
  /** Serves what this transport does not: client and bidi streams. */
  readonly fallback: Transport;
  /**
   * The channel's own per-call work, done in place of `interceptors` on
   * unary and server-streaming calls (the fallback still runs the
   * interceptors): given when every interceptor is one of the channel's own,
   * which then cost a few property writes instead of a chain of wrappers,
   * an abort controller and a Headers object per call.
   */
  readonly direct?: DirectCallHooks | undefined;
}

/** What a channel does for each call on the direct path (see LeanTransportOptions.direct). */
export interface DirectCallHooks {
  /** Adds the channel's headers (request id, passed-on metadata, credentials) to a request's, in node form. */
  decorate(header: OutgoingHttpHeaders, contextValues: ContextValues | undefined): void;
  /** A call starts; the returned function is called once with its status when it ends (0 for OK). */
  begin(method: DescMethod, startsAborted: boolean): (code: Code | 0) => void;
  /** A failed call's error as its caller gets it. */
  error(error: ConnectError): ConnectError;
}

type HeaderInit = ConstructorParameters<typeof Headers>[0];

type UnaryFn = (req: UnaryRequest) => Promise<UnaryResponse>;
type StreamFn = (req: StreamRequest) => Promise<StreamResponse>;

/** Wraps `next` in the interceptors, the first outermost (as connect applies them). */
function intercepted<F>(next: F, interceptors: readonly Interceptor[]): F {
  let fn = next;
  for (let i = interceptors.length - 1; i >= 0; i--) fn = interceptors[i]!(fn as never) as F;
  return fn;
}

/** What a call whose deadline passed fails with, on either path (as connect's deadline signal says it). */
function deadlineError(): ConnectError {
  return new ConnectError("the operation timed out", Code.DeadlineExceeded);
}

/** The reason a call's signal carries once the call ended well: one shared object, not an AbortError made per call. */
const CALL_ENDED: unknown = Object.freeze(new ConnectError("the call ended", Code.Canceled));

/**
 * A call's signal, as connect's transports give one to interceptors and the
 * wire: it aborts when the caller's signal does (with its reason, as a
 * ConnectError), when the deadline passes (DEADLINE_EXCEEDED), and when the
 * call ends, whichever way (so interceptors learn the end from it). One
 * controller, one listener and one timer per call, removed at the end.
 */
class CallSignal {
  private readonly controller = new AbortController();
  private timer: NodeJS.Timeout | undefined;
  private readonly onCallerAbort = (): void => this.abort(ConnectError.from(this.caller!.reason, Code.Canceled));

  constructor(
    private readonly caller: AbortSignal | undefined,
    timeoutMs: number | undefined,
  ) {
    if (caller?.aborted === true) this.onCallerAbort();
    else caller?.addEventListener("abort", this.onCallerAbort, { once: true });
    if (timeoutMs !== undefined && !this.controller.signal.aborted) {
      this.timer = setTimeout(() => this.abort(deadlineError()), timeoutMs);
    }
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  private release(): void {
    clearTimeout(this.timer);
    this.caller?.removeEventListener("abort", this.onCallerAbort);
  }

  private abort(reason: unknown): void {
    this.release();
    if (!this.controller.signal.aborted) this.controller.abort(reason);
  }

  /** The call ended well. */
  done(): void {
    this.abort(CALL_ENDED);
  }

  /** The call failed with `error`: the signal's reason wins when it fired first (as connect reports it). Returns the error to throw. */
  fail(error: unknown): ConnectError {
    const signal = this.controller.signal;
    const failure = signal.aborted && signal.reason !== CALL_ENDED ? ConnectError.from(signal.reason, Code.Canceled) : ConnectError.from(error);
    this.abort(failure);
    return failure;
  }

  /** `messages`, ending the call when they end or fail. */
  track(messages: AsyncIterable<unknown>): AsyncIterable<unknown> {
    return observeStream(messages, {
      end: () => this.done(),
      error: (error) => this.fail(error),
      // The reader stopped early: the call is cancelled.
      cancel: () => void this.fail(new ConnectError("the call was cancelled", Code.Canceled)),
    });
  }
}

/** Who calls, as connect's requestHeader says it (its own name and version), read from it once. */
const USER_AGENT = requestHeader(true, undefined, undefined).get("user-agent") ?? "connect-es";

/**
 * A direct call's request headers in node form, as connect's gRPC
 * transport makes them: the caller's own (names lower-cased, repeated ones
 * as lists), content-type, a user-agent unless the caller set one,
 * grpc-timeout when there is a deadline, te.
 */
function directHeaders(header: HeaderInit | undefined, timeoutMs: number | undefined): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = header === undefined ? {} : nodeHeaders(header instanceof Headers ? header : new Headers(header));
  out["content-type"] = "application/grpc+proto";
  if (out["user-agent"] === undefined) out["user-agent"] = USER_AGENT;
  if (timeoutMs !== undefined) out["grpc-timeout"] = `${timeoutMs}m`;
  out.te = "trailers";
  return out;
}

function onDeadline(call: DirectCall): void {
  call.cancel(deadlineError());
}

/**
 * One call on the direct path: the caller's signal and the deadline cancel
 * its exchange (once there is one), and its end is reported once, with the
 * status the caller sees. A cancellation that comes first decides the
 * status, as with connect's call signal. It is the caller signal's listener
 * itself (handleEvent), so a call makes no closure for it.
 */
class DirectCall {
  private timer: NodeJS.Timeout | undefined;
  private exchange: Exchange | undefined;
  private cancelled: ConnectError | undefined;
  private ended = false;

  constructor(
    private readonly caller: AbortSignal | undefined,
    timeoutMs: number | undefined,
    private readonly report: (code: Code | 0) => void,
    private readonly hooks: DirectCallHooks,
  ) {
    if (caller?.aborted === true) this.cancelled = ConnectError.from(caller.reason, Code.Canceled);
    else caller?.addEventListener("abort", this, { once: true });
    if (timeoutMs !== undefined && this.cancelled === undefined) this.timer = setTimeout(onDeadline, timeoutMs, this);
  }

  handleEvent(): void {
    this.cancel(ConnectError.from(this.caller!.reason, Code.Canceled));
  }

  /** Throws the cancellation that came before the call reached the wire. */
  check(): void {
    if (this.cancelled !== undefined) throw this.cancelled;
  }

  /** Cancelled: the exchange is reset and the call ends now, whether or not anyone reads on (as connect's call signal ends it). */
  cancel(error: ConnectError): void {
    if (this.ended) return;
    this.cancelled ??= error;
    this.exchange?.cancel(this.cancelled);
    this.end(this.cancelled.code);
  }

  attach(exchange: Exchange): void {
    this.exchange = exchange;
    if (this.cancelled !== undefined) exchange.cancel(this.cancelled);
  }

  end(code: Code | 0): void {
    if (this.ended) return;
    this.ended = true;
    clearTimeout(this.timer);
    this.caller?.removeEventListener("abort", this);
    this.report(code);
  }

  /** The call failed: the error its caller gets (a cancellation's, if one came first). */
  fail(error: unknown): ConnectError {
    const failure = this.hooks.error(this.cancelled ?? ConnectError.from(error));
    this.end(failure.code);
    return failure;
  }

  /** A server stream's messages, ending the call when they end, fail or are left. */
  messages(source: AsyncIterable<unknown>): AsyncIterable<unknown> {
    return observeStream(source, { end: () => this.end(0), error: (error) => this.fail(error), cancel: () => this.end(Code.Canceled) });
  }
}

/** A request message as connect's transports take one: a message of the method's input, or an init of it; or its encoding (EncodedMessage). */
function normalized(schema: DescMessage, message: unknown): unknown {
  return isMessage(message, schema) || message instanceof EncodedMessage ? message : create(schema, message as never);
}

export function createLeanGrpcTransport(options: LeanTransportOptions): Transport {
  const { baseUrl, interceptors } = options;
  const timeoutOf = (timeoutMs: number | undefined) => (timeoutMs === undefined ? options.defaultTimeoutMs : timeoutMs <= 0 ? undefined : timeoutMs);
  // The interceptor chains are made once, not per call: what a call needs travels in its request.
  const unaryCall = intercepted<UnaryFn>(async (req) => {
    const exchange = await Exchange.open(options, req.method, nodeHeaders(req.header), req.signal, req.message);
    const out = await exchange.only();
    // Interceptors spread responses: plain properties here (the trailer's Headers is filled in when it comes).
    return { stream: false, service: req.service, method: req.method, header: exchange.header, trailer: exchange.trailer, message: out } as never;
  }, interceptors);
  const streamCall = intercepted<StreamFn>(async (req) => {
    const only = normalized(req.method.input, await single(req.message));
    const exchange = await Exchange.open(options, req.method, nodeHeaders(req.header), req.signal, only, undefined, responseForm(req.contextValues));
    return { stream: true, service: req.service, method: req.method, header: exchange.header, trailer: exchange.trailer, message: exchange.messages() } as never;
  }, interceptors);
  const direct = options.direct;
  /** A direct call's start: its headers, its report of the end, its cancellation. */
  const begin = (hooks: DirectCallHooks, method: DescMethod, signal: AbortSignal | undefined, timeoutMs: number | undefined, header: HeaderInit | undefined, contextValues: ContextValues | undefined) => {
    const timeout = timeoutOf(timeoutMs);
    const headers = directHeaders(header, timeout);
    hooks.decorate(headers, contextValues);
    const call = new DirectCall(signal, timeout, hooks.begin(method, signal?.aborted === true), hooks);
    return { headers, call };
  };
  return {
    async unary<I extends DescMessage, O extends DescMessage>(
      method: DescMethodUnary<I, O>,
      signal: AbortSignal | undefined,
      timeoutMs: number | undefined,
      header: HeaderInit | undefined,
      message: unknown,
      contextValues?: ContextValues,
    ): Promise<UnaryResponse<I, O>> {
      if (direct !== undefined) {
        const { headers, call } = begin(direct, method, signal, timeoutMs, header, contextValues);
        try {
          call.check();
          const exchange = await Exchange.open(options, method, headers, undefined, normalized(method.input, message), call);
          const out = await exchange.only();
          call.end(0);
          return new DirectCallResponse(false, method, out, exchange) as never;
        } catch (error) {
          throw call.fail(error);
        }
      }
      const timeout = timeoutOf(timeoutMs);
      const call = new CallSignal(signal, timeout);
      try {
        const res = await unaryCall({
          stream: false,
          service: method.parent,
          method,
          requestMethod: "POST",
          url: `${baseUrl}/${method.parent.typeName}/${method.name}`,
          header: requestHeader(true, timeout, header),
          contextValues: contextValues ?? createContextValues(),
          message: normalized(method.input, message),
          signal: call.signal,
        } as never);
        call.done();
        return res as unknown as UnaryResponse<I, O>;
      } catch (error) {
        throw call.fail(error);
      }
    },

    async stream<I extends DescMessage, O extends DescMessage>(
      method: DescMethodStreaming<I, O>,
      signal: AbortSignal | undefined,
      timeoutMs: number | undefined,
      header: HeaderInit | undefined,
      input: AsyncIterable<unknown>,
      contextValues?: ContextValues,
    ): Promise<StreamResponse<I, O>> {
      if (method.methodKind !== "server_streaming") return options.fallback.stream(method, signal, timeoutMs, header, input as never, contextValues);
      if (direct !== undefined) {
        const { headers, call } = begin(direct, method, signal, timeoutMs, header, contextValues);
        try {
          call.check();
          const only = normalized(method.input, await single(input));
          const exchange = await Exchange.open(options, method, headers, undefined, only, call, responseForm(contextValues));
          return new DirectCallResponse(true, method, call.messages(exchange.messages()), exchange) as never;
        } catch (error) {
          throw call.fail(error);
        }
      }
      const timeout = timeoutOf(timeoutMs);
      const call = new CallSignal(signal, timeout);
      try {
        const res = await streamCall({
          stream: true,
          service: method.parent,
          method,
          requestMethod: "POST",
          url: `${baseUrl}/${method.parent.typeName}/${method.name}`,
          header: requestHeader(true, timeout, header),
          contextValues: contextValues ?? createContextValues(),
          message: input,
          signal: call.signal,
        } as never);
        return { ...res, message: call.track(res.message) } as unknown as StreamResponse<I, O>;
      } catch (error) {
        throw call.fail(error);
      }
    },
  };
}

async function single(input: AsyncIterable<unknown>): Promise<unknown> {
  if (input instanceof OneMessage) return input.message;
  const it = input[Symbol.asyncIterator]();
  const first = await it.next();
  if (first.done === true) throw new ConnectError("protocol error: missing request message", Code.Internal);
  await it.return?.();
  return first.value;
}

/** Web headers to the node form `session.request` takes (lower-case names, repeated ones as lists). */
function nodeHeaders(headers: Headers): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  headers.forEach((value, name) => {
    const existing = out[name];
    if (existing === undefined) out[name] = value;
    else if (Array.isArray(existing)) existing.push(value);
    else out[name] = [String(existing), value];
  });
  return out;
}

/**
 * A direct call's response as connect's transports answer (UnaryResponse,
 * StreamResponse), its header and trailer made as `Headers` only when read:
 * most callers never read them. The trailer is complete once the messages
 * ended. (Its getters are on the prototype: a spread copy would lose them,
 * so the interceptor path, whose interceptors spread responses, answers
 * with plain objects.)
 */
class DirectCallResponse {
  constructor(
    readonly stream: boolean,
    readonly method: DescMethod,
    readonly message: unknown,
    private readonly exchange: Exchange,
  ) {}

  get service(): DescMethod["parent"] {
    return this.method.parent;
  }

  get header(): Headers {
    return this.exchange.header;
  }

  get trailer(): Headers {
    return this.exchange.trailer;
  }
}

/** Content types connect's parseContentType takes for binary gRPC, as Node reports them (one string). */
function isGrpcProto(contentType: string | string[] | undefined): boolean {
  return contentType === "application/grpc" || contentType === "application/grpc+proto";
}

/**
 * How a server stream's messages are read: parsed, each as its bytes
 * (encodedResponsesKey), or as runs of whole frames (framedResponsesKey,
 * which wins when a caller sets both).
 */
type ResponseForm = "parsed" | "encoded" | "framed";

function responseForm(values: ContextValues | undefined): ResponseForm {
  if (values === undefined) return "parsed";
  return values.get(framedResponsesKey) ? "framed" : values.get(encodedResponsesKey) ? "encoded" : "parsed";
}

/** A frame flagged compressed, decompressed when it is read. */
class Compressed {
  constructor(readonly bytes: Uint8Array) {}
}

/**
 * Frames that arrived back to back in one buffer (headers included), while
 * they wait to be read as one EncodedFrames: a frame read in place right
 * after the run's end extends it.
 */
class FrameRun {
  count = 1;
  constructor(
    readonly buffer: ArrayBufferLike,
    readonly start: number,
    public end: number,
  ) {}
}

/** The response encodings read (the same connect-node's transport accepts); never asked for. */
const DECOMPRESSORS: readonly Compression[] = [compressionGzip, compressionBrotli];

/** As connect-node reports a stream reset by the peer; a code it does not know is an internal error here. */
function resetError(code: number): ConnectError | undefined {
  if (code === h2.NGHTTP2_NO_ERROR || code === h2.NGHTTP2_STREAM_CLOSED) return undefined;
  return h2ResetError(code) ?? new ConnectError(`http/2 stream closed with error code 0x${code.toString(16)}`, Code.Internal);
}

/** Node stream errors as connect-node classifies them. */
function nodeError(error: unknown): ConnectError {
  const code = (error as { code?: unknown } | undefined)?.code;
  const mapped =
    code === "ERR_STREAM_WRITE_AFTER_END" || code === "ERR_STREAM_DESTROYED" || code === "ERR_HTTP2_INVALID_STREAM" || code === "ECONNRESET"
      ? Code.Aborted
      : code === "ETIMEDOUT" || code === "ENOTFOUND" || code === "EAI_AGAIN" || code === "ECONNREFUSED"
        ? Code.Unavailable
        : Code.Internal;
  return ConnectError.from(error, mapped);
}

/**
 * One call's HTTP/2 stream: sends the request frame, validates the response
 * headers, splits the body into message frames (each checked against
 * readMaxBytes from its header before it is buffered) and ends with the
 * trailers' status. Messages wait in a queue until read; while more than
 * a few wait, the stream is paused, so flow control holds the server back.
 */
class Exchange implements EnvelopeSink {
  /** The response headers and trailers as Node gave them; as `Headers` only when asked for (or when a check needs them). */
  private rawHeader: IncomingHttpHeaders | undefined;
  private rawTrailer: IncomingHttpHeaders | undefined;
  private headerObject: Headers | undefined;
  private trailerObject: Headers | undefined;
  private readonly queue: (Uint8Array | Compressed | FrameRun)[] = [];
  private waiter: (() => void) | undefined;
  /** The response ended, or the stream closed. */
  private ended = false;
  /** The caller read to the end (or got the failure): its signal has nothing left to cancel. */
  finished = false;
  private failure: ConnectError | undefined;
  /** The headers carried a grpc-status (a trailers-only response, or a server that sent one early). */
  private headerStatus = false;
  /** The error status the headers carried, if any. */
  private headerError: ConnectError | undefined;
  /** How compressed frames are decompressed (the response's grpc-encoding). */
  private compression: Compression | undefined;
  /** Splits the response body into messages, each checked against readMaxBytes from its header. */
  private readonly envelopes: EnvelopeReader;

  private constructor(
    private readonly stream: ClientHttp2Stream,
    private readonly options: LeanTransportOptions,
    private readonly output: DescMessage,
    private readonly unary: boolean,
    /** How a server stream's messages are read (responseForm). */
    private readonly form: ResponseForm,
  ) {
    this.envelopes = new EnvelopeReader(this, options.readMaxBytes);
  }

  /**
   * Opens the call's stream with `requestHeaders` (node form) and sends
   * `message`. Cancelled by `signal` (the interceptor
   * path: the call's signal) or by `owner` (a direct call, which is given
   * the exchange before the response headers are awaited). `form`: how
   * its messages are read.
   */
  static async open(
    options: LeanTransportOptions,
    method: DescMethod,
    requestHeaders: OutgoingHttpHeaders,
    signal: AbortSignal | undefined,
    message: unknown,
    owner?: DirectCall,
    form: ResponseForm = "parsed",
  ): Promise<Exchange> {
    // A big top-level bytes field goes out from the caller's buffer, not copied (message-chunks.ts).
    // A relayed request goes as the bytes it arrived in (a message of the same wire shape).
    const bytes = message instanceof EncodedMessage ? message.bytes : serializeMessage(method.input, message);
    const length = byteLengthOf(bytes);
    if (length > options.writeMaxBytes) throw writeLimitError(length, options.writeMaxBytes);
    signal?.throwIfAborted();
    const stream = await options.session.request("POST", `/${method.parent.typeName}/${method.name}`, requestHeaders, {});
    const exchange = new Exchange(stream, options, method.output, method.methodKind === "unary", form);
    if (signal !== undefined) {
      const onAbort = () => {
        // connect aborts the call's signal once the caller has its answer, too: nothing to cancel then.
        // Before that an abort fails the call, even when the response is already in.
        if (exchange.finished) return;
        exchange.cancel(ConnectError.from(signal.reason, Code.Canceled));
      };
      if (signal.aborted) onAbort();
      else signal.addEventListener("abort", onAbort, { once: true });
    }
    owner?.attach(exchange);
    stream.once("close", () => exchange.closed());
    stream.on("error", (e) => exchange.fail(nodeError(e)));
    // Trailers may arrive in the same read as the headers: listen before waiting.
    stream.once("trailers", (trailers: IncomingHttpHeaders) => exchange.trailers(trailers));
    const headers = exchange.responseHeaders();
    writeEnvelope(stream, bytes, true);
    await headers;
    stream.on("data", (chunk: Buffer) => exchange.data(chunk));
    stream.once("end", () => exchange.end());
    return exchange;
  }

  /** The response headers (empty until they came). */
  get header(): Headers {
    return (this.headerObject ??= this.rawHeader === undefined ? new Headers() : webHeadersOf(this.rawHeader));
  }

  /** The response trailers (empty until they came; filled in when they do). */
  get trailer(): Headers {
    return (this.trailerObject ??= this.rawTrailer === undefined ? new Headers() : webHeadersOf(this.rawTrailer));
  }

  trailers(trailers: IncomingHttpHeaders): void {
    this.rawTrailer = trailers;
    if (this.trailerObject !== undefined) webHeadersOf(trailers, this.trailerObject);
  }

  /** Resolves once the response headers are in and valid (or the call failed before). */
  private responseHeaders(): Promise<void> {
    return new Promise((resolve, reject) => {
      const onResponse = (headers: IncomingHttpHeaders) => {
        this.stream.off("close", onClose);
        this.rawHeader = headers;
        // The usual answer (200, a gRPC content type, no status and no encoding in the headers) needs no Headers to check.
        if (Number(headers[":status"]) === 200 && isGrpcProto(headers["content-type"]) && headers["grpc-status"] === undefined && headers["grpc-encoding"] === undefined) {
          resolve();
          return;
        }
        try {
          const { foundStatus, headerError } = validateResponse(Number(headers[":status"] ?? 0), this.header);
          // Frames flagged compressed are read with the response's encoding, as connect's transport does.
          const encoding = this.header.get("grpc-encoding");
          if (encoding !== null && encoding.toLowerCase() !== "identity") {
            this.compression = DECOMPRESSORS.find((c) => c.name === encoding);
            if (this.compression === undefined) throw new ConnectError(`unsupported response encoding "${encoding}"`, Code.Internal, this.header);
          }
          // A stream fails at once on an error status in the headers; a unary call reads on, as connect does.
          if (headerError && !this.unary) throw headerError;
          this.headerStatus = foundStatus;
          this.headerError = headerError;
          resolve();
        } catch (error) {
          this.stream.close(h2.NGHTTP2_CANCEL);
          reject(error as Error);
        }
      };
      const onClose = () =>
        reject(this.failure ?? resetError(this.stream.rstCode ?? h2.NGHTTP2_INTERNAL_ERROR) ?? new ConnectError("the stream closed before the response headers", Code.Unavailable));
      this.stream.once("response", onResponse);
      this.stream.once("close", onClose);
    });
  }

  data(chunk: Buffer): void {
    this.options.session.notifyResponseByteRead(this.stream);
    if (this.failure === undefined) this.envelopes.push(chunk);
  }

  /** A message over readMaxBytes: the call fails and the stream is cancelled. */
  onOversize(error: ConnectError): void {
    this.abort(error);
  }

  onMessage(flags: number, bytes: Uint8Array, inPlace: boolean): boolean {
    if ((flags & FLAG_COMPRESSED) !== 0) {
      if (this.compression === undefined) {
        this.abort(compressedEnvelopeError());
        return false;
      }
      this.queue.push(new Compressed(bytes));
    } else if (this.form === "framed" && flags === 0 && inPlace) {
      // Right after the frame before it in the same buffer: one run, written on with one write.
      const start = bytes.byteOffset - ENVELOPE_HEADER_BYTES;
      const end = bytes.byteOffset + bytes.byteLength;
      const tail = this.queue[this.queue.length - 1];
      if (tail instanceof FrameRun && tail.buffer === bytes.buffer && tail.end === start) {
        tail.end = end;
        tail.count += 1;
        return this.failure === undefined;
      }
      this.queue.push(new FrameRun(bytes.buffer, start, end));
    } else this.queue.push(bytes);
    // Hold the server back through flow control while the reader lags.
    if (this.queue.length > 16) this.stream.pause();
    this.wake();
    return this.failure === undefined;
  }

  end(): void {
    // A reset can arrive as the end of the stream (Node emits "end" with the code already set).
    const reset = resetError(this.stream.rstCode ?? h2.NGHTTP2_NO_ERROR);
    if (reset !== undefined) this.fail(reset);
    else if (this.envelopes.partial) this.fail(incompleteEnvelopeError());
    this.ended = true;
    this.wake();
  }

  /** The stream closed: a reset before the end is the call's failure. */
  closed(): void {
    if (!this.ended && this.failure === undefined) {
      this.fail(resetError(this.stream.rstCode ?? h2.NGHTTP2_INTERNAL_ERROR) ?? new ConnectError("the stream closed before the response ended", Code.Unavailable));
    }
    this.ended = true;
    this.wake();
  }

  fail(error: ConnectError): void {
    this.failure ??= error;
    this.wake();
  }

  /** Cancelled (the caller's signal, a deadline): the call fails with `reason` and the stream is reset. */
  cancel(reason: ConnectError): void {
    if (this.finished) return;
    if (!this.stream.closed) this.stream.close(reason.code === Code.Canceled ? h2.NGHTTP2_CANCEL : h2.NGHTTP2_INTERNAL_ERROR);
    this.fail(reason);
  }

  private abort(error: ConnectError): void {
    this.fail(error);
    if (!this.stream.closed) this.stream.close(h2.NGHTTP2_CANCEL);
  }

  private wake(): void {
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.();
  }

  /** The next message's bytes (or run of frames), or undefined at the end (after the trailers' status checked out). */
  private async next(): Promise<Uint8Array | FrameRun | undefined> {
    try {
      for (;;) {
        if (this.failure !== undefined) throw this.failure;
        const entry = this.queue.shift();
        if (entry !== undefined) {
          if (this.queue.length <= 4 && this.stream.isPaused()) this.stream.resume();
          return entry instanceof Compressed ? await this.compression!.decompress(entry.bytes, this.options.readMaxBytes) : entry;
        }
        if (this.ended) {
          // A unary call checks the trailers even after a status in the headers (connect does).
          // An OK status in the trailers is the usual end; anything else is checked as connect checks it.
          if ((this.unary || !this.headerStatus) && this.rawTrailer?.["grpc-status"] !== "0") validateTrailer(this.trailer, this.header);
          this.finished = true;
          return undefined;
        }
        await new Promise<void>((resolve) => (this.waiter = resolve));
      }
    } catch (error) {
      // The caller has its failure: the stream, if still open (a message that
      // would not decompress, say), is cancelled rather than left to the server.
      this.finished = true;
      if (!this.stream.closed) this.stream.close(h2.NGHTTP2_CANCEL);
      throw error;
    }
  }

  private parse(bytes: Uint8Array): unknown {
    return parseMessage(this.output, bytes);
  }

  /** A unary call's one message, with connect's checks of a status the headers carried. */
  async only(): Promise<unknown> {
    const first = await this.next();
    if (first === undefined) {
      if (this.headerError) throw this.headerError;
      throw new ConnectError("protocol error: missing output message for unary method", this.trailer.has("grpc-status") ? Code.Unimplemented : Code.Unknown);
    }
    // (A unary exchange is never framed: its entries are messages.)
    const message = this.parse(first as Uint8Array);
    if ((await this.next()) !== undefined) throw new ConnectError("protocol error: received extra output message for unary method", Code.Unimplemented);
    if (this.headerError) throw new ConnectError("protocol error: received output message for unary method with error status", Code.Unknown);
    return message;
  }

  /**
   * A server stream's messages in the exchange's form: parsed as they are
   * read, as their bytes (EncodedMessage), or as EncodedFrames (a frame
   * that came apart across reads, or compressed, framed again on its own).
   */
  messages(): AsyncIterable<unknown> {
    const form = this.form;
    const result = (entry: Uint8Array | FrameRun | undefined): IteratorResult<unknown> => {
      if (entry === undefined) return { done: true, value: undefined };
      if (entry instanceof FrameRun) return { done: false, value: new EncodedFrames(new Uint8Array(entry.buffer, entry.start, entry.end - entry.start), entry.count) };
      if (form === "framed") return { done: false, value: new EncodedFrames(encodeEnvelope(entry), 1) };
      return { done: false, value: form === "encoded" ? new EncodedMessage(entry) : this.parse(entry) };
    };
    return {
      [Symbol.asyncIterator]: () => ({
        next: (): Promise<IteratorResult<unknown>> => {
          // A message already in: answered without the general path's async function and loop.
          const head = this.queue[0];
          if (this.failure === undefined && head !== undefined && !(head instanceof Compressed)) {
            this.queue.shift();
            if (this.queue.length <= 4 && this.stream.isPaused()) this.stream.resume();
            try {
              return Promise.resolve(result(head));
            } catch (error) {
              return Promise.reject(error as Error);
            }
          }
          return this.next().then(result);
        },
        return: async (): Promise<IteratorResult<unknown>> => {
          if (!this.stream.closed) this.stream.close(h2.NGHTTP2_CANCEL);
          this.ended = true;
          this.finished = true;
          return { done: true, value: undefined };
        },
      }),
    };
  }
}
