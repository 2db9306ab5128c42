// The KV overlap router: one RelayConsumer per configured relay, overlap
// queries merged over every ready pool (KvRouter), the host module serving
// mmgate.kvrouter.v1.OverlapService (`mmgate router` serves it).
export { defaultSubscriberId, MIN_RELAY_RECEIVE_BYTES, routerConfigSchema, type RouterConfig } from "./config.js";
export { KvRouter, MAX_OVERLAP_TOKENS, ROUTER_ERROR_CODES, RouterError, type KvRouterOptions, type RouterErrorCode, type RouterPoolView } from "./router.js";
export { RouterMetrics, type RouterGaugeSource } from "./metrics.js";
export { routerModule, type RouterModuleExports } from "./module.js";
