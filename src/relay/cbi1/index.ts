// CBI1 (Cuckoo Bucket Images v1): the byte format in which the relay carries
// CKF lanes — snapshot chunks and deltas of absolute bucket words — with the
// consumer-side snapshot reassembly. Spec: cbi1-and-ckf.md section A.
export {
  DELTA_BODY_PREFIX_LEN,
  DELTA_IMAGE_LEN,
  FINGERPRINT_BITS,
  FLAG_DELTA,
  FLAG_SNAPSHOT_CHUNK,
  FORMAT_VERSION,
  IMAGES_HEADER_LEN,
  IMAGES_MAGIC,
  IMAGES_MAX_FRAME_BYTES,
  IMAGES_WIRE_VERSION,
  MAX_BUCKET_COUNT,
  MAX_DELTA_IMAGES,
  SLOTS_PER_BUCKET,
  SNAPSHOT_BODY_PREFIX_LEN,
  SNAPSHOT_CHUNK_BUCKETS,
  snapshotChunkCount,
  WORD_LEN,
} from "./constants.js";
export { CBI1_ERROR_CODES, Cbi1Error, isCbi1Error, type Cbi1ErrorCode, type Cbi1ErrorDetails, type FormatErrorKind } from "./errors.js";
export { FilterFormat } from "./format.js";
export type { Cbi1Header } from "./header.js";
export {
  bucketWordCount,
  encodeDelta,
  encodeSnapshotChunk,
  encodeSnapshotChunkInto,
  encodeSnapshotChunks,
  type BucketImage,
  type BucketImageColumns,
  type BucketWords,
} from "./encode.js";
export { decode, DeltaImages, peekFormat, type Cbi1DeltaFrame, type Cbi1Frame, type Cbi1SnapshotChunkFrame } from "./decode.js";
export { SnapshotAssembly, sparseImages, type AssembledSnapshot, type SnapshotAssemblyOptions } from "./assembly.js";
