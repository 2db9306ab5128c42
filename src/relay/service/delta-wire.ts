/**
 * A delta's FilterUpdate as the bytes a subscriber receives (5-byte gRPC
 * length prefix included), written directly: the fields every delta of one
 * producer generation shares (protocol version, relay identity, producer)
 * serialized once by protobuf-es, then the delta's own fields appended in
 * field-number order, exactly as `toBinary` writes them (implicit presence:
 * a zero or empty field is left out). One delta is serialized once for every
 * subscriber; building the message and running `toBinary` for it cost more
 * than the rest of publishing a small delta. The test suite holds the bytes
 * to `toBinary`'s.
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { FilterUpdateKind, FilterUpdateSchema, type ProducerIdentity as WireProducer, type RelayIdentity } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { allocEnvelope, ENVELOPE_HEADER_BYTES } from "../../wire/index.js";
import type { PublicationFrame } from "../hub/index.js";
import { RELAY_CONTRACT_MARKER, RELAY_PROTOCOL_VERSION } from "../wire/index.js";

const VARINT = 0;
const LENGTH_DELIMITED = 2;
const FIXED32 = 5;
const tag = (field: number, wireType: number): number => field * 8 + wireType;
const MARKER_TAG = tag(127, FIXED32);
const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

export class DeltaWire {
  /** Fields 1-3 as protobuf-es writes them. */
  private readonly head: Uint8Array;

  constructor(relay: RelayIdentity, producer: WireProducer) {
    this.head = toBinary(FilterUpdateSchema, create(FilterUpdateSchema, { protocolVersion: RELAY_PROTOCOL_VERSION, relay, producer }));
  }

  /** The length-prefixed FilterUpdate of delta `frame`, sent at `sendTsUs`. */
  envelope(frame: PublicationFrame, sendTsUs: bigint): Buffer {
    const payload = frame.payload;
    const tail: number[] = [];
    u64Field(tail, 4, frame.baseSequence);
    u64Field(tail, 5, frame.sequence);
    u64Field(tail, 6, sendTsUs);
    varint(tail, tag(7, VARINT));
    varint(tail, FilterUpdateKind.DELTA);
    if (payload.byteLength > 0) {
      varint(tail, tag(8, LENGTH_DELIMITED));
      varint(tail, payload.byteLength);
    }
    const body = this.head.byteLength + tail.length + payload.byteLength + 6;
    const out = allocEnvelope(body);
    let at = ENVELOPE_HEADER_BYTES;
    out.set(this.head, at);
    at += this.head.byteLength;
    for (const byte of tail) out[at++] = byte;
    out.set(payload, at);
    at += payload.byteLength;
    // contract_marker: field 127, fixed32, a two-byte tag (0x3fd as a varint), then the value little-endian.
    out[at++] = (MARKER_TAG & 0x7f) | 0x80;
    out[at++] = MARKER_TAG >>> 7;
    out.writeUInt32LE(RELAY_CONTRACT_MARKER, at);
    return out;
  }
}

function varint(out: number[], value: number): void {
  while (value >= 0x80) {
    out.push((value % 0x80) | 0x80);
    value = Math.floor(value / 0x80);
  }
  out.push(value);
}

/** A uint64 field, left out when zero. */
function u64Field(out: number[], field: number, value: bigint): void {
  if (value === 0n) return;
  varint(out, tag(field, VARINT));
  if (value <= MAX_SAFE) {
    varint(out, Number(value));
    return;
  }
  let rest = value;
  while (rest >= 0x80n) {
    out.push(Number(rest & 0x7fn) | 0x80);
    rest >>= 7n;
  }
  out.push(Number(rest));
}

