import type { IncomingHttpHeaders, OutgoingHttpHeaders, ServerHttp2Stream } from "node:http2";
import type { UnaryResponse } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";
import { createMethodSerializationLookup } from "@connectrpc/connect/protocol";
import {
  codeToHttpStatus,
  contentTypeUnaryJson,
  contentTypeUnaryProto,
  contentTypeUnaryRegExp,
  errorToJsonBytes,
  parseContentType,
  parseTimeout,
  trailerMux,
} from "@connectrpc/connect/protocol-connect";
import { readLimitError } from "../../wire/index.js";
import { jsonOptions } from "../json-options.js";
import type { ObservedCall } from "../rpc-observer.js";
import { recordStatus } from "../rpc-observer.js";
import type { CallHost, LeanPathOptions, Route } from "./call.js";
import { LeanCall, SettlingBodyReader, cutUnreadRequest, ignoreError, onStreamClose, onWantTrailers, resetStream, setAll, uncork } from "./call.js";

/**
 * The lean path's Connect unary calls: POST, `application/proto` or
 * `application/json` (with the charset parameter connect allows), no
 * `content-encoding`. It answers as connect's Connect handler
 * (protocol-connect/handler-factory.js) does: 200 and the message (binary,
 * or JSON with the host's options: unknown fields and enum names refused,
 * json-options.ts), or the error's
 * HTTP status and its JSON body (`{"code","message","details"}`) with the
 * error's metadata as headers; the handler's trailers as `trailer-<name>`
 * headers; content-length, x-request-id and date; connect-timeout-ms parsed
 * and bounded as connect does; the same size limit on the request body
 * (refused on its content-length before any of it is read), the same parse
 * errors, and the same treatment of a body left unread. Connect compresses
 * nothing below compressMinBytes and then names no encoding, so neither
 * does this path (calls that may get a compressed answer are connect's,
 * LeanPathOptions.declineCompressible).
 */

/** Whether `type` is a Connect unary content type, as connect matches it: true for binary, false for JSON, undefined when it is neither. */
export function connectUnaryFormat(type: string | undefined): boolean | undefined {
  if (type === contentTypeUnaryProto) return true;
  if (type === contentTypeUnaryJson) return false;
  // The router picks the Connect unary handler by this expression (case-insensitive, "; charset=utf-8"), which then parses the type.
  if (type === undefined || !contentTypeUnaryRegExp.test(type)) return undefined;
  return parseContentType(type)?.binary;
}

/** connect's serializers for the route's method, with its limits and the host's JSON options (as connectNodeAdapter makes them). */
function serializationOf(route: Route, options: LeanPathOptions): NonNullable<Route["connect"]> {
  return (route.connect ??= createMethodSerializationLookup(route.method, undefined, jsonOptions, {
    readMaxBytes: route.readMaxBytes,
    writeMaxBytes: options.writeMaxBytes,
  }));
}

/** Node sends no trailers for an empty object: an empty DATA frame ends the stream, as connect-node's compatibility layer ends it. */
const NO_TRAILERS: OutgoingHttpHeaders = Object.freeze({}) as OutgoingHttpHeaders;

/** One Connect unary call on the lean path; also the HandlerContext its handler gets. */
export class ConnectCall extends LeanCall {
  readonly protocolName = "connect";

  constructor(
    path: CallHost,
    route: Route,
    stream: ServerHttp2Stream,
    headers: IncomingHttpHeaders,
    observed: ObservedCall,
    /** Protobuf binary (application/proto), else JSON. */
    private readonly binary: boolean,
  ) {
    const timeout = headers["connect-timeout-ms"];
    super(path, route, stream, headers, observed, typeof timeout === "string" ? parseTimeout(timeout, path.options.maxTimeoutMs ?? Number.MAX_SAFE_INTEGER) : undefined);
  }

  /** As connect's: the response's content type is there from the start (and a handler may change it). */
  protected override initialResponseHeader(): Headers {
    return new Headers({ "content-type": this.binary ? contentTypeUnaryProto : contentTypeUnaryJson });
  }

  async run(): Promise<void> {
    const stream = this.stream;
    stream.on("error", ignoreError);
    stream.once("close", onStreamClose);
    let status = 200;
    let code: Code | 0 = 0;
    let body: Uint8Array | Uint8Array[];
    try {
      if (this.timeoutError !== undefined) throw this.timeoutError;
      const serialization = serializationOf(this.route, this.path.options);
      const input = serialization.getI(this.binary).parse(await this.readInput());
      const res = (await this.path.chainFor(this.route)(this.request(false, input))) as UnaryResponse;
      this.adopt(res, "header");
      this.adopt(res, "trailer");
      body = this.binary ? this.serializeBinary(res.message) : serialization.getO(false).serialize(res.message);
      // As connect's context once the method is done: aborted without a reason.
      this.controller?.abort();
    } catch (e) {
      // As connect's context after a failure: aborted with it.
      if (this.controller !== undefined && !this.controller.signal.aborted) this.controller.abort(e);
      const error = e instanceof ConnectError ? e : new ConnectError("internal error", Code.Internal, undefined, undefined, e);
      code = error.code;
      recordStatus(this.observed.record, error);
      status = codeToHttpStatus(code);
      const header = this.responseHeader;
      header.set("content-type", contentTypeUnaryJson);
      error.metadata.forEach((value, key) => header.set(key, value));
      body = errorBody(error);
    }
    this.answer(status, code, body);
  }

