import { U64_MAX } from "../../bytes/index.js";

/** Stable codes of KvHashError. */
export type KvHashErrorCode =
  /** A token is not an integer in 0..2^32-1 (tokens are u32 in the reference). */
  | "INVALID_TOKEN"
  /** A block size is not an integer in 0..2^32-1 (the reference's u32). */
  | "INVALID_BLOCK_SIZE"
  /** Query semantics with a block size of 0, which would define no blocks. */
  | "ZERO_BLOCK_SIZE"
  /** A hash, seed or multimodal hash is not a bigint in 0..2^64-1. */
  | "INVALID_U64"
  /** A model id or alias is the empty string. */
  | "EMPTY_NAME"
  /** A model id or alias starts or ends with whitespace. */
  | "SURROUNDING_WHITESPACE"
  /** A hash format this build does not implement. */
  | "UNKNOWN_HASH_FORMAT";

/** Bad input to KV block hashing or to the model identity it is keyed by. */
export class KvHashError extends Error {
  override readonly name = "KvHashError";

  constructor(
    readonly code: KvHashErrorCode,
    message: string,
  ) {
    super(message);
  }
}

/** Returns `value` when it is a u64 bigint; KvHashError INVALID_U64 otherwise (never wrapped). */
export function checkU64(value: bigint, what: string): bigint {
  if (typeof value !== "bigint" || value < 0n || value > U64_MAX) {
    throw new KvHashError("INVALID_U64", `${what} ${String(value)} is not a u64`);
  }
  return value;
}
