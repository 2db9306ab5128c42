// The relay service: pools fed by KV events, the KvEventRelay handlers, the
// ingest endpoint, and the host module that serves them.
export { MIN_MAX_MESSAGE_BYTES, RELAY_ENV, relayConfigSchema, relayPoolConfigSchema, u64Schema, type RelayConfig, type RelayPoolConfig } from "./config.js";
export { IngestError, MAX_REPORTED_REJECTIONS, routerEventFromWire, type IngestErrorCode } from "./ingest.js";
export { relayModule, type RelayModuleExports } from "./module.js";
export { RelayPool, type RelayPoolStats } from "./pool.js";
export { Relay, type CatalogRevision, type LoadWindow, type TopologyEntryValue } from "./relay.js";
export { poolDiscovery, topologyEndpointConflicts, topologyKeysOf, type PoolDiscovery } from "./config.js";
export { DiscoveryLiveness, notAPoolWorker, WORKER_TYPE_KEY, type LivenessSource, type PoolLivenessView } from "./liveness.js";
export { buildTopology, emittableTopology, topologyEntryToWire, type AdapterReadinessValue, type ReadinessState, type TopologyMemberValue } from "./topology.js";
