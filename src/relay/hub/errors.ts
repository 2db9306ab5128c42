/**
 * The stable codes of every publication-hub failure. The mirror's codes
 * follow the reference's apply_delta variants (B.7) so logs read the same on
 * both sides; the rest are the hub's own refusals.
 */
export const HUB_ERROR_CODES = [
  // --- mirror (B.7 apply_delta); the mirror is unchanged after each ---------
  /** The delta's producer identity is not the mirror's. */
  "IdentityChanged",
  /** The delta's lane lease is not the mirror's. */
  "LeaseChanged",
  /** base != current or sequence != base + 1; details carry current, base and next. */
  "SequenceGap",
  /** An image names a bucket outside the lane; details carry bucket and length. */
  "BucketOutOfRange",
  /** An image's value is not a u64 (a JS-only failure: the lane would wrap it silently). */
  "InvalidImage",
  /** A snapshot's word count is not its format's bucket count. */
  "SnapshotBucketCount",
  // --- hub ------------------------------------------------------------------
  /** A frame does not describe the delta it is published with, or a field is out of range. */
  "InvalidFrame",
  /** A limit or option is out of range. */
  "InvalidConfig",
  /** No snapshot is installed yet, or the hub awaits a recovery snapshot (Unavailable). */
  "NotReady",
  /** The per-pool subscriber limit is reached. */
  "SubscriberLimit",
  /** The hub was retired; nothing more is published or subscribed. */
  "Retired",
  /** The hub failed terminally (its mirror rejected a delta); the generation must be fenced. */
  "Failed",
  /** A subscriber's snapshot was already taken: a subscription hands out exactly one. */
  "SnapshotTaken",
] as const;

export type HubErrorCode = (typeof HUB_ERROR_CODES)[number];

/** What a failure is about, where it helps a log or a test. */
export interface HubErrorDetails {
  /** SequenceGap: the mirror's sequence. */
  readonly current?: bigint;
  /** SequenceGap: the delta's base sequence. */
  readonly base?: bigint;
  /** SequenceGap: the delta's target sequence. */
  readonly next?: bigint;
  /** BucketOutOfRange / InvalidImage: the offending bucket index. */
  readonly bucket?: number;
  /** BucketOutOfRange / SnapshotBucketCount: the lane's length. */
  readonly length?: number;
}

/** Every failure of the hub layer: one class, a stable `code`. */
export class HubError extends Error {
  readonly details: HubErrorDetails;

  constructor(
    readonly code: HubErrorCode,
    message: string,
    init: { details?: HubErrorDetails; cause?: unknown } = {},
  ) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = "HubError";
    this.details = Object.freeze({ ...init.details });
  }
}

/** True when `error` is a HubError, optionally with `code`. */
export function isHubError(error: unknown, code?: HubErrorCode): error is HubError {
  return error instanceof HubError && (code === undefined || error.code === code);
}
