import { readFileSync } from "node:fs";
import { extname } from "node:path";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import type { ServiceModule } from "./module.js";
import { MAX_TIMER_MS } from "../util/index.js";

const MiB = 1024 * 1024;

/** `HOST:PORT` or `[IPv6]:PORT` → host (brackets removed) and port. */
export function splitHostPort(address: string): { host: string; port: number } {
  const at = address.lastIndexOf(":");
  return { host: address.slice(0, at).replace(/^\[(.*)\]$/, "$1"), port: Number(address.slice(at + 1)) };
}

/** `HOST:PORT`, `[IPv6]:PORT`; port 0 picks a free port. */
export const hostPort = z
  .string()
  .regex(/^(\[[0-9a-fA-F:.]+\]|[^\s:[\]]+):\d{1,5}$/, "expected HOST:PORT, e.g. 127.0.0.1:50051 or [::1]:50051")
  .refine((s) => splitHostPort(s).port <= 65535, "port must be 0..65535");

const bytes = (min: number, max: number) => z.number().int().min(min).max(max);
/** A duration in milliseconds that a Node timer can hold. */
const timerMs = z.number().int().min(0).max(MAX_TIMER_MS);

/** Settings of the host itself; each module adds its own section. */
export const hostConfigSchema = z.strictObject({
  /** The gRPC / gRPC-Web / Connect listener. */
  listen: hostPort.default("127.0.0.1:50051"),
  /** The HTTP/1.1 admin listener (/metrics, /healthz, /readyz); "" turns it off. */
  adminListen: z.union([hostPort, z.literal("")]).default("127.0.0.1:9464"),
  /** The address other processes use to reach this one; defaults to the bound listen address. */
  advertiseAddress: z.string().default(""),
  tls: z
    .strictObject({
      certFile: z.string().default(""),
      keyFile: z.string().default(""),
    })
    .prefault({})
    .refine((t) => (t.certFile === "") === (t.keyFile === ""), "tls.certFile and tls.keyFile go together"),
  limits: z
    .strictObject({
      /** Largest request message accepted, after decompression. */
      maxReceiveMessageBytes: bytes(1024, 1024 * MiB).default(8 * MiB),
      /** Largest response message sent. */
      maxSendMessageBytes: bytes(1024, 1024 * MiB).default(8 * MiB),
      /** HTTP/2 streams one connection may have open at once. */
      maxConcurrentStreams: z.number().int().min(1).max(2 ** 31 - 1).default(1000),
      /** HTTP/2 initial stream flow-control window (the protocol default is 64 KiB). */
      streamWindowBytes: bytes(65535, 2 ** 31 - 1).default(4 * MiB),
      /** HTTP/2 connection flow-control window. */
      connectionWindowBytes: bytes(65535, 2 ** 31 - 1).default(16 * MiB),
      /** Upper bound on a client's deadline; 0 means none. */
      maxTimeoutMs: z.number().int().min(0).default(0),
    })
    .prefault({}),
  rpc: z
    .strictObject({
      /**
       * Serve unary and server-streaming gRPC calls, and unary Connect calls,
       * on the host's lean path (the same interceptors, limits and wire, a
       * fraction of the per-call cost); false sends every call through
       * connect's handler.
       */
      fastPath: z.boolean().default(true),
      /**
       * Compress responses of at least this many bytes when the client
       * accepts gzip or br; 0 (the default) never compresses them. Tensors
       * and filter frames barely compress and cost CPU to try.
       */
      responseCompressionMinBytes: z.number().int().min(0).max(2 ** 32 - 1).default(0),
    })
    .prefault({}),
  connections: z
    .strictObject({
      /**
       * An HTTP/2 session with no open stream (GOAWAY), or an HTTP/1.1
       * connection with no request, is closed after this long; 0 turns it off.
       */
      idleTimeoutMs: timerMs.default(300_000),
      /** A session silent for this long gets a PING; 0 turns keepalive off. */
      keepaliveTimeMs: timerMs.default(7_200_000),
      /** A keepalive PING not acknowledged within this is the end of the session. */
      keepaliveTimeoutMs: timerMs.min(1).default(20_000),
      /** A client PING sooner than this after the previous one is a strike; 0 allows any rate. */
      minPingIntervalMs: timerMs.default(10_000),
      /** Strikes in a row allowed before GOAWAY ENHANCE_YOUR_CALM (grpc's default: 2). */
      maxPingStrikes: z.number().int().min(0).default(2),
      /**
       * A connection must finish its TLS handshake and HTTP/2 preface (over
       * HTTP/1.1: each request's headers) within this; 0 turns it off.
       */
      handshakeTimeoutMs: timerMs.default(10_000),
      /** Open connections at most; a new one over it is closed at once. 0 means no cap. */
      maxConnections: z.number().int().min(0).default(0),
    })
    .prefault({}),
  cors: z
    .strictObject({
      /**
       * Origins browser clients may call from, e.g. "https://app.example.com";
       * "*" allows any origin. Empty (the default) turns CORS off: no CORS
       * headers, and preflights are refused.
       */
      allowedOrigins: z.array(z.string().min(1)).default([]),
      /** How long a browser may cache a preflight's answer (Access-Control-Max-Age). */
      maxAgeSeconds: z.number().int().min(0).max(86_400).default(7200),
    })
    .prefault({}),
  admin: z
    .strictObject({
      /** How long a client may take to send a request's headers on the admin listener; 0: no limit. */
      headersTimeoutMs: timerMs.default(10_000),
      /** How long a client may take to send a whole request on the admin listener; 0: no limit. */
      requestTimeoutMs: timerMs.default(30_000),
      /** How long an idle keep-alive connection to the admin listener stays open. */
      keepAliveTimeoutMs: timerMs.default(5_000),
    })
    .prefault({})
    .refine(
      (a) => a.requestTimeoutMs === 0 || a.headersTimeoutMs === 0 || a.headersTimeoutMs <= a.requestTimeoutMs,
      "admin.headersTimeoutMs must not exceed admin.requestTimeoutMs",
    ),
  auth: z
    .strictObject({
      /** Bearer token that mutating and admin methods require; "" disables auth. */
      token: z
        .preprocess((v) => (typeof v === "number" ? String(v) : v), z.string())
        .refine((t) => t === "" || t.length >= 16, "a token needs at least 16 characters")
        .refine((t) => !/\s/.test(t), "a token cannot contain white space")
        .default(""),
    })
    .prefault({}),
  log: z
    .strictObject({
      level: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
    })
    .prefault({}),
  shutdown: z
    .strictObject({
      /** How long server streams and unary calls get to finish after SIGTERM. */
      graceMs: z.number().int().min(0).max(600_000).default(10_000),
    })
    .prefault({}),
});

