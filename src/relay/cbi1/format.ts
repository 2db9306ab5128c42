/**
 * FilterFormat (spec A.4): the CKF identity a consumer expects every frame to
 * carry. The version, fingerprint width and slots are fixed by the codec;
 * the seed and bucket count come from the producer's format identity.
 */
import { FINGERPRINT_BITS, FORMAT_VERSION, MAX_BUCKET_COUNT, SLOTS_PER_BUCKET } from "./constants.js";
import { Cbi1Error, describe } from "./errors.js";
import { u64Arg } from "./u64.js";

export class FilterFormat {
  readonly seed: bigint;
  /** A power of two in 2..2^24. */
  readonly bucketCount: number;

  /** Throws Cbi1Error Format (kind BucketCount) for a bucket count that is not a power of two in 2..2^24. */
  constructor(seed: bigint, bucketCount: number) {
    this.seed = u64Arg(seed, "seed");
    if (!FilterFormat.isValidBucketCount(bucketCount)) {
      throw new Cbi1Error(
        "Format",
        `bucket count ${describe(bucketCount)} is not a power of two in 2..${MAX_BUCKET_COUNT}`,
        { bucketCount: describe(bucketCount) },
        "BucketCount",
      );
    }
    this.bucketCount = bucketCount;
    Object.freeze(this);
  }

  static isValidBucketCount(n: unknown): n is number {
    return typeof n === "number" && Number.isInteger(n) && n >= 2 && n <= MAX_BUCKET_COUNT && (n & (n - 1)) === 0;
  }

  /**
   * The error a header with these fields earns, or undefined when they match:
   * version, then fingerprint bits, then slots, then seed and bucket count
   * (the reference's order, so a frame with two faults reports the first).
   * `bucketCount` is the raw u64 from the header, compared without narrowing.
   */
  check(version: number, seed: bigint, bucketCount: bigint, fingerprintBits: number, slotsPerBucket: number): Cbi1Error | undefined {
    if (version !== FORMAT_VERSION) {
      return new Cbi1Error("Format", `format version ${version} is not ${FORMAT_VERSION}`, { version }, "Version");
    }
    if (fingerprintBits !== FINGERPRINT_BITS) {
      return new Cbi1Error("Format", `fingerprint bits ${fingerprintBits} is not ${FINGERPRINT_BITS}`, { fingerprintBits }, "FingerprintBits");
    }
    if (slotsPerBucket !== SLOTS_PER_BUCKET) {
      return new Cbi1Error("Format", `slots per bucket ${slotsPerBucket} is not ${SLOTS_PER_BUCKET}`, { slotsPerBucket }, "SlotsPerBucket");
    }
    if (seed !== this.seed || bucketCount !== BigInt(this.bucketCount)) {
      return new Cbi1Error(
        "Format",
        `frame format (seed ${seed}, ${bucketCount} buckets) is not the expected (seed ${this.seed}, ${this.bucketCount} buckets)`,
        { expectedSeed: this.seed, expectedBucketCount: this.bucketCount, seed, bucketCount },
        "Mismatch",
      );
    }
    return undefined;
  }

  equals(other: FilterFormat): boolean {
    return this.seed === other.seed && this.bucketCount === other.bucketCount;
  }
}

export function formatArg(format: unknown): FilterFormat {
  if (!(format instanceof FilterFormat)) throw new Cbi1Error("InvalidArgument", "format is not a FilterFormat", { what: "format" });
  return format;
}
