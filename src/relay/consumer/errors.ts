/**
 * The consumer's own verdicts on what a relay sent (kv-relay-contract C.7):
 * one error class with a stable `code`, so that the state machine, the views
 * and the logs name a violation the same way. Every code means the same
 * thing to the consumer: this pool's replica is invalid and must be rebuilt
 * from a fresh snapshot on a new subscription.
 */

export const CONSUMER_ERROR_CODES = [
  /** contract_marker is not 0x4B565231 ("KVR1"). */
  "ContractMarker",
  /** protocol_version is not 1. */
  "ProtocolVersion",
  /** A required envelope field is missing or invalid (no relay identity, no or a malformed producer, no catalog snapshot). */
  "MalformedEnvelope",
  /** The relay identity differs from the one the stream started with. */
  "RelayDrift",
  /** The update's producer is not the producer the subscription expects. */
  "ProducerDrift",
  /** FilterUpdateKind is UNSPECIFIED or a value this build does not know. */
  "UnknownKind",
  /** A known kind the current state does not accept (a heartbeat or delta while assembling, a snapshot chunk while ready). */
  "UnexpectedKind",
  /** base_sequence / sequence do not continue the installed sequence (or a chunk's base differs from its sequence). */
  "SequenceGap",
  /** The CBI1 payload does not decode (truncated, checksum, flags, bounds, ...), or a heartbeat carries a payload. */
  "MalformedFrame",
  /** The CBI1 header's CKF identity (version, fingerprint bits, slots, seed, bucket count) is not the producer's. */
  "FormatMismatch",
  /** The CBI1 flags disagree with the FilterUpdate kind (a delta payload in a snapshot chunk, or the reverse). */
  "KindMismatch",
  /** Snapshot chunks out of order, of another snapshot, with a wrong chunk count, or not covering every bucket. */
  "ChunkSequence",
  /** The CBI1 epoch (or a delta's base epoch) is not the FilterUpdate's sequence (base sequence). */
  "EpochMismatch",
  /** The CBI1 header's dc_id is not the producer's pool dc_id. */
  "DcMismatch",
  /** A delta with no images (B.9: a real publication always changes at least one bucket). */
  "EmptyDelta",
  /** A delta names the same bucket twice. */
  "DuplicateBucket",
  /** The mirror already failed; it stays unusable and must be replaced by a new one from a fresh snapshot. */
  "Invalidated",
] as const;

export type ConsumerErrorCode = (typeof CONSUMER_ERROR_CODES)[number];

export type ConsumerErrorDetails = Readonly<Record<string, bigint | number | string | boolean>>;

export class ConsumerError extends Error {
  override readonly name = "ConsumerError";
  constructor(
    readonly code: ConsumerErrorCode,
    message: string,
    readonly details: ConsumerErrorDetails = {},
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** True when `error` is a ConsumerError, optionally with `code`. */
export function isConsumerError(error: unknown, code?: ConsumerErrorCode): error is ConsumerError {
  return error instanceof ConsumerError && (code === undefined || error.code === code);
}
