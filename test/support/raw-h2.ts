/**
 * A raw HTTP/2 client for pinning what a server puts on the wire: it sends
 * headers and body bytes exactly as given (ending its side of the stream or
 * not), and collects the response headers, DATA bytes, trailers and the way
 * the stream ended, with a timeout that only bounds a failure.
 */
import * as http2 from "node:http2";

export interface RawH2Request {
  /** Sent as given; `:method` and `:path` included. */
  readonly headers: http2.OutgoingHttpHeaders;
  /** Body bytes, written as they are (none when absent). */
  readonly body?: Uint8Array;
  /** Whether the client ends its side after the body (true by default). */
  readonly endStream?: boolean;
  /** END_STREAM on the HEADERS frame itself: no DATA frame at all (`body` is then ignored). */
  readonly headersOnly?: boolean;
  /** How long to wait for the stream to close before cancelling it (5 s by default). */
  readonly timeoutMs?: number;
}

export interface RawH2Response {
  /** The response headers (`:status` included), or undefined when none came. */
  readonly headers: http2.IncomingHttpHeaders | undefined;
  readonly status: number | undefined;
  /** The trailers, or undefined when none came (a trailers-only response has its status in `headers`). */
  readonly trailers: http2.IncomingHttpHeaders | undefined;
  /** Every DATA byte received, in order. */
  readonly data: Buffer;
  /** The server ended its side of the stream (END_STREAM). */
  readonly ended: boolean;
  /** The stream closed before the timeout. */
  readonly closed: boolean;
  /** The stream's close code as Node reports it (0: NO_ERROR, a clean close or a reset with NO_ERROR); undefined when it timed out. */
  readonly rstCode: number | undefined;
  /** The stream did not close within the timeout, and the client cancelled it. */
  readonly timedOut: boolean;
  /** The stream's error, if it emitted one. */
  readonly error: string | undefined;
}

export interface RawH2Call {
  readonly stream: http2.ClientHttp2Stream;
  readonly response: Promise<RawH2Response>;
}

/** Opens an HTTP/2 session to `addr` (`HOST:PORT`, cleartext) and waits until it is connected. */
export function connectH2(addr: string, options: http2.ClientSessionOptions = {}): Promise<http2.ClientHttp2Session> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(`http://${addr}`, options);
    const onError = (err: Error) => reject(err);
    session.once("error", onError);
    session.once("connect", () => {
      session.off("error", onError);
      session.on("error", () => undefined);
      resolve(session);
    });
  });
}

/** Starts one request on `session`; `response` settles when the stream closes or the timeout passes. */
export function startRawH2(session: http2.ClientHttp2Session, request: RawH2Request): RawH2Call {
  const stream = session.request(request.headers, { endStream: request.headersOnly ?? false });
  const response = new Promise<RawH2Response>((resolve) => {
    let headers: http2.IncomingHttpHeaders | undefined;
    let trailers: http2.IncomingHttpHeaders | undefined;
    const chunks: Buffer[] = [];
    let ended = false;
    let timedOut = false;
    let error: string | undefined;
    stream.on("response", (h) => (headers = h));
    stream.on("trailers", (t) => (trailers = t));
    stream.on("data", (chunk: Buffer) => chunks.push(chunk));
    stream.on("end", () => (ended = true));
    stream.on("error", (err: Error) => (error ??= err.message));
    const timer = setTimeout(() => {
      timedOut = true;
      stream.close(http2.constants.NGHTTP2_CANCEL);
    }, request.timeoutMs ?? 5000);
    stream.once("close", () => {
      clearTimeout(timer);
      const status = headers?.[":status"];
      resolve({
        headers,
        status: status === undefined ? undefined : Number(status),
        trailers,
        data: Buffer.concat(chunks),
        ended,
        closed: !timedOut,
        rstCode: timedOut ? undefined : stream.rstCode,
        timedOut,
        error,
      });
    });
  });
  if (request.headersOnly ?? false) return { stream, response };
  if (request.endStream ?? true) stream.end(request.body ?? new Uint8Array(0));
  else if (request.body !== undefined && request.body.byteLength > 0) stream.write(request.body);
  return { stream, response };
}

/** One request on a session of its own, closed afterwards. */
export async function rawH2(addr: string, request: RawH2Request): Promise<RawH2Response> {
  const session = await connectH2(addr);
  try {
    return await startRawH2(session, request).response;
  } finally {
    session.destroy();
  }
}

/** A gRPC length-prefixed message: flags, a big-endian u32 length (`declaredLength`, by default the payload's), then the payload. */
export function grpcFrame(payload: Uint8Array, options: { flags?: number; declaredLength?: number } = {}): Buffer {
  const out = Buffer.alloc(5 + payload.byteLength);
  out[0] = options.flags ?? 0;
  out.writeUInt32BE(options.declaredLength ?? payload.byteLength, 1);
  out.set(payload, 5);
  return out;
}

export interface GrpcFrame {
  readonly flags: number;
  readonly payload: Buffer;
}

/** Splits a response body into its gRPC frames; `rest` holds the bytes of an incomplete last frame. */
export function parseGrpcFrames(data: Buffer): { frames: GrpcFrame[]; rest: Buffer } {
  const frames: GrpcFrame[] = [];
  let at = 0;
  while (data.length - at >= 5) {
    const length = data.readUInt32BE(at + 1);
    if (data.length - at - 5 < length) break;
    frames.push({ flags: data[at]!, payload: data.subarray(at + 5, at + 5 + length) });
    at += 5 + length;
  }
  return { frames, rest: data.subarray(at) };
}
