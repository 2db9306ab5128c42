/**
 * Router events (B.4) from the reference's JSON: serde's encoding of
 * `RouterEvent { worker_id, storage_tier?, residency_domain?, event:
 * KvCacheEvent { event_id, dp_rank?, data } }`, one event per line for logs
 * and replays. u64 values are read exactly, as JSON numbers or as decimal
 * strings; JSON.parse would round 9143094415614847814 to 9143094415614847000.
 *
 * Reading follows serde: unknown keys (`state_source`, `session_id`, ...) are
 * ignored, `dp_rank` defaults to 0, an Option field may be absent or null.
 */
import { isJsonObject, JsonError, parseJson, type JsonObject, type JsonValue } from "../../util/index.js";
// A block's multimodal details (mm_extra_info) take block hashing's own shape.
import type { BlockExtraInfo } from "../hash/index.js";
import type { KvCacheEventData, RouterEvent, StorageTier, StoredBlock } from "./events.js";

/** Most UTF-8 bytes of one event's JSON (1 MiB), checked before parsing. */
export const MAX_ROUTER_EVENT_JSON_BYTES = 1024 * 1024;

/** Deepest nesting of one event's JSON; the deepest valid shape (mm_extra_info offsets) is 9. */
const MAX_DEPTH = 32;

/** Stable codes of RouterEventJsonError. */
export type RouterEventJsonErrorCode =
  /** The line exceeds the byte limit (checked before parsing). */
  | "TOO_LARGE"
  /** Not JSON. */
  | "NOT_JSON"
  /** Arrays and objects nest deeper than any router event does. */
  | "TOO_DEEP"
  /** An object names the same key twice. */
  | "DUPLICATE_KEY"
  /** A value has the wrong JSON type (the document or `event` not an object, a hash not a number or string, ...). */
  | "TYPE"
  /** A required key is missing. */
  | "MISSING"
  /** An integer is negative, fractional or too big for its field (u64, u32, usize), or a number overflows a double. */
  | "RANGE"
  /** A string is not a canonical decimal u64. */
  | "FORMAT"
  /** An unknown data kind, storage tier, or a residency domain this reader cannot carry. */
  | "UNKNOWN_VARIANT";

/**
 * Bad router-event JSON: a stable code, the JSON path of the fault ("$" for
 * the document, "$.event.data.stored.blocks[2].tokens_hash" below it) and,
 * from `routerEventsFromJsonLines`, the 1-based line.
 */
export class RouterEventJsonError extends Error {
  override readonly name = "RouterEventJsonError";
  constructor(
    readonly code: RouterEventJsonErrorCode,
    readonly path: string,
    readonly detail: string,
    readonly line?: number,
    options?: { cause?: unknown },
  ) {
    super(`${line === undefined ? "" : `line ${line}: `}${path}: ${detail}`, options);
  }
}

export function isRouterEventJsonError(value: unknown): value is RouterEventJsonError {
  return value instanceof RouterEventJsonError;
}

export interface RouterEventJsonOptions {
  /** Most UTF-8 bytes of one event; default MAX_ROUTER_EVENT_JSON_BYTES. */
  readonly maxBytes?: number;
}

/** One event of a JSON-lines text, with its 1-based line number. */
export interface NumberedRouterEvent {
  readonly line: number;
  readonly event: RouterEvent;
}

const U32_MAX = 0xffff_ffffn;
const U64_MAX = 0xffff_ffff_ffff_ffffn;
const USIZE_MAX = BigInt(Number.MAX_SAFE_INTEGER);
const DECIMAL = /^(?:0|[1-9][0-9]*)$/;
const STORAGE_TIERS: readonly StorageTier[] = ["device", "host_pinned", "disk", "external"];

/**
 * Reads one router event. Throws RouterEventJsonError, never anything else.
 * The result passes the shape check of `DcCkfState.applyEvent`; whether the
 * residency gate accepts it is for `targetsPrimary` to say.
 */
export function routerEventFromJson(line: string, options: RouterEventJsonOptions = {}): RouterEvent {
  const maxBytes = options.maxBytes ?? MAX_ROUTER_EVENT_JSON_BYTES;
  // UTF-16 length bounds the UTF-8 length from below: the cheap test first.
  if (line.length > maxBytes || Buffer.byteLength(line, "utf8") > maxBytes) {
    throw new RouterEventJsonError("TOO_LARGE", "$", `input is larger than ${maxBytes} bytes`);
  }
  let doc: JsonValue;
  try {
    doc = parseJson(line, { maxBytes, maxDepth: MAX_DEPTH });
  } catch (e) {
    if (e instanceof JsonError) {
      const code: RouterEventJsonErrorCode =
        e.code === "TOO_LARGE" || e.code === "TOO_DEEP" || e.code === "DUPLICATE_KEY" || e.code === "RANGE" ? e.code : "NOT_JSON";
      throw new RouterEventJsonError(code, e.path, e.message.slice(e.path.length + 2), undefined, { cause: e });
    }
    throw e;
  }
  return readRouterEvent(doc);
}

