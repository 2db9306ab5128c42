import type { DescField, DescMessage } from "@bufbuild/protobuf";
import { create, ScalarType, toBinary } from "@bufbuild/protobuf";
import { reflect } from "@bufbuild/protobuf/reflect";

/**
 * Serializes a message whose largest part is one top-level `bytes` field
 * (a relay frame, a tensor, a BytesValue) as chunks: the rest of the
 * message as `toBinary` writes it, then the field's tag and length, then
 * the caller's buffer itself. `toBinary` would allocate a buffer of the
 * whole size and copy the payload into it; for messages of megabytes that
 * copy (and the page faults of the fresh buffer) is most of the cost of
 * sending them.
 *
 * The chunks concatenate to exactly the bytes `toBinary` writes, which
 * writes fields in field-number order: fields numbered after the big one
 * (a relay frame's contract marker, field 127) go in a last chunk of their
 * own. The shortcut is not taken with unknown fields (written last) or a set
 * later field in a oneof; then, and for messages without such a field, it
 * returns undefined.
 */
export function serializeChunked(desc: DescMessage, message: Record<string, unknown>, minBytes: number): Uint8Array[] | undefined {
  const plan = planOf(desc);
  if (plan === undefined) return undefined;
  for (const { field, later } of plan) {
    const value = message[field.localName];
    if (!(value instanceof Uint8Array) || value.byteLength < minBytes) continue;
    if ((message["$unknown"] as unknown[] | undefined)?.length) return undefined;
    const setLater = later.length === 0 ? NO_FIELDS : laterSet(desc, message, later);
    if (setLater === undefined) return undefined;
    const blank = blankOf(desc);
    const rest: Record<string, unknown> = { ...message };
    // An implicit-presence field that is empty is not written; an explicit one that is absent is not either.
    if (field.presence === IMPLICIT) rest[field.localName] = EMPTY;
    else delete rest[field.localName];
    for (const f of setLater) rest[f.localName] = blank[f.localName];
    const head = toBinary(desc, rest as never);
    const prefix = fieldPrefix(field.number, value.byteLength);
    if (setLater.length === 0) return [head, prefix, value];
    const only: Record<string, unknown> = { ...blank };
    for (const f of setLater) only[f.localName] = message[f.localName];
    return [head, prefix, value, toBinary(desc, only as never)];
  }
  return undefined;
}

const IMPLICIT = 2;
const EMPTY = new Uint8Array(0);
const NO_FIELDS: readonly DescField[] = [];

/** The later fields that are set; undefined when one of them is in a oneof (its value is not a plain property). */
function laterSet(desc: DescMessage, message: Record<string, unknown>, later: readonly DescField[]): readonly DescField[] | undefined {
  const r = reflect(desc, message as never, false);
  const set = later.filter((f) => r.isSet(f));
  return set.some((f) => f.oneof !== undefined) ? undefined : set;
}

const blanks = new WeakMap<DescMessage, Record<string, unknown>>();

/** A message of `desc` with every field at its default, to clear fields from a copy (read only). */
function blankOf(desc: DescMessage): Record<string, unknown> {
  let blank = blanks.get(desc);
  if (blank === undefined) blanks.set(desc, (blank = create(desc) as unknown as Record<string, unknown>));
  return blank;
}
const WIRE_LENGTH_DELIMITED = 2;

interface BigField {
  readonly field: DescField;
  /** The fields written after it (higher numbers), outside the ones in oneofs too. */
  readonly later: readonly DescField[];
}

const plans = new WeakMap<DescMessage, readonly BigField[] | undefined>();

/** The top-level singular bytes fields of `desc`, outside oneofs; undefined when there are none. */
function planOf(desc: DescMessage): readonly BigField[] | undefined {
  if (plans.has(desc)) return plans.get(desc);
  const candidates = desc.fields.filter((f) => f.fieldKind === "scalar" && f.scalar === ScalarType.BYTES && f.oneof === undefined);
  const plan = candidates.length === 0 ? undefined : candidates.map((field) => ({ field, later: desc.fields.filter((f) => f.number > field.number) }));
  plans.set(desc, plan);
  return plan;
}

/** The tag (field number, length-delimited) and the length, as varints. */
function fieldPrefix(fieldNumber: number, length: number): Uint8Array {
  const out = new Uint8Array(10);
  let at = writeVarint(out, 0, fieldNumber * 8 + WIRE_LENGTH_DELIMITED);
  at = writeVarint(out, at, length);
  return out.subarray(0, at);
}

function writeVarint(target: Uint8Array, at: number, value: number): number {
  // Numbers, not bigint: field numbers are below 2^29 and lengths below 2^32.
  while (value >= 0x80) {
    target[at++] = (value % 0x80) | 0x80;
    value = Math.floor(value / 0x80);
  }
  target[at++] = value;
  return at;
}
