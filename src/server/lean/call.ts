import type { IncomingHttpHeaders, OutgoingHttpHeaders, ServerHttp2Stream } from "node:http2";
import { constants } from "node:http2";
import type { DescMessage, DescMethod, DescService } from "@bufbuild/protobuf";
import { create, isMessage } from "@bufbuild/protobuf";
import type { ContextKey, ContextValues, HandlerContext, Interceptor, StreamRequest, StreamResponse, UnaryRequest, UnaryResponse } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";
import type { createMethodSerializationLookup } from "@connectrpc/connect/protocol";
import { MAX_TIMER_MS } from "../../util/index.js";
import { byteLengthOf, EncodedFrames, EncodedMessage, h2ResetError, incomingHeaderValue, isConnectionHeader, requestHeaderValueKey, serializeMessage, webHeadersOf, writeLimitError } from "../../wire/index.js";
import { setPeerCertificate } from "../peer-certificate.js";
import type { ObservedCall, RpcObserver } from "../rpc-observer.js";
import { rpcRecordKey } from "../rpc-observer.js";

/**
 * What every call of the host's lean request path shares, whatever its
 * protocol (grpc.ts: gRPC, connect.ts: Connect unary): the
 * request and response objects interceptors see, the HandlerContext the
 * method gets, its lazy signal, headers and deadline, the observer's
 * record, and the stream listeners. A protocol's call adds how the request
 * body is read and how the answer is written.
 */

/** A ServiceImpl method, bound to its implementation. */
export type Impl = (input: unknown, ctx: HandlerContext) => unknown;

export interface Route {
  readonly method: DescMethod;
  readonly impl: Impl;
  /** The response is a stream (server streaming). */
  readonly streaming: boolean;
  /** The request is a stream (client streaming; the response one message). */
  readonly clientStreaming: boolean;
  /** Largest request message: the service's own limit, or the host's (options.readMaxBytes). */
  readonly readMaxBytes: number;
  /** connect's serializers for the method (binary and JSON), made on the route's first Connect call. */
  connect?: ReturnType<typeof createMethodSerializationLookup>;
}

export interface LeanPathOptions {
  readonly interceptors: readonly Interceptor[];
  readonly observer: RpcObserver;
  /** Counts the calls taken. */
  readonly taken: { inc(): void };
  /** Largest request message, as connect's readMaxBytes. */
  readonly readMaxBytes: number;
  /** Largest response message, as connect's writeMaxBytes. */
  readonly writeMaxBytes: number;
  /** Upper bound on a client's deadline; undefined: none. */
  readonly maxTimeoutMs: number | undefined;
  /** Aborts the signals of calls still running when the grace is over. */
  readonly shutdownSignal: AbortSignal;
  /** Whether the listener is TLS, for the URL handlers see. */
  readonly tls: boolean;
  /** Leave calls whose client accepts compressed responses to connect (response compression is on). */
  readonly declineCompressible: boolean;
}

/** What a call needs of the LeanPath that took it. */
export interface CallHost {
  readonly options: LeanPathOptions;
  chainFor(route: Route): (req: UnaryRequest | StreamRequest) => Promise<unknown>;
  /** Calls whose signal exists: aborted with the shutdown signal's reason when it fires, by one listener for them all. */
  readonly signalledCalls: Set<LeanCall>;
}

/** The request message, or the reason there is none, as a one-message stream for server-streaming interceptors. */
export class SingleInput implements AsyncIterable<unknown> {
  constructor(readonly message: Promise<unknown>) {}
  async *[Symbol.asyncIterator](): AsyncIterator<unknown> {
    yield await this.message;
  }
}

/** Tags a call's request and response objects (copied along when an interceptor spreads them), and its stream. */
const callKey = Symbol("mmgate.leanCall");
type Tagged = { [callKey]?: LeanCall };

/** The innermost step of the interceptor chain: the method itself, as connect invokes it. */
export async function invokeMethod(route: Route, req: UnaryRequest | StreamRequest): Promise<unknown> {
  const call = (req as Tagged)[callKey];
  if (call === undefined) throw new ConnectError("an interceptor passed on a request it built itself; the lean path cannot serve it", Code.Internal);
  const ctx = call.contextFor(req);
  if (!route.streaming) {
    // A client stream's handler takes the request stream itself, as a unary one takes its message.
    const output = await route.impl((req as UnaryRequest).message, ctx);
    return call.response(false, req, normalize(route.method.output, output));
  }
  const input = req.message instanceof SingleInput ? await req.message.message : await firstOf(req.message as AsyncIterable<unknown>);
  const output = route.impl(input, ctx) as AsyncIterable<unknown>;
  return call.response(true, req, normalizeAll(route.method.output, output));
}

