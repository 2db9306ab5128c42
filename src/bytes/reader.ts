import { ByteReaderError, isLength } from "./errors.js";

export interface ByteReaderOptions {
  /**
   * The most bytes this reader will read (from the start of the view);
   * reads past it fail with "LIMIT_EXCEEDED" even when the data goes on.
   */
  limit?: number;
}

/**
 * Little-endian reads over a Uint8Array view, without copying. Every read
 * checks the remaining length first and throws ByteReaderError instead of
 * reading out of bounds; a failed read leaves the offset where it was.
 */
export class ByteReader {
  private readonly view: DataView;
  private readonly data: Uint8Array;
  /** Where reading stops: the smaller of the data's length and the limit. */
  private readonly end: number;
  private readonly limited: boolean;
  private at = 0;

  constructor(data: Uint8Array, options: ByteReaderOptions = {}) {
    const { limit } = options;
    if (limit !== undefined && !isLength(limit)) throw new RangeError(`reader limit ${limit} is not a non-negative safe integer`);
    this.data = data;
    this.view = new DataView(data.buffer, data.byteOffset, data.byteLength);
    this.limited = limit !== undefined && limit < data.length;
    this.end = this.limited ? limit! : data.length;
  }

  /** Bytes read (or skipped) so far, from the start of the view. */
  get offset(): number {
    return this.at;
  }

  /** Bytes left before the end of the data or the limit. */
  get remaining(): number {
    return this.end - this.at;
  }

  /** Throws unless at least `n` bytes remain; reads nothing. */
  ensure(n: number): void {
    if (!isLength(n)) {
      throw new ByteReaderError("INVALID_LENGTH", `read length ${n} is not a non-negative safe integer`, {
        offset: this.at,
        needed: Number.isFinite(n) ? n : 0,
        available: this.remaining,
      });
    }
    if (n > this.end - this.at) this.fail(n);
  }

  u8(): number {
    this.ensure(1);
    const v = this.view.getUint8(this.at);
    this.at += 1;
    return v;
  }

  u16(): number {
    this.ensure(2);
    const v = this.view.getUint16(this.at, true);
    this.at += 2;
    return v;
  }

  u32(): number {
    this.ensure(4);
    const v = this.view.getUint32(this.at, true);
    this.at += 4;
    return v;
  }

  i32(): number {
    this.ensure(4);
    const v = this.view.getInt32(this.at, true);
    this.at += 4;
    return v;
  }

  u64(): bigint {
    this.ensure(8);
    const v = this.view.getBigUint64(this.at, true);
    this.at += 8;
    return v;
  }

  /** The next `n` bytes as a view into the same memory (not a copy). */
  bytes(n: number): Uint8Array {
    this.ensure(n);
    const v = this.data.subarray(this.at, this.at + n);
    this.at += n;
    return v;
  }

  /**
   * `u64 LE length ‖ bytes`, as ByteWriter.lengthPrefixed writes it; the
   * bytes are a view. The length is checked against what remains before it
   * is used, and a failure leaves the offset before the length.
   */
  lengthPrefixed(): Uint8Array {
    const start = this.at;
    const length = this.u64();
    if (length > BigInt(this.end - this.at)) {
      this.at = start;
      this.fail(8 + Number(length), start);
    }
    return this.bytes(Number(length));
  }

  skip(n: number): this {
    this.ensure(n);
    this.at += n;
    return this;
  }

  private fail(needed: number, offset = this.at): never {
    const available = this.end - offset;
    const pastData = offset + needed > this.data.length;
    const code = this.limited && !pastData ? "LIMIT_EXCEEDED" : "TRUNCATED";
    const what = code === "TRUNCATED" ? "the data ends" : "the read limit is reached";
    throw new ByteReaderError(code, `read of ${needed} bytes at offset ${offset}: ${what} after ${available}`, {
      offset,
      needed,
      available,
    });
  }
}
