import { xxh3 } from "@node-rs/xxhash";
import { MediaError } from "./errors.js";
import { videoMetadataJson } from "./serde-json.js";
import { DTYPE_BYTE, MAX_TENSOR_RANK, isImageMetadata, isVideoMetadata } from "./tensor.js";
import type { DataType, MediaTensorInfo } from "./tensor.js";

/**
 * Below this many bytes the one-shot XXH3 is faster than feeding a reused
 * streaming hasher; above it the streaming hasher runs at memory speed.
 */
export const ONE_SHOT_MAX_BYTES = 2048;

const VIDEO_TAG = new TextEncoder().encode("video");

let shared: xxh3.Xxh3 | undefined;

/** The process-wide streaming hasher, reset. Safe: every use is synchronous. */
function streamingHasher(): xxh3.Xxh3 {
  shared ??= xxh3.Xxh3.withSeed(0n);
  shared.reset();
  return shared;
}

/** XXH3-64 (seed 0) of `prefix ‖ payload`, one-shot when small. */
function hashPrefixed(prefix: Uint8Array, payload: Uint8Array): bigint {
  const total = prefix.length + payload.length;
  if (total < ONE_SHOT_MAX_BYTES) {
    const joined = new Uint8Array(total);
    joined.set(prefix, 0);
    joined.set(payload, prefix.length);
    return xxh3.xxh64(joined, 0n);
  }
  return streamingHasher().update(prefix).update(payload).digest();
}

function checkDim(dim: number): bigint {
  if (!Number.isSafeInteger(dim) || dim < 0) {
    throw new MediaError("TENSOR_INVALID", `tensor dimension ${dim} is not a non-negative integer`);
  }
  return BigInt(dim);
}

/** Writes u64 LE values and raw bytes into one buffer. */
class HeaderWriter {
  private readonly parts: Uint8Array[] = [];
  private size = 0;

  u64(value: bigint): this {
    const b = new Uint8Array(8);
    new DataView(b.buffer).setBigUint64(0, value, true);
    return this.bytes(b);
  }

  bytes(b: Uint8Array): this {
    this.parts.push(b);
    this.size += b.length;
    return this;
  }

  /** LP(x) = u64 LE len(x) ‖ x */
  lengthPrefixed(b: Uint8Array): this {
    return this.u64(BigInt(b.length)).bytes(b);
  }

  shape(shape: readonly number[], dtype: DataType): this {
    if (shape.length > MAX_TENSOR_RANK) {
      throw new MediaError("TENSOR_INVALID", `tensor rank ${shape.length} exceeds the limit of ${MAX_TENSOR_RANK}`);
    }
    this.u64(BigInt(shape.length));
    for (const dim of shape) this.u64(checkDim(dim));
    return this.bytes(Uint8Array.of(DTYPE_BYTE[dtype]));
  }

  finish(): Uint8Array {
    const out = new Uint8Array(this.size);
    let at = 0;
    for (const p of this.parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }
}

/**
 * Canonical image hash: XXH3-64 over `u64 LE rank ‖ dims as u64 LE ‖ dtype
 * byte ‖ bytes`. Null for an empty payload.
 */
export function canonicalContentHash(shape: readonly number[], dtype: DataType, bytes: Uint8Array): bigint | null {
  if (bytes.length === 0) return null;
  return hashPrefixed(new HeaderWriter().shape(shape, dtype).finish(), bytes);
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
  const prefix = new HeaderWriter()
    .lengthPrefixed(VIDEO_TAG)
    .shape(info.shape, info.dtype)
    .lengthPrefixed(json)
    .u64(BigInt(bytes.length))
    .finish();
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
