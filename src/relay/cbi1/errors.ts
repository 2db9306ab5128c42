/**
 * One error class for the whole codec, with a stable `code`. The codes are
 * the reference's error variant names so logs read the same on both sides;
 * two codes are JS-only (marked) because the reference's types rule them out.
 */

export const CBI1_ERROR_CODES = [
  /** Fewer than 48 bytes: not even a header. */
  "Truncated",
  /** More than IMAGES_MAX_FRAME_BYTES; refused before anything is read or allocated. */
  "FrameTooLarge",
  /** Bytes 0..3 are not `CBI1`. */
  "Magic",
  /** wire_version is not 1. */
  "WireVersion",
  /** The body's XXH3-64 low 32 bits differ from the header's body_checksum. */
  "Checksum",
  /** The header's CKF identity is not the expected FilterFormat (see `formatKind`), or a FilterFormat is invalid. */
  "Format",
  /** flags is neither 1 (snapshot chunk) nor 2 (delta). */
  "Flags",
  /** The body contradicts itself or the header (lengths, counts, offsets, bucket indices). */
  "Malformed",
  /** A delta with more than MAX_DELTA_IMAGES images (encode, or a decoded count). */
  "DeltaImageCount",
  /** A snapshot chunk with more than SNAPSHOT_CHUNK_BUCKETS words. */
  "SnapshotChunkWordCount",
  /** Encoder only: an image's (or a chunk's) bucket is outside 0..bucket_count-1. */
  "BucketIndex",
  /** Encoder only: a snapshot's word count is not the format's bucket count. */
  "SnapshotBucketCount",
  /** Assembly: a frame out of order, of another snapshot, or not a snapshot chunk. */
  "ChunkSequence",
  /** Assembly: the last chunk arrived but the chunks did not cover every bucket. */
  "IncompleteCoverage",
  /** JS-only: an argument of the wrong type or outside its integer range (a u64 that is not a bigint in 0..2^64-1, ...). */
  "InvalidArgument",
  /** JS-only: the host is big-endian, so typed-array words would not be the wire's little-endian bytes. */
  "UnsupportedHost",
] as const;

export type Cbi1ErrorCode = (typeof CBI1_ERROR_CODES)[number];

/** The sub-kinds of `Format` (the reference's FormatError), checked in this order by `FilterFormat.check`. */
export type FormatErrorKind = "Version" | "FingerprintBits" | "SlotsPerBucket" | "Mismatch" | "BucketCount";

export type Cbi1ErrorDetails = Readonly<Record<string, bigint | number | string | boolean>>;

export class Cbi1Error extends Error {
  /** Set on `Format` errors only. */
  readonly formatKind: FormatErrorKind | undefined;

  constructor(
    readonly code: Cbi1ErrorCode,
    message: string,
    readonly details: Cbi1ErrorDetails = {},
    formatKind?: FormatErrorKind,
  ) {
    super(message);
    this.name = "Cbi1Error";
    this.formatKind = formatKind;
  }
}

/** True when `error` is a Cbi1Error, optionally with `code`. */
export function isCbi1Error(error: unknown, code?: Cbi1ErrorCode): error is Cbi1Error {
  return error instanceof Cbi1Error && (code === undefined || error.code === code);
}

/** A short, never-throwing description of a value for messages (String() throws on some objects). */
export function describe(value: unknown): string {
  switch (typeof value) {
    case "bigint":
    case "number":
    case "boolean":
    case "undefined":
      return String(value);
    case "string":
      return JSON.stringify(value.length > 32 ? `${value.slice(0, 32)}...` : value);
    default:
      return value === null ? "null" : typeof value;
  }
}
