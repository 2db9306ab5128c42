/**
 * CBI1 as protobuf: frames round-trip bytes -> Cbi1Frame -> bytes exactly,
 * Decode reports every codec error by its code, and a subscriber of the
 * decoded pool stream rebuilds the same lane as one of SubscribeKvPool.
 */
import { create, fromJson, toJson } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import fc from "fast-check";
import { FilterUpdateKind, KvEventRelay } from "../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { Cbi1ErrorDetailSchema, Cbi1FrameSchema, Cbi1Service, DecodedRelayService, type Cbi1Frame } from "../../gen/mmgate/kvrelay/v1/cbi1_pb.js";
import {
  Cbi1Error,
  encodeDelta,
  encodeSnapshotChunk,
  FilterFormat,
  frameFromProto,
  frameToProto,
  IMAGES_MAX_FRAME_BYTES,
  MAX_DELTA_IMAGES,
  producerToWire,
  RELAY_CONTRACT_MARKER,
  SNAPSHOT_CHUNK_BUCKETS,
} from "../../src/relay/index.js";
import { connectErrorOf, grpcServerStream, grpcUnary } from "../support/index.js";
import { build, chunkBody, deltaBody, recipe, SEED } from "./cbi1-helpers.js";
import { chain, grpcProducer, startRelay, TestMirror, type RelayServer } from "./service/support.js";

const FORMAT = new FilterFormat(SEED, 1024);

function roundTrip(bytes: Uint8Array, sparse = false): void {
  const message = frameToProto(bytes, { sparse });
  // And through protobuf's own JSON and binary forms, as a stranger would hold it.
  const viaJson = fromJson(Cbi1FrameSchema, toJson(Cbi1FrameSchema, message));
  expect(Buffer.from(frameFromProto(viaJson)).equals(Buffer.from(bytes))).to.equal(true);
}

