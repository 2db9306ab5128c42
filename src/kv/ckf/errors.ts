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
  /**
   * An event is malformed: not an object, an unknown data kind, a missing or
   * non-array block list, a block that is not an object, a field of the wrong
   * type or out of range (a hash not a u64, a rank not a u32), or a residency
   * field that is not a string; nothing changed.
   */
  "InvalidEvent",
  /**
   * A Stored event carries more blocks, or a Removed event more block hashes,
   * than the state's `maxBlocksPerEvent` (the relay's per-event limit); the
   * event was refused whole before any of its blocks were read; nothing changed.
   */
  "EventTooLarge",
  /** A key given to the filter directly (e.g. `locateKey`) is not a u64. */
  "InvalidKey",
  // --- publication ---------------------------------------------------------
  /** The publisher is fenced (SequenceExhausted, DeliveryUncertain or LeaseStalled); see `fence`. */
  "Fenced",
  /** The sequence is at u64::MAX: no barrier snapshot can be taken on this publisher. */
  "SequenceExhausted",
  /**
   * An identity, lease or layout field is out of range (layoutGeneration 0, a
   * digest not 16 bytes, a bucket count not a power of two, a lane index outside
   * 0..CKF_LANE_COUNT-1, ...).
   */
  "InvalidIdentity",
  /**
   * A batch with no images was given to `publish`. The consumer deactivates on
   * an empty delta (B.9 EmptyDelta), so the producer never sends one; drains
   * yield no batch when nothing changed. Nothing was sent, the sequence stays
   * and the publisher is not fenced.
   */
  "EmptyDelta",
  /**
   * A barrier snapshot was asked of a state whose format identity differs from
   * the publisher's: its words would be read with the wrong seed or bucket
   * count by every consumer. Nothing was drained or published.
   */
  "FormatMismatch",
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

/**
 * A short description of any value for an error message. String() throws on
 * objects without a primitive conversion (Object.create(null)) and
 * JSON.stringify throws on bigints; a message must never be what throws.
 */
export function describeValue(value: unknown): string {
  switch (typeof value) {
    case "string":
      return JSON.stringify(value.length > 64 ? `${value.slice(0, 64)}...` : value);
    case "bigint":
    case "number":
    case "boolean":
    case "undefined":
      return String(value);
    case "symbol":
      return value.toString();
    case "function":
      return "a function";
    default:
      return value === null ? "null" : Array.isArray(value) ? "an array" : "an object";
  }
}

/** True when `error` is a CkfError, optionally with `code`. */
export function isCkfError(error: unknown, code?: CkfErrorCode): error is CkfError {
  return error instanceof CkfError && (code === undefined || error.code === code);
}
