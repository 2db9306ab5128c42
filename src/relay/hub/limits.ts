/**
 * Every limit of the publication hub, named, with the reference's defaults
 * (kv-relay-contract C.4, C.5; cbi1-and-ckf A.1). Memory per hub is bounded
 * by these alone: at most maxSubscribers queues of at most
 * maxQueuedBytes each, plus one lane per subscriber still bootstrapping.
 */
import { IMAGES_MAX_FRAME_BYTES, MAX_DELTA_IMAGES } from "../cbi1/index.js";
import { HubError } from "./errors.js";

/** Envelope headroom counted per queued frame, so byte limits also bound framing overhead. */
export const FRAME_ENVELOPE_HEADROOM_BYTES = 256;
/** The largest CBI1 frame (48 header + 16 chunk prefix + 524,288 words): the largest payload a frame can have. */
export const MAX_FRAME_BYTES = IMAGES_MAX_FRAME_BYTES;
/** publication_queue_capacity. */
export const DEFAULT_MAX_QUEUED_FRAMES = 16;
/** publication_queue_bytes. */
export const DEFAULT_MAX_QUEUED_BYTES = 16 * 1024 * 1024;
/** Per-pool subscribers (--max-subscribers-per-pool). */
export const DEFAULT_MAX_SUBSCRIBERS = 64;
/**
 * A subscriber that has not read for this long is evicted as idle. The
 * reference's nearest bound is snapshot_progress_timeout (60 s): a stream
 * that cannot hand over one frame in that time fails.
 */
export const DEFAULT_SUBSCRIBER_IDLE_MS = 60_000;
/** How often the hub looks for idle subscribers (only while it has any). */
export const DEFAULT_IDLE_SWEEP_INTERVAL_MS = 1_000;
/** Timer values are nonzero and at most one year (C.5). */
export const MAX_TIMER_VALUE_MS = 31_536_000_000;
/** The largest item count a queue may be configured with (load_fanout_capacity's cap; far above any sane value). */
export const MAX_QUEUED_FRAMES_LIMIT = 65_536;

export interface HubLimits {
  /** Most subscribers at once; a further subscribe fails with SubscriberLimit. */
  readonly maxSubscribers: number;
  /** A delta with more images triggers snapshot recovery instead of fan-out. */
  readonly maxDeltaImages: number;
  /** A delta frame whose payload is longer triggers snapshot recovery instead of fan-out. */
  readonly maxFrameBytes: number;
  /** The default and the ceiling of a subscriber's queued frames. */
  readonly maxQueuedFrames: number;
  /** The default and the ceiling of a subscriber's queued bytes (payload + headroom per frame). */
  readonly maxQueuedBytes: number;
  /** A subscriber that has not read for this long is removed as idle. */
  readonly subscriberIdleMs: number;
  /** How often idle subscribers are looked for. */
  readonly idleSweepIntervalMs: number;
}

export const DEFAULT_HUB_LIMITS: HubLimits = Object.freeze({
  maxSubscribers: DEFAULT_MAX_SUBSCRIBERS,
  maxDeltaImages: MAX_DELTA_IMAGES,
  maxFrameBytes: MAX_FRAME_BYTES,
  maxQueuedFrames: DEFAULT_MAX_QUEUED_FRAMES,
  maxQueuedBytes: DEFAULT_MAX_QUEUED_BYTES,
  subscriberIdleMs: DEFAULT_SUBSCRIBER_IDLE_MS,
  idleSweepIntervalMs: DEFAULT_IDLE_SWEEP_INTERVAL_MS,
});

function integerIn(name: string, value: number, min: number, max: number): void {
  if (!Number.isSafeInteger(value) || value < min || value > max) {
    throw new HubError("InvalidConfig", `${name} ${String(value)} is not an integer in ${min}..${max}`);
  }
}

/** The smallest byte limit that still holds one largest admissible delta frame. */
export function minQueuedBytes(maxFrameBytes: number): number {
  return maxFrameBytes + FRAME_ENVELOPE_HEADROOM_BYTES;
}

/** Fills in defaults and checks every limit (the reference's hub config validation, plus timers). */
export function hubLimits(init: Partial<HubLimits> = {}): HubLimits {
  const limits = { ...DEFAULT_HUB_LIMITS, ...init };
  integerIn("maxSubscribers", limits.maxSubscribers, 1, Number.MAX_SAFE_INTEGER);
  integerIn("maxDeltaImages", limits.maxDeltaImages, 1, MAX_DELTA_IMAGES);
  integerIn("maxFrameBytes", limits.maxFrameBytes, 1, MAX_FRAME_BYTES);
  integerIn("maxQueuedFrames", limits.maxQueuedFrames, 1, MAX_QUEUED_FRAMES_LIMIT);
  // A queue must hold one largest admissible delta, or every such delta would lag every subscriber.
  integerIn("maxQueuedBytes", limits.maxQueuedBytes, minQueuedBytes(limits.maxFrameBytes), Number.MAX_SAFE_INTEGER);
  integerIn("subscriberIdleMs", limits.subscriberIdleMs, 1, MAX_TIMER_VALUE_MS);
  integerIn("idleSweepIntervalMs", limits.idleSweepIntervalMs, 1, MAX_TIMER_VALUE_MS);
  return Object.freeze(limits);
}

/** A subscriber's own queue bounds: at most the hub's, at least one largest frame. */
export function queueLimits(limits: HubLimits, init: { maxQueuedFrames?: number; maxQueuedBytes?: number }): { maxQueuedFrames: number; maxQueuedBytes: number } {
  const maxQueuedFrames = init.maxQueuedFrames ?? limits.maxQueuedFrames;
  const maxQueuedBytes = init.maxQueuedBytes ?? limits.maxQueuedBytes;
  integerIn("maxQueuedFrames", maxQueuedFrames, 1, limits.maxQueuedFrames);
  integerIn("maxQueuedBytes", maxQueuedBytes, minQueuedBytes(limits.maxFrameBytes), limits.maxQueuedBytes);
  return { maxQueuedFrames, maxQueuedBytes };
}