export type HostConfig = z.output<typeof hostConfigSchema>;

/** The whole configuration: host settings, the module list, module sections. */
export interface MmgateConfig extends HostConfig {
  /** Names of the modules to run (and serve). */
  modules: string[];
  /** One validated section per known module, keyed by module name. */
  sections: Record<string, unknown>;
}

/** Config errors name the offending field and where the value came from. */
export class ConfigError extends Error {
  override readonly name = "ConfigError";
  constructor(
    message: string,
    readonly issues: readonly string[] = [],
  ) {
    super(issues.length > 0 ? `${message}:\n  ${issues.join("\n  ")}` : message);
  }
}

/** Secrets that print-config and GetConfig replace with "<redacted>". */
const SECRET_PATHS = [["auth", "token"]];
/** Keys that hold a secret wherever they sit inside a module's section (a pool's NATS credentials, say). */
const SECRET_KEYS = new Set(["token", "pass"]);

/**
 * Replaces every non-empty SECRET_KEYS value below `node`, in arrays too,
 * and writes u64s (bigint) as decimal strings, which the config reads back.
 */
function redactSecretKeys(node: unknown): void {
  if (typeof node !== "object" || node === null) return;
  const record = node as Record<string, unknown>;
  for (const [key, value] of Object.entries(record)) {
    if (SECRET_KEYS.has(key) && typeof value === "string" && value !== "") record[key] = "<redacted>";
    else if (typeof value === "bigint") record[key] = value.toString();
    else redactSecretKeys(value);
  }
}

