import { create } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import {
  FilterUpdateKind,
  KvEventRelay,
  type ProducerIdentity as WireProducer,
} from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { KvEventService, PublishRequestSchema, type RouterEvent as WireRouterEvent } from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { producerToWire, RELAY_CONTRACT_MARKER, relayReasonOf } from "../../../src/relay/index.js";
import { connectErrorOf, eventually, grpcServerStream, grpcUnary, type GrpcClient } from "../../support/index.js";
import { chain, grpcProducer, removed, startRelay, stored, TestMirror, type RelayServer, type UpdateView } from "./support.js";

const MARKER = RELAY_CONTRACT_MARKER;
const EIGHT_MIB = 8 * 1024 * 1024;


interface GrpcUpdate {
  kind: string;
  baseSequence: string;
  sequence: string;
  sendTsUs: string;
  payload: Buffer;
  contractMarker: number;
  protocolVersion: number;
}

function grpcView(update: GrpcUpdate): UpdateView {
  const kind = update.kind.replace("FILTER_UPDATE_KIND_", "") as UpdateView["kind"];
  return { kind, baseSequence: BigInt(update.baseSequence), sequence: BigInt(update.sequence), payload: update.payload };
}

async function publish(server: RelayServer, pool: string, events: WireRouterEvent[]) {
  const client = createClient(KvEventService, server.connectTransport);
  async function* requests() {
    yield create(PublishRequestSchema, { pool, events });
  }
  return client.publish(requests());
}

function trailerReason(err: grpc.ServiceError): string | undefined {
  const value = err.metadata?.get("kv-relay-error-reason")[0];
  return typeof value === "string" ? value : undefined;
}

