import { expect } from "chai";
import { create, createFileRegistry, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { DescMessage } from "@bufbuild/protobuf";
import { BytesValueSchema, FileDescriptorProtoSchema, FieldDescriptorProto_Label, FieldDescriptorProto_Type } from "@bufbuild/protobuf/wkt";
import { FilterUpdateSchema } from "../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { serializeChunked } from "../../src/wire/message-chunks.js";

const { BYTES: TYPE_BYTES, UINT64: TYPE_UINT64, STRING: TYPE_STRING } = FieldDescriptorProto_Type;
const OPTIONAL = FieldDescriptorProto_Label.OPTIONAL;

/** Frame { uint64 seq = 1; bytes payload = 2; string note = 3; optional bytes extra = 4; oneof body { bytes inline = 5; } } */
const file = create(FileDescriptorProtoSchema, {
  name: "mmgate/test/v1/chunks.proto",
  package: "mmgate.test.v1",
  syntax: "proto3",
  messageType: [
    {
      name: "Frame",
      field: [
        { name: "seq", number: 1, type: TYPE_UINT64, label: OPTIONAL, jsonName: "seq" },
        { name: "payload", number: 2, type: TYPE_BYTES, label: OPTIONAL, jsonName: "payload" },
        { name: "note", number: 3, type: TYPE_STRING, label: OPTIONAL, jsonName: "note" },
        { name: "extra", number: 4, type: TYPE_BYTES, label: OPTIONAL, jsonName: "extra", proto3Optional: true, oneofIndex: 0 },
        { name: "inline", number: 5, type: TYPE_BYTES, label: OPTIONAL, jsonName: "inline", oneofIndex: 1 },
      ],
      oneofDecl: [{ name: "_extra" }, { name: "body" }],
    },
  ],
});
const Frame = createFileRegistry(file, () => undefined).getMessage("mmgate.test.v1.Frame") as DescMessage;

const big = (n: number, seed = 7) => Uint8Array.from({ length: n }, (_, i) => (i * seed) & 0xff);
const MIN = 64 * 1024;

function joined(chunks: Uint8Array[]): Uint8Array {
  return Buffer.concat(chunks);
}

describe("serializeChunked: big top-level bytes fields sent from the caller's buffer", () => {
  const cases: { name: string; desc: DescMessage; init: Record<string, unknown>; chunked: boolean }[] = [
    { name: "BytesValue of 4 MiB", desc: BytesValueSchema, init: { value: big(4 << 20) }, chunked: true },
    { name: "BytesValue of exactly the threshold", desc: BytesValueSchema, init: { value: big(MIN) }, chunked: true },
    { name: "BytesValue one byte under the threshold", desc: BytesValueSchema, init: { value: big(MIN - 1) }, chunked: false },
    { name: "empty BytesValue", desc: BytesValueSchema, init: {}, chunked: false },
    { name: "payload with an earlier field set", desc: Frame, init: { seq: 2n ** 64n - 1n, payload: big(200_000) }, chunked: true },
    // A varint length of 3 bytes (2^14 ≤ n < 2^21) and of 4 bytes (≥ 2^21).
    { name: "payload of 2^21 bytes (4-byte length)", desc: Frame, init: { seq: 1n, payload: big(1 << 21) }, chunked: true },
    // Fields numbered after the big one go in a chunk of their own after it.
    { name: "payload with a later field set", desc: Frame, init: { seq: 9n, payload: big(200_000), note: "after" }, chunked: true },
    { name: "payload with a later explicit field set", desc: Frame, init: { payload: big(200_000), extra: new Uint8Array(0) }, chunked: true },
    { name: "payload with every later field set", desc: Frame, init: { payload: big(200_000), note: "n", extra: big(10) }, chunked: true },
    { name: "payload with a later oneof member set: written whole", desc: Frame, init: { payload: big(200_000), body: { case: "inline", value: big(3) } }, chunked: false },
    {
      name: "a relay FilterUpdate (payload 8, contract marker 127)",
      desc: FilterUpdateSchema,
      init: { protocolVersion: 1, baseSequence: 4n, sequence: 4n, kind: 1, payload: big(4 << 20), contractMarker: 0x4b565231 },
      chunked: true,
    },
    { name: "the explicit-presence field as the big one", desc: Frame, init: { seq: 3n, extra: big(100_000) }, chunked: true },
    { name: "a big oneof member: written whole", desc: Frame, init: { body: { case: "inline", value: big(100_000) } }, chunked: false },
  ];
  for (const c of cases) {
    it(`${c.name}: ${c.chunked ? "chunks" : "no chunks"}, bytes equal to toBinary`, () => {
      const message = create(c.desc, c.init as never);
      const expected = toBinary(c.desc, message);
      const chunks = serializeChunked(c.desc, message as unknown as Record<string, unknown>, MIN);
      if (!c.chunked) {
        expect(chunks).to.equal(undefined);
        return;
      }
      expect(chunks, "chunks").to.be.an("array");
      const value = (c.init["value"] ?? c.init["payload"] ?? c.init["extra"]) as Uint8Array;
      // The caller's buffer itself, not a copy.
      expect(chunks!.includes(value)).to.equal(true);
      expect(Buffer.compare(joined(chunks!), expected)).to.equal(0);
      // And what a parser reads back is the message.
      expect(toBinary(c.desc, fromBinary(c.desc, joined(chunks!)))).to.deep.equal(expected);
    });
  }

  it("leaves a message with unknown fields to toBinary (they are written last)", () => {
    const message = create(BytesValueSchema, { value: big(MIN) });
    message.$unknown = [{ no: 9, wireType: 0, data: new Uint8Array([1]) }];
    expect(serializeChunked(BytesValueSchema, message as unknown as Record<string, unknown>, MIN)).to.equal(undefined);
  });

  it("does not touch the caller's message", () => {
    const message = create(Frame, { seq: 5n, payload: big(MIN) } as never) as unknown as Record<string, unknown>;
    const before = message["payload"];
    serializeChunked(Frame, message, MIN);
    expect(message["payload"]).to.equal(before);
    expect(message["seq"]).to.equal(5n);
  });
});