/**
 * Reads a JSON-lines text, one event per line ("\n" or "\r\n"); blank lines
 * are skipped. Yields each event with its line number; a bad line throws its
 * RouterEventJsonError with `line` set, and ends the iteration.
 */
export function* routerEventsFromJsonLines(text: string, options: RouterEventJsonOptions = {}): Generator<NumberedRouterEvent, void, undefined> {
  let start = 0;
  for (let line = 1; start <= text.length; line++) {
    let end = text.indexOf("\n", start);
    if (end < 0) end = text.length;
    const raw = text.slice(start, end > start && text.charCodeAt(end - 1) === 0x0d ? end - 1 : end);
    start = end + 1;
    if (raw.trim() === "") continue;
    try {
      yield { line, event: routerEventFromJson(raw, options) };
    } catch (e) {
      if (e instanceof RouterEventJsonError && e.line === undefined) {
        throw new RouterEventJsonError(e.code, e.path, e.detail, line, { cause: e.cause });
      }
      throw e;
    }
  }
}

// --- typed reads, each naming the path of what it rejects -------------------

function typeName(v: JsonValue | undefined): string {
  if (v === undefined) return "nothing";
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  if (typeof v === "bigint") return "a number";
  return typeof v === "object" ? "an object" : `a ${typeof v}`;
}

function wrongType(path: string, want: string, v: JsonValue | undefined): never {
  throw new RouterEventJsonError("TYPE", path, `expected ${want}, got ${typeName(v)}`);
}

function child(path: string, key: string): string {
  return `${path}.${key}`;
}

function object(v: JsonValue | undefined, path: string): JsonObject {
  if (!isJsonObject(v)) wrongType(path, "an object", v);
  return v;
}

function array(v: JsonValue | undefined, path: string): JsonValue[] {
  if (!Array.isArray(v)) wrongType(path, "an array", v);
  return v;
}

/** A required key's value; MISSING when the key is absent. */
function required(o: JsonObject, key: string, path: string): JsonValue {
  const v = o[key];
  if (v === undefined) throw new RouterEventJsonError("MISSING", child(path, key), "required field is missing");
  return v;
}

/** An integer JSON number in [0, max]. */
function unsigned(v: JsonValue, path: string, max: bigint, what: string): bigint {
  let n: bigint;
  if (typeof v === "bigint") n = v;
  else if (typeof v === "number") {
    if (!Number.isInteger(v)) throw new RouterEventJsonError("RANGE", path, `expected ${what}, got ${v}`);
    n = BigInt(v);
  } else return wrongType(path, what, v);
  if (n < 0n || n > max) throw new RouterEventJsonError("RANGE", path, `${n} is out of range for ${what}`);
  return n;
}

/** A u64: a JSON number, or a canonical decimal string (no sign, no leading zeros). */
function u64(v: JsonValue, path: string): bigint {
  if (typeof v === "string") {
    if (!DECIMAL.test(v)) throw new RouterEventJsonError("FORMAT", path, `${JSON.stringify(v.slice(0, 40))} is not a decimal u64`);
    const n = BigInt(v);
    if (n > U64_MAX) throw new RouterEventJsonError("RANGE", path, `${v} is out of range for a u64`);
    return n;
  }
  return unsigned(v, path, U64_MAX, "a u64");
}

const u32 = (v: JsonValue, path: string): number => Number(unsigned(v, path, U32_MAX, "a u32"));
const usize = (v: JsonValue, path: string): number => Number(unsigned(v, path, USIZE_MAX, "an offset"));

/** An Option field: undefined when absent or null. */
function optional<T>(o: JsonObject, key: string, path: string, read: (v: JsonValue, path: string) => T): T | undefined {
  const v = o[key];
  return v === undefined || v === null ? undefined : read(v, child(path, key));
}

// --- the event ---------------------------------------------------------------

function readRouterEvent(doc: JsonValue): RouterEvent {
  const root = object(doc, "$");
  const workerId = u64(required(root, "worker_id", "$"), "$.worker_id");
  const body = object(required(root, "event", "$"), "$.event");
  const eventId = u64(required(body, "event_id", "$.event"), "$.event.event_id");
  // serde(default): absent is rank 0; null is not a u32.
  const rank = body["dp_rank"];
  const dpRank = rank === undefined ? 0 : u32(rank, "$.event.dp_rank");
  const data = readData(required(body, "data", "$.event"), "$.event.data");
  const storageTier = readStorageTier(root);
  const residencyDomain = readResidencyDomain(root);
  return {
    workerId,
    dpRank,
    eventId,
    data,
    ...(storageTier === undefined ? {} : { storageTier }),
    ...(residencyDomain === undefined ? {} : { residencyDomain }),
  };
}

