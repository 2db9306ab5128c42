import { ByteRangeError, ByteWriterError, U64_MAX, isLength } from "./errors.js";

function checkInt(what: string, value: number, min: number, max: number): number {
  if (!Number.isInteger(value) || value < min || value > max) throw new ByteRangeError(what, value, min, max);
  return value;
}

/**
 * Little-endian writes into a buffer of fixed capacity, given up front:
 * callers compute the exact size first and allocate once. A write that
 * does not fit throws ByteWriterError "OVERFLOW", a value outside its
 * type's range throws ByteRangeError; neither writes anything.
 */
export class ByteWriter {
  private readonly buffer: Uint8Array;
  private readonly view: DataView;
  private at = 0;

  /** Writes into `target` when given a buffer, or into a new one of `target` bytes. */
  constructor(target: number | Uint8Array) {
    if (typeof target === "number") {
      if (!isLength(target)) {
        throw new ByteWriterError("INVALID_LENGTH", `writer capacity ${target} is not a non-negative safe integer`, {
          offset: 0,
          needed: 0,
          available: 0,
        });
      }
      this.buffer = new Uint8Array(target);
    } else {
      this.buffer = target;
    }
    this.view = new DataView(this.buffer.buffer, this.buffer.byteOffset, this.buffer.byteLength);
  }

  get capacity(): number {
    return this.buffer.length;
  }

  /** Bytes written so far. */
  get offset(): number {
    return this.at;
  }

  /** Capacity left. */
  get remaining(): number {
    return this.buffer.length - this.at;
  }

  u8(value: number): this {
    checkInt("u8", value, 0, 0xff);
    this.room(1);
    this.view.setUint8(this.at, value);
    this.at += 1;
    return this;
  }

  u16(value: number): this {
    checkInt("u16", value, 0, 0xffff);
    this.room(2);
    this.view.setUint16(this.at, value, true);
    this.at += 2;
    return this;
  }

  u32(value: number): this {
    checkInt("u32", value, 0, 0xffff_ffff);
    this.room(4);
    this.view.setUint32(this.at, value, true);
    this.at += 4;
    return this;
  }

  i32(value: number): this {
    checkInt("i32", value, -0x8000_0000, 0x7fff_ffff);
    this.room(4);
    this.view.setInt32(this.at, value, true);
    this.at += 4;
    return this;
  }

  /** A u64, range-checked (0..2^64-1), never wrapped. */
  u64(value: bigint): this {
    if (typeof value !== "bigint" || value < 0n || value > U64_MAX) throw new ByteRangeError("u64", value, 0n, U64_MAX);
    this.room(8);
    this.view.setBigUint64(this.at, value, true);
    this.at += 8;
    return this;
  }

  /** Copies `data` in. */
  bytes(data: Uint8Array): this {
    this.room(data.length);
    this.buffer.set(data, this.at);
    this.at += data.length;
    return this;
  }

  /** `u64 LE length ‖ data`; checks room for both before writing either. */
  lengthPrefixed(data: Uint8Array): this {
    this.room(8 + data.length);
    return this.u64(BigInt(data.length)).bytes(data);
  }

  /** A view of the bytes written so far (not a copy). */
  finish(): Uint8Array {
    return this.buffer.subarray(0, this.at);
  }

  private room(n: number): void {
    const available = this.buffer.length - this.at;
    if (n > available) {
      throw new ByteWriterError("OVERFLOW", `write of ${n} bytes at offset ${this.at} overflows the capacity of ${this.buffer.length}`, {
        offset: this.at,
        needed: n,
        available,
      });
    }
  }
}

/** Bytes that `lengthPrefixed` writes for a payload of `n` bytes. */
export function lengthPrefixedSize(n: number): number {
  return 8 + n;
}
