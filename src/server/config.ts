import { readFileSync } from "node:fs";
import { extname } from "node:path";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import type { ServiceModule } from "./module.js";
import { MAX_TIMER_MS } from "../util/index.js";
import { isAllowedHostEntry } from "./request-host.js";

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
  server: z
    .strictObject({
      /**
       * The hosts requests may name (Host, :authority): names or addresses,
       * ".example.com" for a domain and its subdomains, "*" for any. Empty
       * (the default): the loopback names when the listener is on loopback,
       * any host otherwise. Others are refused (403, PERMISSION_DENIED),
       * which stops DNS rebinding from a web page.
       */
      allowedHosts: z
        .array(
          z
            .string()
            .min(1)
            .refine(isAllowedHostEntry, 'expected a host name, an address, ".domain" or "*"'),
        )
        .default([]),
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
      /** "json": one JSON object a line; "pretty": readable lines; "auto": pretty when stdout is a terminal, else JSON. */
      format: z.enum(["auto", "json", "pretty"]).default("auto"),
    })
    .prefault({}),
  telemetry: z
    .strictObject({
      /**
       * OpenTelemetry tracing (src/telemetry): spans exported over OTLP/HTTP.
       * The standard OTEL_* variables win over these keys, and setting
       * OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) alone turns it on.
       */
      tracing: z
        .strictObject({
          /** Off by default; OTEL_SDK_DISABLED=true turns it off whatever is set. */
          enabled: z.boolean().default(false),
          /** The collector's OTLP/HTTP base URL, `/v1/traces` appended; "" is http://localhost:4318. */
          endpoint: z.union([z.literal(""), z.url({ protocol: /^https?$/ })]).default(""),
          /** OTLP encoding of the export requests. */
          protocol: z.enum(["http/protobuf", "http/json"]).default("http/protobuf"),
          /** service.name of the spans (OTEL_SERVICE_NAME wins). */
          serviceName: z.string().min(1).default("mmgate"),
          /** Share of new traces recorded, 0..1; a caller's sampled flag decides for its calls (OTEL_TRACES_SAMPLER wins). */
          sampleRatio: z.number().min(0).max(1).default(1),
        })
        .prefault({}),
    })
    .prefault({}),
  shutdown: z
    .strictObject({
      /** How long server streams and unary calls get to finish after SIGTERM. */
      graceMs: z.number().int().min(0).max(600_000).default(10_000),
      /**
       * How long the server keeps serving after SIGTERM, with health already
       * NOT_SERVING (and /readyz 503), before it stops taking calls: the time
       * peers (load balancers, a hop's health checks, the other roles of a
       * stack stopped all at once) need to stop sending to it, as a
       * Kubernetes preStop pause gives. 0 (default): stop taking calls at once.
       */
      delayMs: z.number().int().min(0).max(600_000).default(0),
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

/** `log.level` → `MMGATE_LOG__LEVEL`, the variable that sets a key (envNameToPath backwards). */
function pathToEnvName(path: string): string {
  return `MMGATE_${path
    .split(".")
    .map((part) => part.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase())
    .join("__")}`;
}

/** The keys a config may have with a set of modules. */
export interface ConfigKeyIndex {
  /** Every dotted key path of the schemas' objects, sections and leaves alike. */
  readonly paths: ReadonlySet<string>;
  /** Keys that hold a list of strings or numbers: env and flags may give those as `a,b` or a JSON array. */
  readonly lists: ReadonlyMap<string, "string" | "number">;
}

/** The parts of a zod schema's definition that say which keys it has (zod keeps them on `_zod.def`). */
interface SchemaDef {
  readonly type: string;
  readonly shape?: Record<string, unknown>;
  readonly innerType?: unknown;
  readonly in?: unknown;
  readonly out?: unknown;
  readonly element?: unknown;
  readonly options?: readonly unknown[];
  readonly left?: unknown;
  readonly right?: unknown;
  readonly getter?: () => unknown;
  readonly values?: readonly unknown[];
}

function schemaDef(schema: unknown): SchemaDef | undefined {
  return (schema as { _zod?: { def?: SchemaDef } } | undefined)?._zod?.def;
}

/** The definition behind wrappers (default, optional, pipes, lazy), where a value's shape is decided. */
function unwrapDef(schema: unknown, depth = 0): SchemaDef | undefined {
  const def = schemaDef(schema);
  if (def === undefined || depth > 32) return def;
  switch (def.type) {
    case "default":
    case "prefault":
    case "optional":
    case "nullable":
    case "readonly":
    case "catch":
    case "nonoptional":
      return unwrapDef(def.innerType, depth + 1);
    case "pipe":
      // z.preprocess pipes a transform into the schema, .transform() the schema into a transform.
      return unwrapDef(schemaDef(def.in)?.type === "transform" ? def.out : def.in, depth + 1);
    case "lazy":
      return unwrapDef(def.getter?.(), depth + 1);
    default:
      return def;
  }
}

function scalarKind(schema: unknown): "string" | "number" | undefined {
  const def = unwrapDef(schema);
  switch (def?.type) {
    case "string":
    case "enum":
    case "template_literal":
      return "string";
    case "number":
      return "number";
    case "literal":
      if (def.values?.every((v) => typeof v === "string")) return "string";
      return def.values?.every((v) => typeof v === "number") ? "number" : undefined;
    case "union": {
      const kinds = new Set(def.options?.map(scalarKind));
      return kinds.size === 1 ? [...kinds][0] : undefined;
    }
    default:
      return undefined;
  }
}

function indexSchema(schema: unknown, path: string, paths: Set<string>, lists: Map<string, "string" | "number">, depth = 0): void {
  const def = unwrapDef(schema);
  if (def === undefined || depth > 32) return;
  if (def.type === "object") {
    for (const [key, child] of Object.entries(def.shape ?? {})) {
      const at = path === "" ? key : `${path}.${key}`;
      paths.add(at);
      indexSchema(child, at, paths, lists, depth + 1);
    }
  } else if (def.type === "union") {
    for (const option of def.options ?? []) indexSchema(option, path, paths, lists, depth + 1);
  } else if (def.type === "intersection") {
    indexSchema(def.left, path, paths, lists, depth + 1);
    indexSchema(def.right, path, paths, lists, depth + 1);
  } else if (def.type === "array" && path !== "") {
    const kind = scalarKind(def.element);
    if (kind !== undefined) lists.set(path, kind);
  }
}

/** Every key the host's and these modules' schemas know, and which of them are lists. */
export function configKeyIndex(modules: readonly ServiceModule[]): ConfigKeyIndex {
  const paths = new Set<string>(["modules"]);
  const lists = new Map<string, "string" | "number">([["modules", "string"]]);
  indexSchema(hostConfigSchema, "", paths, lists);
  for (const module of modules) {
    paths.add(module.name);
    indexSchema(module.configSchema, module.name, paths, lists);
  }
  return { paths, lists };
}

/** Edits (insert, delete, substitute, swap two neighbours) that turn `a` into `b`. */
function editDistance(a: string, b: string): number {
  let before: number[] = [];
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let d = Math.min(previous[j]! + 1, current[j - 1]! + 1, previous[j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d = Math.min(d, before[j - 2]! + 1);
      current.push(d);
    }
    before = previous;
    previous = current;
  }
  return previous[b.length]!;
}

/**
 * The candidate nearest to `word` (case aside) when it is close enough to be
 * a typo of it: at most one edit per four characters, three at most.
 */
export function nearestName(word: string, candidates: Iterable<string>): string | undefined {
  const limit = Math.min(3, Math.max(1, Math.floor(word.length / 4)));
  const lower = word.toLowerCase();
  let best: string | undefined;
  let bestDistance = limit + 1;
  for (const candidate of candidates) {
    if (candidate === word || Math.abs(candidate.length - word.length) >= bestDistance) continue;
    const distance = editDistance(lower, candidate.toLowerCase());
    if (distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  return best;
}

/** Whether an origin names an environment variable (else a flag or the config file). */
function isEnvOrigin(origin: string): boolean {
  return /^[A-Z][A-Z0-9_]*$/.test(origin);
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
  // Every value the file holds is named by it until a later source sets it.
  if (sources.file) for (const path of leafPaths(values)) origins.set(path, sources.file);
  // A module's own names for its keys (the relay's DYN_RELAY_*, say), before
  // MMGATE_* so that the project's own prefix wins when both are set.
  for (const module of modules) {
    for (const [name, key] of Object.entries(module.env ?? {})) {
      const value = sources.env?.[name];
      if (value === undefined) continue;
      set(`${module.name}.${key}`, parseScalar(value), name);
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
      const near = nearestName(name, [...Object.keys(ENV_ALIASES), ...[...index.paths].map(pathToEnvName)]);
      warn(`${name} is not a config key; left to whatever reads it by name${near === undefined ? "" : ` (did you mean ${near}?)`}`);
      continue;
    }
    set(path, alias?.raw ? value : parseScalar(value), name);
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
    const named = sources.overrideOrigins !== undefined && Object.hasOwn(sources.overrideOrigins, given) ? sources.overrideOrigins[given] : undefined;
    set(path, value, named ?? `--set ${given}`);
  }
  return { values, origins };
}

/**
 * The sources of the value at `path`: the one that set it or a key above
 * it (the latest, most specific), and for a section, those that set keys
 * inside it.
 */
function originsOf(path: string, origins: ReadonlyMap<string, string>): string[] {
  let own: [string, string] | undefined;
  const inside: string[] = [];
  for (const [set, source] of origins) {
    if (path !== "" && (path === set || path.startsWith(`${set}.`))) {
      if (own === undefined || set.length >= own[0].length) own = [set, source];
    } else if (path === "" || set.startsWith(`${path}.`)) {
      inside.push(source);
    }
  }
  return [...new Set([...(own ? [own[1]] : []), ...inside])];
}

function fromText(sources: readonly string[]): string {
  return sources.length > 0 ? ` (from ${sources.join(", ")})` : "";
}

/**
 * An unknown key, once per source that set it, under the path that source
 * used (`--set nope.key` reports `nope.key`), with the nearest known key
 * (as a variable name for a variable).
 */
function unknownKeyIssues(unknown: string, origins: ReadonlyMap<string, string>, index: ConfigKeyIndex): string[] {
  const bySource = new Map<string, string[]>();
  for (const [set, source] of origins) {
    const inside = set === unknown || set.startsWith(`${unknown}.`);
    if (!inside && !unknown.startsWith(`${set}.`)) continue;
    bySource.set(source, [...(bySource.get(source) ?? []), inside ? set : unknown]);
  }
  if (bySource.size === 0) bySource.set("", [unknown]);
  return [...bySource].map(([source, paths]) => {
    const shown = paths.length === 1 ? paths[0]! : unknown;
    const near = nearestName(shown, index.paths);
    const hint = near === undefined ? "" : `; did you mean ${isEnvOrigin(source) && source.startsWith("MMGATE_") ? pathToEnvName(near) : near}?`;
    return `${shown}: unknown key${hint}${fromText(source === "" ? [] : [source])}`;
  });
}

function formatIssues(error: z.ZodError, prefix: string, origins: ReadonlyMap<string, string>, index: ConfigKeyIndex): string[] {
  return error.issues.flatMap((issue) => {
    const path = [prefix, ...issue.path.map(String)].filter((p) => p !== "").join(".");
    if (issue.code === "unrecognized_keys") {
      return issue.keys.flatMap((key) => unknownKeyIssues(path === "" ? key : `${path}.${key}`, origins, index));
    }
    // Name the variable, flag or file that set this field (or the section holding it).
    return [`${path || "(root)"}: ${issue.message}${fromText(originsOf(path, origins))}`];
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
