// The per-datacenter Cuckoo filter (CKF) of KV sequence hashes: its
// configuration and format identity, the packed lane and its addressing, the
// producer state with exact ownership, and the publication envelope.
export { CKF_ERROR_CODES, CkfError, isCkfError, type CkfErrorCode, type FenceReason } from "./errors.js";
export {
  bucketCount,
  CKF_LANE_COUNT,
  ckfConfig,
  DEFAULT_CKF_CONFIG,
  DEFAULT_EXPECTED_UNIQUE_BLOCKS,
  DEFAULT_PUBLICATION_THRESHOLD,
  FINGERPRINT_BITS,
  FORMAT_VERSION,
  formatIdentity,
  MAX_KICKS,
  MAX_RELAY_BUCKET_COUNT,
  MAX_VERIFICATION_WINDOW,
  SLOTS_PER_BUCKET,
  validateCkfConfig,
  type CkfConfig,
  type CkfConfigInit,
  type DcCkfFormatIdentity,
} from "./config.js";
export { CkfAddressing, locateKey, slotsHoldKey, type CkfLocation } from "./addressing.js";
export { CkfLane, type CkfLaneOptions, type CkfWriteObserver } from "./lane.js";
export { laneSeed, SplitMix64, splitMix64Reference } from "./splitmix.js";
export { Xxh3Of8 } from "./xxh3-8.js";
export { hi32, joinU64, lo32 } from "./u64.js";
export { residencyGate, targetsPrimary, type KvCacheEventData, type ResidencyDomain, type RouterEvent, type StorageTier, type StoredBlock } from "./events.js";
export {
  ColumnBatch,
  digestIdentity,
  imageCount,
  imagesOf,
  laneLease,
  poolId,
  producerIdentity,
  relayLease,
  sameFormat,
  sameLease,
  samePoolId,
  sameProducerIdentity,
  type ConsumerDrainMarker,
  type DcCkfBucketImage,
  type DcCkfDelta,
  type DcCkfImageColumns,
  type DcCkfPublicationBatch,
  type DcCkfSnapshot,
  type DigestIdentity,
  type IdentitySource,
  type IndexerDomainId,
  type LaneLease,
  type PoolId,
  type ProducerIdentity,
} from "./identity.js";
export { BarrierCopy } from "./barrier-copy.js";
export { DcCkfState, type ApplyOutcome, type ApplySteps, type CanonicalOwnership, type DcCkfStateOptions, type DcCkfStats, type PauseCheck } from "./state.js";
export { DcCkfPublisher, type DcCkfPublisherOptions, type DeliverySink, type PublishResult } from "./publisher.js";
export { isRouterEventJsonError, MAX_ROUTER_EVENT_JSON_BYTES, RouterEventJsonError, routerEventFromJson, routerEventsFromJsonLines, type NumberedRouterEvent, type RouterEventJsonErrorCode, type RouterEventJsonOptions } from "./event-json.js";
