/**
 * The lossless JSON reader (integers beyond 2^53 as bigint, null-prototype
 * objects, size and depth limits) and writer that the reference formats need
 * (the LLM request and output model, the KV router events), with its typed
 * error.
 */
/** Stable codes of JsonError. */
export type JsonErrorCode =
  /** The input exceeds the byte limit. */
  | "TOO_LARGE"
  /** Arrays and objects nest deeper than the depth limit. */
  | "TOO_DEEP"
  /** Not JSON. */
  | "SYNTAX"
  /** An object names the same key twice. */
  | "DUPLICATE_KEY"
  /** A value has the wrong JSON type. */
  | "TYPE"
  /** A number is out of the field's range or not an integer where one is needed. */
  | "RANGE"
  /** A required key is missing. */
  | "MISSING"
  /** A string or tag names no known variant. */
  | "UNKNOWN_VARIANT"
  /** A string does not have the field's format (hex ids). */
  | "FORMAT"
  /** An integer inside a free-form JSON field is not exact as a double. */
  | "LOSSY_NUMBER";

/**
 * Bad JSON, or JSON that does not fit the model read from it: a stable code
 * and the JSON path of the offending value ("$" for the document,
 * "$.multi_modal_data.image[0]" below it).
 */
export class JsonError extends Error {
  override readonly name = "JsonError";
  constructor(
    readonly code: JsonErrorCode,
    readonly path: string,
    detail: string,
  ) {
    super(`${path}: ${detail}`);
  }
}

/**
 * A parsed JSON value. Integers outside the safe range of a double are
 * bigint, so u64 and i64 values survive; other numbers are number. Objects
 * have a null prototype, so keys such as "__proto__" are plain keys.
 */
export type JsonValue = null | boolean | number | bigint | string | JsonValue[] | JsonObject;
export interface JsonObject {
  [key: string]: JsonValue;
}

/** Limits checked while parsing. */
export interface JsonLimits {
  /** Most UTF-8 bytes of input. */
  readonly maxBytes: number;
  /** Deepest nesting of arrays and objects. */
  readonly maxDepth: number;
}

export const DEFAULT_JSON_LIMITS: JsonLimits = { maxBytes: 16 * 1024 * 1024, maxDepth: 128 };

export function isJsonObject(value: JsonValue | undefined): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

export function newJsonObject(): JsonObject {
  return Object.create(null) as JsonObject;
}

const NUMBER = /-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;
const ESCAPES: Record<string, string> = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };

/**
 * Parses JSON text (RFC 8259) without losing integer precision. Rejects
 * duplicate keys, and numbers that overflow a double as serde_json does.
 */
export function parseJson(text: string, limits: JsonLimits = DEFAULT_JSON_LIMITS): JsonValue {
  // UTF-16 length bounds the UTF-8 length from below, so this check is
  // cheap before the exact one.
  if (text.length > limits.maxBytes || Buffer.byteLength(text, "utf8") > limits.maxBytes) {
    throw new JsonError("TOO_LARGE", "$", `input is larger than ${limits.maxBytes} bytes`);
  }
  let pos = 0;
  const syntax = (path: string, what: string): never => {
    throw new JsonError("SYNTAX", path, `${what} at offset ${pos}`);
  };
  const ws = () => {
    while (pos < text.length) {
      const c = text.charCodeAt(pos);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) pos++;
      else break;
    }
  };
  const str = (path: string): string => {
    pos++; // opening quote
    let out = "";
    let start = pos;
    for (;;) {
      if (pos >= text.length) syntax(path, "unterminated string");
      const c = text.charCodeAt(pos);
      if (c === 0x22) {
        out += text.slice(start, pos);
        pos++;
        return out;
      }
      if (c < 0x20) syntax(path, "control character in string");
      if (c === 0x5c) {
        out += text.slice(start, pos);
        const e = text[pos + 1] ?? "";
        if (e === "u") {
          const hex = text.slice(pos + 2, pos + 6);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) syntax(path, "bad \\u escape");
          out += String.fromCharCode(parseInt(hex, 16));
          pos += 6;
        } else {
          const mapped = ESCAPES[e];
          if (mapped === undefined) syntax(path, "bad escape");
          out += mapped;
          pos += 2;
        }
        start = pos;
      } else pos++;
    }
  };
  const value = (path: string, depth: number): JsonValue => {
    ws();
    const c = text[pos];
    if (c === "{" || c === "[") {
      if (depth >= limits.maxDepth) throw new JsonError("TOO_DEEP", path, `nesting deeper than ${limits.maxDepth}`);
      pos++;
      ws();
      if (c === "[") {
        const arr: JsonValue[] = [];
        if (text[pos] === "]") {
          pos++;
          return arr;
        }
        for (;;) {
          arr.push(value(`${path}[${arr.length}]`, depth + 1));
          ws();
          if (text[pos] === ",") pos++;
          else if (text[pos] === "]") {
            pos++;
            return arr;
          } else syntax(path, "expected ',' or ']'");
        }
      }
      const obj = newJsonObject();
      if (text[pos] === "}") {
        pos++;
        return obj;
      }
      for (;;) {
        ws();
        if (text[pos] !== '"') syntax(path, "expected a key");
        const key = str(path);
        const child = childPath(path, key);
        if (Object.prototype.hasOwnProperty.call(obj, key)) throw new JsonError("DUPLICATE_KEY", child, "duplicate key");
        ws();
        if (text[pos] !== ":") syntax(child, "expected ':'");
        pos++;
        obj[key] = value(child, depth + 1);
        ws();
        if (text[pos] === ",") pos++;
        else if (text[pos] === "}") {
          pos++;
          return obj;
        } else syntax(path, "expected ',' or '}'");
      }
    }
    if (c === '"') return str(path);
    if (text.startsWith("true", pos)) return (pos += 4), true;
    if (text.startsWith("false", pos)) return (pos += 5), false;
    if (text.startsWith("null", pos)) return (pos += 4), null;
    NUMBER.lastIndex = pos;
    const m = NUMBER.exec(text);
    if (m === null) return syntax(path, "expected a value");
    pos += m[0].length;
    if (m[1] === undefined && m[2] === undefined) {
      const n = Number(m[0]);
      return Number.isSafeInteger(n) ? n : BigInt(m[0]);
    }
    const n = Number(m[0]);
    if (!Number.isFinite(n)) throw new JsonError("RANGE", path, "number out of range");
    return n;
  };
  const result = value("$", 0);
  ws();
  if (pos !== text.length) syntax("$", "trailing characters");
  return result;
}

/** The path of an object's key below `path`. */
export function childPath(path: string, key: string): string {
  return /^[A-Za-z_][A-Za-z0-9_]*$/.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`;
}

/**
 * Writes JSON without whitespace, keys in insertion order; bigint as its
 * digits. Non-finite numbers are written as null, as serde_json does.
 */
export function stringifyJson(value: JsonValue): string {
  if (value === null) return "null";
  switch (typeof value) {
    case "boolean":
      return value ? "true" : "false";
    case "bigint":
      return value.toString();
    case "number":
      return Number.isFinite(value) ? JSON.stringify(value) : "null";
    case "string":
      return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(stringifyJson).join(",")}]`;
  const parts: string[] = [];
  for (const key of Object.keys(value)) parts.push(`${JSON.stringify(key)}:${stringifyJson(value[key] as JsonValue)}`);
  return `{${parts.join(",")}}`;
}
