/**
 * CBI1 (Cuckoo Bucket Images v1) wire constants (spec A.1). Every limit is a
 * number of bytes or items the decoder checks before it reads past a length.
 */

/** `CBI1` as bytes 0..3 of every frame. */
export const IMAGES_MAGIC: readonly number[] = Object.freeze([0x43, 0x42, 0x49, 0x31]);
/** Frame-encoding version (header offset 4). */
export const IMAGES_WIRE_VERSION = 1;
/** Fixed header size; the body (and the checksum's input) starts here. */
export const IMAGES_HEADER_LEN = 48;
/** `flags` is an exact value, not a bitmask: 1 is a snapshot chunk, 2 a delta, anything else is refused. */
export const FLAG_SNAPSHOT_CHUNK = 1;
export const FLAG_DELTA = 2;
/** CKF layout identity carried in every header (format version 1: 16-bit fingerprints, 4 slots per bucket). */
export const FORMAT_VERSION = 1;
export const FINGERPRINT_BITS = 16;
export const SLOTS_PER_BUCKET = 4;
/** Bucket words per snapshot chunk (4 MiB of words); every chunk but the last is full. */
export const SNAPSHOT_CHUNK_BUCKETS = 524_288;
/** Largest bucket count a FilterFormat accepts (a lane of 128 MiB). */
export const MAX_BUCKET_COUNT = 1 << 24;
/** Snapshot chunk body prefix: chunk_index u32, chunk_count u32, bucket_offset u64. */
export const SNAPSHOT_BODY_PREFIX_LEN = 16;
/** Bytes per bucket word. */
export const WORD_LEN = 8;
/** The largest frame: a full snapshot chunk, 48 + 16 + 524,288 * 8 = 4,194,368 bytes. */
export const IMAGES_MAX_FRAME_BYTES = IMAGES_HEADER_LEN + SNAPSHOT_BODY_PREFIX_LEN + SNAPSHOT_CHUNK_BUCKETS * WORD_LEN;
/** Delta body prefix: base_epoch u64, image_count u32. */
export const DELTA_BODY_PREFIX_LEN = 12;
/** One delta image: bucket u32, value u64 (unaligned after the prefix). */
export const DELTA_IMAGE_LEN = 12;
/** The most images a delta can carry and still fit IMAGES_MAX_FRAME_BYTES: 349,525. */
export const MAX_DELTA_IMAGES = Math.floor((IMAGES_MAX_FRAME_BYTES - IMAGES_HEADER_LEN - DELTA_BODY_PREFIX_LEN) / DELTA_IMAGE_LEN);

/** Header field offsets (spec A.2). */
export const OFFSET = Object.freeze({
  magic: 0,
  wireVersion: 4,
  flags: 6,
  fingerprintBits: 8,
  slotsPerBucket: 9,
  formatVersion: 10,
  seed: 12,
  bucketCount: 20,
  dcId: 28,
  epoch: 36,
  checksum: 44,
});

/** Chunks of a snapshot of `bucketCount` buckets: ceil(bucketCount / SNAPSHOT_CHUNK_BUCKETS). */
export function snapshotChunkCount(bucketCount: number): number {
  return Math.ceil(bucketCount / SNAPSHOT_CHUNK_BUCKETS);
}
