import { create, toBinary } from "@bufbuild/protobuf";
import { expect } from "chai";
import { FilterUpdateKind, FilterUpdateSchema, RelayIdentitySchema } from "../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { publicationFrame } from "../../src/relay/hub/index.js";
import { DeltaWire } from "../../src/relay/service/delta-wire.js";
import { producerToWire, RELAY_CONTRACT_MARKER, RELAY_PROTOCOL_VERSION } from "../../src/relay/wire/index.js";
import { identity } from "./hub-helpers.js";

describe("relay: a delta's FilterUpdate written directly (DeltaWire)", () => {
  it("is byte for byte what toBinary writes for the same message, behind the gRPC prefix", () => {
    const U64_MAX = (1n << 64n) - 1n;
    for (const [id, relay] of [
      [identity(1, 11n), create(RelayIdentitySchema, { drtInstanceId: 7n, relayIncarnation: 9n })],
      [identity(3, U64_MAX), create(RelayIdentitySchema, { drtInstanceId: U64_MAX, relayIncarnation: 1n << 53n })],
    ] as const) {
      const producer = producerToWire(id);
      const wire = new DeltaWire(relay, producer);
      for (const base of [0n, 1n, 127n, 128n, 300n, (1n << 53n) - 1n, 1n << 53n, U64_MAX - 1n]) {
        for (const payload of [new Uint8Array(0), new Uint8Array([1, 2, 3]), new Uint8Array(200).fill(9), new Uint8Array(70_000).fill(4)]) {
          for (const sendTsUs of [0n, 1_764_633_600_123_456n, U64_MAX]) {
            const frame = publicationFrame({ identity: id, baseSequence: base, sequence: base + 1n, kind: "delta", payload });
            const message = create(FilterUpdateSchema, {
              protocolVersion: RELAY_PROTOCOL_VERSION,
              relay,
              producer,
              baseSequence: base,
              sequence: base + 1n,
              sendTsUs,
              kind: FilterUpdateKind.DELTA,
              payload,
              contractMarker: RELAY_CONTRACT_MARKER,
            });
            const body = Buffer.from(toBinary(FilterUpdateSchema, message));
            const envelope = wire.envelope(frame, sendTsUs);
            expect(envelope[0]).to.equal(0);
            expect(envelope.readUInt32BE(1)).to.equal(body.byteLength);
            expect(envelope.subarray(5).equals(body), `base ${base}, ${payload.byteLength} payload bytes, sent ${sendTsUs}`).to.equal(true);
          }
        }
      }
    }
  });
});
