/** Validation of a raw config against the host's schema and each module's, every problem reported at once. */
import type { ServiceModule } from "../module.js";
import { ConfigError } from "./errors.js";
import { formatIssues, fromText, originsOf } from "./issues.js";
import { configKeyIndex } from "./keys.js";
import { hostConfigSchema, type MmgateConfig } from "./schema.js";
import { gatherRawConfig, type ConfigSources } from "./sources.js";
import { adoptRenamedKeys, RENAMED_KEYS, treeView } from "./renamed-keys.js";
import { nearestName } from "./suggest.js";

/** The first-level keys a config may have with these modules. */
function topLevelConfigKeys(modules: readonly ServiceModule[]): Set<string> {
  return new Set([...Object.keys(hostConfigSchema.shape), "modules", ...RENAMED_KEYS.map((k) => k.old.split(".")[0]!), ...modules.map((m) => m.name)]);
}

/**
 * Validates the raw config against the host schema and each module's schema.
 * Every problem is reported, each naming its field.
 */
export function resolveConfig(
  raw: Record<string, unknown>,
  modules: readonly ServiceModule[],
  origins: ReadonlyMap<string, string> = new Map(),
  onWarning?: (message: string) => void,
): MmgateConfig {
  const known = new Map(modules.map((m) => [m.name, m]));
  // Old key names reach here only from callers that pass a raw object
  // themselves; gatherRawConfig adopts them at each source.
  const adopted = structuredClone(raw);
  adoptRenamedKeys(treeView(adopted, ""), (message) => onWarning?.(message));
  const { modules: listed, ...rest } = adopted;
  const listKey = "modules";
  const hostRaw: Record<string, unknown> = {};
  const moduleRaw: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(rest)) (known.has(key) ? moduleRaw : hostRaw)[key] = value;

  const issues: string[] = [];
  const index = configKeyIndex(modules);
  const host = hostConfigSchema.safeParse(hostRaw);
  if (!host.success) issues.push(...formatIssues(host.error, "", origins, index));

  let enabled = [...known.keys()];
  if (listed !== undefined) {
    const list = typeof listed === "string" ? listed.split(",").map((s) => s.trim()).filter(Boolean) : listed;
    const from = fromText(originsOf(listKey, origins));
    if (!Array.isArray(list) || !list.every((s) => typeof s === "string")) {
      issues.push(`${listKey}: expected a list of module names${from}`);
    } else {
      const unknown = list.filter((s) => !known.has(s));
      const near = unknown.map((s) => nearestName(s, known.keys())).filter((s) => s !== undefined);
      const hint = near.length > 0 ? `; did you mean ${near.map((s) => `"${s}"`).join(", ")}?` : "";
      if (unknown.length > 0) issues.push(`${listKey}: unknown module ${unknown.map((s) => `"${s}"`).join(", ")}${hint} (known: ${[...known.keys()].join(", ")})${from}`);
      enabled = [...new Set(list)];
    }
  }

  const sections: Record<string, unknown> = {};
  for (const module of modules) {
    const parsed = module.configSchema.safeParse(moduleRaw[module.name] ?? {});
    if (parsed.success) sections[module.name] = parsed.data;
    else issues.push(...formatIssues(parsed.error, module.name, origins, index));
  }

  if (issues.length > 0 || !host.success) throw new ConfigError("invalid configuration", issues);
  return { ...host.data, modules: enabled, sections };
}

/** Loads, merges and validates in one step. */
export function loadConfig(sources: ConfigSources, modules: readonly ServiceModule[]): MmgateConfig {
  const raw = gatherRawConfig(sources, topLevelConfigKeys(modules), modules);
  return resolveConfig(raw.values, modules, raw.origins, sources.onWarning);
}
