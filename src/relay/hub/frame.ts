/**
 * The canonical, transport-independent publication of one producer
 * generation: a snapshot chunk or a delta, its payload opaque CBI1 bytes
 * (the codec makes them; the hub only counts them).
 */
import type { ProducerIdentity } from "../../kv/index.js";
import { HubError } from "./errors.js";
import { FRAME_ENVELOPE_HEADROOM_BYTES } from "./limits.js";

/** Lets a driver tell snapshot bootstrap from live deltas without decoding CBI1. */
export type PublicationFrameKind = "snapshot_chunk" | "delta";

export interface PublicationFrame {
  /** The producer generation that owns this frame. */
  readonly identity: ProducerIdentity;
  /** The sequence that must already be applied before this frame. */
  readonly baseSequence: bigint;
  /** The sequence after this frame is applied. */
  readonly sequence: bigint;
  readonly kind: PublicationFrameKind;
  /** The CBI1 payload, never copied or changed by the hub. */
  readonly payload: Uint8Array;
  /** What the frame counts against a subscriber's byte limit: payload + FRAME_ENVELOPE_HEADROOM_BYTES. */
  readonly queuedBytes: number;
  /**
   * When the frame was made, unix microseconds (wall clock, sub-millisecond):
   * a delta's is its publication time, which every subscriber's copy carries
   * (its wire form is made once for all of them).
   */
  readonly publishedAtUs: bigint;
}

/** Now, in unix microseconds (the wall clock at the monotonic clock's origin, plus the monotonic clock). */
export function unixMicros(): bigint {
  return BigInt(Math.round((performance.timeOrigin + performance.now()) * 1000));
}

function isU64(value: unknown): value is bigint {
  return typeof value === "bigint" && BigInt.asUintN(64, value) === value;
}

/**
 * A frozen frame with its queued size. The sequences must be u64s and fit
 * the kind: a snapshot chunk sits at one sequence (base == sequence), a
 * delta moves it by exactly one.
 */
export function publicationFrame(init: {
  identity: ProducerIdentity;
  baseSequence: bigint;
  sequence: bigint;
  kind: PublicationFrameKind;
  payload: Uint8Array;
}): PublicationFrame {
  const { identity, baseSequence, sequence, kind, payload } = init;
  if (!isU64(baseSequence) || !isU64(sequence)) throw new HubError("InvalidFrame", "a frame's sequences are u64s");
  if (kind === "snapshot_chunk" ? baseSequence !== sequence : sequence !== baseSequence + 1n) {
    throw new HubError("InvalidFrame", `a ${kind} frame cannot go from ${baseSequence} to ${sequence}`);
  }
  if (!(payload instanceof Uint8Array)) throw new HubError("InvalidFrame", "a frame's payload is a Uint8Array");
  return Object.freeze({ identity, baseSequence, sequence, kind, payload, queuedBytes: payload.length + FRAME_ENVELOPE_HEADROOM_BYTES, publishedAtUs: unixMicros() });
}
