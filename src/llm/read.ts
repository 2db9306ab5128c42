import { create, type JsonObject as PbJsonObject, type JsonValue as PbJsonValue } from "@bufbuild/protobuf";
import { NullValue, ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import { JsonError, childPath, isJsonObject, newJsonObject, type JsonObject, type JsonValue } from "../util/index.js";

// Typed reads of parsed JSON, each naming the path of what it rejects.

export function typeName(v: JsonValue | undefined): string {
  if (v === undefined) return "nothing";
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  if (typeof v === "bigint") return "a number";
  return typeof v === "object" ? "an object" : `a ${typeof v}`;
}

function wrong(path: string, want: string, v: JsonValue | undefined): never {
  throw new JsonError("TYPE", path, `expected ${want}, got ${typeName(v)}`);
}

export function object(v: JsonValue | undefined, path: string): JsonObject {
  if (!isJsonObject(v)) wrong(path, "an object", v);
  return v;
}

export function array(v: JsonValue | undefined, path: string): JsonValue[] {
  if (!Array.isArray(v)) wrong(path, "an array", v);
  return v;
}

export function string(v: JsonValue | undefined, path: string): string {
  if (typeof v !== "string") wrong(path, "a string", v);
  return v;
}

export function bool(v: JsonValue | undefined, path: string): boolean {
  if (typeof v !== "boolean") wrong(path, "a boolean", v);
  return v;
}

/** An integer in [min, max], as bigint. */
export function integer(v: JsonValue | undefined, path: string, min: bigint, max: bigint): bigint {
  if (typeof v === "number") {
    if (!Number.isInteger(v)) throw new JsonError("RANGE", path, `expected an integer, got ${v}`);
    v = BigInt(v);
  }
  if (typeof v !== "bigint") wrong(path, "an integer", v);
  if (v < min || v > max) throw new JsonError("RANGE", path, `${v} is out of range [${min}, ${max}]`);
  return v;
}

export const U8_MAX = 0xffn;
export const U16_MAX = 0xffffn;
export const U32_MAX = 0xffff_ffffn;
export const U64_MAX = 0xffff_ffff_ffff_ffffn;
export const I32_MIN = -0x8000_0000n;
export const I32_MAX = 0x7fff_ffffn;
export const I64_MIN = -0x8000_0000_0000_0000n;
export const I64_MAX = 0x7fff_ffff_ffff_ffffn;

export const u8 = (v: JsonValue | undefined, path: string) => Number(integer(v, path, 0n, U8_MAX));
export const u16 = (v: JsonValue | undefined, path: string) => Number(integer(v, path, 0n, U16_MAX));
export const u32 = (v: JsonValue | undefined, path: string) => Number(integer(v, path, 0n, U32_MAX));
export const i32 = (v: JsonValue | undefined, path: string) => Number(integer(v, path, I32_MIN, I32_MAX));
export const u64 = (v: JsonValue | undefined, path: string) => integer(v, path, 0n, U64_MAX);
export const i64 = (v: JsonValue | undefined, path: string) => integer(v, path, I64_MIN, I64_MAX);

/** A float field: any JSON number (integers are read as doubles, as serde does). */
export function f64(v: JsonValue | undefined, path: string): number {
  if (typeof v === "bigint") return Number(v);
  if (typeof v !== "number") wrong(path, "a number", v);
  return v;
}

export function list<T>(v: JsonValue | undefined, path: string, item: (v: JsonValue, path: string) => T): T[] {
  return array(v, path).map((x, i) => item(x, `${path}[${i}]`));
}

/** Calls `read` on a key's value unless it is absent or null (an Option's None). */
export function opt<T>(o: JsonObject, key: string, path: string, read: (v: JsonValue, path: string) => T): T | undefined {
  const v = o[key];
  if (v === undefined || v === null) return undefined;
  return read(v, childPath(path, key));
}

/** A required key. */
export function req<T>(o: JsonObject, key: string, path: string, read: (v: JsonValue, path: string) => T): T {
  const v = o[key];
  if (v === undefined) throw new JsonError("MISSING", childPath(path, key), "missing required key");
  return read(v, childPath(path, key));
}

/** Any JSON value as google.protobuf.Value; integers must be exact in a double. */
export function toValue(v: JsonValue, path: string): Value {
  if (v === null) return create(ValueSchema, { kind: { case: "nullValue", value: NullValue.NULL_VALUE } });
  if (typeof v === "bigint") throw new JsonError("LOSSY_NUMBER", path, `${v} is not exact in a JSON field (a double)`);
  if (typeof v === "number") return create(ValueSchema, { kind: { case: "numberValue", value: v } });
  if (typeof v === "string") return create(ValueSchema, { kind: { case: "stringValue", value: v } });
  if (typeof v === "boolean") return create(ValueSchema, { kind: { case: "boolValue", value: v } });
  if (Array.isArray(v)) {
    return create(ValueSchema, { kind: { case: "listValue", value: { values: v.map((x, i) => toValue(x, `${path}[${i}]`)) } } });
  }
  return create(ValueSchema, { kind: { case: "structValue", value: { fields: structFields(v, path) } } });
}

function structFields(o: JsonObject, path: string): Record<string, Value> {
  const fields: Record<string, Value> = {};
  for (const key of Object.keys(o)) fields[key] = toValue(o[key] as JsonValue, childPath(path, key));
  return fields;
}

function toPbJson(v: JsonValue, path: string): PbJsonValue {
  if (typeof v === "bigint") throw new JsonError("LOSSY_NUMBER", path, `${v} is not exact in a JSON field (a double)`);
  if (v === null || typeof v !== "object") return v;
  if (Array.isArray(v)) return v.map((x, i) => toPbJson(x, `${path}[${i}]`));
  const out = Object.create(null) as PbJsonObject;
  for (const key of Object.keys(v)) out[key] = toPbJson(v[key] as JsonValue, childPath(path, key));
  return out;
}

/**
 * A JSON object for a google.protobuf.Struct field (protobuf-es holds those
 * as plain JSON objects); integers must be exact in a double.
 */
export function toStruct(v: JsonValue, path: string): PbJsonObject {
  return toPbJson(object(v, path), path) as PbJsonObject;
}

/** google.protobuf.Value back to JSON; an unset kind reads as null. */
export function fromValue(v: Value): JsonValue {
  switch (v.kind.case) {
    case "numberValue":
    case "stringValue":
    case "boolValue":
      return v.kind.value;
    case "listValue":
      return v.kind.value.values.map(fromValue);
    case "structValue": {
      const out = newJsonObject();
      const fields = v.kind.value.fields;
      for (const key of Object.keys(fields).sort()) out[key] = fromValue(fields[key] as Value);
      return out;
    }
    default:
      return null;
  }
}

/** A Struct field's object back to JSON, keys sorted (serde_json's map order). */
export function fromStruct(s: PbJsonObject): JsonObject {
  return fromPbJson(s) as JsonObject;
}

function fromPbJson(v: PbJsonValue): JsonValue {
  if (v === null || typeof v !== "object") return v;
  if (Array.isArray(v)) return v.map(fromPbJson);
  const out = newJsonObject();
  for (const key of Object.keys(v).sort()) out[key] = fromPbJson(v[key] as PbJsonValue);
  return out;
}
