/**
 * CBI1 encoders (spec A.5). Every returned frame is one allocation of its
 * exact size; a snapshot chunk can also be written into a caller's buffer
 * (`encodeSnapshotChunkInto`, the one implementation both forms share). Its
 * words go in with one bulk copy of the lane's bytes, and the checksum is
 * patched in last.
 */
import {
  DELTA_BODY_PREFIX_LEN,
  DELTA_IMAGE_LEN,
  FLAG_DELTA,
  FLAG_SNAPSHOT_CHUNK,
  IMAGES_HEADER_LEN,
  MAX_DELTA_IMAGES,
  SNAPSHOT_BODY_PREFIX_LEN,
  SNAPSHOT_CHUNK_BUCKETS,
  snapshotChunkCount,
  WORD_LEN,
} from "./constants.js";
import { Cbi1Error, describe } from "./errors.js";
import { formatArg, type FilterFormat } from "./format.js";
import { allocFrame, patchChecksum, writeHeader } from "./header.js";
import { assertLittleEndianHost, HOST_IS_LITTLE_ENDIAN, isU64, u32Arg, u64Arg } from "./u64.js";

/** One absolute bucket image: the bucket's whole u64 word after the batch (0 = emptied). */
export interface BucketImage {
  readonly bucket: number;
  readonly value: bigint;
}

/**
 * Images as parallel arrays, the faster input: a Uint32Array of buckets needs
 * no per-item type check, a BigUint64Array of values no range check.
 */
export interface BucketImageColumns {
  readonly buckets: Uint32Array | readonly number[];
  readonly values: BigUint64Array | readonly bigint[];
}

/**
 * Bucket words as the lane holds them: its Uint16Array of slots (4 per
 * bucket, the same bytes as the LE words on a little-endian host) or its
 * BigUint64Array `words()` view, or a subarray of either.
 */
export type BucketWords = BigUint64Array | Uint16Array;

/** How many buckets `words` holds; a slot array must hold whole buckets. */
export function bucketWordCount(words: BucketWords): number {
  if (words instanceof BigUint64Array) return words.length;
  if (words instanceof Uint16Array) {
    if (words.length % 4 !== 0) {
      throw new Cbi1Error("InvalidArgument", `a slot array of ${words.length} slots does not hold whole 4-slot buckets`, { slots: words.length });
    }
    return words.length >>> 2;
  }
  throw new Cbi1Error("InvalidArgument", "bucket words are neither a BigUint64Array nor a Uint16Array of slots", { what: "words" });
}

function invalidBucket(bucket: unknown, bucketCount: number): Cbi1Error {
  return new Cbi1Error("BucketIndex", `bucket ${describe(bucket)} is outside 0..${bucketCount - 1}`, { bucket: describe(bucket), bucketCount });
}

