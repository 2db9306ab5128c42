// The KV relay's consumer side (kv-relay-contract C.7): a pure per-producer
// mirror of a pool's CKF lane fed by FilterUpdate messages (LaneMirror), the
// prompt-prefix overlap against a mirrored lane, the catalog reader, and
// RelayConsumer, which watches a relay's catalog and keeps one mirror per
// pool over gRPC with backoff, quarantine and resubscription.
export { CONSUMER_ERROR_CODES, ConsumerError, isConsumerError, type ConsumerErrorCode, type ConsumerErrorDetails } from "./errors.js";
export { checkRelayIdentity, checkResponseEnvelope, type RelayIncarnation } from "./envelope.js";
export { LaneMirror, type LaneMirrorOptions, type LaneMirrorState, type LaneMirrorStep, type SnapshotProgress } from "./lane-mirror.js";
export {
  HashedPrompt,
  LaneProbe,
  matchedPrefixBlocks,
  poolOverlap,
  PromptHashes,
  type OverlapPool,
  type PoolOverlapResult,
  type PromptOptions,
} from "./overlap.js";
export { poolKey, readCatalogUpdate, type CatalogPool, type CatalogRejection, type CatalogSnapshot } from "./catalog.js";
export { backoffDelay, backoffOptions, DEFAULT_BACKOFF, interruptibleWait, type BackoffOptions, type Wait, type WaitEnd } from "../../util/index.js";
export { RelayConsumer, type RelayConsumerOptions } from "./consumer.js";
export type {
  CatalogView,
  ConsumerFailure,
  OverlapAnswer,
  PoolState,
  PoolView,
  RelayConsumerEvent,
  RelayConsumerListener,
  RunResult,
} from "./types.js";
