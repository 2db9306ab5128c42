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
 * holds one piece of the stream's writes at a time, at most PIECE_BYTES
 * (part of a message, or several small ones), and the next only once it
 * took that one (put it into DATA frames and wrote it to the socket, which
 * flow control allows only as the client reads); the rest waits in
 * JavaScript and is simply released when the stream closes. Small messages
 * written in one turn, or while a piece is in flight, go out as one piece:
 * one write and one DATA frame, as Writable joins what is written while a
 * write is pending.
 *
 * The Writable above accepts each write at once (its callback runs as the
 * bytes join this queue), so the transport writing a message (the lean
 * path, or connect's response) never waits on 'drain' for a client that
 * does not read: it asks the handler for its next message, and the handler
 * decides, with `idle` / `whenIdle()` or `backlog` / `whenBelow()`, to wait
 * for this backlog to empty (or shrink), for its own end, or for a timeout.
 * What a turn of the event loop writes to the stream goes to Node at the
 * end of the turn (pumpLater), small messages joined into one piece: one
 * write, one DATA frame, for a burst of them. The end of the response
 * (`_final`: END_STREAM or trailers) waits until every queued byte was
 * handed over.
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
  /** The bytes of the piece in Node's native queue (its callback has not run yet); 0 when none is. */
  private inFlight = 0;
  private closedValue = false;
  private takenBytes = 0;
  /** A pump is due at the end of the current task. */
  private pumpQueued = false;
  /** The stream's end, deferred until the queue is empty. */
  private finalCallback: WriteCallback | undefined;
  private waiters: (() => void)[] = [];
  /** Waiters for the backlog to go below a size, with that size. */
  private belowWaiters: { readonly bytes: number; readonly resolve: () => void }[] = [];
  private readonly write: (chunk: Buffer, encoding: BufferEncoding, callback: WriteCallback) => void;
  private readonly final: (callback: WriteCallback) => void;

  private constructor(private readonly stream: ServerHttp2Stream) {
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
    return this.closedValue || (this.inFlight === 0 && this.queuedBytes === 0);
  }

  /** Resolves once `idle`. */
  whenIdle(): Promise<void> {
    if (this.idle) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  /**
   * Writes bytes that are whole messages of the response past the transport
   * that writes the others (a relay delta serialized once for every
   * subscriber, pre-encoded.ts): queued behind whatever the stream holds.
   * Only while that transport is between messages (its handler is making
   * the next one) and before the response ends; false when the stream is
   * gone or ending, and nothing was written.
   */
  writeDirect(bytes: Buffer): boolean {
    const stream = this.stream;
    if (this.closedValue || stream.writableEnded || stream.destroyed) return false;
    // The Writable above hands each write down at once unless corked: with nothing
    // buffered there, the bytes join this queue directly, in order, without its machinery.
    if (stream.writableLength === 0 && stream.writableCorked === 0) this.push(bytes, "buffer" as BufferEncoding);
    else stream.write(bytes);
    return true;
  }

  /** Bytes HTTP/2 took so far (written out to the connection, as flow control let it): what a progress timeout watches. */
  get taken(): number {
    return this.takenBytes;
  }

  /** Bytes written and not yet taken by HTTP/2: queued here, plus the piece in Node's queue (0 once the stream closed). */
  get backlog(): number {
    return this.closedValue ? 0 : this.queuedBytes + this.inFlight;
  }

  /** Resolves once `backlog` is below `bytes` (or the stream closed). */
  whenBelow(bytes: number): Promise<void> {
    if (this.backlog < bytes) return Promise.resolve();
    return new Promise((resolve) => this.belowWaiters.push({ bytes, resolve }));
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
    // Once this turn's work is done: whatever it writes to this stream (a burst of small messages) becomes one piece.
    if (!this.pumpQueued) {
      this.pumpQueued = true;
      pumpLater(this);
    }
  }

  /** The pump `pumpLater` runs. */
  pumpNow(): void {
    this.pumpQueued = false;
    this.pump();
  }

  /**
   * Hands Node the next piece once the one before was taken, everything
   * queued meanwhile joined into it (up to PIECE_BYTES), or, with nothing
   * left, ends the stream if asked to and wakes the waiters.
   */
  private pump(): void {
    if (this.closedValue || this.inFlight > 0) return;
    if (this.queuedBytes > 0) {
      const piece = this.take(PIECE_BYTES);
      this.inFlight = piece.byteLength;
      // "buffer", as Writable names a Buffer chunk's encoding: Node then writes the bytes as they are.
      this.write(piece, "buffer" as BufferEncoding, this.pieceDone);
      return;
    }
    const final = this.finalCallback;
    this.finalCallback = undefined;
    if (final !== undefined) this.final(final);
    this.wake();
  }

  private readonly pieceDone = (error?: Error | null): void => {
    this.takenBytes += this.inFlight;
    this.inFlight = 0;
    if (error) this.close();
    else {
      this.pump();
      this.wakeBelow();
    }
  };

  /** Up to `limit` bytes off the front of the queue; small chunks are joined into one piece (fewer, fuller DATA frames). */
  private take(limit: number): Buffer {
    const first = this.queue[0]!;
    if (first.byteLength >= limit || this.queue.length === 1) return this.slice(Math.min(first.byteLength, limit));
    const parts: Buffer[] = [];
    let size = 0;
    while (size < limit && this.queue.length > 0) {
      const part = this.slice(Math.min(this.queue[0]!.byteLength, limit - size));
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
    this.wakeBelow();
  }

  private wakeBelow(): void {
    if (this.belowWaiters.length === 0) return;
    const backlog = this.backlog;
    const waiting = this.belowWaiters;
    this.belowWaiters = [];
    for (const waiter of waiting) {
      if (backlog < waiter.bytes) waiter.resolve();
      else this.belowWaiters.push(waiter);
    }
  }

  private wake(): void {
    const waiters = this.waiters;
    if (waiters.length === 0) return;
    this.waiters = [];
    for (const resolve of waiters) resolve();
  }
}

const installed = new WeakMap<ServerHttp2Stream, PacedWrites>();

/**
 * Streams written to in this turn of the event loop, pumped together in its
 * check phase (one setImmediate for all of them): the messages a turn writes
 * to one stream (deltas published in one turn, say) reach Node as one write,
 * not one each; HTTP/2 sends them in the next socket write either way.
 */
let dueStreams: PacedWrites[] = [];

function pumpLater(paced: PacedWrites): void {
  if (dueStreams.length === 0) setImmediate(pumpDue);
  dueStreams.push(paced);
}

function pumpDue(): void {
  const due = dueStreams;
  dueStreams = [];
  for (const paced of due) paced.pumpNow();
}
