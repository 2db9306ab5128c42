export type { Host, HostOptions } from "./host.js";
export { startHost } from "./host.js";
export type { MmgateConfig, ConfigSources, HostConfig } from "./config.js";
export { ConfigError, loadConfig, parseScalar, gatherRawConfig, resolveConfig, redactedConfig, hostConfigSchema, hostPort, splitHostPort } from "./config.js";
export type {
  DepsOf,
  ErrorMapper,
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
export { Access, methodAccess } from "./auth.js";
export { DescriptorIndex, addReflection, answerReflection } from "./reflection.js";
export { requestIdOf } from "./rpc-observer.js";
