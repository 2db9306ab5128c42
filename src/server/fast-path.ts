import type { IncomingHttpHeaders, OutgoingHttpHeaders, ServerHttp2Stream } from "node:http2";
import type { DescMessage, DescMethod, DescService } from "@bufbuild/protobuf";
import { create, fromBinary, isMessage, toBinary } from "@bufbuild/protobuf";
import type { ContextKey, ContextValues, HandlerContext, Interceptor, StreamRequest, StreamResponse, UnaryRequest, UnaryResponse } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";
import { parseTimeout, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { serializeChunked } from "./message-chunks.js";
import type { ObservedCall, RpcObserver } from "./rpc-observer.js";
import { rpcRecordKey } from "./rpc-observer.js";

/**
 * The host's lean request path: unary and server-streaming calls over the
 * gRPC protocol with protobuf messages and no request compression, which
 * is nearly every call a gRPC client makes. It decodes the request, runs
 * the same interceptors and the same `ServiceImpl` method connect would,
 * and encodes the answer straight onto the HTTP/2 stream, without connect's
 * per-call async-iterable pipeline, without the HTTP/1 compatibility
 * objects, and without abort machinery no one listens to: a call's
 * `AbortSignal`, request `Headers` and response `Headers` exist only once a
 * handler or interceptor reads them.
 *
 * What a client sees is what connect's gRPC handler sends: the same
 * headers (content type, x-request-id, date), the same trailers, error
 * codes and messages, size limits, deadline parsing, and the same
 * treatment of an unread request body. Anything else (other protocols,
 * compressed requests, client and bidi streams, a response that may be
 * compressed) is left to connect: `serve` returns false.
 */

/** The frame header: one flags byte and a big-endian u32 length. */
const HEADER_BYTES = 5;
const FLAG_COMPRESSED = 0x01;
/** Messages up to this size are copied behind their header into one write; larger ones are written as they are. */
const COPY_MAX_BYTES = 16 * 1024;
/** A top-level bytes field from this size on is sent from the handler's buffer, not copied (message-chunks.ts). */
const CHUNKED_MIN_BYTES = 64 * 1024;

type Impl = (input: unknown, ctx: HandlerContext) => unknown;

interface Route {
  readonly method: DescMethod;
  readonly impl: Impl;
  readonly streaming: boolean;
}

export interface FastPathOptions {
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

/** The lean path's routes and the entry point for an HTTP/2 stream. */
export class FastPath {
  private readonly routes = new Map<string, Route>();
  /** The interceptors applied around a call's method, built once per route. */
  private readonly chains = new Map<Route, (req: UnaryRequest | StreamRequest) => Promise<unknown>>();

  constructor(readonly options: FastPathOptions) {}

  /** Serves the unary and server-streaming methods of `service` that `implementation` defines. */
  addService(service: DescService, implementation: object): void {
    for (const method of service.methods) {
      if (method.methodKind !== "unary" && method.methodKind !== "server_streaming") continue;
      const fn = (implementation as Record<string, unknown>)[method.localName];
      // An unimplemented method is connect's to answer (UNIMPLEMENTED).
      if (typeof fn !== "function") continue;
      const route: Route = { method, impl: (fn as Impl).bind(implementation), streaming: method.methodKind === "server_streaming" };
      this.routes.set(`/${service.typeName}/${method.name}`, route);
    }
  }

  /**
   * Takes the stream when the call is one the lean path serves; returns
   * false, having touched nothing, when connect should have it.
   */
  serve(stream: ServerHttp2Stream, headers: IncomingHttpHeaders): boolean {
    const path = headers[":path"];
    if (path === undefined || headers[":method"] !== "POST") return false;
    const route = this.routes.get(path);
    if (route === undefined) return false;
    const type = headers["content-type"];
    if (type !== "application/grpc" && type !== "application/grpc+proto") return false;
    const encoding = headers["grpc-encoding"];
    if (encoding !== undefined && encoding !== "identity") return false;
    if (this.options.declineCompressible && negotiatedEncoding(headers["grpc-accept-encoding"]) !== undefined) return false;
    this.options.taken.inc();
    const call = new GrpcCall(this, route, stream, headers, this.options.observer.open(path, headers));
    void call.run();
    return true;
  }

  /** The interceptor chain around `route`'s method, as connect's applyInterceptors builds it. */
  chainFor(route: Route): (req: UnaryRequest | StreamRequest) => Promise<unknown> {
    let chain = this.chains.get(route);
    if (chain === undefined) {
      const invoke = (req: UnaryRequest | StreamRequest) => invokeMethod(route, req);
      chain = [...this.options.interceptors].reverse().reduce(
        (next, interceptor) => interceptor(next as never) as never,
        invoke as (req: UnaryRequest | StreamRequest) => Promise<unknown>,
      );
      this.chains.set(route, chain);
    }
    return chain;
  }
}

/** The request message, or the reason there is none, as a one-message stream for server-streaming interceptors. */
class SingleInput implements AsyncIterable<unknown> {
  constructor(readonly message: Promise<unknown>) {}
  async *[Symbol.asyncIterator](): AsyncIterator<unknown> {
    yield await this.message;
  }
}

/** Tags a call's request and response objects (copied along when an interceptor spreads them). */
const callKey = Symbol("mmgate.fastPathCall");
type Tagged = { [callKey]?: GrpcCall };

/** The innermost step of the interceptor chain: the method itself, as connect invokes it. */
async function invokeMethod(route: Route, req: UnaryRequest | StreamRequest): Promise<unknown> {
  const call = (req as Tagged)[callKey];
  if (call === undefined) throw new ConnectError("an interceptor passed on a request it built itself; the lean path cannot serve it", Code.Internal);
  const ctx = call.contextFor(req);
  if (!route.streaming) {
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
  return isMessage(value, desc) ? value : create(desc, value as never);
}

async function* normalizeAll(desc: DescMessage, source: AsyncIterable<unknown>): AsyncGenerator<unknown> {
  for await (const value of source) yield normalize(desc, value);
}

let dateSecond = -1;
let dateValue = "";
/** The Date header, formatted once a second (the HTTP/2 compatibility layer sends one too). */
function httpDate(): string {
  const now = Date.now();
  const second = Math.floor(now / 1000);
  if (second !== dateSecond) {
    dateSecond = second;
    dateValue = new Date(now).toUTCString();
  }
  return dateValue;
}

function headersOf(incoming: IncomingHttpHeaders): Headers {
  const out = new Headers();
  for (const name of Object.keys(incoming)) {
    if (name.startsWith(":")) continue;
    const value = incoming[name];
    if (value === undefined) continue;
    if (Array.isArray(value)) for (const v of value) out.append(name, v);
    else out.append(name, value);
  }
  return out;
}

/** Copies `from` into node headers; a name given more than once (set-cookie) becomes a list, as connect-node sends it. */
function addTo(target: OutgoingHttpHeaders, from: Headers): void {
  from.forEach((value, name) => {
    const existing = target[name];
    if (existing === undefined || name.startsWith(":")) target[name] = value;
    else if (Array.isArray(existing)) existing.push(value);
    else target[name] = [String(existing), value];
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
  readonly [callKey]: GrpcCall;
  constructor(
    call: GrpcCall,
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
  readonly [callKey]: GrpcCall;
  constructor(
    call: GrpcCall,
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

/**
 * Stream listeners shared by every call: the stream is `this`, its call
 * hangs off it. Closures per call would each cost an allocation (and, run
 * through tsx, a defineProperty for their name) on the hottest path.
 */
type CallStream = ServerHttp2Stream & { [callKey]?: GrpcCall };
function ignoreError(): void {}
function onStreamClose(this: CallStream): void {
  this[callKey]?.onClose();
}
function onWantTrailers(this: CallStream): void {
  this[callKey]?.sendTrailers();
}
function onRequestData(this: CallStream, chunk: Buffer): void {
  this[callKey]?.input?.data(chunk);
}
function onRequestEnd(this: CallStream): void {
  this[callKey]?.input?.end();
}

/** One call on the lean path; also the HandlerContext its handler gets. */
class GrpcCall implements HandlerContext {
  readonly requestMethod = "POST";
  readonly protocolName = "grpc";
  readonly service: DescService;
  readonly method: DescMethod;
  readonly values: ContextValues;
  /** Absolute deadline (Date.now() scale), when the client sent grpc-timeout. */
  private readonly deadline: number | undefined;
  private readonly timeoutError: ConnectError | undefined;
  private controller: AbortController | undefined;
  private deadlineTimer: NodeJS.Timeout | undefined;
  private requestHeaders: Headers | undefined;
  private responseHeaders: Headers | undefined;
  private responseTrailers: Headers | undefined;
  private headersSent = false;
  /** The status code in the trailers sent; undefined until they are. */
  private sentCode: Code | 0 | undefined;
  /** Set once the trailers went out: the client has its status. */
  private trailersSent = false;
  /** Set once the stream closed, whatever the reason. */
  private closed = false;

  constructor(
    private readonly path: FastPath,
    private readonly route: Route,
    private readonly stream: ServerHttp2Stream,
    private readonly headers: IncomingHttpHeaders,
    private readonly observed: ObservedCall,
  ) {
    this.method = route.method;
    this.service = route.method.parent;
    this.values = new CallValues().set(rpcRecordKey, observed.record);
    (stream as CallStream)[callKey] = this;
    const timeout = headers["grpc-timeout"];
    if (typeof timeout === "string") {
      const parsed = parseTimeout(timeout, path.options.maxTimeoutMs ?? Number.MAX_SAFE_INTEGER);
      this.timeoutError = parsed.error;
      if (parsed.timeoutMs !== undefined) this.deadline = Date.now() + parsed.timeoutMs;
    }
  }

  get url(): string {
    const scheme = this.path.options.tls ? "https" : "http";
    return `${scheme}://${this.headers[":authority"] ?? ""}${this.headers[":path"] ?? ""}`;
  }

  get requestHeader(): Headers {
    return (this.requestHeaders ??= headersOf(this.headers));
  }

  get responseHeader(): Headers {
    return (this.responseHeaders ??= new Headers());
  }

  get responseTrailer(): Headers {
    return (this.responseTrailers ??= new Headers());
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
      shutdown.addEventListener("abort", this.onShutdown);
      if (this.deadline !== undefined) {
        const left = this.deadline - Date.now();
        if (left <= 0) controller.abort(deadlineExceeded());
        else this.deadlineTimer = setTimeout(() => controller.abort(deadlineExceeded()), left);
      }
    }
    return controller.signal;
  }

  private readonly onShutdown = (): void => {
    this.controller?.abort(this.path.options.shutdownSignal.reason);
  };

  async run(): Promise<void> {
    const stream = this.stream;
    stream.on("error", ignoreError);
    stream.once("close", onStreamClose);
    try {
      const chain = this.path.chainFor(this.route);
      if (!this.route.streaming) {
        const req = this.request(false, await this.readInput());
        const res = (await chain(req)) as UnaryResponse;
        this.adopt(res, "header");
        this.adopt(res, "trailer");
        this.sendMessage(this.serialize(res.message), true);
      } else {
        const input = this.readInput();
        // Read at once, so that an oversized request is refused as it
        // arrives; the failure surfaces where the method takes its input.
        input.catch(() => undefined);
        const res = (await chain(this.request(true, new SingleInput(input)))) as StreamResponse;
        this.adopt(res, "header");
        await this.writeAll(res.message);
        this.adopt(res, "trailer");
        this.finish(undefined);
      }
    } catch (error) {
      this.finish(error);
    }
  }

  /** The request the interceptors see; its signal and header exist once read. */
  private request(streaming: boolean, message: unknown): UnaryRequest | StreamRequest {
    const req = new LeanRequest(this, streaming, message);
    this.originalRequest = req;
    return req as unknown as UnaryRequest | StreamRequest;
  }

  private originalRequest: object | undefined;
  private originalResponse: object | undefined;

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
  private adopt(res: UnaryResponse | StreamResponse, field: "header" | "trailer"): void {
    if (res === this.originalResponse) return;
    const given = res[field] as Headers | undefined;
    if (given === undefined) return;
    if (field === "header" && given !== this.responseHeaders) this.responseHeaders = given;
    if (field === "trailer" && given !== this.responseTrailers) this.responseTrailers = given;
  }

  /** Writes every message of a server stream, waiting while the client's window is full. */
  private async writeAll(messages: AsyncIterable<unknown>): Promise<void> {
    const it = messages[Symbol.asyncIterator]();
    let done = false;
    try {
      while (!this.closed) {
        const next = await it.next();
        if (next.done === true) {
          done = true;
          return;
        }
        if (!this.sendMessage(this.serialize(next.value), false)) await this.drained();
      }
    } finally {
      // The client left, or a message could not be sent: the method's
      // generator is stopped (its finally blocks run), as connect does.
      if (!done) await it.return?.().catch(() => undefined);
    }
  }

  private drained(): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        this.stream.off("drain", done);
        this.stream.off("close", done);
        resolve();
      };
      this.stream.on("drain", done);
      this.stream.on("close", done);
    });
  }

  /** The message's bytes: one buffer, or (a big top-level bytes field) chunks that concatenate to it. */
  private serialize(message: unknown): Uint8Array | Uint8Array[] {
    let bytes: Uint8Array | Uint8Array[];
    let length: number;
    try {
      const chunks = serializeChunked(this.method.output, message as Record<string, unknown>, CHUNKED_MIN_BYTES);
      if (chunks === undefined) {
        bytes = toBinary(this.method.output, message as never);
        length = bytes.byteLength;
      } else {
        bytes = chunks;
        length = chunks.reduce((sum, c) => sum + c.byteLength, 0);
      }
    } catch (e) {
      throw new ConnectError(`serialize binary: ${e instanceof Error ? e.message : String(e)}`, Code.Internal);
    }
    const max = this.path.options.writeMaxBytes;
    if (length > max) {
      throw new ConnectError(`message size ${length} is larger than configured writeMaxBytes ${max}`, Code.ResourceExhausted);
    }
    return bytes;
  }

  private respond(): void {
    this.headersSent = true;
    const head: OutgoingHttpHeaders = {
      ":status": 200,
      "x-request-id": this.observed.record.requestId,
      "content-type": "application/grpc+proto",
      date: httpDate(),
    };
    // connect names the encoding it negotiated even when it compresses
    // nothing (its frames then carry flag 0): the same header here.
    const encoding = negotiatedEncoding(this.headers["grpc-accept-encoding"]);
    if (encoding !== undefined) head["grpc-encoding"] = encoding;
    if (this.responseHeaders !== undefined) addTo(head, this.responseHeaders);
    this.stream.respond(head, { waitForTrailers: true });
    this.stream.once("wantTrailers", onWantTrailers);
  }

  private trailers: OutgoingHttpHeaders = {};

  sendTrailers(): void {
    try {
      this.stream.sendTrailers(this.trailers);
      this.trailersSent = true;
    } catch {
      // The client reset the stream meanwhile.
    }
    // A request body still arriving is cut once the answer is out, as on
    // connect's path (RST_STREAM NO_ERROR after END_STREAM).
    if (!this.stream.readableEnded) setImmediate(cutUnreadRequest, this.stream);
  }

  /** Writes one message frame; returns false when the stream asks the writer to wait. */
  private sendMessage(bytes: Uint8Array | Uint8Array[], last: boolean): boolean {
    const stream = this.stream;
    if (this.closed || stream.destroyed) return true;
    if (!this.headersSent) this.respond();
    if (last) this.trailers = this.trailerStatus(undefined);
    if (!Array.isArray(bytes) && bytes.byteLength <= COPY_MAX_BYTES) {
      // Small: header and message in one buffer, one DATA frame.
      const frame = Buffer.allocUnsafe(HEADER_BYTES + bytes.byteLength);
      writeHeader(frame, bytes.byteLength);
      frame.set(bytes, HEADER_BYTES);
      if (last) {
        stream.end(frame);
        return true;
      }
      return stream.write(frame);
    }
    // Large: the header, then the message's own buffers, none copied.
    const parts = Array.isArray(bytes) ? bytes : [bytes];
    const header = Buffer.allocUnsafe(HEADER_BYTES);
    writeHeader(header, parts.reduce((sum, p) => sum + p.byteLength, 0));
    stream.cork();
    stream.write(header);
    let ok = true;
    for (let i = 0; i < parts.length - 1; i++) ok = stream.write(parts[i]!);
    if (last) stream.end(parts[parts.length - 1]);
    else ok = stream.write(parts[parts.length - 1]!);
    process.nextTick(uncork, stream);
    return last || ok;
  }

  /** Ends the response: trailers only (after the headers), with `error`'s status or OK. */
  private finish(error: unknown): void {
    const stream = this.stream;
    if (this.closed || stream.destroyed || this.sentCode !== undefined) return;
    try {
      if (!this.headersSent) this.respond();
      this.trailers = this.trailerStatus(error);
      stream.end();
    } catch {
      // The stream went away between the check and the write.
    }
  }

  private trailerStatus(error: unknown): OutgoingHttpHeaders {
    const target = new Headers(this.responseTrailers);
    let status: ConnectError | undefined;
    if (error instanceof ConnectError) status = error;
    else if (error !== undefined) status = new ConnectError("internal error", Code.Internal, undefined, undefined, error);
    if (status === undefined && this.responseTrailers === undefined) {
      this.sentCode = 0;
      return { "grpc-status": "0" };
    }
    setTrailerStatus(target, status);
    this.sentCode = status?.code ?? 0;
    const out: OutgoingHttpHeaders = {};
    addTo(out, target);
    return out;
  }

  onClose(): void {
    this.closed = true;
    this.input?.abort();
    clearTimeout(this.deadlineTimer);
    this.path.options.shutdownSignal.removeEventListener("abort", this.onShutdown);
    if (this.controller !== undefined && !this.controller.signal.aborted) {
      // As connect's request signal: a reset is a cancellation; a normal end aborts without a reason.
      const code = this.stream.rstCode;
      if (code !== undefined && code !== 0 && this.sentCode === undefined) {
        this.controller.abort(new ConnectError(`http/2 stream closed with error code ${code}`, Code.Canceled));
      } else this.controller.abort();
    }
    // A response cut short (reset by the client, cut at the grace) gave the
    // client no status: CANCELLED, or the status the interceptor recorded.
    this.path.options.observer.close(this.observed, this.trailersSent && this.sentCode !== undefined ? this.sentCode : (this.observed.record.code ?? Code.Canceled));
  }

  /** The request body's reader while it is read. */
  input: InputReader | undefined;

  /**
   * Reads the request's one message (see InputReader); a bad deadline
   * fails it first, as connect's handler does.
   */
  private readInput(): Promise<unknown> {
    if (this.timeoutError !== undefined) return Promise.reject(this.timeoutError);
    const reader = new InputReader(this.stream, this.method.input, this.path.options.readMaxBytes, this.route.streaming ? "server-streaming" : "unary");
    this.input = reader;
    const stream = this.stream;
    stream.on("data", onRequestData);
    stream.once("end", onRequestEnd);
    return reader.message;
  }
}

/**
 * Reads a request body that must hold exactly one message frame. Fails as
 * connect's gRPC handler does for an oversized, compressed, truncated,
 * missing or extra message, or one that does not parse. The size is
 * checked from the frame header, before anything is allocated; a message
 * that arrives in one chunk is parsed in place. Stricter than connect in
 * one respect: a frame cut short at the end of the body is INVALID_ARGUMENT
 * "incomplete envelope" even when only its header arrived (connect then
 * answers as if the frame were absent).
 */
class InputReader {
  readonly message: Promise<unknown>;
  private resolve!: (message: unknown) => void;
  private reject!: (error: ConnectError) => void;
  private settled = false;
  /** A frame header split across chunks, while it is completed. */
  private header: Buffer | undefined;
  private headerFilled = 0;
  private flags = 0;
  /** Inside a frame's payload: its length, and how much of it arrived. */
  private inFrame = false;
  private expected = 0;
  private filled = 0;
  /** A frame's payload while it arrives over several chunks. */
  private body: Uint8Array | undefined;
  /** The request message, once its frame arrived and parsed. */
  private received: unknown;

  constructor(
    private readonly stream: ServerHttp2Stream,
    private readonly desc: DescMessage,
    private readonly readMaxBytes: number,
    private readonly kind: string,
  ) {
    this.message = new Promise((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
    });
  }

  data(chunk: Buffer): void {
    let at = 0;
    while (at < chunk.length && !this.settled) {
      if (!this.inFrame) {
        let length: number;
        if (this.headerFilled === 0 && chunk.length - at >= HEADER_BYTES) {
          this.flags = chunk[at]!;
          length = chunk.readUInt32BE(at + 1);
          at += HEADER_BYTES;
        } else {
          const header = (this.header ??= Buffer.allocUnsafe(HEADER_BYTES));
          const take = Math.min(HEADER_BYTES - this.headerFilled, chunk.length - at);
          chunk.copy(header, this.headerFilled, at, at + take);
          this.headerFilled += take;
          at += take;
          if (this.headerFilled < HEADER_BYTES) return;
          this.headerFilled = 0;
          this.flags = header[0]!;
          length = header.readUInt32BE(1);
        }
        if (length > this.readMaxBytes) {
          this.fail(new ConnectError(`message size ${length} is larger than configured readMaxBytes ${this.readMaxBytes}`, Code.ResourceExhausted));
          return;
        }
        if (chunk.length - at >= length) {
          this.complete(chunk.subarray(at, at + length));
          at += length;
          continue;
        }
        this.inFrame = true;
        this.expected = length;
        this.filled = 0;
        this.body = new Uint8Array(length);
        continue;
      }
      const body = this.body!;
      const take = Math.min(this.expected - this.filled, chunk.length - at);
      body.set(chunk.subarray(at, at + take), this.filled);
      this.filled += take;
      at += take;
      if (this.filled === this.expected) {
        this.inFrame = false;
        this.body = undefined;
        this.complete(body);
      }
    }
  }

  end(): void {
    if (this.settled) return;
    if (this.inFrame || this.headerFilled > 0) this.fail(new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument));
    else if (this.received === undefined) this.fail(new ConnectError(`protocol error: missing input message for ${this.kind} method`, Code.Unimplemented));
    else {
      this.settle();
      this.resolve(this.received);
    }
  }

  /** The stream closed before the body ended. */
  abort(): void {
    if (!this.settled) this.fail(new ConnectError("the client closed the stream before sending its request", Code.Canceled));
  }

  /**
   * A whole frame arrived: checked and parsed at once, so that errors come
   * in connect's order (a second frame's own fault before "extra message").
   */
  private complete(bytes: Uint8Array): void {
    if ((this.flags & FLAG_COMPRESSED) !== 0) {
      this.fail(new ConnectError("received compressed envelope, but do not know how to decompress", Code.Internal));
      return;
    }
    let message: unknown;
    try {
      message = fromBinary(this.desc, bytes);
    } catch (e) {
      this.fail(new ConnectError(`parse binary: ${e instanceof Error ? e.message : String(e)}`, Code.Internal));
      return;
    }
    if (this.received !== undefined) this.fail(new ConnectError(`protocol error: received extra input message for ${this.kind} method`, Code.Unimplemented));
    else this.received = message;
  }

  /** Stops reading: what is left of the body is cut once the answer is out. */
  private fail(error: ConnectError): void {
    this.settle();
    this.stream.pause();
    this.reject(error);
  }

  private settle(): void {
    this.settled = true;
    this.stream.off("data", onRequestData);
    this.stream.off("end", onRequestEnd);
  }
}

/** The encodings the host accepts, in connect-node's order. */
const ENCODINGS = ["gzip", "br"];
let lastAccepted: string | undefined;
let lastNegotiated: string | undefined;

/** The first encoding in the client's grpc-accept-encoding that the host has (as connect's negotiation picks it). */
function negotiatedEncoding(accepted: string | string[] | undefined): string | undefined {
  if (accepted === undefined || accepted === "") return undefined;
  const text = Array.isArray(accepted) ? accepted.join(",") : accepted;
  // Clients send the same value on every call: remember the last answer.
  if (text !== lastAccepted) {
    lastAccepted = text;
    lastNegotiated = text.split(",").map((n) => n.trim()).find((n) => ENCODINGS.includes(n));
  }
  return lastNegotiated;
}

function cutUnreadRequest(stream: ServerHttp2Stream): void {
  if (!stream.readableEnded && !stream.destroyed) stream.destroy();
}

function uncork(stream: ServerHttp2Stream): void {
  stream.uncork();
}

function writeHeader(target: Buffer, length: number): void {
  target[0] = 0;
  target.writeUInt32BE(length, 1);
}

function deadlineExceeded(): ConnectError {
  return new ConnectError("the operation timed out", Code.DeadlineExceeded);
}