async function firstOf(iterable: AsyncIterable<unknown>): Promise<unknown> {
  for await (const message of iterable) return message;
  throw new ConnectError("protocol error: missing input message for server-streaming method", Code.Unimplemented);
}

function normalize(desc: DescMessage, value: unknown): unknown {
  // A relayed encoding is written as it is (only calls that accept it get one: acceptsEncodedKey).
  return isMessage(value, desc) || value instanceof EncodedMessage || value instanceof EncodedFrames ? value : create(desc, value as never);
}

/**
 * The method's messages, each normalized: a mapping iterator rather than an
 * async generator, which would cost a few more promises per message of a
 * long stream. Its return() stops the method's iterator, as leaving a
 * for-await loop would.
 */
function normalizeAll(desc: DescMessage, source: AsyncIterable<unknown>): AsyncIterable<unknown> {
  return {
    [Symbol.asyncIterator](): AsyncIterator<unknown> {
      const it = source[Symbol.asyncIterator]();
      const map = (result: IteratorResult<unknown>): IteratorResult<unknown> => (result.done === true ? result : { done: false, value: normalize(desc, result.value) });
      return {
        next: () => it.next().then(map),
        return: async (value?: unknown) => (await it.return?.(value)) ?? { done: true, value },
      };
    },
  };
}

let dateSecond = -1;
let dateValue = "";
/** The Date header, formatted once a second (the HTTP/2 compatibility layer sends one too). */
export function httpDate(): string {
  const now = Date.now();
  const second = Math.floor(now / 1000);
  if (second !== dateSecond) {
    dateSecond = second;
    dateValue = new Date(now).toUTCString();
  }
  return dateValue;
}

/**
 * Copies `from` into node headers as connect-node's writeHead does: a name
 * `from` has replaces the one there (a handler's own x-request-id or
 * content-type), at its place; set-cookie, given more than once, becomes a
 * list; a connection header is dropped.
 */
export function setAll(target: OutgoingHttpHeaders, from: Headers): void {
  let cookies = false;
  from.forEach((value, name) => {
    // Connection-specific headers have no place in HTTP/2 and would make Node refuse the whole set.
    if (isConnectionHeader(name, value)) return;
    if (name !== "set-cookie") target[name] = value;
    else if (!cookies) {
      cookies = true;
      target[name] = value;
    } else {
      const existing = target[name]!;
      if (Array.isArray(existing)) existing.push(value);
      else target[name] = [String(existing), value];
    }
  });
}

/**
 * The request object interceptors see. A class, so that its lazy getters
 * cost nothing per call; an interceptor that spreads it into a new object
 * drops them, and the call's own header and signal stand in (contextFor).
 */
class LeanRequest {
  readonly requestMethod = "POST";
  readonly service: DescService;
  readonly method: DescMethod;
  readonly contextValues: ContextValues;
  readonly [callKey]: LeanCall;
  constructor(
    call: LeanCall,
    readonly stream: boolean,
    readonly message: unknown,
  ) {
    this[callKey] = call;
    this.service = call.service;
    this.method = call.method;
    this.contextValues = call.values;
  }
  get url(): string {
    return this[callKey].url;
  }
  get signal(): AbortSignal {
    return this[callKey].signal;
  }
  get header(): Headers {
    return this[callKey].requestHeader;
  }
}

/** The response object interceptors see; its header and trailer exist once read. */
class LeanResponse {
  readonly [callKey]: LeanCall;
  constructor(
    call: LeanCall,
    readonly stream: boolean,
    readonly service: DescService,
    readonly method: DescMethod,
    readonly message: unknown,
  ) {
    this[callKey] = call;
  }
  get header(): Headers {
    return this[callKey].responseHeader;
  }
  get trailer(): Headers {
    return this[callKey].responseTrailer;
  }
}

