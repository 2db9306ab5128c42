import { ByteWriter, lengthPrefixedSize, ONE_SHOT_MAX_BYTES, xxh3_64Parts } from "../bytes/index.js";
import { MediaError } from "./errors.js";
import { videoMetadataJson } from "./serde-json.js";
import { DTYPE_BYTE, MAX_TENSOR_RANK, isImageMetadata, isVideoMetadata } from "./tensor.js";
import type { DataType, MediaTensorInfo } from "./tensor.js";

export { ONE_SHOT_MAX_BYTES };

const VIDEO_TAG = new TextEncoder().encode("video");

/** XXH3-64 (seed 0) of `prefix ‖ payload`. */
function hashPrefixed(prefix: Uint8Array, payload: Uint8Array): bigint {
  return xxh3_64Parts([prefix, payload], 0n);
}

function checkDim(dim: number): bigint {
  if (!Number.isSafeInteger(dim) || dim < 0) {
    throw new MediaError("TENSOR_INVALID", `tensor dimension ${dim} is not a non-negative integer`);
  }
  return BigInt(dim);
}

/** Bytes of `u64 LE rank ‖ dims as u64 LE ‖ dtype byte`; refuses too many dimensions before anything is built. */
function shapeSize(shape: readonly number[]): number {
  if (shape.length > MAX_TENSOR_RANK) {
    throw new MediaError("TENSOR_INVALID", `tensor rank ${shape.length} exceeds the limit of ${MAX_TENSOR_RANK}`);
  }
  return 8 + 8 * shape.length + 1;
}

function writeShape(writer: ByteWriter, shape: readonly number[], dtype: DataType): ByteWriter {
  writer.u64(BigInt(shape.length));
  for (const dim of shape) writer.u64(checkDim(dim));
  return writer.u8(DTYPE_BYTE[dtype]);
}

/**
 * Canonical image hash: XXH3-64 over `u64 LE rank ‖ dims as u64 LE ‖ dtype
 * byte ‖ bytes`. Null for an empty payload.
 */
export function canonicalContentHash(shape: readonly number[], dtype: DataType, bytes: Uint8Array): bigint | null {
  if (bytes.length === 0) return null;
  const header = writeShape(new ByteWriter(shapeSize(shape)), shape, dtype).finish();
  return hashPrefixed(header, bytes);
}

/**
 * Canonical video hash: `LP("video") ‖ rank ‖ dims ‖ dtype ‖ LP(metadata
 * JSON) ‖ LP(bytes)`. Throws when the tensor is not a valid video.
 */
export function videoContentHash(info: MediaTensorInfo, bytes: Uint8Array): bigint {
  if (bytes.length === 0) throw new MediaError("VIDEO_TENSOR_INVALID", "decoded video payload is empty");
  if (info.metadata === null) throw new MediaError("VIDEO_METADATA_INVALID", "decoded video metadata is missing");
  if (!isVideoMetadata(info.metadata)) {
    throw new MediaError("VIDEO_METADATA_INVALID", "decoded media metadata is not video metadata");
  }
  const json = new TextEncoder().encode(videoMetadataJson(info.metadata.Video));
  const size = lengthPrefixedSize(VIDEO_TAG.length) + shapeSize(info.shape) + lengthPrefixedSize(json.length) + 8;
  const writer = new ByteWriter(size).lengthPrefixed(VIDEO_TAG);
  const prefix = writeShape(writer, info.shape, info.dtype).lengthPrefixed(json).u64(BigInt(bytes.length)).finish();
  return hashPrefixed(prefix, bytes);
}

/**
 * The hash the reference stores with decoded media: images always, videos
 * only when eligible for exact routing (and valid), nothing without
 * metadata or for an empty payload.
 */
export function contentHashForTensor(info: MediaTensorInfo, bytes: Uint8Array, hashVideo: boolean): bigint | null {
  if (bytes.length === 0) return null;
  if (isImageMetadata(info.metadata)) return canonicalContentHash(info.shape, info.dtype, bytes);
  if (isVideoMetadata(info.metadata) && hashVideo) {
    try {
      return videoContentHash(info, bytes);
    } catch {
      // As the reference: an unhashable video simply gets no exact-routing key.
      return null;
    }
  }
  return null;
}

/** 16 lowercase hex digits, zero-padded. */
export function formatContentHashKey(hash: bigint): string {
  return hash.toString(16).padStart(16, "0");
}

/** Parses a content hash key (radix 16) back to its u64; null when malformed. */
export function parseContentHashKey(key: string): bigint | null {
  if (!/^[0-9a-fA-F]{1,16}$/.test(key)) return null;
  return BigInt(`0x${key}`);
}
