/**
 * CKF configuration (B.1): defaults, validation and the bucket-count rule.
 * The bucket count is fixed when a state is built and never resizes, so it is
 * derived here once from the expected number of unique blocks.
 */
import { CkfError } from "./errors.js";
import { isU64, U64_MAX } from "./u64.js";

/** Lanes of the global filter (one per datacenter); the DC state uses lane 0. */
export const CKF_LANE_COUNT = 16;
/** Upper bound of maxKicks. */
export const MAX_KICKS = 4096;
/** Upper bound of search.verificationWindow. */
export const MAX_VERIFICATION_WINDOW = 8;
/** The relay's largest accepted bucket count (a lane of 128 MiB). */
export const MAX_RELAY_BUCKET_COUNT = 1 << 24;
/** Fingerprint width and bucket shape of format version 1. */
export const FORMAT_VERSION = 1;
export const FINGERPRINT_BITS = 16;
export const SLOTS_PER_BUCKET = 4;
/** The relay's defaults (B.8): expected unique blocks per DC and events per publication. */
export const DEFAULT_EXPECTED_UNIQUE_BLOCKS = 1_048_576;
export const DEFAULT_PUBLICATION_THRESHOLD = 16;

/** A validated CKF configuration. */
export interface CkfConfig {
  /** How many unique blocks the DC is expected to hold; sizes the filter for about 80% load. */
  readonly expectedBlocksPerDc: number;
  /** The u64 seed of addressing and of the eviction RNG. */
  readonly seed: bigint;
  /** Evictions tried before an insert gives up (and rolls back). */
  readonly maxKicks: number;
  /** Consumer prefix search; validated here because the format's consumers share this config. */
  readonly search: { readonly verificationWindow: number };
  /** Applied events per publication boundary. */
  readonly publishEveryNEvents: number;
}

/** What a caller may leave out; everything else takes the reference default. */
export interface CkfConfigInit {
  readonly expectedBlocksPerDc?: number;
  readonly seed?: bigint;
  readonly maxKicks?: number;
  readonly search?: { readonly verificationWindow?: number };
  readonly publishEveryNEvents?: number;
}

export const DEFAULT_CKF_CONFIG: CkfConfig = Object.freeze({
  expectedBlocksPerDc: 1,
  seed: 0x5dee_ce66_d1b5_4a33n,
  maxKicks: 500,
  search: Object.freeze({ verificationWindow: 2 }),
  publishEveryNEvents: 1,
});

/** The identity of a filter layout: two filters with equal identities index the same keys the same way. */
export interface DcCkfFormatIdentity {
  readonly formatVersion: 1;
  readonly seed: bigint;
  readonly bucketCount: number;
  readonly fingerprintBits: 16;
  readonly slotsPerBucket: 4;
}

/**
 * bucket_count(n): the next power of two of max(2, floor((5n + 15) / 16)),
 * i.e. ceil(5n/16) rounded up to a power of two, about 80% slot load at four
 * slots per bucket. The arithmetic is checked against u64 as the reference's
 * usize is; the relay's 2^24 bound is checked by `ckfConfig`, not here.
 */
export function bucketCount(expectedBlocks: number | bigint): number {
  let n: bigint;
  if (typeof expectedBlocks === "bigint") {
    n = expectedBlocks;
  } else {
    if (!Number.isInteger(expectedBlocks)) throw invalidCapacity(expectedBlocks);
    n = BigInt(expectedBlocks);
  }
  if (n < 0n || n > U64_MAX) throw invalidCapacity(expectedBlocks);
  if (n === 0n) throw new CkfError("ExpectedCapacityZero", "expectedBlocksPerDc must be > 0");
  const scaled = 5n * n + 15n;
  if (scaled > U64_MAX) throw overflow(n);
  let target = scaled / 16n;
  if (target < 2n) target = 2n;
  let pow = 1n;
  while (pow < target) pow <<= 1n;
  if (pow > U64_MAX) throw overflow(n);
  return Number(pow);
}

function invalidCapacity(value: number | bigint): CkfError {
  return new CkfError("InvalidExpectedCapacity", `expectedBlocksPerDc ${String(value)} is not an integer in 1..2^64-1`);
}

function overflow(n: bigint): CkfError {
  return new CkfError("CapacityOverflow", `the bucket count for ${n} expected blocks overflows u64`);
}

/** Defaults filled in and every field validated; throws CkfError on the first bad field. */
export function ckfConfig(init: CkfConfigInit = {}): CkfConfig {
  const config: CkfConfig = Object.freeze({
    expectedBlocksPerDc: init.expectedBlocksPerDc ?? DEFAULT_CKF_CONFIG.expectedBlocksPerDc,
    seed: init.seed ?? DEFAULT_CKF_CONFIG.seed,
    maxKicks: init.maxKicks ?? DEFAULT_CKF_CONFIG.maxKicks,
    search: Object.freeze({ verificationWindow: init.search?.verificationWindow ?? DEFAULT_CKF_CONFIG.search.verificationWindow }),
    publishEveryNEvents: init.publishEveryNEvents ?? DEFAULT_CKF_CONFIG.publishEveryNEvents,
  });
  validateCkfConfig(config);
  return config;
}

/** Throws CkfError unless `config` is usable; returns the bucket count it implies. */
export function validateCkfConfig(config: CkfConfig): number {
  const buckets = bucketCount(config.expectedBlocksPerDc);
  if (buckets > MAX_RELAY_BUCKET_COUNT) {
    throw new CkfError(
      "BucketCountTooLarge",
      `${config.expectedBlocksPerDc} expected blocks need ${buckets} buckets; the relay allows at most ${MAX_RELAY_BUCKET_COUNT}`,
    );
  }
  if (!isU64(config.seed)) throw new CkfError("InvalidSeed", `seed ${String(config.seed)} is not a u64`);
  if (!Number.isInteger(config.maxKicks) || config.maxKicks < 1 || config.maxKicks > MAX_KICKS) {
    throw new CkfError("InvalidMaxKicks", `maxKicks ${config.maxKicks} is outside 1..${MAX_KICKS}`);
  }
  const window = config.search.verificationWindow;
  if (!Number.isInteger(window) || window < 1 || window > MAX_VERIFICATION_WINDOW) {
    throw new CkfError("InvalidVerificationWindow", `search.verificationWindow ${window} is outside 1..${MAX_VERIFICATION_WINDOW}`);
  }
  if (!Number.isSafeInteger(config.publishEveryNEvents) || config.publishEveryNEvents < 1) {
    throw new CkfError("InvalidPublishEveryNEvents", `publishEveryNEvents ${config.publishEveryNEvents} must be an integer > 0`);
  }
  return buckets;
}

/** The format identity of a filter with `seed` and `bucketCount` buckets. */
export function formatIdentity(seed: bigint, buckets: number): DcCkfFormatIdentity {
  return Object.freeze({ formatVersion: FORMAT_VERSION, seed, bucketCount: buckets, fingerprintBits: FINGERPRINT_BITS, slotsPerBucket: SLOTS_PER_BUCKET });
}
