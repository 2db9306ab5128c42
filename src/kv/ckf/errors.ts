/**
 * The stable codes of every CKF failure. The names follow the reference's
 * error variants so logs and tests read the same on both sides.
 */
export const CKF_ERROR_CODES = [
  // --- configuration -------------------------------------------------------
  /** expectedBlocksPerDc is 0. */
  "ExpectedCapacityZero",
  /** expectedBlocksPerDc is not a non-negative integer (a JS-only failure: usize cannot be negative or fractional). */
  "InvalidExpectedCapacity",
  /** maxKicks outside 1..=4096. */
  "InvalidMaxKicks",
  /** search.verificationWindow outside 1..=8. */
  "InvalidVerificationWindow",
  /** publishEveryNEvents is 0 (or not an integer). */
  "InvalidPublishEveryNEvents",
  /** The bucket count arithmetic overflows u64 (usize in the reference). */
  "CapacityOverflow",
  /** The bucket count exceeds the relay's 2^24. */
  "BucketCountTooLarge",
  /** The seed is not a u64. */
  "InvalidSeed",
  /** The host is big-endian: lanes are little-endian u64 words viewed as u16 slots. */
  "UnsupportedHost",
  // --- filter and event application ---------------------------------------
  /** Both candidate buckets are full and the eviction walk failed; nothing changed. */
  "CapacityExhausted",
  /** A fingerprint the ownership table says is resident is in neither bucket. */
  "IndexerInvariantViolation",
  /** The event names a residency domain this indexer does not know; nothing changed. */
  "UnsupportedResidencyDomain",
  /** A Stored event's parent is not in the member's lineage; nothing changed. */
  "ParentBlockNotFound",
  /** A Stored event contradicts the member's lineage or has a start position without a parent; nothing changed. */
  "InvalidBlockSequence",
  /** A canonical hash already has 2^32 - 1 owners. */
  "OwnershipDegreeOverflow",
  /** An event field is out of range (a hash not a u64, a rank not a u32); nothing changed. */
  "InvalidEvent",
  // --- publication ---------------------------------------------------------
  /** The publisher is fenced (SequenceExhausted, DeliveryUncertain or LeaseStalled); see `fence`. */
  "Fenced",
  /** The sequence is at u64::MAX: no barrier snapshot can be taken on this publisher. */
  "SequenceExhausted",
  /** An identity or lease field is out of range (layoutGeneration 0, a digest not 16 bytes, ...). */
  "InvalidIdentity",
] as const;

export type CkfErrorCode = (typeof CKF_ERROR_CODES)[number];

/** Why a publisher stopped publishing until its next barrier snapshot. */
export type FenceReason = "SequenceExhausted" | "DeliveryUncertain" | "LeaseStalled";

/** Every failure of the CKF layer: one class, a stable `code`. */
export class CkfError extends Error {
  /** Set on `Fenced` errors: what fenced the publisher. */
  readonly fence: FenceReason | undefined;

  constructor(
    readonly code: CkfErrorCode,
    message: string,
    init: { fence?: FenceReason; cause?: unknown } = {},
  ) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = "CkfError";
    this.fence = init.fence;
  }
}

/** True when `error` is a CkfError, optionally with `code`. */
export function isCkfError(error: unknown, code?: CkfErrorCode): error is CkfError {
  return error instanceof CkfError && (code === undefined || error.code === code);
}
