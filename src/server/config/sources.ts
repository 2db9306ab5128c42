/**
 * Where a raw config comes from and how it is merged: the file (JSON or
 * YAML), then the environment (MMGATE_* and modules' own names), then flags,
 * each value remembered with the source that set it.
 */
import { readFileSync } from "node:fs";
import { extname } from "node:path";
import { parse as parseYaml } from "yaml";
import type { ServiceModule } from "../module.js";
import { ConfigError } from "./errors.js";
import { configKeyIndex } from "./keys.js";
import { adoptRenamedKeys, flatView, treeView } from "./renamed-keys.js";
import { nearestName } from "./suggest.js";

export interface ConfigSources {
  /** Path of a JSON or YAML file. */
  file?: string | undefined;
  /** Environment; MMGATE_* variables override the file. */
  env?: Record<string, string | undefined>;
  /** `path.to.key` → value, applied last (from flags). */
  overrides?: Record<string, unknown>;
  /**
   * The flag that set an override, by its key in `overrides` (`log.level` →
   * `--log-level`), for error messages; `--set KEY` otherwise.
   */
  overrideOrigins?: Readonly<Record<string, string>>;
  /** Told about ignored input, e.g. an MMGATE_* variable that matches no key. */
  onWarning?: (message: string) => void;
}

/** Raw config plus where each value came from, for error messages. */
export interface RawConfig {
  readonly values: Record<string, unknown>;
  /** `path.to.key` → the source that set it: "MMGATE_X", "--set path.to.key", a flag such as "--log-level", or the config file's path. */
  readonly origins: ReadonlyMap<string, string>;
}

/** Env names that map to a nested key directly, as operators expect. */
const ENV_ALIASES: Record<string, { path: string; raw: boolean }> = {
  MMGATE_LISTEN: { path: "listen", raw: true },
  MMGATE_ADMIN_LISTEN: { path: "adminListen", raw: true },
  MMGATE_ADVERTISE_ADDRESS: { path: "advertiseAddress", raw: true },
  MMGATE_AUTH_TOKEN: { path: "auth.token", raw: true },
  MMGATE_LOG_LEVEL: { path: "log.level", raw: true },
  MMGATE_LOG_FORMAT: { path: "log.format", raw: true },
  MMGATE_MODULES: { path: "modules", raw: true },
  MMGATE_TLS_CERT_FILE: { path: "tls.certFile", raw: true },
  MMGATE_TLS_KEY_FILE: { path: "tls.keyFile", raw: true },
};

/** Variables that are not config keys. */
const ENV_IGNORED = new Set(["MMGATE_CONFIG"]);

/**
 * `MMGATE_LIMITS__MAX_RECEIVE_MESSAGE_BYTES` → `limits.maxReceiveMessageBytes`:
 * `__` separates levels, single `_` separates words.
 */
function envNameToPath(name: string): string {
  return name
    .slice("MMGATE_".length)
    .split("__")
    .map((part) => part.toLowerCase().replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase()))
    .join(".");
}

/**
 * A value from the environment or a flag: JSON when it parses as JSON, else
 * the string. A number that would not survive the trip (too many digits, a
 * leading zero) stays the string it was.
 */
export function parseScalar(text: string): unknown {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return text;
  }
  return typeof value === "number" && String(value) !== text.trim() ? text : value;
}

/** Path segments that would reach an object's prototype rather than a key of its own. */
const PROTOTYPE_KEYS = new Set(["__proto__", "constructor", "prototype"]);

function setPath(target: Record<string, unknown>, path: string, value: unknown, origin: string): void {
  const keys = path.split(".");
  const bad = keys.find((key) => PROTOTYPE_KEYS.has(key));
  if (bad !== undefined) throw new ConfigError(`${path}: "${bad}" is no config key (from ${origin})`);
  let node = target;
  for (const key of keys.slice(0, -1)) {
    const next = node[key];
    if (typeof next !== "object" || next === null || Array.isArray(next)) node[key] = {};
    node = node[key] as Record<string, unknown>;
  }
  node[keys[keys.length - 1]!] = value;
}

function readConfigFile(file: string): Record<string, unknown> {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    throw new ConfigError(`cannot read config file ${file}: ${(err as Error).message}`);
  }
  let parsed: unknown;
  try {
    parsed = extname(file) === ".json" ? JSON.parse(text) : parseYaml(text);
  } catch (err) {
    throw new ConfigError(`config file ${file} is not valid ${extname(file) === ".json" ? "JSON" : "YAML"}: ${(err as Error).message}`);
  }
  if (parsed === null || parsed === undefined) return {};
  if (typeof parsed !== "object" || Array.isArray(parsed)) throw new ConfigError(`config file ${file} must hold an object`);
  return parsed as Record<string, unknown>;
}

/** `from`'s own entries in an object without a prototype. */
function ownEntries<T>(from: Readonly<Record<string, T>> | undefined): Record<string, T> {
  const out = Object.create(null) as Record<string, T>;
  for (const [key, value] of Object.entries(from ?? {})) out[key] = value;
  return out;
}

/** The variable that sets a key: its alias (MMGATE_MODULES) or its derived name. */
function envNameOf(path: string): string {
  return Object.entries(ENV_ALIASES).find(([, alias]) => alias.path === path)?.[0] ?? pathToEnvName(path);
}

