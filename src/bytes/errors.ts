/** Why a read failed. */
export type ByteReaderErrorCode =
  /** The data ends before the read does. */
  | "TRUNCATED"
  /** The reader's `limit` ends before the read does (the data may go on). */
  | "LIMIT_EXCEEDED"
  /** A length or count argument is not a non-negative safe integer. */
  | "INVALID_LENGTH";

/** Why a write failed. */
export type ByteWriterErrorCode =
  /** The write does not fit in the remaining capacity. */
  | "OVERFLOW"
  /** A length or capacity argument is not a non-negative safe integer. */
  | "INVALID_LENGTH";

/** Where a read or write stood when it failed, in bytes. */
export interface BytePosition {
  /** Offset of the failed operation from the start of the view. */
  readonly offset: number;
  /** Bytes the operation needed. */
  readonly needed: number;
  /** Bytes that were left. */
  readonly available: number;
}

/** A read that did not happen; the reader's offset is unchanged. */
export class ByteReaderError extends Error implements BytePosition {
  readonly offset: number;
  readonly needed: number;
  readonly available: number;

  constructor(
    readonly code: ByteReaderErrorCode,
    message: string,
    position: BytePosition,
  ) {
    super(message);
    this.name = "ByteReaderError";
    this.offset = position.offset;
    this.needed = position.needed;
    this.available = position.available;
  }
}

/** A write that did not happen; the writer's offset is unchanged. */
export class ByteWriterError extends Error implements BytePosition {
  readonly offset: number;
  readonly needed: number;
  readonly available: number;

  constructor(
    readonly code: ByteWriterErrorCode,
    message: string,
    position: BytePosition,
  ) {
    super(message);
    this.name = "ByteWriterError";
    this.offset = position.offset;
    this.needed = position.needed;
    this.available = position.available;
  }
}

/** An integer outside the range of the type it is written as (never wrapped). */
export class ByteRangeError extends RangeError {
  readonly code = "OUT_OF_RANGE" as const;

  constructor(
    readonly what: string,
    readonly value: bigint | number,
    readonly min: bigint | number,
    readonly max: bigint | number,
  ) {
    super(`${what} ${String(value)} is outside ${String(min)}..${String(max)}`);
    this.name = "ByteRangeError";
  }
}

/** 2^64 - 1, the largest u64. */
export const U64_MAX = (1n << 64n) - 1n;

/** Returns `value` when it is a bigint in 0..2^64-1; throws ByteRangeError otherwise. */
export function assertU64(value: bigint, what = "u64"): bigint {
  if (typeof value !== "bigint" || value < 0n || value > U64_MAX) throw new ByteRangeError(what, value, 0n, U64_MAX);
  return value;
}

/** True for a length or count the reader and writer accept. */
export function isLength(n: number): boolean {
  return Number.isSafeInteger(n) && n >= 0;
}
