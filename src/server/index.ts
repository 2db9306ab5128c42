export type { Host, HostOptions } from "./host.js";
export { startHost } from "./host.js";
export type { MmgateConfig, ConfigSources, HostConfig } from "./config/index.js";
export { ConfigError, loadConfig, parseScalar, resolveConfig, redactedConfig, hostPort, splitHostPort } from "./config/index.js";
export type {
  DepsOf,
  ErrorMapper,
  HostStatusDecorator,
  HostStatusOrigin,
  HttpRoute,
  HttpRouteContext,
  HttpRouteRequest,
  HttpRouteResponse,
  LocalRoutes,
  ModuleContext,
  ModuleHealth,
  ModuleInstance,
  ModuleRequirements,
  ServiceBinding,
  ServiceModule,
  TaskSupervisor,
} from "./module.js";
export type { TaskOptions } from "./supervisor.js";
export { bindService, defineModule } from "./module.js";
export { HealthRegistry, Readiness, ServingStatus } from "./health.js";
export { Access } from "./auth.js";
export { codeName, requestIdOf } from "./rpc-observer.js";
export { callTransportOf, directMessagesOf, pacedWritesOf, type CallTransport, type DirectMessages } from "./call-transport.js";
export { PacedWrites } from "./paced-writes.js";
export { preEncode, preEncodedEnvelope, writesBinary } from "./pre-encoded.js";
export { callerKey, callerLabelKey, type Caller, type CallerLabel, type CallerLimits } from "./caller.js";
export {
  addKey,
  callerLimitsSchema,
  callerNameSchema,
  configuredKeysFile,
  generateKey,
  keyDigest,
  KeysFileError,
  readKeysFileSync,
  removeKey,
  scopeCatalog,
  scopeSchema,
  type KeyEntry,
} from "./access/index.js";