/** A delta frame (flags 2): base_epoch, then `images` in the given order. Empty is legal. */
export function encodeDelta(
  format: FilterFormat,
  dcId: bigint,
  baseEpoch: bigint,
  epoch: bigint,
  images: readonly BucketImage[] | BucketImageColumns,
): Uint8Array {
  formatArg(format);
  u64Arg(dcId, "dcId");
  u64Arg(baseEpoch, "baseEpoch");
  u64Arg(epoch, "epoch");
  const columns = Array.isArray(images) ? undefined : (images as BucketImageColumns);
  let count: number;
  if (columns === undefined) {
    count = (images as readonly BucketImage[]).length;
  } else {
    if (columns === null || typeof columns !== "object" || columns.buckets == null || columns.values == null) {
      throw new Cbi1Error("InvalidArgument", "images are neither an array nor { buckets, values }", { what: "images" });
    }
    count = columns.buckets.length;
    if (columns.values.length !== count) {
      throw new Cbi1Error("InvalidArgument", `${count} buckets but ${columns.values.length} values`, { buckets: count, values: columns.values.length });
    }
  }
  // Checked before the frame is allocated: the count bounds the allocation.
  if (count > MAX_DELTA_IMAGES) {
    throw new Cbi1Error("DeltaImageCount", `${count} images exceed the ${MAX_DELTA_IMAGES} a frame can carry`, { actual: count, maximum: MAX_DELTA_IMAGES });
  }
  const bucketCount = format.bucketCount;
  const { bytes, view } = allocFrame(IMAGES_HEADER_LEN + DELTA_BODY_PREFIX_LEN + DELTA_IMAGE_LEN * count);
  writeHeader(view, FLAG_DELTA, format, dcId, epoch);
  view.setBigUint64(IMAGES_HEADER_LEN, baseEpoch, true);
  view.setUint32(IMAGES_HEADER_LEN + 8, count, true);
  let at = IMAGES_HEADER_LEN + DELTA_BODY_PREFIX_LEN;
  if (columns === undefined) {
    const list = images as readonly BucketImage[];
    for (let i = 0; i < count; i++, at += DELTA_IMAGE_LEN) {
      const image = list[i];
      const bucket: unknown = image?.bucket;
      if (typeof bucket !== "number" || bucket >>> 0 !== bucket || bucket >= bucketCount) throw invalidBucket(bucket, bucketCount);
      const value: unknown = image!.value;
      if (!isU64(value)) u64Arg(value, `value of image ${i}`);
      view.setUint32(at, bucket, true);
      view.setBigUint64(at + 4, value as bigint, true);
    }
  } else {
    const { buckets, values } = columns;
    const typedBuckets = buckets instanceof Uint32Array;
    const typedValues = values instanceof BigUint64Array;
    if (typedValues && HOST_IS_LITTLE_ENDIAN) {
      // Each value as its two u32 halves (low first on this host): no BigInt per image.
      const halves = new Uint32Array(values.buffer, values.byteOffset, count * 2);
      for (let i = 0; i < count; i++, at += DELTA_IMAGE_LEN) {
        const bucket: unknown = buckets[i];
        if (!typedBuckets && (typeof bucket !== "number" || bucket >>> 0 !== bucket)) throw invalidBucket(bucket, bucketCount);
        if ((bucket as number) >= bucketCount) throw invalidBucket(bucket, bucketCount);
        view.setUint32(at, bucket as number, true);
        view.setUint32(at + 4, halves[i * 2]!, true);
        view.setUint32(at + 8, halves[i * 2 + 1]!, true);
      }
      patchChecksum(bytes, view);
      return bytes;
    }
    for (let i = 0; i < count; i++, at += DELTA_IMAGE_LEN) {
      const bucket: unknown = buckets[i];
      if (!typedBuckets && (typeof bucket !== "number" || bucket >>> 0 !== bucket)) throw invalidBucket(bucket, bucketCount);
      if ((bucket as number) >= bucketCount) throw invalidBucket(bucket, bucketCount);
      const value = values[i]!;
      if (!typedValues && !isU64(value)) u64Arg(value, `value of image ${i}`);
      view.setUint32(at, bucket as number, true);
      view.setBigUint64(at + 4, value, true);
    }
  }
  patchChecksum(bytes, view);
  return bytes;
}

/**
 * One snapshot chunk frame (flags 1) carrying `words` at bucket offset
 * chunkIndex * SNAPSHOT_CHUNK_BUCKETS, as the producer always places them.
 * One allocation of 64 + 8 * words bytes, then `encodeSnapshotChunkInto`.
 */
export function encodeSnapshotChunk(
  format: FilterFormat,
  dcId: bigint,
  epoch: bigint,
  chunkIndex: number,
  chunkCount: number,
  words: BucketWords,
): Uint8Array {
  const length = checkSnapshotChunk(format, dcId, epoch, chunkIndex, chunkCount, words);
  const { bytes } = allocFrame(length);
  writeSnapshotChunk(bytes, format, dcId, epoch, chunkIndex, chunkCount, words, length);
  return bytes;
}

/**
 * The same frame as `encodeSnapshotChunk`, written into `target[0..length)`
 * of a caller's buffer (reused across chunks, it spares a fresh multi-MiB
 * allocation and its page faults per frame). Returns the frame's length,
 * 64 + 8 * words; IMAGES_MAX_FRAME_BYTES always suffices. Bytes past the
 * frame are left alone. Every argument, and then the target's size
 * (InvalidArgument), is checked before anything is written, so a refused
 * call leaves the target as it was. The words are copied as bytes, so the
 * target may sit at any byte offset.
 */
export function encodeSnapshotChunkInto(
  target: Uint8Array,
  format: FilterFormat,
  dcId: bigint,
  epoch: bigint,
  chunkIndex: number,
  chunkCount: number,
  words: BucketWords,
): number {
  if (!(target instanceof Uint8Array)) {
    throw new Cbi1Error("InvalidArgument", "the target is not a Uint8Array", { what: "target" });
  }
  const length = checkSnapshotChunk(format, dcId, epoch, chunkIndex, chunkCount, words);
  if (target.length < length) {
    throw new Cbi1Error("InvalidArgument", `a ${length}-byte frame does not fit a ${target.length}-byte target`, {
      what: "target",
      needed: length,
      available: target.length,
    });
  }
  writeSnapshotChunk(target, format, dcId, epoch, chunkIndex, chunkCount, words, length);
  return length;
}

