import { xxh3 } from "@node-rs/xxhash";
import { assertU64 } from "./errors.js";

/**
 * Below this many bytes the one-shot XXH3 is faster than feeding a reused
 * streaming hasher; from it on the streaming hasher runs at memory speed.
 * Both give the same digest.
 */
export const ONE_SHOT_MAX_BYTES = 2048;

/** Reused streaming hasher per seed; a handful of seeds are in use at most. */
const hashers = new Map<bigint, xxh3.Xxh3>();
const MAX_CACHED_SEEDS = 8;

/** A reset streaming hasher for `seed`. Safe to share: every use is synchronous. */
function reusedHasher(seed: bigint): xxh3.Xxh3 {
  let hasher = hashers.get(seed);
  if (hasher === undefined) {
    if (hashers.size >= MAX_CACHED_SEEDS) hashers.clear();
    hasher = xxh3.Xxh3.withSeed(seed);
    hashers.set(seed, hasher);
  } else {
    hasher.reset();
  }
  return hasher;
}

/** XXH3-64 of `data` with `seed` (a u64; checked, never wrapped). */
export function xxh3_64(data: Uint8Array, seed = 0n): bigint {
  assertU64(seed, "xxh3 seed");
  if (data.length < ONE_SHOT_MAX_BYTES) return xxh3.xxh64(data, seed);
  return reusedHasher(seed).update(data).digest();
}

/** XXH3-64 of the concatenation of `parts`, without concatenating them (beyond a small join under ONE_SHOT_MAX_BYTES). */
export function xxh3_64Parts(parts: readonly Uint8Array[], seed = 0n): bigint {
  assertU64(seed, "xxh3 seed");
  let total = 0;
  for (const part of parts) total += part.length;
  if (total < ONE_SHOT_MAX_BYTES) {
    if (parts.length === 1) return xxh3.xxh64(parts[0]!, seed);
    const joined = new Uint8Array(total);
    let at = 0;
    for (const part of parts) {
      joined.set(part, at);
      at += part.length;
    }
    return xxh3.xxh64(joined, seed);
  }
  const hasher = reusedHasher(seed);
  for (const part of parts) hasher.update(part);
  return hasher.digest();
}

/** The low 32 bits of XXH3-64(data, seed), as an unsigned number. */
export function xxh3Low32(data: Uint8Array, seed = 0n): number {
  return Number(xxh3_64(data, seed) & 0xffff_ffffn);
}

/** A seeded streaming XXH3-64 for callers that hash as data arrives. */
export class Xxh3Stream {
  readonly seed: bigint;
  private readonly hasher: xxh3.Xxh3;

  constructor(seed = 0n) {
    this.seed = assertU64(seed, "xxh3 seed");
    this.hasher = xxh3.Xxh3.withSeed(seed);
  }

  update(data: Uint8Array): this {
    this.hasher.update(data);
    return this;
  }

  /** The digest of everything fed since construction or the last reset; feeding may go on. */
  digest(): bigint {
    return this.hasher.digest();
  }

  /** Back to the empty input, same seed. */
  reset(): this {
    this.hasher.reset();
    return this;
  }
}