describe("CBI1 frames as protobuf", () => {
  describe("frameToProto / frameFromProto", () => {
    it("the golden delta and snapshot chunk round-trip byte for byte, dense and sparse", () => {
      const delta = build(recipe({ dcId: 0x0102_0304_0506_0708n, epoch: 9n, body: deltaBody(8n, [[0, 0n], [5, 0x0001_abcd_0000_1234n], [1023, 0xffff_ffff_ffff_ffffn]]) }));
      roundTrip(delta);
      const message = frameToProto(delta);
      expect(message).to.deep.include({ wireVersion: 1, flags: 2, fingerprintBits: 16, slotsPerBucket: 4, formatVersion: 1, seed: SEED, bucketCount: 1024n, epoch: 9n });
      expect(message.body.case).to.equal("delta");
      const chunk = build(recipe({ flags: 1, seed: 0xdead_beef_0000_0001n, bucketCount: 4n, dcId: 3n, epoch: 77n, body: chunkBody(0, 1, 0n, [0x0001_abcd_0000_1234n, 0n, 1n, 0xffff_0000_ffff_0000n]) }));
      roundTrip(chunk);
      roundTrip(chunk, true);
      const sparse = frameToProto(chunk, { sparse: true });
      expect(sparse.body.case === "snapshotChunk" && sparse.body.value.nonzero.map((i) => i.bucket)).to.deep.equal([0, 2, 3]);
      expect(sparse.body.case === "snapshotChunk" && sparse.body.value.words).to.deep.equal([]);
    });

    it("fuzzed valid deltas and chunks round-trip byte for byte", () => {
      const u64 = fc.bigInt({ min: 0n, max: (1n << 64n) - 1n });
      fc.assert(
        fc.property(fc.integer({ min: 1, max: 12 }), u64, u64, u64, fc.array(fc.tuple(fc.nat(), u64), { maxLength: 40 }), (log2, seed, dcId, epoch, raw) => {
          const format = new FilterFormat(seed, 1 << log2);
          const images = raw.map(([b, value]) => ({ bucket: b % format.bucketCount, value }));
          roundTrip(encodeDelta(format, dcId, epoch, BigInt.asUintN(64, epoch + 1n), images));
        }),
        { numRuns: 300 },
      );
      fc.assert(
        fc.property(fc.integer({ min: 1, max: 10 }), u64, u64, fc.array(u64, { maxLength: 1024 }), fc.boolean(), (log2, seed, dcId, raw, sparse) => {
          const format = new FilterFormat(seed, 1 << log2);
          const words = BigUint64Array.from({ length: format.bucketCount }, (_, i) => (i < raw.length ? raw[i]! : 0n));
          roundTrip(encodeSnapshotChunk(format, dcId, 5n, 0, 1, words), sparse);
        }),
        { numRuns: 200 },
      );
    });

    it("a second chunk of a 2^20 lane keeps its offset", () => {
      const format = new FilterFormat(SEED, 1 << 20);
      const words = new BigUint64Array(SNAPSHOT_CHUNK_BUCKETS);
      words[7] = 0x1234n;
      const frame = encodeSnapshotChunk(format, 1n, 2n, 1, 2, words);
      const sparse = frameToProto(frame, { sparse: true });
      expect(sparse.body.case === "snapshotChunk" && sparse.body.value.nonzero.map((i) => i.bucket)).to.deep.equal([SNAPSHOT_CHUNK_BUCKETS + 7]);
      roundTrip(frame, true);
    });

    it("encode refuses what the codec would not write, by code", () => {
      const good = frameToProto(encodeDelta(FORMAT, 1n, 4n, 5n, [{ bucket: 1, value: 2n }]));
      const chunk = frameToProto(encodeSnapshotChunk(new FilterFormat(SEED, 4), 1n, 5n, 0, 1, new BigUint64Array(4)));
      const cases: [string, (m: Cbi1Frame) => void, string][] = [
        ["a wrong checksum", (m) => void (m.checksum ^= 1), "Checksum"],
        ["fingerprint bits 8", (m) => void (m.fingerprintBits = 8), "Format"],
        ["a bucket count that is not a power of two", (m) => void (m.bucketCount = 1000n), "Format"],
        ["a bucket past the lane", (m) => void (m.body.case === "delta" && (m.body.value.images[0]!.bucket = 1024)), "BucketIndex"],
        ["no body", (m) => void (m.body = { case: undefined }), "InvalidArgument"],
        ["delta flags on a chunk body", (m) => void (m.body = chunk.body), "Flags"],
      ];
      for (const [name, edit, code] of cases) {
        const copy = fromJson(Cbi1FrameSchema, toJson(Cbi1FrameSchema, good));
        edit(copy);
        let caught: unknown;
        try {
          frameFromProto(copy);
        } catch (error) {
          caught = error;
        }
        expect(caught, name).to.be.instanceOf(Cbi1Error);
        expect((caught as Cbi1Error).code, name).to.equal(code);
      }
    });
  });

  describe("Cbi1Service and DecodedRelayService over the network", function () {
    this.timeout(20_000);
    let server: RelayServer;
    before(async () => {
      server = await startRelay({ pools: [{ name: "default", expectedBlocks: 2_097_152 }], publicationThreshold: 1 });
    });
    after(() => server.close());

    it("Decode and Encode through connect and grpc-js; reflection lists both services", async () => {
      const frame = encodeDelta(FORMAT, 9n, 4n, 5n, [{ bucket: 3, value: 0xffff_ffff_ffff_ffffn }]);
      const client = createClient(Cbi1Service, server.transport);
      const decoded = await client.decode({ frame });
      expect(decoded.frame?.body.case).to.equal("delta");
      const encoded = await client.encode({ frame: decoded.frame });
      expect(Buffer.from(encoded.frame).equals(Buffer.from(frame))).to.equal(true);
      const grpcClient = server.grpcClient("mmgate/kvrelay/v1/cbi1.proto", "mmgate.kvrelay.v1.Cbi1Service");
      const viaGrpc = await grpcUnary<{ frame: { delta: { images: { bucket: number; value: string }[] }; seed: string } }>(grpcClient, "Decode", {
        frame: Buffer.from(frame),
        expectedFormat: { seed: SEED.toString(), bucketCount: "1024" },
      });
      expect(viaGrpc.frame.delta.images).to.deep.equal([{ bucket: 3, value: "18446744073709551615" }]);
      expect(server.host.serviceNames).to.include.members(["mmgate.kvrelay.v1.Cbi1Service", "mmgate.kvrelay.v1.DecodedRelayService"]);
    });

    it("Decode answers every codec error as INVALID_ARGUMENT with its code in a Cbi1ErrorDetail", async () => {
      const client = createClient(Cbi1Service, server.transport);
      const body = deltaBody(4n, [[1, 1n]]);
      const cases: [string, Uint8Array, string][] = [
        ["47 bytes", build(recipe({ body, truncateTo: 47 })), "Truncated"],
        ["one byte past the largest frame", build(recipe({ body, padTo: IMAGES_MAX_FRAME_BYTES + 1 })), "FrameTooLarge"],
        ["magic CBI2", build(recipe({ body, magic: [0x43, 0x42, 0x49, 0x32] })), "Magic"],
        ["wire version 2", build(recipe({ body, wireVersion: 2 })), "WireVersion"],
        ["a bad checksum", build(recipe({ body, badChecksum: true })), "Checksum"],
        ["fingerprint bits 8", build(recipe({ body, fingerprintBits: 8 })), "Format"],
        ["flags 3", build(recipe({ body, flags: 3 })), "Flags"],
        ["a delta body of 11 bytes", build(recipe({ body: new Uint8Array(11) })), "Malformed"],
        ["a delta count past the limit", build(recipe({ body: deltaBody(4n, [[1, 1n]], MAX_DELTA_IMAGES + 1) })), "DeltaImageCount"],
      ];
      for (const [name, frame, code] of cases) {
        const err = await connectErrorOf(client.decode({ frame, expectedFormat: { seed: SEED, bucketCount: 1024n } }));
        expect(err.code, name).to.equal(Code.InvalidArgument);
        const [detail] = err.findDetails(Cbi1ErrorDetailSchema);
        expect(detail?.code, name).to.equal(code);
      }
      // The expected format is checked too.
      const mismatch = await connectErrorOf(client.decode({ frame: encodeDelta(FORMAT, 1n, 1n, 2n, []), expectedFormat: { seed: SEED ^ 1n, bucketCount: 1024n } }));
      expect(mismatch.findDetails(Cbi1ErrorDetailSchema)[0]?.code).to.equal("Format");
    });

    it("a grpc-js subscriber of SubscribeKvPoolDecoded rebuilds exactly the lane SubscribeKvPool gives, sparse and dense", async () => {
      const pool = server.relay.pool("default")!;
      await publishEvents(server, 40);
      const request = { subscriberId: "decoded", expectedProducer: producerToWire(pool.producer), contractMarker: RELAY_CONTRACT_MARKER };
      // The bytes stream, through connect: the reference mirror.
      const raw = new TestMirror(pool.producer.format.seed, pool.producer.format.bucketCount);
      for await (const update of createClient(KvEventRelay, server.transport).subscribeKvPool(request)) {
        raw.apply({ kind: FilterUpdateKind[update.kind] as "DELTA", baseSequence: update.baseSequence, sequence: update.sequence, payload: update.payload });
        if (raw.words !== undefined) break;
      }
      for (const sparse of [true, false]) {
        const words = new BigUint64Array(pool.producer.format.bucketCount);
        let chunks = 0;
        const grpcClient = server.grpcClient("mmgate/kvrelay/v1/cbi1.proto", "mmgate.kvrelay.v1.DecodedRelayService", { "grpc.max_receive_message_length": 64 * 1024 * 1024 });
        const grpcRequest = { request: { subscriberId: "decoded-grpc", expectedProducer: grpcProducer(pool), contractMarker: RELAY_CONTRACT_MARKER }, sparse };
        await grpcServerStream<{ kind: string; frame: { snapshotChunk: { chunkCount: number; bucketOffset: string; words: string[]; nonzero: { bucket: number; value: string }[] } } }>(
          grpcClient,
          "SubscribeKvPoolDecoded",
          grpcRequest,
          {
            onMessage: (update, call) => {
              expect(update.kind).to.equal("FILTER_UPDATE_KIND_SNAPSHOT_CHUNK");
              const chunk = update.frame.snapshotChunk;
              const offset = Number(chunk.bucketOffset);
              if (sparse) for (const image of chunk.nonzero) words[image.bucket] = BigInt(image.value);
              else chunk.words.forEach((w, i) => (words[offset + i] = BigInt(w)));
              chunks += 1;
              if (chunks === chunk.chunkCount) call.cancel();
            },
          },
        ).catch((e: grpc.ServiceError) => {
          if (e.code !== grpc.status.CANCELLED) throw e;
        });
        expect(chunks).to.equal(2);
        expect(Buffer.from(words.buffer).equals(Buffer.from(raw.words!.buffer)), `sparse ${sparse}`).to.equal(true);
      }
    });

    it("the decoded stream refuses what SubscribeKvPool refuses, with the same trailer", async () => {
      const client = createClient(DecodedRelayService, server.transport);
      const err = await connectErrorOf(async () => {
        for await (const _ of client.subscribeKvPoolDecoded({ request: { subscriberId: "x", contractMarker: 1 } })) void _;
      });
      expect(err.code).to.equal(Code.FailedPrecondition);
      expect(err.metadata.get("kv-relay-error-reason")).to.equal("RELAY_ERROR_REASON_CONTRACT_MISMATCH");
    });
  });
});

async function publishEvents(server: RelayServer, n: number): Promise<void> {
  const { KvEventService, PublishRequestSchema } = await import("../../gen/mmgate/kvevents/v1/kvevents_pb.js");
  await createClient(KvEventService, server.connectTransport).publish(
    (async function* () {
      yield create(PublishRequestSchema, { pool: "default", events: Array.from({ length: n }, (_, i) => chain(BigInt(1 + (i % 4)), BigInt(i) * 100n, 8)) });
    })(),
  );
}