/** connect's ContextValues, with its methods on a prototype rather than made per call. */
class CallValues implements ContextValues {
  get<T>(key: ContextKey<T>): T {
    const own = this as unknown as Record<symbol, T>;
    return key.id in own ? own[key.id]! : key.defaultValue;
  }
  set<T>(key: ContextKey<T>, value: T): this {
    (this as unknown as Record<symbol, T>)[key.id] = value;
    return this;
  }
  delete(key: ContextKey<unknown>): this {
    delete (this as unknown as Record<symbol, unknown>)[key.id];
    return this;
  }
}

/** Reads a call's request body from the stream's "data" and "end" events. */
export interface BodyReader {
  data(chunk: Buffer): void;
  end(): void;
  /** The stream closed before the body ended. */
  abort(): void;
}

/**
 * A request body reader that settles once: with its result, or with the
 * error that refused the body. Either way it stops reading; a refusal also
 * pauses the stream, whose unread rest is cut once the answer is out.
 */
export abstract class SettlingBodyReader<T> implements BodyReader {
  readonly result: Promise<T>;
  settled = false;
  private resolveResult!: (value: T) => void;
  private rejectResult!: (error: ConnectError) => void;

  constructor(protected readonly stream: ServerHttp2Stream) {
    this.result = new Promise<T>((resolve, reject) => {
      this.resolveResult = resolve;
      this.rejectResult = reject;
    });
  }

  abstract data(chunk: Buffer): void;
  abstract end(): void;

  /** The stream closed before the body ended. */
  abort(): void {
    if (!this.settled) this.fail(new ConnectError("the client closed the stream before sending its request", Code.Canceled));
  }

  protected succeed(value: T): void {
    this.settle();
    this.resolveResult(value);
  }

  protected fail(error: ConnectError): void {
    this.settle();
    this.stream.pause();
    this.rejectResult(error);
  }

  private settle(): void {
    this.settled = true;
    stopReading(this.stream);
  }
}

/**
 * Stream listeners shared by every call: the stream is `this`, its call
 * hangs off it. Closures per call would each cost an allocation (and, run
 * through tsx, a defineProperty for their name) on the hottest path.
 */
type CallStream = ServerHttp2Stream & { [callKey]?: LeanCall };
export function ignoreError(): void {}
export function onStreamClose(this: CallStream): void {
  this[callKey]?.onClose();
}
export function onWantTrailers(this: CallStream): void {
  this[callKey]?.sendTrailers();
}
export function onRequestData(this: CallStream, chunk: Buffer): void {
  this[callKey]?.input?.data(chunk);
}
export function onRequestEnd(this: CallStream): void {
  this[callKey]?.input?.end();
}
/** Stops listening to the request body of `stream` (what is left of it is cut once the answer is out). */
export function stopReading(stream: ServerHttp2Stream): void {
  stream.off("data", onRequestData);
  stream.off("end", onRequestEnd);
}
/**
 * The reason a call's signal carries once the call is over: what abort()
 * without one would give (an AbortError), made once, since a DOMException
 * per call (it captures a stack) is a measurable share of a small call.
 */
const CALL_ENDED = new DOMException("This operation was aborted", "AbortError");

function abortAtDeadline(controller: AbortController): void {
  controller.abort(deadlineExceeded());
}

/**
 * One call on the lean path, of either protocol; also the HandlerContext
 * its handler gets. A call whose signal was made is in its host's
 * `signalledCalls` until it closes, so that the shutdown signal reaches it
 * without a listener of its own (adding and removing one per call cost more
 * than the call's signal).
 */
export abstract class LeanCall implements HandlerContext {
  readonly requestMethod = "POST";
  abstract readonly protocolName: string;
  readonly service: DescService;
  readonly method: DescMethod;
  readonly values: ContextValues;
  /** Absolute deadline (Date.now() scale), when the client sent one. */
  private readonly deadline: number | undefined;
  /** Why the client's deadline header is refused, when it is. */
  protected readonly timeoutError: ConnectError | undefined;
  protected controller: AbortController | undefined;
  private deadlineTimer: NodeJS.Timeout | undefined;
  private requestHeaders: Headers | undefined;
  protected responseHeaders: Headers | undefined;
  protected responseTrailers: Headers | undefined;
  /** The status code of the answer sent; undefined until it is. */
  protected sentCode: Code | 0 | undefined;
  /** Set once the end of the answer went out: the client has its status. */
  protected answered = false;
  /** Set once the stream closed, whatever the reason. */
  protected closed = false;
  /** The request body's reader while it is read. */
  input: BodyReader | undefined;
  private originalRequest: object | undefined;
  private originalResponse: object | undefined;

