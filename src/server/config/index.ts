/**
 * The host's configuration: its schema (schema.ts), where a raw config comes
 * from and how the sources merge (sources.ts), the keys the schemas know
 * (keys.ts, the one reader of zod's internals), renamed keys (renamed-keys.ts),
 * validation (resolve.ts), error text (issues.ts, suggest.ts) and redaction
 * (redact.ts).
 */
export { ConfigError } from "./errors.js";
export { hostConfigSchema, hostPort, splitHostPort, type HostConfig, type MmgateConfig } from "./schema.js";
export { gatherRawConfig, parseScalar, type ConfigSources, type RawConfig } from "./sources.js";
export { configKeyIndex, type ConfigKeyIndex } from "./keys.js";
export { RENAMED_KEYS } from "./renamed-keys.js";
export { nearestName } from "./suggest.js";
export { loadConfig, resolveConfig } from "./resolve.js";
export { redactedConfig } from "./redact.js";