/** `log.level` → `MMGATE_LOG__LEVEL`, the variable that sets a key (envNameToPath backwards). */
export function pathToEnvName(path: string): string {
  return `MMGATE_${path
    .split(".")
    .map((part) => part.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase())
    .join("__")}`;
}

/**
 * A list setting as the environment or a flag gives it: a JSON array, or a
 * comma list (`a,b`; "" is the empty list). A lone number or boolean is a
 * one-item list; anything else is left for the schema to refuse.
 */
function listValue(value: unknown, kind: "string" | "number", path: string, origin: string): unknown {
  if (typeof value === "number" || typeof value === "boolean") return [kind === "string" ? String(value) : value];
  if (typeof value !== "string") return value;
  const text = value.trim();
  if (text.startsWith("[")) {
    try {
      return JSON.parse(text) as unknown;
    } catch (err) {
      throw new ConfigError("invalid configuration", [
        `${path}: not a JSON array (${(err as Error).message}); give a comma list a,b or a JSON array ["a","b"] (from ${origin})`,
      ]);
    }
  }
  return text
    .split(",")
    .map((item) => item.trim())
    .filter((item) => item !== "")
    .map((item) => (kind === "number" ? parseScalar(item) : item));
}

/** The dotted paths of the values in a plain object (lists are values). */
function leafPaths(node: Record<string, unknown>, prefix = ""): string[] {
  return Object.entries(node).flatMap(([key, value]) => {
    const path = prefix === "" ? key : `${prefix}.${key}`;
    const nested = typeof value === "object" && value !== null && !Array.isArray(value) && Object.keys(value).length > 0;
    return nested ? leafPaths(value as Record<string, unknown>, path) : [path];
  });
}

/**
 * Gathers the raw (unvalidated) config from file, env and overrides, in that
 * order. MMGATE_* variables whose first level names no key of the config
 * (`topLevelKeys`) are left out with a warning: the prefix is shared with
 * variables such as API keys that modules read by name.
 */
export function gatherRawConfig(sources: ConfigSources, topLevelKeys?: ReadonlySet<string>, modules: readonly ServiceModule[] = []): RawConfig {
  const values = sources.file ? readConfigFile(sources.file) : {};
  const origins = new Map<string, string>();
  const warn = (message: string) => sources.onWarning?.(message);
  const index = configKeyIndex(modules);
  /** Sets a value from the environment or a flag: lists from their text, and the path now named by `origin` alone. */
  const set = (path: string, value: unknown, origin: string) => {
    const kind = index.lists.get(path);
    setPath(values, path, kind === undefined ? value : listValue(value, kind, path, origin), origin);
    for (const earlier of [...origins.keys()]) if (earlier === path || earlier.startsWith(`${path}.`)) origins.delete(earlier);
    origins.set(path, origin);
  };
  // Old key names become the new ones in each source as it is read (renamed-keys.ts).
  if (sources.file) adoptRenamedKeys(treeView(values, ` in ${sources.file}`), warn);
  // Copies without a prototype: a key such as "toString" or "__proto__" is a key like any other.
  const env = ownEntries<string | undefined>(sources.env);
  adoptRenamedKeys(flatView([env], envNameOf, envNameOf), warn);
  const overrides = ownEntries<unknown>(sources.overrides);
  // Each override named by its flag, or `--set KEY` as given (kept when an old key is renamed).
  const overrideOrigins = ownEntries<string>(undefined);
  for (const path of Object.keys(overrides)) {
    overrideOrigins[path] = sources.overrideOrigins !== undefined && Object.hasOwn(sources.overrideOrigins, path) ? sources.overrideOrigins[path]! : `--set ${path}`;
  }
  adoptRenamedKeys(
    flatView([overrides, overrideOrigins], (path) => path, (path) => `"${path}" (${overrideOrigins[path] ?? `--${path}`})`),
    warn,
  );
  // Every value the file holds is named by it until a later source sets it.
  if (sources.file) for (const path of leafPaths(values)) origins.set(path, sources.file);
  // A module's own names for its keys (the relay's DYN_RELAY_*, say), before
  // MMGATE_* so that the project's own prefix wins when both are set.
  for (const module of modules) {
    for (const [name, key] of Object.entries(module.env ?? {})) {
      const value = env[name];
      if (value === undefined) continue;
      set(`${module.name}.${key}`, parseScalar(value), name);
    }
  }
  for (const [name, value] of Object.entries(env)) {
    if (!name.startsWith("MMGATE_") || value === undefined || ENV_IGNORED.has(name)) continue;
    const alias = ENV_ALIASES[name];
    const path = alias ? alias.path : envNameToPath(name);
    if (topLevelKeys && !topLevelKeys.has(path.split(".", 1)[0]!)) {
      const near = nearestName(name, [...Object.keys(ENV_ALIASES), ...[...index.paths].map(pathToEnvName)]);
      warn(`${name} is not a config key; left to whatever reads it by name${near === undefined ? "" : ` (did you mean ${near}?)`}`);
      continue;
    }
    set(path, alias?.raw ? value : parseScalar(value), name);
  }
  for (const [path, value] of Object.entries(overrides)) set(path, value, overrideOrigins[path]!);
  return { values, origins };
}