  constructor(
    protected readonly path: CallHost,
    protected readonly route: Route,
    protected readonly stream: ServerHttp2Stream,
    protected readonly headers: IncomingHttpHeaders,
    protected readonly observed: ObservedCall,
    /** The client's deadline as its protocol's parseTimeout read it (undefined: no deadline header). */
    timeout: { timeoutMs?: number; error?: ConnectError } | undefined,
  ) {
    this.method = route.method;
    this.service = route.method.parent;
    this.values = new CallValues().set(rpcRecordKey, observed.record);
    if (path.options.tls) setPeerCertificate(this.values, stream.session);
    (stream as CallStream)[callKey] = this;
    if (timeout !== undefined) {
      this.timeoutError = timeout.error;
      if (timeout.timeoutMs !== undefined) this.deadline = Date.now() + timeout.timeoutMs;
    }
  }

  /** Sends what ends the answer once its body is out ("wantTrailers"). */
  abstract sendTrailers(): void;

  get url(): string {
    const scheme = this.path.options.tls ? "https" : "http";
    return `${scheme}://${this.headers[":authority"] ?? ""}${this.headers[":path"] ?? ""}`;
  }

  get requestHeader(): Headers {
    return (this.requestHeaders ??= webHeadersOf(this.headers));
  }

  /** One request header (wire's requestHeaderValue): from Node's headers until the `Headers` exists, which a caller may have changed. */
  [requestHeaderValueKey](name: string): string | null {
    if (this.requestHeaders !== undefined) return this.requestHeaders.get(name);
    return name.startsWith(":") ? null : incomingHeaderValue(this.headers, name);
  }

  get responseHeader(): Headers {
    return (this.responseHeaders ??= this.initialResponseHeader());
  }

  get responseTrailer(): Headers {
    return (this.responseTrailers ??= new Headers());
  }

  /** The response header a handler finds before it sets any. */
  protected initialResponseHeader(): Headers {
    return new Headers();
  }

  timeoutMs(): number | undefined {
    return this.deadline === undefined ? undefined : this.deadline - Date.now();
  }

  /**
   * Created on first use. It aborts like connect's: at the deadline
   * (DEADLINE_EXCEEDED), when the server's grace is over, when the client
   * cancels, and once the call is over.
   */
  get signal(): AbortSignal {
    if (this.controller !== undefined) return this.controller.signal;
    const controller = new AbortController();
    this.controller = controller;
    const shutdown = this.path.options.shutdownSignal;
    if (this.closed) controller.abort();
    else if (shutdown.aborted) controller.abort(shutdown.reason);
    else {
      this.path.signalledCalls.add(this);
      if (this.deadline !== undefined) {
        const left = this.deadline - Date.now();
        if (left <= 0) controller.abort(deadlineExceeded());
        // A deadline past what a Node timer holds (about 24.8 days) is no
        // deadline in practice; a longer delay would fire after 1 ms.
        else if (left <= MAX_TIMER_MS) this.deadlineTimer = setTimeout(abortAtDeadline, left, controller);
      }
    }
    return controller.signal;
  }

  /** The host's shutdown signal fired (the grace is over). */
  shutdown(reason: unknown): void {
    this.controller?.abort(reason);
  }

  /** The request the interceptors see; its signal and header exist once read. */
  protected request(streaming: boolean, message: unknown): UnaryRequest | StreamRequest {
    const req = new LeanRequest(this, streaming, message);
    if (this.route.clientStreaming) {
      // An interceptor that watches what the method reads of a client stream passes on a spread copy with its
      // own message (the host's call interceptor does): the header, signal and url as own values survive that.
      Object.defineProperties(req, {
        header: { value: this.requestHeader, enumerable: true },
        signal: { value: this.signal, enumerable: true },
        url: { value: this.url, enumerable: true },
      });
    }
    this.originalRequest = req;
    return req as unknown as UnaryRequest | StreamRequest;
  }

  /**
   * The handler's context: the call itself, unless an interceptor passed on
   * a request of its own; then, as connect's mergeRequest does, the
   * request's service, header, signal and values over the call's.
   */
  contextFor(req: UnaryRequest | StreamRequest): HandlerContext {
    if (req === this.originalRequest) return this;
    // A spread copy of the request lacks the lazy getters: the call's own stand in.
    return Object.defineProperties(Object.create(this) as HandlerContext, {
      service: { value: req.service },
      requestHeader: { value: (req.header as Headers | undefined) ?? this.requestHeader },
      // Its header is the request's: read through it, not from Node's.
      [requestHeaderValueKey]: { value: undefined },
      signal: { value: (req.signal as AbortSignal | undefined) ?? this.signal },
      values: { value: req.contextValues },
    });
  }

