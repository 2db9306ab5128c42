import type { IncomingHttpHeaders, OutgoingHttpHeaders, ServerHttp2Stream } from "node:http2";
import type { DescMessage, DescService } from "@bufbuild/protobuf";
import { fromBinary } from "@bufbuild/protobuf";
import type { StreamRequest, StreamResponse, UnaryRequest, UnaryResponse } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";
import { parseTimeout, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { acceptsEncodedKey } from "../wire/index.js";
import type { CallHost, FastPathOptions, Impl, Route } from "./fast-path-call.js";
import {
  LeanCall,
  SingleInput,
  cutUnreadRequest,
  httpDate,
  ignoreError,
  invokeMethod,
  negotiatedEncoding,
  onStreamClose,
  onWantTrailers,
  resetStream,
  setAll,
  SettlingBodyReader,
  uncork,
} from "./fast-path-call.js";
import { ConnectCall, connectUnaryFormat } from "./fast-path-connect.js";
import { preEncodedEnvelope } from "./pre-encoded.js";
import type { ObservedCall } from "./rpc-observer.js";
import { peerOf, recordStatus } from "./rpc-observer.js";

export type { FastPathOptions } from "./fast-path-call.js";

/**
 * The host's lean request path: unary and server-streaming calls over the
 * gRPC protocol with protobuf messages and no request compression, which
 * is nearly every call a gRPC client makes, and unary calls over the
 * Connect protocol (POST, binary or JSON, uncompressed; fast-path-connect.ts).
 * It decodes the request, runs the same interceptors and the same
 * `ServiceImpl` method connect would, and encodes the answer straight onto
 * the HTTP/2 stream, without connect's per-call async-iterable pipeline,
 * without the HTTP/1 compatibility objects, and without abort machinery no
 * one listens to: a call's `AbortSignal`, request `Headers` and response
 * `Headers` exist only once a handler or interceptor reads them
 * (fast-path-call.ts, shared by both protocols).
 *
 * What a client sees is what connect's handler for the protocol sends: the
 * same headers (content type, x-request-id, date), the same trailers, error
 * codes and messages, size limits, deadline parsing, and the same
 * treatment of an unread request body. Anything else (other protocols,
 * compressed requests, client and bidi streams, Connect streams and GET
 * requests, a response that may be compressed) is left to connect: `serve`
 * returns false.
 */

/** The frame header: one flags byte and a big-endian u32 length. */
const HEADER_BYTES = 5;
const FLAG_COMPRESSED = 0x01;
/** Messages up to this size are copied behind their header into one write; larger ones are written as they are. */
const COPY_MAX_BYTES = 16 * 1024;

/** The lean path's routes and the entry point for an HTTP/2 stream. */
export class FastPath implements CallHost {
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
    if (type === "application/grpc" || type === "application/grpc+proto") {
      const encoding = headers["grpc-encoding"];
      if (encoding !== undefined && encoding !== "identity") return false;
      if (this.options.declineCompressible && negotiatedEncoding(headers["grpc-accept-encoding"]) !== undefined) return false;
      this.options.taken.inc();
      const call = new GrpcCall(this, route, stream, headers, this.options.observer.open(path, headers, peerOf(stream.session?.socket), stream));
      void call.run();
      return true;
    }
    // Connect: unary methods only (a Connect stream has a content type of its own).
    if (route.streaming) return false;
    const binary = connectUnaryFormat(type);
    if (binary === undefined) return false;
    const encoding = headers["content-encoding"];
    if (encoding !== undefined && encoding !== "identity") return false;
    if (this.options.declineCompressible && negotiatedEncoding(headers["accept-encoding"]) !== undefined) return false;
    this.options.taken.inc();
    const call = new ConnectCall(this, route, stream, headers, this.options.observer.open(path, headers, peerOf(stream.session?.socket), stream), binary);
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

/** One gRPC call on the lean path; also the HandlerContext its handler gets. */
class GrpcCall extends LeanCall {
  readonly protocolName = "grpc";
  private headersSent = false;

  constructor(path: CallHost, route: Route, stream: ServerHttp2Stream, headers: IncomingHttpHeaders, observed: ObservedCall) {
    const timeout = headers["grpc-timeout"];
    super(path, route, stream, headers, observed, typeof timeout === "string" ? parseTimeout(timeout, path.options.maxTimeoutMs ?? Number.MAX_SAFE_INTEGER) : undefined);
    // Its frames are binary and never compressed: a relayed encoding goes out as it is.
    this.values.set(acceptsEncodedKey, true);
  }

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
        this.sendMessage(this.serializeBinary(res.message), true);
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
        // A message serialized once for many calls (pre-encoded.ts) goes out as its bytes, copied nowhere.
        const envelope = preEncodedEnvelope(next.value, this.method.output);
        const ok = envelope === undefined ? this.sendMessage(this.serializeBinary(next.value), false) : this.sendEnvelope(envelope);
        if (!ok) await this.drained();
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
    if (this.responseHeaders !== undefined) setAll(head, this.responseHeaders);
    try {
      this.stream.respond(head, { waitForTrailers: true });
    } catch (e) {
      // Headers Node refuses to send (a connection-specific one a handler
      // set): the stream is reset rather than left without an answer.
      resetStream(this.stream);
      throw e;
    }
    this.stream.once("wantTrailers", onWantTrailers);
  }

  private trailers: OutgoingHttpHeaders = {};

  sendTrailers(): void {
    try {
      this.stream.sendTrailers(this.trailers);
      this.answered = true;
    } catch {
      // The client reset the stream meanwhile, or Node refused a trailer:
      // either way the stream must not be left waiting for its end.
      resetStream(this.stream);
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

  /** Writes one whole length-prefixed message as it is (not the last); returns false when the stream asks the writer to wait. */
  private sendEnvelope(envelope: Buffer): boolean {
    const length = envelope.byteLength - HEADER_BYTES;
    const max = this.path.options.writeMaxBytes;
    if (length > max) throw new ConnectError(`message size ${length} is larger than configured writeMaxBytes ${max}`, Code.ResourceExhausted);
    const stream = this.stream;
    if (this.closed || stream.destroyed) return true;
    if (!this.headersSent) this.respond();
    return stream.write(envelope);
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
      // The stream went away between the check and the write, or the status
      // could not be put in trailers: never leave the client without an end.
      resetStream(stream);
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
    if (status !== undefined) recordStatus(this.observed.record, status);
    const out: OutgoingHttpHeaders = {};
    setAll(out, target);
    return out;
  }

  /**
   * Reads the request's one message (see InputReader); a bad deadline
   * fails it first, as connect's handler does.
   */
  private readInput(): Promise<unknown> {
    if (this.timeoutError !== undefined) return Promise.reject(this.timeoutError);
    const reader = new InputReader(this.stream, this.method.input, this.path.options.readMaxBytes, this.route.streaming ? "server-streaming" : "unary");
    this.listenToBody(reader);
    return reader.result;
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
class InputReader extends SettlingBodyReader<unknown> {
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
    stream: ServerHttp2Stream,
    private readonly desc: DescMessage,
    private readonly readMaxBytes: number,
    private readonly kind: string,
  ) {
    super(stream);
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
    else this.succeed(this.received);
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

}

function writeHeader(target: Buffer, length: number): void {
  target[0] = 0;
  target.writeUInt32BE(length, 1);
}
