import type { Writable } from "node:stream";
import { Code, ConnectError } from "@connectrpc/connect";
import { COPY_MAX_BYTES, ENVELOPE_HEADER_BYTES } from "./protocol.js";

/**
 * The envelope codec: the 5-byte prefix (flags, big-endian length) that
 * gRPC, gRPC-Web and Connect streams put before every message. One reader
 * splits a byte stream into messages (the lean path's request bodies, the
 * lean client's responses, the status sniffer's response bodies) and one
 * writer puts a message on a stream with its prefix (the lean path's
 * responses, the lean client's requests), with the errors connect raises
 * for the same faults, worded as connect words them.
 */

/** A message over readMaxBytes, refused from its header; `length` undefined when no header says it (a body without content-length). */
export function readLimitError(length: number | undefined, readMaxBytes: number): ConnectError {
  const size = length === undefined ? "message size" : `message size ${length}`;
  return new ConnectError(`${size} is larger than configured readMaxBytes ${readMaxBytes}`, Code.ResourceExhausted);
}

/** A message over writeMaxBytes, refused before any of it is written. */
export function writeLimitError(length: number, writeMaxBytes: number): ConnectError {
  return new ConnectError(`message size ${length} is larger than configured writeMaxBytes ${writeMaxBytes}`, Code.ResourceExhausted);
}

/** The stream ended inside an envelope: its header or its message cut short (EnvelopeReader.partial). */
export function incompleteEnvelopeError(): ConnectError {
  return new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
}

/** An envelope flagged compressed on a stream that names no encoding the reader has. */
export function compressedEnvelopeError(): ConnectError {
  return new ConnectError("received compressed envelope, but do not know how to decompress", Code.Internal);
}

/** What an EnvelopeReader hands its messages to. */
export interface EnvelopeSink {
  /**
   * Whether to take the message whose header just arrived; one not taken
   * is skipped as it arrives and never buffered. Without this method every
   * message is taken.
   */
  wantsMessage?(flags: number, length: number): boolean;
  /**
   * A whole message: a view of the chunk when it arrived in one, else a
   * buffer of its own. `inPlace`: it arrived in one chunk together with its
   * 5-byte header, which precedes it in the same buffer. Returns whether to
   * read on.
   */
  onMessage(flags: number, payload: Uint8Array, inPlace: boolean): boolean;
  /** A message over readMaxBytes, refused from its header before any of it is buffered; the reader stops. */
  onOversize(error: ConnectError): void;
}

/**
 * Splits a byte stream, chunk by chunk, into enveloped messages. The size
 * is checked from the header, before anything is allocated; a message that
 * arrives in one chunk is handed over in place, one spread over several is
 * gathered into a buffer of its size. Stops for good once the sink says so
 * or a message is refused.
 */
export class EnvelopeReader {
  /** A header split across chunks, while it is completed. */
  private header: Uint8Array | undefined;
  private headerFilled = 0;
  private flags = 0;
  /** Inside a message: its length, and how much of it arrived. */
  private inMessage = false;
  private expected = 0;
  private filled = 0;
  /** A taken message's payload while it arrives over several chunks. */
  private body: Uint8Array | undefined;
  private stopped = false;

  constructor(
    private readonly sink: EnvelopeSink,
    private readonly readMaxBytes = Number.POSITIVE_INFINITY,
  ) {}

  /** Whether a message is cut short so far (its header or payload partly arrived): at the end of the stream, incompleteEnvelopeError. */
  get partial(): boolean {
    return this.inMessage || this.headerFilled > 0;
  }

