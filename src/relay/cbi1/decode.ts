/**
 * CBI1 decoding (spec A.6): the checks run in the reference's order, so a
 * frame with several faults always reports the earliest one. The length
 * checks come before anything is allocated (not even a DataView), and what
 * comes back are views into the caller's bytes, never copies.
 */
import {
  DELTA_BODY_PREFIX_LEN,
  DELTA_IMAGE_LEN,
  FLAG_DELTA,
  FLAG_SNAPSHOT_CHUNK,
  IMAGES_HEADER_LEN,
  IMAGES_MAGIC,
  IMAGES_MAX_FRAME_BYTES,
  IMAGES_WIRE_VERSION,
  MAX_BUCKET_COUNT,
  MAX_DELTA_IMAGES,
  OFFSET,
  SNAPSHOT_BODY_PREFIX_LEN,
  SNAPSHOT_CHUNK_BUCKETS,
  WORD_LEN,
} from "./constants.js";
import { Cbi1Error } from "./errors.js";
import { FilterFormat, formatArg } from "./format.js";
import { bodyChecksum, type Cbi1Header } from "./header.js";
import type { BucketImage } from "./encode.js";

/** A delta's images, read in place from the frame (12-byte records, so u64s are unaligned: read through a DataView). */
export class DeltaImages implements Iterable<BucketImage> {
  readonly length: number;
  /** The image records as a view of the frame: 12 bytes each, bucket u32 then value u64, LE. */
  readonly bytes: Uint8Array;
  private readonly view: DataView;

