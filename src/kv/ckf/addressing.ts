/**
 * Key -> fingerprint and candidate buckets (B.2).
 *
 *   mixed       = XXH3_64(le_u64(key), seed)
 *   fingerprint = mixed & 0xFFFF, or 1 when that is 0 (0 marks an empty slot)
 *   bucketA     = (mixed >> 16) & (bucketCount - 1)
 *   delta(fp)   = XXH3_64(le_u16(fp), seed ^ 0x9E3779B97F4A7C15) & (bucketCount - 1), or 1 when 0
 *   bucketB     = bucketA ^ delta(fp);  alternate(bucket, fp) = bucket ^ delta(fp)
 *
 * delta depends on the fingerprint only, which is what lets an evicted
 * fingerprint find its other bucket without the key; it is never 0, so the two
 * buckets always differ, and xor makes `alternate` an involution.
 */
import { xxh3_64 } from "../../bytes/index.js";
import { MAX_RELAY_BUCKET_COUNT } from "./config.js";
import { CkfError, describeValue } from "./errors.js";
import { GOLDEN_GAMMA, isU64, leU64 } from "./u64.js";
import { Xxh3Of8 } from "./xxh3-8.js";

const FINGERPRINTS = 1 << 16;

/**
 * The low 32 bits of XXH3_64(le_u16(fp), seed ^ gamma) for every fp, per
 * seed. Built with the library (65,536 hashes, tens of milliseconds), so it is
 * kept for the few seeds a process uses; masks of any bucket count apply on top.
 */
const rawDeltaTables = new Map<bigint, Uint32Array>();
const MAX_CACHED_SEEDS = 4;

function rawDeltaTable(seed: bigint): Uint32Array {
  let table = rawDeltaTables.get(seed);
  if (table !== undefined) return table;
  table = new Uint32Array(FINGERPRINTS);
  const deltaSeed = seed ^ GOLDEN_GAMMA;
  const bytes = new Uint8Array(2);
  for (let fp = 0; fp < FINGERPRINTS; fp++) {
    bytes[0] = fp & 0xff;
    bytes[1] = fp >>> 8;
    table[fp] = Number(xxh3_64(bytes, deltaSeed) & 0xffff_ffffn);
  }
  if (rawDeltaTables.size >= MAX_CACHED_SEEDS) rawDeltaTables.clear();
  rawDeltaTables.set(seed, table);
  return table;
}

/**
 * delta(fp) for every fp, per (seed, bucket count): 256 KiB that every lane of
 * that layout shares (a consumer holds up to 16 lanes of one format).
 */
const deltaTables = new Map<string, Uint32Array>();
const MAX_CACHED_LAYOUTS = 8;

function deltaTable(seed: bigint, mask: number): Uint32Array {
  const key = `${seed}:${mask}`;
  let table = deltaTables.get(key);
  if (table !== undefined) return table;
  const raw = rawDeltaTable(seed);
  table = new Uint32Array(FINGERPRINTS);
  for (let fp = 0; fp < FINGERPRINTS; fp++) table[fp] = (raw[fp]! & mask) || 1;
  if (deltaTables.size >= MAX_CACHED_LAYOUTS) deltaTables.clear();
  deltaTables.set(key, table);
  return table;
}

/**
 * Throws CkfError unless (seed, bucketCount) is a layout the addressing can
 * serve: a u64 seed (InvalidSeed) and a power of two in 2..2^24
 * (BucketCountTooLarge above, InvalidIdentity otherwise). At most 2^24 keeps
 * `mask` a small positive int32 for the fast path's bit operations; the BigInt
 * path shares the check so that both answer for exactly the same layouts.
 */
function checkLayout(seed: bigint, bucketCount: number): void {
  if (!isU64(seed)) throw new CkfError("InvalidSeed", `seed ${describeValue(seed)} is not a u64`);
  if (typeof bucketCount === "number" && bucketCount > MAX_RELAY_BUCKET_COUNT) {
    throw new CkfError("BucketCountTooLarge", `bucket count ${bucketCount} exceeds ${MAX_RELAY_BUCKET_COUNT}`);
  }
  if (!Number.isInteger(bucketCount) || bucketCount < 2 || (bucketCount & (bucketCount - 1)) !== 0) {
    throw new CkfError("InvalidIdentity", `bucket count ${describeValue(bucketCount)} is not a power of two >= 2`);
  }
}

