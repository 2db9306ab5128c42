import { xxh3_64 } from "../../bytes/index.js";
import { checkU64 } from "./errors.js";

/** One multimodal object that overlaps a block. */
export interface BlockMmObjectInfo {
  /** The object's routing hash (see hashMmIdentifier), a u64. */
  readonly mmHash: bigint;
  /** Token ranges the object covers, [start, end); carried along, not hashed. */
  readonly offsets: readonly (readonly [number, number])[];
}

/** The multimodal objects of one block; their hashes enter that block's hash. */
export interface BlockExtraInfo {
  readonly mmObjects: readonly BlockMmObjectInfo[];
}

/** sglang's pad-value offset; pad values below it would collide with real token ids. */
export const MM_PAD_SHIFT_VALUE = 1_000_000;
/** sglang keeps the low 30 bits of an mm hash in its pad value. */
export const MM_PAD_HASH_MASK = (1n << 30n) - 1n;

const utf8 = new TextEncoder();
const VLLM_HEX_DIGEST = /^[0-9a-fA-F]{64}$/;

/**
 * A multimodal identifier's routing hash. vLLM's 64-hex-digit digests keep
 * their established mapping (the u64 read from the first 16 hex digits) so
 * that hashes agree with what vLLM workers report; any other non-empty
 * identifier is XXH3-64 of its UTF-8 bytes with seed 0. The empty string has
 * no hash.
 */
export function hashMmIdentifier(identifier: string): bigint | undefined {
  if (identifier === "") return undefined;
  if (identifier.length === 64 && VLLM_HEX_DIGEST.test(identifier)) return BigInt(`0x${identifier.slice(0, 16)}`);
  return xxh3_64(utf8.encode(identifier), 0n);
}

/**
 * The placeholder token sglang puts where a multimodal object sits:
 * 1,000,000 + the hash's low 30 bits. Frontend and router both derive it from
 * the mm hash so that request-side and event-side hashes agree.
 */
export function padValueForMmHash(mmHash: bigint): number {
  return MM_PAD_SHIFT_VALUE + Number(checkU64(mmHash, "mm hash") & MM_PAD_HASH_MASK);
}