/** serde's externally tagged enum: "cleared", {"stored": {...}} or {"removed": {...}}. */
function readData(v: JsonValue, path: string): KvCacheEventData {
  if (typeof v === "string") {
    if (v === "cleared") return { kind: "cleared" };
    if (v === "stored" || v === "removed") throw new RouterEventJsonError("TYPE", path, `"${v}" carries data: expected {"${v}": {...}}`);
    throw new RouterEventJsonError("UNKNOWN_VARIANT", path, `unknown data kind ${JSON.stringify(v.slice(0, 40))}`);
  }
  const o = object(v, path);
  const keys = Object.keys(o);
  if (keys.length !== 1) {
    throw new RouterEventJsonError("TYPE", path, `expected one data kind ("stored", "removed" or "cleared"), got ${keys.length} keys`);
  }
  const kind = keys[0]!;
  const inner = o[kind]!;
  const at = child(path, kind);
  switch (kind) {
    case "stored":
      return readStored(object(inner, at), at);
    case "removed": {
      const removed = object(inner, at);
      const hashesPath = child(at, "block_hashes");
      const blockHashes = array(required(removed, "block_hashes", at), hashesPath).map((h, i) => u64(h, `${hashesPath}[${i}]`));
      return { kind: "removed", blockHashes };
    }
    case "cleared":
      // serde reads a unit variant in map form only as {"cleared": null}.
      if (inner !== null) wrongType(at, "null", inner);
      return { kind: "cleared" };
    default:
      throw new RouterEventJsonError("UNKNOWN_VARIANT", at, `unknown data kind ${JSON.stringify(kind.slice(0, 40))}`);
  }
}

function readStored(o: JsonObject, path: string): KvCacheEventData {
  const parentHash = optional(o, "parent_hash", path, u64);
  const startPosition = optional(o, "start_position", path, u32);
  const blocksPath = child(path, "blocks");
  const blocks = array(required(o, "blocks", path), blocksPath).map((b, i) => readBlock(b, `${blocksPath}[${i}]`));
  return {
    kind: "stored",
    ...(parentHash === undefined ? {} : { parentHash }),
    ...(startPosition === undefined ? {} : { startPosition }),
    blocks,
  };
}

function readBlock(v: JsonValue, path: string): StoredBlock {
  const o = object(v, path);
  const blockHash = u64(required(o, "block_hash", path), child(path, "block_hash"));
  const tokensHash = u64(required(o, "tokens_hash", path), child(path, "tokens_hash"));
  const mmExtraInfo = optional(o, "mm_extra_info", path, readExtraInfo);
  return mmExtraInfo === undefined ? { blockHash, tokensHash } : { blockHash, tokensHash, mmExtraInfo };
}

function readExtraInfo(v: JsonValue, path: string): BlockExtraInfo {
  const o = object(v, path);
  const objectsPath = child(path, "mm_objects");
  const mmObjects = array(required(o, "mm_objects", path), objectsPath).map((item, i) => {
    const at = `${objectsPath}[${i}]`;
    const obj = object(item, at);
    const mmHash = u64(required(obj, "mm_hash", at), child(at, "mm_hash"));
    const offsetsPath = child(at, "offsets");
    const offsets = array(required(obj, "offsets", at), offsetsPath).map((pair, j): readonly [number, number] => {
      const pairPath = `${offsetsPath}[${j}]`;
      const p = array(pair, pairPath);
      if (p.length !== 2) throw new RouterEventJsonError("TYPE", pairPath, `expected a [start, end] pair, got ${p.length} items`);
      return [usize(p[0]!, `${pairPath}[0]`), usize(p[1]!, `${pairPath}[1]`)];
    });
    return { mmHash, offsets };
  });
  return { mmObjects };
}

/** `storage_tier`: serde(default) Device; one of the reference's snake_case tiers. */
function readStorageTier(root: JsonObject): StorageTier | undefined {
  const v = root["storage_tier"];
  if (v === undefined) return undefined;
  if (typeof v !== "string") wrongType("$.storage_tier", "a storage tier string", v);
  const tier = STORAGE_TIERS.find((t) => t === v);
  if (tier === undefined) throw new RouterEventJsonError("UNKNOWN_VARIANT", "$.storage_tier", `unknown storage tier ${JSON.stringify(v.slice(0, 40))}`);
  return tier;
}

/**
 * `residency_domain`: the reference's wire names "worker" (our "primary") and
 * "cache_owner". Another string is carried as is, so `targetsPrimary` rejects
 * it as UnsupportedResidencyDomain as the reference does; only the literal
 * "primary" cannot be carried (it would read as the worker domain) and is
 * UNKNOWN_VARIANT here. Null or a non-string is TYPE here, where the
 * reference defers it to UnsupportedResidencyDomain at apply time.
 */
function readResidencyDomain(root: JsonObject): string | undefined {
  const v = root["residency_domain"];
  if (v === undefined) return undefined;
  if (typeof v !== "string") wrongType("$.residency_domain", "a residency domain string", v);
  if (v === "worker") return "primary";
  if (v === "primary") throw new RouterEventJsonError("UNKNOWN_VARIANT", "$.residency_domain", `unknown residency domain "primary" (the wire name is "worker")`);
  return v;
}
