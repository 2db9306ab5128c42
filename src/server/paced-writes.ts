import type { ServerHttp2Stream } from "node:http2";

/**
 * Paced writes for a long-lived HTTP/2 response stream whose handler must
 * see its own backlog (the relay's pool streams).
 *
 * Node queues whatever is written to an HTTP/2 stream in its native layer
 * until flow control lets it out, and counts those bytes against the
 * session's `maxSessionMemory`; when the client resets the stream, the
 * queued bytes are dropped but never taken off that count (Http2Stream::
 * Destroy discards its write queue without returning the bytes). Sixteen
 * 4 MiB messages cancelled mid-write leave a 64 MB session refusing every
 * new stream with ENHANCE_YOUR_CALM, for good. So here the native layer
 * gets one piece of at most PIECE_BYTES at a time, the next once it took the
 * previous one (put into DATA frames and written to the socket, which flow
 * control allows only as the client reads); the rest waits in JavaScript
 * and is simply released when the stream closes.
 *
 * The Writable above accepts each write at once (its callback runs as the
 * bytes join this queue), so the transport writing a message (the lean
 * path, or connect's response) never waits on 'drain' for a client that
 * does not read: it asks the handler for its next message, and the handler
 * decides, with `idle` / `whenIdle()`, to wait for this backlog to empty,
 * for its own end, or for a timeout. The end of the response (`_final`:
 * END_STREAM or trailers) waits until every queued byte was handed over.
 *
 * Installed by overriding the stream's Writable hooks (`_write`, `_writev`,
 * `_final`), so every writer of the stream goes through it. It assumes the
 * response waits for trailers (gRPC, and every response of the HTTP/2
 * compatibility layer), as Node then shuts the writable side only in `_final`.
 */

/**
 * The most bytes in Node's native queue for one stream, and so the most a
 * reset can strand there: about 1,000 resets mid-write before a session's 64 MB
 * are gone, rather than 16. Smaller pieces strand less but cost an event
 * loop turn each (16 KiB pieces made a 32 MiB snapshot about three times
 * slower to send than unpaced writes; 64 KiB, about one and a half).
 */
export const PIECE_BYTES = 64 * 1024;

type WriteCallback = (error?: Error | null) => void;

export class PacedWrites {
  private readonly queue: Buffer[] = [];
  private queuedBytes = 0;
  /** A piece is in Node's native queue: its callback has not run yet. */
  private writing = false;
  private closedValue = false;
  /** The stream's end, deferred until the queue is empty. */
  private finalCallback: WriteCallback | undefined;
  private waiters: (() => void)[] = [];
  private readonly write: (chunk: Buffer, encoding: BufferEncoding, callback: WriteCallback) => void;
  private readonly final: (callback: WriteCallback) => void;

  private constructor(stream: ServerHttp2Stream) {
    // Node's own hooks, which the pieces and the deferred end go through.
    this.write = stream._write.bind(stream);
    this.final = stream._final.bind(stream);
    stream._write = (chunk: unknown, encoding: BufferEncoding, callback: WriteCallback) => {
      this.push(chunk, encoding);
      callback();
    };
    stream._writev = (chunks: { chunk: unknown; encoding: BufferEncoding }[], callback: WriteCallback) => {
      for (const { chunk, encoding } of chunks) this.push(chunk, encoding);
      callback();
    };
    stream._final = (callback: WriteCallback) => {
      if (this.idle) this.final(callback);
      else this.finalCallback = callback;
    };
    stream.once("close", () => this.close());
    if (stream.destroyed) this.close();
  }

  /** The pacer of `stream`, installed on first use (idempotent: one per stream). */
  static of(stream: ServerHttp2Stream): PacedWrites {
    let paced = installed.get(stream);
    if (paced === undefined) {
      paced = new PacedWrites(stream);
      installed.set(stream, paced);
    }
    return paced;
  }

  /** Everything written so far was handed to HTTP/2 (or the stream closed: nothing will be). */
  get idle(): boolean {
    return this.closedValue || (!this.writing && this.queuedBytes === 0);
  }

  /** Resolves once `idle`. */
  whenIdle(): Promise<void> {
    if (this.idle) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  private push(chunk: unknown, encoding: BufferEncoding): void {
    if (this.closedValue) return;
    let bytes: Buffer;
    if (Buffer.isBuffer(chunk)) bytes = chunk;
    else if (typeof chunk === "string") bytes = Buffer.from(chunk, encoding);
    else {
      // Writable hands over Buffers; any other view is wrapped, not copied.
      const view = chunk as Uint8Array;
      bytes = Buffer.from(view.buffer, view.byteOffset, view.byteLength);
    }
    if (bytes.byteLength === 0) return;
    this.queue.push(bytes);
    this.queuedBytes += bytes.byteLength;
    this.pump();
  }

  /** Hands the next piece to Node, or, with nothing left, ends the stream if asked to and wakes the waiters. */
  private pump(): void {
    if (this.writing || this.closedValue) return;
    if (this.queuedBytes === 0) {
      const final = this.finalCallback;
      this.finalCallback = undefined;
      if (final !== undefined) this.final(final);
      this.wake();
      return;
    }
    const piece = this.take();
    this.writing = true;
    // "buffer", as Writable names a Buffer chunk's encoding: Node then writes the bytes as they are.
    this.write(piece, "buffer" as BufferEncoding, (error) => {
      this.writing = false;
      if (error) this.close();
      else this.pump();
    });
  }

  /** Up to PIECE_BYTES off the front of the queue; small chunks are joined into one piece (fewer, fuller DATA frames). */
  private take(): Buffer {
    const first = this.queue[0]!;
    if (first.byteLength >= PIECE_BYTES || this.queue.length === 1) return this.slice(Math.min(first.byteLength, PIECE_BYTES));
    const parts: Buffer[] = [];
    let size = 0;
    while (size < PIECE_BYTES && this.queue.length > 0) {
      const part = this.slice(Math.min(this.queue[0]!.byteLength, PIECE_BYTES - size));
      parts.push(part);
      size += part.byteLength;
    }
    return Buffer.concat(parts, size);
  }

  /** The first `length` bytes of the queue's first chunk, taken off the queue. */
  private slice(length: number): Buffer {
    const first = this.queue[0]!;
    this.queuedBytes -= length;
    if (length === first.byteLength) {
      this.queue.shift();
      return first;
    }
    this.queue[0] = first.subarray(length);
    return first.subarray(0, length);
  }

  /** The stream is gone: what is queued here is dropped, and nothing waits for it any more. */
  private close(): void {
    if (this.closedValue) return;
    this.closedValue = true;
    this.queue.length = 0;
    this.queuedBytes = 0;
    this.finalCallback = undefined;
    this.wake();
  }

  private wake(): void {
    const waiters = this.waiters;
    if (waiters.length === 0) return;
    this.waiters = [];
    for (const resolve of waiters) resolve();
  }
}

const installed = new WeakMap<ServerHttp2Stream, PacedWrites>();