/** The argument checks of a snapshot chunk, in the encoder's order; returns the frame length. */
function checkSnapshotChunk(format: FilterFormat, dcId: bigint, epoch: bigint, chunkIndex: number, chunkCount: number, words: BucketWords): number {
  formatArg(format);
  u64Arg(dcId, "dcId");
  u64Arg(epoch, "epoch");
  u32Arg(chunkIndex, "chunkIndex");
  u32Arg(chunkCount, "chunkCount");
  const wordCount = bucketWordCount(words);
  if (wordCount > SNAPSHOT_CHUNK_BUCKETS) {
    throw new Cbi1Error("SnapshotChunkWordCount", `${wordCount} words exceed the ${SNAPSHOT_CHUNK_BUCKETS} of a chunk`, {
      actual: wordCount,
      maximum: SNAPSHOT_CHUNK_BUCKETS,
    });
  }
  // A frame the decoder would refuse is an encoder bug; say so here instead.
  if (chunkIndex >= chunkCount) {
    throw new Cbi1Error("InvalidArgument", `chunk ${chunkIndex} of ${chunkCount} does not exist`, { chunkIndex, chunkCount });
  }
  const bucketOffset = chunkIndex * SNAPSHOT_CHUNK_BUCKETS;
  if (bucketOffset + wordCount > format.bucketCount) throw invalidBucket(bucketOffset + wordCount - 1, format.bucketCount);
  assertLittleEndianHost();
  return IMAGES_HEADER_LEN + SNAPSHOT_BODY_PREFIX_LEN + WORD_LEN * wordCount;
}

/**
 * Writes a checked chunk into target[0..length): one bulk byte copy of the
 * words first (so a target that overlaps the words' own buffer still gets
 * them before the header lands), then the header and body prefix, then the
 * checksum over exactly this frame's body.
 */
function writeSnapshotChunk(
  target: Uint8Array,
  format: FilterFormat,
  dcId: bigint,
  epoch: bigint,
  chunkIndex: number,
  chunkCount: number,
  words: BucketWords,
  length: number,
): void {
  const frame = target.length === length ? target : target.subarray(0, length);
  const view = new DataView(frame.buffer, frame.byteOffset, length);
  frame.set(new Uint8Array(words.buffer, words.byteOffset, length - IMAGES_HEADER_LEN - SNAPSHOT_BODY_PREFIX_LEN), IMAGES_HEADER_LEN + SNAPSHOT_BODY_PREFIX_LEN);
  writeHeader(view, FLAG_SNAPSHOT_CHUNK, format, dcId, epoch);
  view.setUint32(IMAGES_HEADER_LEN, chunkIndex, true);
  view.setUint32(IMAGES_HEADER_LEN + 4, chunkCount, true);
  view.setBigUint64(IMAGES_HEADER_LEN + 8, BigInt(chunkIndex * SNAPSHOT_CHUNK_BUCKETS), true);
  patchChecksum(frame, view);
}

/**
 * The chunk frames of a whole lane, 0..n-1 in order, produced lazily (each
 * frame is built when asked for). The word count is checked now, not at the
 * first `next()`. The lane must not change while the frames are drawn.
 */
export function encodeSnapshotChunks(format: FilterFormat, dcId: bigint, epoch: bigint, words: BucketWords): IterableIterator<Uint8Array> {
  formatArg(format);
  u64Arg(dcId, "dcId");
  u64Arg(epoch, "epoch");
  const actual = bucketWordCount(words);
  if (actual !== format.bucketCount) {
    throw new Cbi1Error("SnapshotBucketCount", `snapshot has ${actual} buckets, the format declares ${format.bucketCount}`, {
      expected: format.bucketCount,
      actual,
    });
  }
  return chunks(format, dcId, epoch, words);
}

function* chunks(format: FilterFormat, dcId: bigint, epoch: bigint, words: BucketWords): IterableIterator<Uint8Array> {
  const total = format.bucketCount;
  const count = snapshotChunkCount(total);
  // Slots are 4 per word, so a Uint16Array is cut at 4x the word indices.
  const scale = words instanceof Uint16Array ? 4 : 1;
  for (let index = 0; index < count; index++) {
    const start = index * SNAPSHOT_CHUNK_BUCKETS;
    const end = Math.min(start + SNAPSHOT_CHUNK_BUCKETS, total);
    yield encodeSnapshotChunk(format, dcId, epoch, index, count, words.subarray(start * scale, end * scale));
  }
}
