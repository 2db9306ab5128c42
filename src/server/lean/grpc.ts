import type { IncomingHttpHeaders, OutgoingHttpHeaders, ServerHttp2Stream } from "node:http2";
import type { DescMessage } from "@bufbuild/protobuf";
import type { ContextValues, StreamResponse, UnaryResponse } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";
import { parseTimeout, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import type { EnvelopeSink } from "../../wire/index.js";
import {
  acceptsEncodedKey,
  checkFrames,
  compressedEnvelopeError,
  EncodedFrames,
  EncodedMessage,
  type EncodedRequests,
  encodedRequestsKey,
  ENVELOPE_HEADER_BYTES,
  EnvelopeReader,
  FLAG_COMPRESSED,
  incompleteEnvelopeError,
  parseMessage,
  requestEncodingKey,
  writeEnvelope,
  writeLimitError,
} from "../../wire/index.js";
import { preEncodedEnvelope } from "../pre-encoded.js";
import type { ObservedCall } from "../rpc-observer.js";
import { recordStatus } from "../rpc-observer.js";
import type { BodyReader, CallHost, Route } from "./call.js";
import {
  LeanCall,
  SingleInput,
  cutUnreadRequest,
  httpDate,
  ignoreError,
  negotiatedEncoding,
  onStreamClose,
  onWantTrailers,
  resetStream,
  setAll,
  SettlingBodyReader,
  stopReading,
} from "./call.js";

/**
 * The lean path's gRPC protocol: unary, server-streaming and
 * client-streaming calls with protobuf messages and no request compression,
 * answered as connect's gRPC handler answers them (headers, trailers,
 * status, limits).
 */

/** One gRPC call on the lean path; also the HandlerContext its handler gets. */
export class GrpcCall extends LeanCall {
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
      if (this.route.clientStreaming) {
        // A bad deadline fails the call before the method runs, as connect's handler does.
        if (this.timeoutError !== undefined) throw this.timeoutError;
        const req = this.request(true, this.readStream());
        const res = (await chain(req)) as UnaryResponse;
        this.adopt(res, "header");
        this.adopt(res, "trailer");
        this.sendMessage(this.serializeBinary(res.message), true);
      } else if (!this.route.streaming) {
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
        const value = next.value;
        let ok: boolean;
        // Relayed frames, and a message serialized once for many calls (pre-encoded.ts), go out as their bytes, copied nowhere.
        if (value instanceof EncodedFrames) ok = this.sendFrames(value);
        else {
          const envelope = preEncodedEnvelope(value, this.method.output);
          ok = envelope === undefined ? this.sendMessage(this.serializeBinary(value), false) : this.sendEnvelope(envelope);
        }
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
    return writeEnvelope(stream, bytes, last);
  }

  /** Writes one whole length-prefixed message as it is (not the last); returns false when the stream asks the writer to wait. */
  private sendEnvelope(envelope: Buffer): boolean {
    const length = envelope.byteLength - ENVELOPE_HEADER_BYTES;
    const max = this.path.options.writeMaxBytes;
    if (length > max) throw writeLimitError(length, max);
    const stream = this.stream;
    if (this.closed || stream.destroyed) return true;
    if (!this.headersSent) this.respond();
    return stream.write(envelope);
  }

  /** Writes relayed frames as they are, each message checked against writeMaxBytes first; returns false when the stream asks the writer to wait. */
  private sendFrames(frames: EncodedFrames): boolean {
    checkFrames(frames, this.path.options.writeMaxBytes);
    const stream = this.stream;
    if (this.closed || stream.destroyed) return true;
    if (!this.headersSent) this.respond();
    return stream.write(frames.bytes);
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
   * A client stream's messages, each parsed when the method takes it (as
   * its encoding once the method asked: readsEncodedRequests). The body is
   * split into frames as it arrives, each checked against readMaxBytes from
   * its header; while more than STREAM_READ_AHEAD_BYTES of messages wait to
   * be taken the stream is paused, so HTTP/2 flow control holds the client
   * back. A frame that cannot be taken (over the limit, compressed, cut
   * short at the end, or a message that does not parse) fails the stream
   * where the method reaches it, after the messages before it, with
   * connect's errors.
   */
  private readStream(): StreamInput {
    const input = new StreamInput(this.stream, this.method.input, this.route.readMaxBytes);
    this.values.set(encodedRequestsKey, input);
    this.listenToBody(input);
    return input;
  }

  /**
   * Reads the request's one message (see InputReader); a bad deadline
   * fails it first, as connect's handler does.
   */
  private readInput(): Promise<unknown> {
    if (this.timeoutError !== undefined) return Promise.reject(this.timeoutError);
    const reader = new InputReader(this.stream, this.method.input, this.route.readMaxBytes, this.route.streaming ? "server-streaming" : "unary", this.values);
    this.listenToBody(reader);
    return reader.result;
  }
}

/**
 * How far a client stream is read ahead of its method: whole messages that
 * arrived and wait to be taken, up to this many bytes, before the stream
 * is paused (then HTTP/2 flow control holds the client back). Enough that
 * a client is not stalled for a window update each time the method takes
 * a message; with a partly arrived message (at most the receive limit) it
 * bounds what one stream holds.
 */
const STREAM_READ_AHEAD_BYTES = 1024 * 1024;

/**
 * A client stream's request messages, read as the method asks for them
 * (see readStream).
 */
class StreamInput implements BodyReader, EnvelopeSink, EncodedRequests, AsyncIterable<unknown> {
  /** Whole messages that arrived and were not taken yet, and their bytes. */
  private readonly queue: Uint8Array[] = [];
  private queuedBytes = 0;
  private readonly envelopes: EnvelopeReader;
  /** Why the stream cannot go on, once a frame refused it; thrown after the messages before it. */
  private failure: ConnectError | undefined;
  private ended = false;
  /** The method stopped reading (left its loop): nothing more is taken. */
  private done = false;
  private encoded = false;
  private waiter: (() => void) | undefined;

  constructor(
    private readonly stream: ServerHttp2Stream,
    private readonly desc: DescMessage,
    readMaxBytes: number,
  ) {
    this.envelopes = new EnvelopeReader(this, readMaxBytes);
  }

  readEncoded(): void {
    this.encoded = true;
  }

  data(chunk: Buffer): void {
    if (this.done || this.failure !== undefined) return;
    this.envelopes.push(chunk);
    // Flow control holds the client back while the method has enough to take.
    if (this.queuedBytes >= STREAM_READ_AHEAD_BYTES) this.stream.pause();
    this.wake();
  }

  end(): void {
    if (this.envelopes.partial) this.failure ??= incompleteEnvelopeError();
    this.ended = true;
    this.wake();
  }

  abort(): void {
    if (!this.ended) this.failure ??= new ConnectError("the client closed the stream before sending its request", Code.Canceled);
    this.ended = true;
    this.wake();
  }

  onOversize(error: ConnectError): void {
    this.failure ??= error;
  }

  onMessage(flags: number, bytes: Uint8Array): boolean {
    if ((flags & FLAG_COMPRESSED) !== 0) {
      this.failure ??= compressedEnvelopeError();
      return false;
    }
    this.queue.push(bytes);
    this.queuedBytes += bytes.byteLength;
    return true;
  }

  private wake(): void {
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.();
  }

  /** The next message, parsed (or as its encoding), once it arrived; undefined at the end. */
  private async next(): Promise<unknown> {
    for (;;) {
      if (this.done) return undefined;
      const bytes = this.queue.shift();
      if (bytes !== undefined) {
        this.queuedBytes -= bytes.byteLength;
        if (this.queuedBytes < STREAM_READ_AHEAD_BYTES / 2 && this.stream.isPaused()) this.stream.resume();
        // (A view of what Node read, never reused: a handler may keep it.)
        if (this.encoded) return new EncodedMessage(bytes);
        try {
          return parseMessage(this.desc, bytes);
        } catch (error) {
          // As connect's stream ends at a message that does not parse: no message after it is read.
          this.stop();
          throw error;
        }
      }
      if (this.failure !== undefined) {
        this.stop();
        throw this.failure;
      }
      if (this.ended) return undefined;
      await new Promise<void>((resolve) => (this.waiter = resolve));
    }
  }

  /** Stops reading: what is left of the body is cut once the answer is out. */
  private stop(): void {
    this.done = true;
    this.queue.length = 0;
    this.queuedBytes = 0;
    stopReading(this.stream);
  }

  [Symbol.asyncIterator](): AsyncIterator<unknown> {
    return {
      next: async (): Promise<IteratorResult<unknown>> => {
        const value = await this.next();
        return value === undefined ? { done: true, value: undefined } : { done: false, value };
      },
      return: (): Promise<IteratorResult<unknown>> => {
        this.stop();
        return Promise.resolve({ done: true, value: undefined });
      },
    };
  }
}

/**
 * Reads a request body that must hold exactly one message frame. Fails as
 * connect's gRPC handler does for an oversized, compressed, truncated,
 * missing or extra message, or one that does not parse. The size is
 * checked from the frame header, before anything is allocated; a message
 * that arrives in one chunk is parsed in place (EnvelopeReader). Stricter
 * than connect in one respect: a frame cut short at the end of the body is
 * INVALID_ARGUMENT "incomplete envelope" even when only its header arrived
 * (connect then answers as if the frame were absent).
 */
class InputReader extends SettlingBodyReader<unknown> implements EnvelopeSink {
  private readonly envelopes: EnvelopeReader;
  /** The request message, once its frame arrived and parsed. */
  private received: unknown;

  constructor(
    stream: ServerHttp2Stream,
    private readonly desc: DescMessage,
    readMaxBytes: number,
    private readonly kind: string,
    private readonly values: ContextValues,
  ) {
    super(stream);
    this.envelopes = new EnvelopeReader(this, readMaxBytes);
  }

  data(chunk: Buffer): void {
    if (!this.settled) this.envelopes.push(chunk);
  }

  end(): void {
    if (this.settled) return;
    if (this.envelopes.partial) this.fail(incompleteEnvelopeError());
    else if (this.received === undefined) this.fail(new ConnectError(`protocol error: missing input message for ${this.kind} method`, Code.Unimplemented));
    else this.succeed(this.received);
  }

  /** The frame is over readMaxBytes. */
  onOversize(error: ConnectError): void {
    this.fail(error);
  }

  /**
   * A whole frame arrived: checked and parsed at once, so that errors come
   * in connect's order (a second frame's own fault before "extra message").
   */
  onMessage(flags: number, bytes: Uint8Array): boolean {
    if ((flags & FLAG_COMPRESSED) !== 0) {
      this.fail(compressedEnvelopeError());
      return false;
    }
    let message: unknown;
    try {
      message = parseMessage(this.desc, bytes);
    } catch (e) {
      this.fail(e as ConnectError);
      return false;
    }
    if (this.received !== undefined) this.fail(new ConnectError(`protocol error: received extra input message for ${this.kind} method`, Code.Unimplemented));
    else {
      this.received = message;
      // A view of what Node read, never reused: a relaying handler may send it on as it is.
      this.values.set(requestEncodingKey, bytes);
    }
    return !this.settled;
  }
}
