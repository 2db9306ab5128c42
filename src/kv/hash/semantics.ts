import { KvHashError } from "./errors.js";

/**
 * The complete token → sequence-hash pipeline of a pool, versioned as one
 * unit (windowing, multimodal bytes, salt, block and chain hashing): a
 * consumer implements a format whole or rejects it, never mixes steps.
 */
export const KV_QUERY_HASH_FORMATS = ["DYNAMO_STANDARD_V1", "DYNAMO_EAGLE_V1"] as const;
export type KvQueryHashFormat = (typeof KV_QUERY_HASH_FORMATS)[number];

/** `value` as a KvQueryHashFormat; KvHashError UNKNOWN_HASH_FORMAT for anything else. */
export function parseKvQueryHashFormat(value: string): KvQueryHashFormat {
  if ((KV_QUERY_HASH_FORMATS as readonly string[]).includes(value)) return value as KvQueryHashFormat;
  throw new KvHashError("UNKNOWN_HASH_FORMAT", `unknown KV query hash format ${JSON.stringify(value)}`);
}

export function kvQueryHashFormatFromEagle(enableEagle: boolean): KvQueryHashFormat {
  return enableEagle ? "DYNAMO_EAGLE_V1" : "DYNAMO_STANDARD_V1";
}

/** Whether the format hashes Eagle windows (block size + 1 tokens, striding by block size). */
export function isEagleHashFormat(format: KvQueryHashFormat): boolean {
  return format === "DYNAMO_EAGLE_V1";
}

/** The version the format mixes into the pool's cache-semantics identity: 1 standard, 2 Eagle. */
export function hashFormatIdentityVersion(format: KvQueryHashFormat): number {
  return format === "DYNAMO_EAGLE_V1" ? 2 : 1;
}

/** What a consumer needs to reproduce the sequence hashes a pool's filter holds. */
export interface KvQuerySemantics {
  /** Tokens per block, 1..2^32-1. */
  readonly kvBlockSize: number;
  readonly hashFormat: KvQueryHashFormat;
  /** isEagleHashFormat(hashFormat), kept beside it for the hashing options. */
  readonly isEagle: boolean;
}

/**
 * Validated query semantics: a block size of 0 (KvHashError ZERO_BLOCK_SIZE)
 * would silently hash nothing, so it is refused here rather than later; a
 * non-u32 size is INVALID_BLOCK_SIZE, an unknown format UNKNOWN_HASH_FORMAT.
 */
export function createKvQuerySemantics(kvBlockSize: number, hashFormat: KvQueryHashFormat): KvQuerySemantics {
  if (kvBlockSize >>> 0 !== kvBlockSize) {
    throw new KvHashError("INVALID_BLOCK_SIZE", `kv block size ${String(kvBlockSize)} is not an integer in 1..4294967295`);
  }
  if (kvBlockSize === 0) throw new KvHashError("ZERO_BLOCK_SIZE", "kv block size must not be 0");
  const format = parseKvQueryHashFormat(hashFormat);
  return Object.freeze({ kvBlockSize, hashFormat: format, isEagle: isEagleHashFormat(format) });
}