/** The addressing of one (seed, bucket count); `probe` fills reused fields. */
export class CkfAddressing {
  readonly seed: bigint;
  readonly bucketCount: number;
  readonly mask: number;
  /** delta(fp) for every 16-bit fp (index 0 is never used by a stored fingerprint); shared, never written. */
  readonly deltas: Uint32Array;
  /** Results of the last `probe`. */
  fingerprint = 0;
  bucketA = 0;
  bucketB = 0;
  private readonly mixer: Xxh3Of8;

  constructor(seed: bigint, bucketCount: number) {
    checkLayout(seed, bucketCount);
    this.seed = seed;
    this.bucketCount = bucketCount;
    this.mask = bucketCount - 1;
    this.mixer = new Xxh3Of8(seed);
    this.deltas = deltaTable(seed, this.mask);
  }

  /** Addresses the key (hi, lo): sets `fingerprint`, `bucketA`, `bucketB`. */
  probe(hi: number, lo: number): void {
    const mixer = this.mixer;
    mixer.hash(hi, lo);
    const mixedLo = mixer.lo;
    const fp = (mixedLo & 0xffff) || 1;
    // (mixed >> 16) & mask; mask < 2^31, so the high half contributes bits 16.. of the index.
    const a = ((mixedLo >>> 16) | (mixer.hi << 16)) & this.mask;
    this.fingerprint = fp;
    this.bucketA = a;
    this.bucketB = a ^ this.deltas[fp]!;
  }

  /** The other candidate bucket of a fingerprint stored in `bucket`. */
  alternate(bucket: number, fingerprint: number): number {
    return bucket ^ this.deltas[fingerprint]!;
  }
}

/** Where a u64 sequence hash lives in a filter: for diagnostics (`kv locate`) and as a BigInt reference. */
export interface CkfLocation {
  readonly key: bigint;
  readonly mixed: bigint;
  readonly fingerprint: number;
  readonly bucketA: number;
  readonly bucketB: number;
}

/**
 * B.2 in BigInt through the library, independent of the 32-bit fast path:
 * what `mmgate kv locate` prints and what the tests hold the fast path to.
 * Throws CkfError for a key that is not a u64 (InvalidKey: le_u64 would wrap
 * it, or throw a bare TypeError) and for a layout CkfAddressing refuses (the
 * mask arithmetic would otherwise answer silently for a layout that cannot
 * exist, e.g. bucket count 0 masks with -1).
 */
export function locateKey(key: bigint, format: { readonly seed: bigint; readonly bucketCount: number }): CkfLocation {
  if (!isU64(key)) throw new CkfError("InvalidKey", `key ${describeValue(key)} is not a u64`);
  checkLayout(format.seed, format.bucketCount);
  const mask = BigInt(format.bucketCount - 1);
  const mixed = xxh3_64(leU64(key), format.seed);
  const fingerprint = Number(mixed & 0xffffn) || 1;
  const bucketA = (mixed >> 16n) & mask;
  const fpBytes = Uint8Array.of(fingerprint & 0xff, fingerprint >>> 8);
  const delta = (xxh3_64(fpBytes, format.seed ^ GOLDEN_GAMMA) & mask) || 1n;
  return { key, mixed, fingerprint, bucketA: Number(bucketA), bucketB: Number(bucketA ^ delta) };
}

/**
 * Whether either of the key's candidate buckets in `slots` (four 16-bit slots
 * per bucket) holds its fingerprint: the filter's membership test, with false
 * positives and no false negatives. `addressing` is left holding the key's probe.
 */
export function slotsHoldKey(addressing: CkfAddressing, slots: Uint16Array, hi: number, lo: number): boolean {
  addressing.probe(hi, lo);
  const fp = addressing.fingerprint;
  let i = addressing.bucketA << 2;
  if (slots[i] === fp || slots[i + 1] === fp || slots[i + 2] === fp || slots[i + 3] === fp) return true;
  i = addressing.bucketB << 2;
  return slots[i] === fp || slots[i + 1] === fp || slots[i + 2] === fp || slots[i + 3] === fp;
}