describe("relay service (KvEventRelay over the network)", function () {
  this.timeout(20_000);

  describe("envelope and validation", () => {
    let server: RelayServer;
    let grpcClient: GrpcClient;
    before(async () => {
      server = await startRelay({ pools: [{ name: "default", expectedBlocks: 64 }] });
      grpcClient = server.grpcClient("dynamo/kvrelay/v1/relay.proto", "dynamo.kvrelay.v1.KvEventRelay");
    });
    after(() => server.close());

    it("GetRelayInfo answers version 1, the relay identity and the marker, to grpc-js and connect", async () => {
      const info = await grpcUnary<{ protocolVersion: number; contractMarker: number; relay: { drtInstanceId: string; relayIncarnation: string } }>(grpcClient, "GetRelayInfo", {
        contractMarker: MARKER,
      });
      expect(info.protocolVersion).to.equal(1);
      expect(info.contractMarker).to.equal(MARKER);
      expect(BigInt(info.relay.drtInstanceId)).to.equal(server.relay.identity.drtInstanceId);
      const viaConnect = await createClient(KvEventRelay, server.transport).getRelayInfo({ contractMarker: MARKER });
      expect(viaConnect.relay?.relayIncarnation).to.equal(server.relay.identity.relayIncarnation);
    });

    it("a wrong or missing marker is FAILED_PRECONDITION with RELAY_ERROR_REASON_CONTRACT_MISMATCH on every RPC", async () => {
      const cases: [string, unknown, boolean][] = [
        ["GetRelayInfo", { contractMarker: 0 }, false],
        ["WatchKvPoolCatalog", { subscriberId: "a", contractMarker: 1 }, true],
        ["SubscribeKvPool", { subscriberId: "a", contractMarker: 0x4b565232 }, true],
        ["SubscribeServingReadiness", { subscriberId: "a" }, true],
        ["SubscribeKvPoolLoad", { subscriberId: "a", contractMarker: 7 }, true],
      ];
      for (const [method, request, streaming] of cases) {
        const failure = streaming ? grpcServerStream(grpcClient, method, request) : grpcUnary(grpcClient, method, request);
        const err = (await failure.then(
          () => undefined,
          (e: unknown) => e,
        )) as grpc.ServiceError;
        expect(err, method).to.be.instanceOf(Error);
        expect(err.code, method).to.equal(grpc.status.FAILED_PRECONDITION);
        expect(trailerReason(err), method).to.equal("RELAY_ERROR_REASON_CONTRACT_MISMATCH");
      }
    });

    it("subscriber ids: empty, over 128 bytes or with control characters are INVALID_ARGUMENT / INVALID_REQUEST; 128 bytes is fine", async () => {
      const client = createClient(KvEventRelay, server.transport);
      for (const id of ["", "x".repeat(129), "é".repeat(65), "a\nb", "a\u0085b"]) {
        const err = await connectErrorOf(async () => {
          for await (const _ of client.watchKvPoolCatalog({ subscriberId: id, contractMarker: MARKER })) break;
        });
        expect(err.code, JSON.stringify(id)).to.equal(Code.InvalidArgument);
        expect(relayReasonOf(err)).to.equal("INVALID_REQUEST");
      }
      for await (const update of client.watchKvPoolCatalog({ subscriberId: "é".repeat(64), contractMarker: MARKER })) {
        expect(update.snapshot?.pools).to.have.length(1);
        break;
      }
    });

    it("an unknown pool is NOT_FOUND; another generation of a known pool is PRODUCER_CHANGED; an unsupported format is UNSUPPORTED_FEATURE", async () => {
      const client = createClient(KvEventRelay, server.transport);
      const producer = server.relay.pool("default")!.producer;
      const subscribe = async (expected: WireProducer) => {
        const err = await connectErrorOf(async () => {
          for await (const _ of client.subscribeKvPool({ subscriberId: "t", expectedProducer: expected, contractMarker: MARKER })) void _;
        });
        return [err.code, relayReasonOf(err)];
      };
      const unknownPool = producerToWire({ ...producer, poolId: { ...producer.poolId, dcId: producer.poolId.dcId + 1n } });
      expect(await subscribe(unknownPool)).to.deep.equal([Code.NotFound, "POOL_NOT_FOUND"]);
      const nextIncarnation = producerToWire({ ...producer, producerIncarnation: BigInt.asUintN(64, producer.producerIncarnation + 1n) });
      expect(await subscribe(nextIncarnation)).to.deep.equal([Code.FailedPrecondition, "PRODUCER_CHANGED"]);
      const wide = producerToWire(producer);
      wide.ckfFormat!.fingerprintBits = 32;
      expect(await subscribe(wide)).to.deep.equal([Code.FailedPrecondition, "UNSUPPORTED_FEATURE"]);
      const zeroLayout = producerToWire(producer);
      zeroLayout.layoutGeneration = 0n;
      expect(await subscribe(zeroLayout)).to.deep.equal([Code.InvalidArgument, "INVALID_REQUEST"]);
      // None of the refusals started a hub.
      expect(server.relay.pool("default")!.hub).to.equal(undefined);
    });
  });

  describe("pool streams", () => {
    let server: RelayServer;
    beforeEach(async () => {
      // 2^20 buckets: a two-chunk snapshot.
      server = await startRelay({ pools: [{ name: "default", expectedBlocks: 2_097_152 }], poolHeartbeatIntervalMs: 100, publicationThreshold: 4 });
    });
    afterEach(() => server.close());

    it("a grpc-js subscriber with an 8 MiB limit gets every snapshot chunk, then deltas that reproduce the producer's filter exactly, heartbeats only after the snapshot", async () => {
      const pool = server.relay.pool("default")!;
      await publish(server, "default", [chain(1n, 1000n, 40), chain(2n, 5000n, 25)]);
      const client = server.grpcClient("dynamo/kvrelay/v1/relay.proto", "dynamo.kvrelay.v1.KvEventRelay", { "grpc.max_receive_message_length": EIGHT_MIB });
      const catalog = await new Promise<{ snapshot: { pools: { producer: unknown }[] } }>((resolve, reject) => {
        const call = (client["WatchKvPoolCatalog"] as (r: unknown) => grpc.ClientReadableStream<never>)({ subscriberId: "grpc-js", contractMarker: MARKER });
        call.on("data", (update) => {
          resolve(update);
          call.cancel();
        });
        call.on("error", (e) => (e as grpc.ServiceError).code === grpc.status.CANCELLED || reject(e));
      });
      const mirror = new TestMirror(pool.producer.format.seed, pool.producer.format.bucketCount);
      const updates: GrpcUpdate[] = [];
      let published = false;
      // Applied, not only sent: ingest applies in later turns, and the pool's sequence moves only then.
      let applied = false;
      const done = grpcServerStream<GrpcUpdate>(
        client,
        "SubscribeKvPool",
        { subscriberId: "grpc-js", expectedProducer: catalog.snapshot.pools[0]!.producer, contractMarker: MARKER },
        {
          onMessage: (update, call) => {
            updates.push(update);
            mirror.apply(grpcView(update));
            if (mirror.words !== undefined && !published) {
              published = true;
              void publish(server, "default", [chain(3n, 9000n, 30), removed(1n, [1030n, 1031n, 1032n]), chain(1n, 20000n, 3)]).then(() => (applied = true));
            }
            if (mirror.heartbeats >= 2 && mirror.sequence === pool.sequence && applied) call.cancel();
          },
        },
      ).catch((e: grpc.ServiceError) => {
        if (e.code !== grpc.status.CANCELLED) throw e;
      });
      await done;
      expect(mirror.chunks).to.equal(2);
      expect(updates.slice(0, 2).map((u) => u.kind)).to.deep.equal(["FILTER_UPDATE_KIND_SNAPSHOT_CHUNK", "FILTER_UPDATE_KIND_SNAPSHOT_CHUNK"]);
      expect(mirror.deltas).to.be.greaterThan(0);
      expect(mirror.firstHeartbeatAfterChunks).to.equal(2);
      expect(Buffer.from(mirror.words!.buffer).equals(Buffer.from(pool.words().buffer))).to.equal(true);
      for (const update of updates) {
        expect(update.contractMarker).to.equal(MARKER);
        expect(update.protocolVersion).to.equal(1);
        expect(Number(BigInt(update.sendTsUs) / 1000n)).to.be.closeTo(Date.now(), 60_000);
      }
    });

    it("a producer change mid-stream ends the stream with PRODUCER_CHANGED, and the catalog lists the new generation", async () => {
      const client = createClient(KvEventRelay, server.transport);
      const pool = server.relay.pool("default")!;
      const expected = producerToWire(pool.producer);
      const err = await connectErrorOf(async () => {
        for await (const update of client.subscribeKvPool({ subscriberId: "c", expectedProducer: expected, contractMarker: MARKER })) {
          if (update.kind === FilterUpdateKind.HEARTBEAT) pool.rotateGeneration();
        }
      });
      expect([err.code, relayReasonOf(err)]).to.deep.equal([Code.FailedPrecondition, "PRODUCER_CHANGED"]);
      for await (const update of client.watchKvPoolCatalog({ subscriberId: "c", contractMarker: MARKER })) {
        expect(update.snapshot!.pools[0]!.producer!.layoutGeneration).to.equal(2n);
        break;
      }
    });

    it("the total pool stream limit refuses with RESOURCE_EXHAUSTED / RESOURCE_LIMIT and the reference's message", async () => {
      await server.close();
      server = await startRelay({ pools: [{ name: "default", expectedBlocks: 64 }], maxPoolStreamsTotal: 1 });
      const client = createClient(KvEventRelay, server.transport);
      const expected = producerToWire(server.relay.pool("default")!.producer);
      const first = client.subscribeKvPool({ subscriberId: "a", expectedProducer: expected, contractMarker: MARKER })[Symbol.asyncIterator]();
      await first.next();
      const err = await connectErrorOf(async () => {
        for await (const _ of client.subscribeKvPool({ subscriberId: "b", expectedProducer: expected, contractMarker: MARKER })) void _;
      });
      expect([err.code, relayReasonOf(err)]).to.deep.equal([Code.ResourceExhausted, "RESOURCE_LIMIT"]);
      expect(err.rawMessage).to.equal("Relay total pool stream limit 1 reached");
      await first.return?.();
    });

    it("a subscriber that stops reading is ended as SUBSCRIBER_LAGGED", async () => {
      await server.close();
      server = await startRelay({ pools: [{ name: "default", expectedBlocks: 4096 }], publicationQueueCapacity: 2, publicationThreshold: 1 });
      const pool = server.relay.pool("default")!;
      const client = server.grpcClient("dynamo/kvrelay/v1/relay.proto", "dynamo.kvrelay.v1.KvEventRelay", { "grpc.max_receive_message_length": EIGHT_MIB });
      const expected = grpcProducer(pool);
      const call = (client["SubscribeKvPool"] as (r: unknown) => grpc.ClientReadableStream<GrpcUpdate>)({ subscriberId: "slow", expectedProducer: expected, contractMarker: MARKER });
      const got: GrpcUpdate[] = [];
      const ended = new Promise<grpc.ServiceError>((resolve) => call.on("error", resolve));
      call.on("data", (u: GrpcUpdate) => {
        got.push(u);
        if (got.length === 1) call.pause();
      });
      await eventually(() => expect(got).to.have.length(1));
      // Each event is its own delta; the paused stream stops taking frames once HTTP/2's windows fill.
      for (let i = 0; i < 400 && (pool.hub?.stats().ended.lagged ?? 0) === 0; i++) await publish(server, "default", [chain(BigInt(i + 1), BigInt(i) * 1000n, 64)]);
      await eventually(() => expect(pool.hub?.stats().ended.lagged).to.equal(1));
      call.resume();
      const err = await ended;
      expect(err.code).to.equal(grpc.status.RESOURCE_EXHAUSTED);
      expect(trailerReason(err)).to.equal("RELAY_ERROR_REASON_SUBSCRIBER_LAGGED");
    });
  });

  describe("ingest", () => {
    let server: RelayServer;
    before(async () => {
      server = await startRelay({ pools: [{ name: "default", expectedBlocks: 1024 }, { name: "other", expectedBlocks: 64, endpoint: { component: "other" } }] });
    });
    after(() => server.close());

    it("Publish applies events in order and reports rejections with their positions and codes", async () => {
      const summary = await publish(server, "other", [
        stored(7n, [[1n, 11n], [2n, 12n]]),
        stored(7n, [[3n, 13n]], 99n),
        removed(7n, [1n]),
        create((await import("../../../gen/mmgate/kvevents/v1/kvevents_pb.js")).RouterEventSchema, { workerId: 7n }),
      ]);
      expect(summary.applied).to.equal(2n);
      expect(summary.rejected).to.equal(2n);
      expect(summary.rejections.map((r) => [r.index, r.code])).to.deep.equal([
        [1n, "ParentBlockNotFound"],
        [3n, "InvalidEvent"],
      ]);
      expect(server.relay.pool("other")!.occupancy()).to.deep.equal({ uniqueBlocks: 1, ranks: 1 });
    });

    it("events that arrive together are one delta; later ones below the threshold go out after the delay", async () => {
      const pool = server.relay.pool("default")!;
      pool.openHub();
      const before = pool.sequence;
      // 100 events, over six thresholds of 16: applied in one turn, published as one delta.
      const burst = await publish(server, "default", Array.from({ length: 100 }, (_, i) => chain(BigInt(i % 5), 50_000n + BigInt(i) * 10n, 3)));
      expect(burst.deltasPublished).to.equal(1n);
      expect(pool.sequence).to.equal(before + 1n);
      // Three events: below the threshold; the stream's end publishes them.
      const tail = await publish(server, "default", [chain(9n, 90_000n, 2), chain(9n, 90_100n, 2), chain(9n, 90_200n, 2)]);
      expect(tail.deltasPublished).to.equal(1n);
      expect(pool.sequence).to.equal(before + 2n);
    });

    it("an unknown pool is NOT_FOUND and a stream that changes pool is INVALID_ARGUMENT", async () => {
      const client = createClient(KvEventService, server.connectTransport);
      const nope = await connectErrorOf(publish(server, "nope", []));
      expect(nope.code).to.equal(Code.NotFound);
      const switching = await connectErrorOf(
        client.publish(
          (async function* () {
            yield create(PublishRequestSchema, { pool: "default" });
            yield create(PublishRequestSchema, { pool: "other" });
          })(),
        ),
      );
      expect(switching.code).to.equal(Code.InvalidArgument);
    });
  });
});

