import { create, toBinary, toJson } from "@bufbuild/protobuf";
import { expect } from "chai";
import { FilterUpdateKind, FilterUpdateSchema, RelayInfoSchema } from "../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { preEncode, preEncodedEnvelope, writesBinary } from "../../src/server/index.js";

const update = create(FilterUpdateSchema, {
  protocolVersion: 1,
  relay: { drtInstanceId: 7n, relayIncarnation: 9n },
  baseSequence: 41n,
  sequence: 42n,
  sendTsUs: 1_700_000_000_123_456n,
  kind: FilterUpdateKind.DELTA,
  payload: new Uint8Array([1, 2, 3, 250]),
  contractMarker: 0x4b565231,
});

describe("server: pre-encoded messages", () => {
  it("a stand-in serializes to exactly the original's bytes, and carries them behind the gRPC prefix", () => {
    const body = toBinary(FilterUpdateSchema, update);
    const stand = preEncode(FilterUpdateSchema, update);
    expect(Buffer.from(toBinary(FilterUpdateSchema, stand)).equals(Buffer.from(body))).to.equal(true);
    const envelope = preEncodedEnvelope(stand, FilterUpdateSchema)!;
    expect(envelope[0]).to.equal(0);
    expect(envelope.readUInt32BE(1)).to.equal(body.byteLength);
    expect(envelope.subarray(5).equals(Buffer.from(body))).to.equal(true);
  });

  it("an empty message's stand-in is empty; a field number past one tag byte works too", () => {
    const empty = preEncode(FilterUpdateSchema, create(FilterUpdateSchema));
    expect(toBinary(FilterUpdateSchema, empty).byteLength).to.equal(0);
    expect(preEncodedEnvelope(empty, FilterUpdateSchema)!.byteLength).to.equal(5);
    // contract_marker alone: field 127, a two-byte tag.
    const marker = create(FilterUpdateSchema, { contractMarker: 0x4b565231 });
    expect(Buffer.from(toBinary(FilterUpdateSchema, preEncode(FilterUpdateSchema, marker))).equals(Buffer.from(toBinary(FilterUpdateSchema, marker)))).to.equal(true);
  });

  it("only a stand-in of the call's own type has bytes; anything else has none", () => {
    const stand = preEncode(FilterUpdateSchema, update);
    expect(preEncodedEnvelope(stand, RelayInfoSchema)).to.equal(undefined);
    expect(preEncodedEnvelope(update, FilterUpdateSchema)).to.equal(undefined);
    expect(preEncodedEnvelope(undefined, FilterUpdateSchema)).to.equal(undefined);
    // Copied (an interceptor spreading it), it is a plain message again, without the bytes.
    expect(preEncodedEnvelope({ ...stand }, FilterUpdateSchema)).to.equal(undefined);
    // It reads as an empty message: only writers of binary take it.
    expect(toJson(FilterUpdateSchema, stand)).to.deep.equal({});
  });

  it("writesBinary: the call answers with messages of that type, in protobuf binary", () => {
    const ctx = (type: string, output = FilterUpdateSchema) =>
      ({ method: { output }, requestHeader: new Headers({ "content-type": type }) }) as unknown as Parameters<typeof writesBinary>[0];
    for (const type of ["application/grpc", "application/grpc+proto", "application/grpc-web+proto", "application/connect+proto", "application/grpc; charset=utf-8"]) {
      expect(writesBinary(ctx(type), FilterUpdateSchema), type).to.equal(true);
    }
    for (const type of ["application/grpc+json", "application/connect+json", "application/json", "application/grpc-web-text"]) {
      expect(writesBinary(ctx(type), FilterUpdateSchema), type).to.equal(false);
    }
    expect(writesBinary(ctx("application/grpc", RelayInfoSchema as never), FilterUpdateSchema)).to.equal(false);
  });
});