  constructor(bytes: Uint8Array) {
    this.bytes = bytes;
    this.length = (bytes.length / DELTA_IMAGE_LEN) | 0;
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  bucket(i: number): number {
    return this.view.getUint32(i * DELTA_IMAGE_LEN, true);
  }

  value(i: number): bigint {
    return this.view.getBigUint64(i * DELTA_IMAGE_LEN + 4, true);
  }

  *[Symbol.iterator](): IterableIterator<BucketImage> {
    for (let i = 0; i < this.length; i++) yield { bucket: this.bucket(i), value: this.value(i) };
  }

  /** A copy as plain objects (for tests and diagnostics; the hot path uses bucket(i) / value(i)). */
  toArray(): BucketImage[] {
    return [...this];
  }
}

export interface Cbi1DeltaFrame {
  readonly kind: "delta";
  readonly header: Cbi1Header;
  /** The sequence the consumer must hold before applying (FilterUpdate.base_sequence); header.epoch is the target. */
  readonly baseEpoch: bigint;
  readonly images: DeltaImages;
}

export interface Cbi1SnapshotChunkFrame {
  readonly kind: "snapshotChunk";
  readonly header: Cbi1Header;
  readonly chunkIndex: number;
  readonly chunkCount: number;
  /** First bucket of this chunk; decode has checked bucketOffset + wordCount <= bucketCount. */
  readonly bucketOffset: number;
  readonly wordCount: number;
  /** The words' bytes: a view of the frame, at any alignment. */
  readonly wordBytes: Uint8Array;
  /**
   * The words as a BigUint64Array view of the frame when its bytes start
   * 8-aligned in their ArrayBuffer (frames from the encoder always do); undefined
   * otherwise, because a typed array cannot start at an unaligned offset.
   * A Uint8Array from a socket is a slice of a pooled slab at any offset:
   * use `wordBytes` (SnapshotAssembly copies those bytes once into its buffer,
   * alignment does not matter to it) or copy them yourself.
   */
  readonly words: BigUint64Array | undefined;
}

export type Cbi1Frame = Cbi1DeltaFrame | Cbi1SnapshotChunkFrame;

function malformed(message: string, details: Record<string, bigint | number>): Cbi1Error {
  return new Cbi1Error("Malformed", message, details);
}

/** Checks 1-4 of A.6 (length, size bound, magic, wire version); allocates nothing. */
function checkEnvelope(frame: Uint8Array): void {
  if (!(frame instanceof Uint8Array)) throw new Cbi1Error("InvalidArgument", "a frame is a Uint8Array", { what: "frame" });
  const length = frame.length;
  if (length < IMAGES_HEADER_LEN) {
    throw new Cbi1Error("Truncated", `${length} bytes are fewer than the ${IMAGES_HEADER_LEN}-byte header`, { actual: length, minimum: IMAGES_HEADER_LEN });
  }
  if (length > IMAGES_MAX_FRAME_BYTES) {
    throw new Cbi1Error("FrameTooLarge", `${length} bytes exceed the ${IMAGES_MAX_FRAME_BYTES}-byte frame bound`, {
      actual: length,
      maximum: IMAGES_MAX_FRAME_BYTES,
    });
  }
  for (let i = 0; i < 4; i++) {
    if (frame[OFFSET.magic + i] !== IMAGES_MAGIC[i]) throw new Cbi1Error("Magic", "the frame does not start with CBI1");
  }
  const wireVersion = frame[OFFSET.wireVersion]! | (frame[OFFSET.wireVersion + 1]! << 8);
  if (wireVersion !== IMAGES_WIRE_VERSION) {
    throw new Cbi1Error("WireVersion", `wire version ${wireVersion} is not ${IMAGES_WIRE_VERSION}`, { version: wireVersion });
  }
}

/**
 * Decodes and validates one frame against the expected format. Throws
 * Cbi1Error, and nothing else, for any byte string.
 */
export function decode(format: FilterFormat, frame: Uint8Array): Cbi1Frame {
  formatArg(format);
  checkEnvelope(frame);
  const view = new DataView(frame.buffer, frame.byteOffset, frame.byteLength);
  const flags = view.getUint16(OFFSET.flags, true);
  const fingerprintBits = view.getUint8(OFFSET.fingerprintBits);
  const slotsPerBucket = view.getUint8(OFFSET.slotsPerBucket);
  const formatVersion = view.getUint16(OFFSET.formatVersion, true);
  const seed = view.getBigUint64(OFFSET.seed, true);
  const rawBucketCount = view.getBigUint64(OFFSET.bucketCount, true);
  const dcId = view.getBigUint64(OFFSET.dcId, true);
  const epoch = view.getBigUint64(OFFSET.epoch, true);
  const checksum = view.getUint32(OFFSET.checksum, true);

  const actual = bodyChecksum(frame);
  if (actual !== checksum) {
    throw new Cbi1Error("Checksum", `body checksum ${actual} is not the header's ${checksum}`, { expected: checksum, actual });
  }
  // The reference narrows bucket_count to usize (Malformed if it does not fit)
  // before comparing; the comparison here is on the raw u64, so no value can
  // slip through a narrowing and the usize case cannot arise.
  const formatError = format.check(formatVersion, seed, rawBucketCount, fingerprintBits, slotsPerBucket);
  if (formatError !== undefined) throw formatError;
  const bucketCount = format.bucketCount;
  const header: Cbi1Header = {
    wireVersion: IMAGES_WIRE_VERSION,
    flags,
    fingerprintBits,
    slotsPerBucket,
    formatVersion,
    seed,
    bucketCount,
    dcId,
    epoch,
    checksum,
  };
  const body = frame.length - IMAGES_HEADER_LEN;
  if (flags === FLAG_DELTA) return decodeDelta(frame, view, header, body);
  if (flags === FLAG_SNAPSHOT_CHUNK) return decodeSnapshotChunk(frame, view, header, body);
  throw new Cbi1Error("Flags", `flags ${flags} is neither ${FLAG_SNAPSHOT_CHUNK} (snapshot chunk) nor ${FLAG_DELTA} (delta)`, { flags });
}

function decodeDelta(frame: Uint8Array, view: DataView, header: Cbi1Header, body: number): Cbi1DeltaFrame {
  if (body < DELTA_BODY_PREFIX_LEN) throw malformed(`a delta body of ${body} bytes is shorter than its ${DELTA_BODY_PREFIX_LEN}-byte prefix`, { body });
  const baseEpoch = view.getBigUint64(IMAGES_HEADER_LEN, true);
  const count = view.getUint32(IMAGES_HEADER_LEN + 8, true);
  if (count > MAX_DELTA_IMAGES) {
    throw new Cbi1Error("DeltaImageCount", `${count} images exceed the ${MAX_DELTA_IMAGES} a frame can carry`, { actual: count, maximum: MAX_DELTA_IMAGES });
  }
  const expected = DELTA_BODY_PREFIX_LEN + DELTA_IMAGE_LEN * count;
  if (body !== expected) throw malformed(`a delta of ${count} images has a ${expected}-byte body, not ${body}`, { body, expected, count });
  const start = IMAGES_HEADER_LEN + DELTA_BODY_PREFIX_LEN;
  const bucketCount = header.bucketCount;
  for (let i = 0, at = start; i < count; i++, at += DELTA_IMAGE_LEN) {
    const bucket = view.getUint32(at, true);
    // Duplicates are not refused here: the lane ingestor does that (B.9).
    if (bucket >= bucketCount) throw malformed(`image ${i} names bucket ${bucket} of ${bucketCount}`, { image: i, bucket, bucketCount });
  }
  return { kind: "delta", header, baseEpoch, images: new DeltaImages(frame.subarray(start)) };
}

function decodeSnapshotChunk(frame: Uint8Array, view: DataView, header: Cbi1Header, body: number): Cbi1SnapshotChunkFrame {
  if (body < SNAPSHOT_BODY_PREFIX_LEN) {
    throw malformed(`a snapshot chunk body of ${body} bytes is shorter than its ${SNAPSHOT_BODY_PREFIX_LEN}-byte prefix`, { body });
  }
  const chunkIndex = view.getUint32(IMAGES_HEADER_LEN, true);
  const chunkCount = view.getUint32(IMAGES_HEADER_LEN + 4, true);
  const rawOffset = view.getBigUint64(IMAGES_HEADER_LEN + 8, true);
  if (chunkCount === 0 || chunkIndex >= chunkCount) throw malformed(`chunk ${chunkIndex} of ${chunkCount} does not exist`, { chunkIndex, chunkCount });
  const wordBytesLength = body - SNAPSHOT_BODY_PREFIX_LEN;
  if (wordBytesLength % WORD_LEN !== 0) throw malformed(`${wordBytesLength} word bytes are not whole u64 words`, { wordBytes: wordBytesLength });
  const wordCount = wordBytesLength / WORD_LEN;
  // Unreachable behind FrameTooLarge (64 + 8w <= 4,194,368 means w <= 524,288); kept for the reference's order.
  if (wordCount > SNAPSHOT_CHUNK_BUCKETS) {
    throw new Cbi1Error("SnapshotChunkWordCount", `${wordCount} words exceed the ${SNAPSHOT_CHUNK_BUCKETS} of a chunk`, {
      actual: wordCount,
      maximum: SNAPSHOT_CHUNK_BUCKETS,
    });
  }
  // u64 arithmetic as bigint: offset + words cannot wrap, it just exceeds.
  if (rawOffset + BigInt(wordCount) > BigInt(header.bucketCount)) {
    throw malformed(`words ${rawOffset}..${rawOffset + BigInt(wordCount)} exceed the ${header.bucketCount} buckets`, {
      bucketOffset: rawOffset,
      wordCount,
      bucketCount: header.bucketCount,
    });
  }
  const start = IMAGES_HEADER_LEN + SNAPSHOT_BODY_PREFIX_LEN;
  const wordBytes = frame.subarray(start);
  const aligned = (wordBytes.byteOffset & (WORD_LEN - 1)) === 0;
  return {
    kind: "snapshotChunk",
    header,
    chunkIndex,
    chunkCount,
    bucketOffset: Number(rawOffset),
    wordCount,
    wordBytes,
    words: aligned ? new BigUint64Array(wordBytes.buffer, wordBytes.byteOffset, wordCount) : undefined,
  };
}

/**
 * The format a frame declares, without validating its body, so a fresh
 * consumer can learn it from the first frame: Truncated, FrameTooLarge, Magic
 * and WireVersion as in `decode`, then the FilterFormat rules (Format,
 * kind BucketCount). Nothing else (checksum, flags, CKF identity) is checked.
 */
export function peekFormat(frame: Uint8Array): FilterFormat {
  checkEnvelope(frame);
  const view = new DataView(frame.buffer, frame.byteOffset, frame.byteLength);
  const seed = view.getBigUint64(OFFSET.seed, true);
  const raw = view.getBigUint64(OFFSET.bucketCount, true);
  // Anything above 2^24 fails the constructor; keep the u64 for the message.
  if (raw > BigInt(MAX_BUCKET_COUNT)) {
    throw new Cbi1Error("Format", `bucket count ${raw} is not a power of two in 2..${MAX_BUCKET_COUNT}`, { bucketCount: raw.toString() }, "BucketCount");
  }
  return new FilterFormat(seed, Number(raw));
}
