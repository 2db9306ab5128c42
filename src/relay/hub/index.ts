// The per-pool publication hub of the KV relay: the copy-on-write mirror of
// a producer's lane, the publication frame, and the bounded fan-out to
// subscribers with lag, retire, idle eviction and snapshot recovery.
export { HUB_ERROR_CODES, HubError, isHubError, type HubErrorCode, type HubErrorDetails } from "./errors.js";
export {
  DEFAULT_HUB_LIMITS,
  DEFAULT_IDLE_SWEEP_INTERVAL_MS,
  DEFAULT_MAX_QUEUED_BYTES,
  DEFAULT_MAX_QUEUED_FRAMES,
  DEFAULT_MAX_SUBSCRIBERS,
  DEFAULT_SUBSCRIBER_IDLE_MS,
  FRAME_ENVELOPE_HEADROOM_BYTES,
  hubLimits,
  MAX_FRAME_BYTES,
  MAX_QUEUED_FRAMES_LIMIT,
  MAX_TIMER_VALUE_MS,
  minQueuedBytes,
  type HubLimits,
} from "./limits.js";
export { publicationFrame, unixMicros, type PublicationFrame, type PublicationFrameKind } from "./frame.js";
export { HubMirror, type HubSnapshot, type SnapshotPin } from "./snapshot.js";
export { HubSubscriber, SUBSCRIBER_END_REASONS, type SubscriberEndReason, type SubscriberRead } from "./subscriber.js";
export { SYSTEM_HUB_CLOCK, type HubClock } from "./clock.js";
export {
  PublicationHub,
  type HubState,
  type HubStats,
  type PublicationHubOptions,
  type PublishDeltaResult,
  type RecoveryCause,
  type SubscribeOptions,
} from "./hub.js";