  push(chunk: Uint8Array): void {
    let at = 0;
    while (at < chunk.length && !this.stopped) {
      if (!this.inMessage) {
        let length: number;
        // The header is this chunk's own, right before the message: a message whole in the chunk is then in place.
        const headerInChunk = this.headerFilled === 0 && chunk.length - at >= ENVELOPE_HEADER_BYTES;
        if (headerInChunk) {
          this.flags = chunk[at]!;
          length = envelopeLengthAt(chunk, at);
          at += ENVELOPE_HEADER_BYTES;
        } else {
          const header = (this.header ??= new Uint8Array(ENVELOPE_HEADER_BYTES));
          const take = Math.min(ENVELOPE_HEADER_BYTES - this.headerFilled, chunk.length - at);
          header.set(chunk.subarray(at, at + take), this.headerFilled);
          this.headerFilled += take;
          at += take;
          if (this.headerFilled < ENVELOPE_HEADER_BYTES) return;
          this.headerFilled = 0;
          this.flags = header[0]!;
          length = envelopeLengthAt(header, 0);
        }
        if (length > this.readMaxBytes) {
          this.stopped = true;
          this.sink.onOversize(readLimitError(length, this.readMaxBytes));
          return;
        }
        const wanted = this.sink.wantsMessage?.(this.flags, length) ?? true;
        if (chunk.length - at >= length) {
          if (wanted && !this.sink.onMessage(this.flags, chunk.subarray(at, at + length), headerInChunk)) this.stopped = true;
          at += length;
          continue;
        }
        this.inMessage = true;
        this.expected = length;
        this.filled = 0;
        this.body = wanted ? new Uint8Array(length) : undefined;
        continue;
      }
      const take = Math.min(this.expected - this.filled, chunk.length - at);
      this.body?.set(chunk.subarray(at, at + take), this.filled);
      this.filled += take;
      at += take;
      if (this.filled === this.expected) {
        const body = this.body;
        this.inMessage = false;
        this.body = undefined;
        if (body !== undefined && !this.sink.onMessage(this.flags, body, false)) this.stopped = true;
      }
    }
  }
}

/** The message length an envelope header starting at `at` gives (its big-endian u32 after the flags byte). */
export function envelopeLengthAt(bytes: Uint8Array, at: number): number {
  return bytes[at + 1]! * 0x1000000 + ((bytes[at + 2]! << 16) | (bytes[at + 3]! << 8) | bytes[at + 4]!);
}

/** An envelope's header for a message of `length` bytes, flags 0. */
function envelopeHeader(length: number): Buffer {
  const header = Buffer.allocUnsafe(ENVELOPE_HEADER_BYTES);
  header[0] = 0;
  header.writeUInt32BE(length, 1);
  return header;
}

/**
 * An envelope (flags 0) for a message of `messageBytes`, its header written:
 * the message goes at ENVELOPE_HEADER_BYTES, for a writer that serializes
 * straight into it.
 */
export function allocEnvelope(messageBytes: number): Buffer {
  const envelope = Buffer.allocUnsafe(ENVELOPE_HEADER_BYTES + messageBytes);
  envelope[0] = 0;
  envelope.writeUInt32BE(messageBytes, 1);
  return envelope;
}

/** `payload` in its envelope (flags 0): header and a copy of the message in one buffer. */
export function encodeEnvelope(payload: Uint8Array): Buffer {
  const envelope = allocEnvelope(payload.byteLength);
  envelope.set(payload, ENVELOPE_HEADER_BYTES);
  return envelope;
}

/**
 * Writes one message (one buffer, or chunks that concatenate to it) in its
 * envelope, uncompressed, and ends the stream with it when `end`. Up to
 * COPY_MAX_BYTES it goes out as one buffer with its header, one DATA frame;
 * larger, the header and then the message's own buffers, corked, none
 * copied. Returns false when the stream asks the writer to wait.
 */
export function writeEnvelope(stream: Writable, message: Uint8Array | readonly Uint8Array[], end: boolean): boolean {
  const one = !Array.isArray(message) ? (message as Uint8Array) : message.length === 1 ? message[0]! : undefined;
  if (one !== undefined && one.byteLength <= COPY_MAX_BYTES) {
    const envelope = encodeEnvelope(one);
    if (end) {
      stream.end(envelope);
      return true;
    }
    return stream.write(envelope);
  }
  const parts = one !== undefined ? [one] : (message as readonly Uint8Array[]);
  let length = 0;
  for (const part of parts) length += part.byteLength;
  stream.cork();
  stream.write(envelopeHeader(length));
  let ok = true;
  for (let i = 0; i < parts.length - 1; i++) ok = stream.write(parts[i]!);
  if (end) stream.end(parts[parts.length - 1]);
  else ok = stream.write(parts[parts.length - 1]!);
  // end() uncorks the stream itself; otherwise the corked writes go out together at the end of this tick.
  if (!end) process.nextTick(uncork, stream);
  return end || ok;
}

function uncork(stream: Writable): void {
  stream.uncork();
}
