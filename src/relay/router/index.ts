// The KV overlap router: one RelayConsumer per configured relay, overlap
// queries merged over every ready pool (KvRouter), the host module serving
// mmgate.kvrouter.v1.OverlapService (`mmgate router` serves it).
export { defaultSubscriberId, MIN_RELAY_RECEIVE_BYTES, routerConfigSchema, type RouterConfig } from "./config.js";
export {
  KvRouter,
  MAX_OVERLAP_TOKENS,
  poolReadiness,
  ROUTER_ERROR_CODES,
  RouterError,
  type ExcludedPool,
  type KvRouterOptions,
  type PoolReadinessVerdict,
  type RouteResult,
  type RoutedOverlap,
  type RouterErrorCode,
  type RouterPoolView,
} from "./router.js";
export {
  readLoadUpdate,
  readReadinessUpdate,
  RelayState,
  topologyKey,
  type LoadProjection,
  type PoolLoadView,
  type ReadinessEntryView,
  type ReadinessProjection,
  type ReadinessRejection,
  type RelayStateEvent,
  type ServingStateName,
} from "./relay-state.js";
export { RouterMetrics, type RouterGaugeSource } from "./metrics.js";
export { routerModule, type RouterModuleExports } from "./module.js";
