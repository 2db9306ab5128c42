import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import { create, toBinary } from "@bufbuild/protobuf";
import type { WireType } from "@bufbuild/protobuf/wire";
import type { HandlerContext } from "@connectrpc/connect";
import { encodeEnvelope, ENVELOPE_HEADER_BYTES } from "../wire/index.js";

/**
 * Messages serialized once and written as they are to many calls: a relay
 * delta goes to every subscriber of its pool, and serializing it per
 * subscriber was most of what fanning it out cost.
 *
 * `preEncode` makes a stand-in for the message: a message of the same type
 * whose fields protobuf-es holds as unknown fields (the bytes after the
 * first tag, behind that tag), so that serializing it, as connect's
 * transport does, writes exactly the bytes of the original and encodes no
 * field; and which carries the whole gRPC length-prefixed message, which the
 * lean path (lean/grpc.ts) writes to the stream as it is, copying nothing.
 * A stand-in reads as an empty message: only a handler whose call writes
 * protobuf binary messages of that type may return it (`writesBinary`).
 */

const PRE_ENCODED = Symbol("mmgate.preEncoded");

interface PreEncoded {
  readonly typeName: string;
  /** The message behind the 5-byte gRPC prefix (flags 0, big-endian length). */
  readonly envelope: Buffer;
}

/** A stand-in for `message` that serializes to the same bytes without encoding a field (see above). */
export function preEncode<Desc extends DescMessage>(desc: Desc, message: MessageShape<Desc>): MessageShape<Desc> {
  const body = toBinary(desc, message);
  const envelope = encodeEnvelope(body);
  const carrier = create(desc) as MessageShape<Desc> & { $unknown?: { no: number; wireType: WireType; data: Uint8Array }[] };
  if (body.byteLength > 0) {
    // protobuf-es writes an unknown field as its tag, then its data as it is: the first tag, then everything after it.
    const { fieldNo, wireType, end } = firstTag(body);
    carrier.$unknown = [{ no: fieldNo, wireType, data: envelope.subarray(ENVELOPE_HEADER_BYTES + end) }];
  }
  const pre: PreEncoded = Object.freeze({ typeName: desc.typeName, envelope });
  Object.defineProperty(carrier, PRE_ENCODED, { value: pre });
  return carrier;
}

/** The gRPC length-prefixed bytes of a stand-in made by `preEncode` for a `desc` message; undefined for anything else. */
export function preEncodedEnvelope(message: unknown, desc: DescMessage): Buffer | undefined {
  if (typeof message !== "object" || message === null) return undefined;
  const pre = (message as { [PRE_ENCODED]?: PreEncoded })[PRE_ENCODED];
  return pre !== undefined && pre.typeName === desc.typeName ? pre.envelope : undefined;
}

/** Protobuf binary content types of the gRPC, gRPC-web and Connect streaming protocols. */
const BINARY_CONTENT_TYPE = /^application\/(?:grpc|grpc-web|connect)(?:\+proto)?\s*(?:;|$)/i;

/**
 * Whether the call of `ctx` answers with `desc` messages in the protobuf
 * binary format, so that a stand-in from `preEncode` may be returned in
 * place of one. Not for a handler called by another with its own context
 * (that call's messages are of another type), nor for JSON.
 */
export function writesBinary(ctx: HandlerContext, desc: DescMessage): boolean {
  if (ctx.method.output.typeName !== desc.typeName) return false;
  return BINARY_CONTENT_TYPE.test(ctx.requestHeader.get("content-type") ?? "");
}

/** The field number, wire type and length of the tag that starts `bytes` (a varint). */
function firstTag(bytes: Uint8Array): { fieldNo: number; wireType: WireType; end: number } {
  let tag = 0;
  let shift = 1;
  let at = 0;
  for (;;) {
    const byte = bytes[at++];
    if (byte === undefined || at > 5) throw new Error("preEncode: the message does not start with a field tag");
    tag += (byte & 0x7f) * shift;
    if ((byte & 0x80) === 0) break;
    shift *= 0x80;
  }
  return { fieldNo: Math.floor(tag / 8), wireType: (tag % 8) as WireType, end: at };
}