  /** The response the method returns through the interceptors; its header and trailer exist once read. */
  response(streaming: boolean, req: UnaryRequest | StreamRequest, message: unknown): UnaryResponse | StreamResponse {
    const res = new LeanResponse(this, streaming, req.service, req.method, message);
    this.originalResponse = res;
    return res as unknown as UnaryResponse | StreamResponse;
  }

  /** Takes an interceptor's header or trailer object when it is not the call's own (connect copies it over). */
  protected adopt(res: UnaryResponse | StreamResponse, field: "header" | "trailer"): void {
    if (res === this.originalResponse) return;
    const given = res[field] as Headers | undefined;
    if (given === undefined) return;
    if (field === "header" && given !== this.responseHeaders) this.responseHeaders = given;
    if (field === "trailer" && given !== this.responseTrailers) this.responseTrailers = given;
  }

  /** The message's binary bytes: one buffer, or (a big top-level bytes field) chunks that concatenate to it; errors as connect's. */
  protected serializeBinary(message: unknown): Uint8Array | Uint8Array[] {
    // A relayed encoding is written as it is.
    const bytes = message instanceof EncodedMessage ? message.bytes : serializeMessage(this.method.output, message);
    const length = byteLengthOf(bytes);
    const max = this.path.options.writeMaxBytes;
    if (length > max) throw writeLimitError(length, max);
    return bytes;
  }

  /** Listens to the stream's request body (the reader is `input`). */
  protected listenToBody(reader: BodyReader): void {
    this.input = reader;
    const stream = this.stream;
    stream.on("data", onRequestData);
    stream.once("end", onRequestEnd);
  }

  onClose(): void {
    this.closed = true;
    this.input?.abort();
    if (this.deadlineTimer !== undefined) clearTimeout(this.deadlineTimer);
    if (this.controller !== undefined) {
      this.path.signalledCalls.delete(this);
      if (!this.controller.signal.aborted) {
        // As connect-node's request signal: a reset aborts with what its code means; a normal end without a reason.
        const reset = h2ResetError(this.stream.rstCode ?? 0);
        this.controller.abort(reset ?? CALL_ENDED);
      }
    }
    // A response cut short (reset by the client, cut at the grace) gave the
    // client no status: CANCELLED, or the status the interceptor recorded.
    this.path.options.observer.close(this.observed, this.answered && this.sentCode !== undefined ? this.sentCode : (this.observed.record.code ?? Code.Canceled));
  }
}

/** The encodings the host accepts, in connect-node's order. */
const ENCODINGS = ["gzip", "br"];
let lastAccepted: string | undefined;
let lastNegotiated: string | undefined;

/** The first encoding in the client's grpc-accept-encoding (or Connect's accept-encoding) that the host has, as connect's negotiation picks it. */
export function negotiatedEncoding(accepted: string | string[] | undefined): string | undefined {
  if (accepted === undefined || accepted === "") return undefined;
  const text = Array.isArray(accepted) ? accepted.join(",") : accepted;
  // Clients send the same value on every call: remember the last answer.
  if (text !== lastAccepted) {
    lastAccepted = text;
    lastNegotiated = text.split(",").map((n) => n.trim()).find((n) => ENCODINGS.includes(n));
  }
  return lastNegotiated;
}

/** Once the answer is out, a request body still arriving is cut, as on connect's path (RST_STREAM NO_ERROR after END_STREAM). */
export function cutUnreadRequest(stream: ServerHttp2Stream): void {
  if (!stream.readableEnded && !stream.destroyed) stream.destroy();
}

/** Resets a stream whose answer cannot be sent (RST_STREAM INTERNAL_ERROR). */
export function resetStream(stream: ServerHttp2Stream): void {
  if (!stream.destroyed) stream.close(constants.NGHTTP2_INTERNAL_ERROR);
}

export function uncork(stream: ServerHttp2Stream): void {
  stream.uncork();
}

export function deadlineExceeded(): ConnectError {
  return new ConnectError("the operation timed out", Code.DeadlineExceeded);
}
