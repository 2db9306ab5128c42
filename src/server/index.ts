export type { Host, HostOptions } from "./host.js";
export { startHost } from "./host.js";
export type { MmgateConfig, ConfigSources, HostConfig } from "./config.js";
export { ConfigError, loadConfig, parseScalar, gatherRawConfig, resolveConfig, redactedConfig, hostConfigSchema, hostPort } from "./config.js";
export type { ModuleContext, ModuleInstance, ServiceBinding, ServiceModule } from "./module.js";
export { bindService, defineModule } from "./module.js";
export { HealthRegistry, ServingStatus } from "./health.js";
export { Access, methodAccess } from "./auth.js";
export { DescriptorIndex, addReflection, answerReflection } from "./reflection.js";