export interface ConfigSources {
  /** Path of a JSON or YAML file. */
  file?: string | undefined;
  /** Environment; MMGATE_* variables override the file. */
  env?: Record<string, string | undefined>;
  /** `path.to.key` → value, applied last (from flags). */
  overrides?: Record<string, unknown>;
  /** Told about ignored input, e.g. an MMGATE_* variable that matches no key. */
  onWarning?: (message: string) => void;
}

/** Raw config plus where each overridden path came from, for error messages. */
export interface RawConfig {
  readonly values: Record<string, unknown>;
  /** `path.to.key` → "MMGATE_X" or "--set path.to.key". */
  readonly origins: ReadonlyMap<string, string>;
}

/** Env names that map to a nested key directly, as operators expect. */
const ENV_ALIASES: Record<string, { path: string; raw: boolean }> = {
  MMGATE_LISTEN: { path: "listen", raw: true },
  MMGATE_ADMIN_LISTEN: { path: "adminListen", raw: true },
  MMGATE_ADVERTISE_ADDRESS: { path: "advertiseAddress", raw: true },
  MMGATE_AUTH_TOKEN: { path: "auth.token", raw: true },
  MMGATE_LOG_LEVEL: { path: "log.level", raw: true },
  MMGATE_MODULES: { path: "modules", raw: true },
  MMGATE_SERVICES: { path: "modules", raw: true },
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

function setPath(target: Record<string, unknown>, path: string, value: unknown): void {
  const keys = path.split(".");
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
  // `services` was the first name of `modules` (it held module names all
  // along). Each source's old name becomes the new one where it is read, so
  // that later sources still win: a file's `modules` loses to MMGATE_SERVICES.
  if (values.services !== undefined) {
    if (values.modules === undefined) {
      values.modules = values.services;
      warn(`"services" in ${sources.file} is the old name of "modules"; it still works`);
    } else {
      warn(`${sources.file} sets both "modules" and its old name "services"; "services" is ignored`);
    }
    delete values.services;
  }
  // A module's own names for its keys (the relay's DYN_RELAY_*, say), before
  // MMGATE_* so that the project's own prefix wins when both are set.
  for (const module of modules) {
    for (const [name, key] of Object.entries(module.env ?? {})) {
      const value = sources.env?.[name];
      if (value === undefined) continue;
      const path = `${module.name}.${key}`;
      setPath(values, path, parseScalar(value));
      origins.set(path, name);
    }
  }
  for (const [name, value] of Object.entries(sources.env ?? {})) {
    if (!name.startsWith("MMGATE_") || value === undefined || ENV_IGNORED.has(name)) continue;
    if (name === "MMGATE_SERVICES") {
      if (sources.env?.MMGATE_MODULES !== undefined) {
        warn("both MMGATE_MODULES and its old name MMGATE_SERVICES are set; MMGATE_SERVICES is ignored");
        continue;
      }
      warn("MMGATE_SERVICES is the old name of MMGATE_MODULES; it still works");
    }
    const alias = ENV_ALIASES[name];
    const path = alias ? alias.path : envNameToPath(name);
    if (topLevelKeys && !topLevelKeys.has(path.split(".", 1)[0]!)) {
      warn(`${name} is not a config key; left to whatever reads it by name`);
      continue;
    }
    setPath(values, path, alias?.raw ? value : parseScalar(value));
    origins.set(path, name);
  }
  for (const [given, value] of Object.entries(sources.overrides ?? {})) {
    let path = given;
    if (given === "services") {
      if (sources.overrides?.modules !== undefined) {
        warn('both "modules" and its old name "services" are set by flags; "services" is ignored');
        continue;
      }
      warn('"services" (--services) is the old name of "modules" (--modules); it still works');
      path = "modules";
    }
    setPath(values, path, value);
    origins.set(path, `--set ${given}`);
  }
  return { values, origins };
}

function formatIssues(error: z.ZodError, prefix: string, origins: ReadonlyMap<string, string>): string[] {
  return error.issues.map((issue) => {
    const path = [prefix, ...issue.path.map(String)].filter((p) => p !== "").join(".");
    // Name the variable or flag that set this field (or the object holding it).
    let origin: string | undefined;
    for (const [set, source] of origins) {
      if (path === set || path.startsWith(`${set}.`) || set.startsWith(`${path}.`)) origin = source;
    }
    return `${path || "(root)"}: ${issue.message}${origin ? ` (from ${origin})` : ""}`;
  });
}

/** The first-level keys a config may have with these modules. */
function topLevelConfigKeys(modules: readonly ServiceModule[]): Set<string> {
  return new Set([...Object.keys(hostConfigSchema.shape), "modules", "services", ...modules.map((m) => m.name)]);
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
  const { modules: rawModules, services: rawServices, ...rest } = raw;
  // `services`, the old name, reaches here only from callers that pass a raw
  // object themselves; gatherRawConfig renames it at each source.
  let listed = rawModules;
  let listKey = "modules";
  if (rawServices !== undefined) {
    if (rawModules === undefined) {
      listed = rawServices;
      listKey = "services";
      onWarning?.(`"services" is the old name of "modules"; it still works`);
    } else {
      onWarning?.(`both "modules" and its old name "services" are set; "services" is ignored`);
    }
  }
  const hostRaw: Record<string, unknown> = {};
  const moduleRaw: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(rest)) (known.has(key) ? moduleRaw : hostRaw)[key] = value;

  const issues: string[] = [];
  const host = hostConfigSchema.safeParse(hostRaw);
  if (!host.success) issues.push(...formatIssues(host.error, "", origins));

  let enabled = [...known.keys()];
  if (listed !== undefined) {
    const list = typeof listed === "string" ? listed.split(",").map((s) => s.trim()).filter(Boolean) : listed;
    const origin = origins.get(listKey);
    const from = origin ? ` (from ${origin})` : "";
    if (!Array.isArray(list) || !list.every((s) => typeof s === "string")) {
      issues.push(`${listKey}: expected a list of module names${from}`);
    } else {
      const unknown = list.filter((s) => !known.has(s));
      if (unknown.length > 0) issues.push(`${listKey}: unknown module ${unknown.map((s) => `"${s}"`).join(", ")} (known: ${[...known.keys()].join(", ")})${from}`);
      enabled = [...new Set(list)];
    }
  }

  const sections: Record<string, unknown> = {};
  for (const module of modules) {
    const parsed = module.configSchema.safeParse(moduleRaw[module.name] ?? {});
    if (parsed.success) sections[module.name] = parsed.data;
    else issues.push(...formatIssues(parsed.error, module.name, origins));
  }

  if (issues.length > 0 || !host.success) throw new ConfigError("invalid configuration", issues);
  return { ...host.data, modules: enabled, sections };
}

/** Loads, merges and validates in one step. */
export function loadConfig(sources: ConfigSources, modules: readonly ServiceModule[]): MmgateConfig {
  const raw = gatherRawConfig(sources, topLevelConfigKeys(modules), modules);
  return resolveConfig(raw.values, modules, raw.origins, sources.onWarning);
}

/** The config as a plain object with secrets redacted, for printing and GetConfig. */
export function redactedConfig(config: MmgateConfig): Record<string, unknown> {
  const { sections, ...host } = config;
  const out = structuredClone({ ...host, ...sections }) as Record<string, unknown>;
  for (const name of Object.keys(sections)) redactSecretKeys(out[name]);
  // JSON-ready: print-config and GetConfig write it as it is.
  for (const path of SECRET_PATHS) {
    let node: unknown = out;
    for (const key of path.slice(0, -1)) node = (node as Record<string, unknown> | undefined)?.[key];
    const last = path[path.length - 1]!;
    if (node && typeof node === "object" && (node as Record<string, unknown>)[last]) {
      (node as Record<string, unknown>)[last] = "<redacted>";
    }
  }
  return out;
}
