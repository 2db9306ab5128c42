import { createRequire } from "node:module";
import { xxh3 } from "@node-rs/xxhash";
import { rootUrl } from "../paths.js";
import { assertU64 } from "./errors.js";

/** xxhash-addon's XXH3-64 class: a big-endian 8-byte seed in, a big-endian 8-byte digest out; Buffers only. */
interface NativeXxh3 {
  update(data: Buffer): void;
  digest(): Buffer;
  reset(): void;
}
interface NativeXxh3Class {
  new (seed: Buffer): NativeXxh3;
  hash(data: Buffer): Buffer;
}

/**
 * xxhash-addon's prebuilt XXH3, which dispatches to AVX2 at run time (the
 * @node-rs/xxhash prebuild does not: about half the speed on large inputs).
 * It aborts the process on an argument that is not a Buffer, so it is
 * reached only through `asBuffer` below. Undefined when it cannot be loaded
 * (no prebuild for this platform): @node-rs/xxhash serves instead, with the
 * same digests.
 */
const native: NativeXxh3Class | undefined = (() => {
  if (process.env["MMGATE_XXH3"] === "node-rs") return undefined;
  try {
    // Resolved from the repository's root, whichever depth the calling file (or bundle chunk) sits at.
    const addon = createRequire(new URL("package.json", rootUrl))("xxhash-addon") as { XXHash3?: NativeXxh3Class };
    return typeof addon.XXHash3 === "function" ? addon.XXHash3 : undefined;
  } catch {
    return undefined;
  }
})();

/** Which implementation hashes: "xxhash-addon" (native AVX2 dispatch) or "@node-rs/xxhash". */
export const XXH3_IMPLEMENTATION: "xxhash-addon" | "@node-rs/xxhash" = native ? "xxhash-addon" : "@node-rs/xxhash";

/** A Buffer view of `data` (no copy): the only form the native addon may be handed. */
function asBuffer(data: Uint8Array): Buffer {
  return Buffer.isBuffer(data) ? data : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
}

/** Native hashers by seed, reused (every use is synchronous). */
const nativeHashers = new Map<bigint, NativeXxh3>();

function nativeHasher(seed: bigint): NativeXxh3 {
  let hasher = nativeHashers.get(seed);
  if (hasher === undefined) {
    if (nativeHashers.size >= MAX_CACHED_SEEDS) nativeHashers.clear();
    const seedBytes = Buffer.alloc(8);
    seedBytes.writeBigUInt64BE(seed);
    hasher = new native!(seedBytes);
    nativeHashers.set(seed, hasher);
  } else {
    hasher.reset();
  }
  return hasher;
}

/** The native digest of the concatenation of `parts` (a 0 seed of one part takes the addon's one-shot path). */
function nativeDigest(parts: readonly Uint8Array[], seed: bigint): bigint {
  if (seed === 0n && parts.length === 1) return native!.hash(asBuffer(parts[0]!)).readBigUInt64BE(0);
  const hasher = nativeHasher(seed);
  for (const part of parts) hasher.update(asBuffer(part));
  return hasher.digest().readBigUInt64BE(0);
}

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
  if (native) return nativeDigest([data], seed);
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
  if (native) return nativeDigest(parts, seed);
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
  private readonly hasher: xxh3.Xxh3 | NativeXxh3;

  constructor(seed = 0n) {
    this.seed = assertU64(seed, "xxh3 seed");
    if (native) {
      const seedBytes = Buffer.alloc(8);
      seedBytes.writeBigUInt64BE(seed);
      this.hasher = new native(seedBytes);
    } else {
      this.hasher = xxh3.Xxh3.withSeed(seed);
    }
  }

  update(data: Uint8Array): this {
    if (native) (this.hasher as NativeXxh3).update(asBuffer(data));
    else (this.hasher as xxh3.Xxh3).update(data);
    return this;
  }

  /** The digest of everything fed since construction or the last reset; feeding may go on. */
  digest(): bigint {
    return native ? (this.hasher as NativeXxh3).digest().readBigUInt64BE(0) : (this.hasher as xxh3.Xxh3).digest();
  }

  /** Back to the empty input, same seed. */
  reset(): this {
    this.hasher.reset();
    return this;
  }
}