  /** Writes the answer: its headers (trailers among them), its body, then the end of the stream ("wantTrailers"). */
  private answer(status: number, code: Code | 0, body: Uint8Array | Uint8Array[]): void {
    const stream = this.stream;
    if (this.closed || stream.destroyed) return;
    let length = 0;
    if (Array.isArray(body)) for (const part of body) length += part.byteLength;
    else length = body.byteLength;
    // In connect-node's order: x-request-id (the observer's), the handler's
    // headers as a Headers object lists them (sorted), then the date, which
    // Node adds (sendDate).
    const head: OutgoingHttpHeaders = { ":status": status, "x-request-id": this.observed.record.requestId };
    if (this.responseHeaders === undefined && this.responseTrailers === undefined) {
      head["content-length"] = String(length);
      head["content-type"] = this.binary ? contentTypeUnaryProto : contentTypeUnaryJson;
    } else {
      const header = trailerMux(this.responseHeader, this.responseTrailer);
      header.set("content-length", String(length));
      setAll(head, header);
    }
    try {
      stream.respond(head, { waitForTrailers: true });
    } catch {
      // Headers Node refuses to send (a connection-specific one a handler
      // set): the stream is reset rather than left without an answer.
      resetStream(stream);
      return;
    }
    this.sentCode = code;
    stream.once("wantTrailers", onWantTrailers);
    if (!Array.isArray(body)) {
      stream.end(body);
      return;
    }
    stream.cork();
    for (let i = 0; i < body.length - 1; i++) stream.write(body[i]!);
    stream.end(body[body.length - 1]);
    process.nextTick(uncork, stream);
  }

  sendTrailers(): void {
    try {
      this.stream.sendTrailers(NO_TRAILERS);
      this.answered = true;
    } catch {
      // The client reset the stream meanwhile.
    }
    // A request body still arriving is cut once the answer is out, as on
    // connect's path (RST_STREAM NO_ERROR after END_STREAM).
    if (!this.stream.readableEnded) setImmediate(cutUnreadRequest, this.stream);
  }

  /** Reads the request body (see BodyBytes). */
  private readInput(): Promise<Uint8Array> {
    const reader = new BodyBytes(this.stream, this.route.readMaxBytes, this.headers["content-length"]);
    if (!reader.settled) this.listenToBody(reader);
    return reader.result;
  }
}

/** connect's JSON error body; an error it cannot serialize (connect would then send nothing at all) is answered as that failure. */
function errorBody(error: ConnectError): Uint8Array {
  try {
    return errorToJsonBytes(error, undefined);
  } catch (e) {
    return errorToJsonBytes(e instanceof ConnectError ? e : new ConnectError(String(e), Code.Internal), undefined);
  }
}

/**
 * Reads a Connect unary request body whole, as connect's readAllBytes
 * does: with a valid content-length, that many bytes (more or fewer is
 * INVALID_ARGUMENT "promised"), refused before any is read when it is over
 * readMaxBytes; without one, whatever comes, refused once it grows past
 * readMaxBytes. A body that arrives in one chunk is used as it is.
 */
class BodyBytes extends SettlingBodyReader<Uint8Array> {
  /** The content-length, when it is one connect takes; -1 otherwise. */
  private readonly expected: number;
  private received = 0;
  /** The body, while it is one chunk. */
  private first: Buffer | undefined;
  /** The body's chunks after the first, without a content-length. */
  private more: Buffer[] | undefined;
  /** The body, with a content-length, once it is more than one chunk. */
  private buffer: Uint8Array | undefined;

  constructor(
    stream: ServerHttp2Stream,
    private readonly readMaxBytes: number,
    contentLength: string | undefined,
  ) {
    super(stream);
    // connect's parseLengthHint: parseInt, then a safe integer >= 0.
    const hint = contentLength === undefined ? Number.NaN : parseInt(contentLength, 10);
    this.expected = Number.isSafeInteger(hint) && hint >= 0 ? hint : -1;
    if (this.expected > readMaxBytes) {
      this.fail(readLimitError(this.expected, readMaxBytes));
    }
  }

  data(chunk: Buffer): void {
    if (this.settled) return;
    const at = this.received;
    const total = at + chunk.byteLength;
    if (this.expected >= 0) {
      if (total > this.expected) {
        this.fail(new ConnectError(`protocol error: promised ${this.expected} bytes, received ${total}`, Code.InvalidArgument));
        return;
      }
      this.received = total;
      if (at === 0 && this.buffer === undefined) {
        this.first = chunk;
        return;
      }
      if (this.buffer === undefined) {
        this.buffer = new Uint8Array(this.expected);
        this.buffer.set(this.first!, 0);
        this.first = undefined;
      }
      this.buffer.set(chunk, at);
      return;
    }
    if (total > this.readMaxBytes) {
      this.fail(readLimitError(undefined, this.readMaxBytes));
      return;
    }
    this.received = total;
    if (this.first === undefined) this.first = chunk;
    else (this.more ??= []).push(chunk);
  }

  end(): void {
    if (this.settled) return;
    if (this.expected >= 0 && this.received < this.expected) {
      this.fail(new ConnectError(`protocol error: promised ${this.expected} bytes, received ${this.received}`, Code.InvalidArgument));
      return;
    }
    let bytes: Uint8Array;
    if (this.buffer !== undefined) bytes = this.buffer;
    else if (this.more !== undefined) bytes = Buffer.concat([this.first!, ...this.more], this.received);
    else bytes = this.first ?? new Uint8Array(0);
    this.succeed(bytes);
  }
}
