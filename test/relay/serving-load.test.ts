/**
 * SubscribeServingLoad (C.1, the newest lineage's additive RPC) and the load
 * semantics both load streams share (C.4): served over the network to a
 * connect client and a grpc-js client, on the request path the run selects
 * (lean by default, connect with MMGATE_TEST_RPC_PATH=connect). The load
 * timer is set to an hour: the tests make every window themselves, so what a
 * stream receives never depends on timing.
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, createClient, type Client } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import {
  DataStatus,
  KvEventRelay,
  LoadViewSchema,
  RequestLifecycleStatsSchema,
  TokenLoadStatsSchema,
  type ServingLoadUpdate,
} from "../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { KvEventService, PublishRequestSchema, type RouterEvent as WireRouterEvent } from "../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { producerToWire, RELAY_CONTRACT_MARKER, relayReasonOf } from "../../src/relay/index.js";
import { connectErrorOf, connectPathOnly, grpcServerStream, metricValue, type GrpcClient } from "../support/index.js";
import { chain, startRelay, type RelayServer } from "./service/support.js";

const MARKER = RELAY_CONTRACT_MARKER;
const HOUR_MS = 3_600_000;
const REASON = "kv-relay-error-reason";

async function publish(server: RelayServer, pool: string, events: WireRouterEvent[]): Promise<void> {
  await createClient(KvEventService, server.connectTransport).publish(
    (async function* () {
      yield create(PublishRequestSchema, { pool, events });
    })(),
  );
}

function trailerReason(err: grpc.ServiceError): string | undefined {
  const value = err.metadata?.get(REASON)[0];
  return typeof value === "string" ? value : undefined;
}

/** The error a grpc-js stream ends with; its messages are in `received`. */
async function grpcFailure<T>(call: Promise<T[]>): Promise<grpc.ServiceError & { received: T[] }> {
  return call.then(
    () => expect.fail("the stream ended cleanly"),
    (e: unknown) => e as grpc.ServiceError & { received: T[] },
  );
}

/** A grpc-js stream, the first message awaited separately from its end. */
function grpcStream<T>(client: GrpcClient, method: string, request: unknown): { first: Promise<T>; end: Promise<grpc.ServiceError & { received: T[] }> } {
  let resolveFirst!: (msg: T) => void;
  const first = new Promise<T>((resolve) => (resolveFirst = resolve));
  const end = grpcFailure(grpcServerStream<T>(client, method, request, { onMessage: (msg) => resolveFirst(msg) }));
  return { first, end };
}

function relayClient(server: RelayServer): Client<typeof KvEventRelay> {
  return createClient(KvEventRelay, server.transport);
}

const emptyUnavailable = toBinary(LoadViewSchema, create(LoadViewSchema, { requests: {}, tokens: {}, status: DataStatus.UNAVAILABLE }));

function expectUnavailableView(view: ServingLoadUpdate["pools"][number]["load"], what: string): void {
  expect(view, what).to.not.equal(undefined);
  expect(view!.status, what).to.equal(DataStatus.UNAVAILABLE);
  expect(view!.sourceObservedMs, what).to.equal(0n);
  expect(toBinary(RequestLifecycleStatsSchema, view!.requests!), what).to.have.length(0);
  expect(toBinary(TokenLoadStatsSchema, view!.tokens!), what).to.have.length(0);
  expect(toBinary(LoadViewSchema, view!), what).to.deep.equal(emptyUnavailable);
}

interface GrpcView {
  requests: Record<string, never> | null;
  tokens: Record<string, never> | null;
  status: string;
  sourceObservedMs: string;
}

interface GrpcServingLoad {
  protocolVersion: number;
  relay: { drtInstanceId: string; relayIncarnation: string };
  windowSequence: string;
  windowMs: string;
  pools: { producer: { layoutGeneration: string }; load: GrpcView; deployment: { liveWorkers?: number; maxConcurrency?: number } }[];
  models: { namespace: string; canonicalModelId: string; load: GrpcView; deployment: { expectedFrontends: number; observedFrontends: number; readyFrontends: number; servingPools: number } }[];
  contractMarker: number;
}

describe(`SubscribeServingLoad and load semantics on the ${connectPathOnly ? "connect" : "lean"} request path`, function () {
  this.timeout(20_000);

  describe("the serving-load stream", () => {
    let server: RelayServer;
    beforeEach(async () => {
      server = await startRelay({
        pools: [
          { name: "a", expectedBlocks: 64, models: [{ model: "m1" }, { model: "m2" }], endpoint: { component: "a" } },
          { name: "b", expectedBlocks: 64, models: [{ model: "m1", aliases: ["one"] }], endpoint: { component: "b" } },
          { name: "c", expectedBlocks: 64, models: [{ model: "m1" }], endpoint: { namespace: "other" } },
        ],
        loadWindowMs: HOUR_MS,
      });
    });
    afterEach(() => server.close());

    it("connect: the first window has the envelope and UNAVAILABLE views; live workers once a pool heard from its workers; the load stream's windows", async () => {
      const client = relayClient(server);
      const serving = client.subscribeServingLoad({ subscriberId: "serving", contractMarker: MARKER })[Symbol.asyncIterator]();
      const pool = client.subscribeKvPoolLoad({ subscriberId: "pool", contractMarker: MARKER })[Symbol.asyncIterator]();
      try {
        const first = (await serving.next()).value as ServingLoadUpdate;
        expect(first.protocolVersion).to.equal(1);
        expect(first.contractMarker).to.equal(MARKER);
        expect(first.relay?.drtInstanceId).to.equal(server.relay.identity.drtInstanceId);
        expect(first.relay?.relayIncarnation).to.equal(server.relay.identity.relayIncarnation);
        expect(first.windowMs).to.equal(BigInt(HOUR_MS));
        expect(first.pools.map((p) => p.producer)).to.deep.equal(["a", "b", "c"].map((name) => producerToWire(server.relay.pool(name)!.producer)));
        for (const [i, entry] of first.pools.entries()) {
          expectUnavailableView(entry.load, `pool ${i}`);
          // Nothing reached any pool yet: live workers unknown, and concurrency is never known here.
          expect(entry.deployment?.liveWorkers, `pool ${i}`).to.equal(undefined);
          expect(entry.deployment?.maxConcurrency, `pool ${i}`).to.equal(undefined);
        }
        expect(first.models.map((m) => [m.namespace, m.canonicalModelId, m.deployment?.servingPools])).to.deep.equal([
          ["mmgate", "m1", 2],
          ["mmgate", "m2", 1],
          ["other", "m1", 1],
        ]);
        for (const model of first.models) {
          expectUnavailableView(model.load, model.canonicalModelId);
          expect([model.deployment?.expectedFrontends, model.deployment?.observedFrontends, model.deployment?.readyFrontends]).to.deep.equal([0, 0, 0]);
        }
        // The same window as the pool load stream's.
        expect((await pool.next()).value?.windowSequence).to.equal(first.windowSequence);

        await publish(server, "a", [chain(1n, 10n, 3), chain(2n, 100n, 2)]);
        server.relay.nextLoadWindow();
        const second = (await serving.next()).value as ServingLoadUpdate;
        expect(second.windowSequence).to.equal(first.windowSequence + 1n);
        expect((await pool.next()).value?.windowSequence).to.equal(second.windowSequence);
        expect(second.pools.map((p) => p.deployment?.liveWorkers)).to.deep.equal([2, undefined, undefined]);
        for (const entry of second.pools) expectUnavailableView(entry.load, "after events");
      } finally {
        await serving.return?.();
        await pool.return?.();
      }
    });

    it("grpc-js: the RPC is served, with the marker, the version, UNAVAILABLE views and live workers set only where known", async () => {
      await publish(server, "b", [chain(7n, 10n, 2)]);
      server.relay.nextLoadWindow();
      const grpcClient = server.grpcClient("dynamo/kvrelay/v1/relay.proto", "dynamo.kvrelay.v1.KvEventRelay");
      const err = await grpcFailure(
        grpcServerStream<GrpcServingLoad>(grpcClient, "SubscribeServingLoad", { subscriberId: "grpc", contractMarker: MARKER }, { onMessage: (_msg, call) => call.cancel() }),
      );
      expect(err.code).to.equal(grpc.status.CANCELLED);
      const update = err.received[0]!;
      expect(update.protocolVersion).to.equal(1);
      expect(update.contractMarker).to.equal(MARKER);
      expect(BigInt(update.relay.drtInstanceId)).to.equal(server.relay.identity.drtInstanceId);
      expect(update.windowMs).to.equal(String(HOUR_MS));
      expect(update.pools).to.have.length(3);
      for (const view of [...update.pools.map((p) => p.load), ...update.models.map((m) => m.load)]) {
        expect(view.status).to.equal("DATA_STATUS_UNAVAILABLE");
        expect(view.sourceObservedMs).to.equal("0");
      }
      expect(update.pools.map((p) => p.producer.layoutGeneration)).to.deep.equal(["1", "1", "1"]);
      expect(update.pools.map((p) => [p.deployment.liveWorkers, p.deployment.maxConcurrency])).to.deep.equal([
        [undefined, undefined],
        [1, undefined],
        [undefined, undefined],
      ]);
      expect(update.models.map((m) => [m.namespace, m.canonicalModelId, m.deployment.servingPools])).to.deep.equal([
        ["mmgate", "m1", 2],
        ["mmgate", "m2", 1],
        ["other", "m1", 1],
      ]);
    });

    it("refuses a bad subscriber id (INVALID_ARGUMENT, INVALID_REQUEST) and a bad marker (FAILED_PRECONDITION, CONTRACT_MISMATCH), to both clients", async () => {
      const client = relayClient(server);
      const grpcClient = server.grpcClient("dynamo/kvrelay/v1/relay.proto", "dynamo.kvrelay.v1.KvEventRelay");
      const cases: [Record<string, unknown>, Code, number, string][] = [
        [{ subscriberId: "", contractMarker: MARKER }, Code.InvalidArgument, grpc.status.INVALID_ARGUMENT, "INVALID_REQUEST"],
        [{ subscriberId: "x".repeat(129), contractMarker: MARKER }, Code.InvalidArgument, grpc.status.INVALID_ARGUMENT, "INVALID_REQUEST"],
        [{ subscriberId: "a\u0007b", contractMarker: MARKER }, Code.InvalidArgument, grpc.status.INVALID_ARGUMENT, "INVALID_REQUEST"],
        [{ subscriberId: "s", contractMarker: 0 }, Code.FailedPrecondition, grpc.status.FAILED_PRECONDITION, "CONTRACT_MISMATCH"],
        [{ subscriberId: "s", contractMarker: MARKER + 1 }, Code.FailedPrecondition, grpc.status.FAILED_PRECONDITION, "CONTRACT_MISMATCH"],
      ];
      for (const [request, code, grpcCode, reason] of cases) {
        const what = JSON.stringify(request).slice(0, 60);
        const err = await connectErrorOf(async () => {
          for await (const _ of client.subscribeServingLoad(request)) void _;
        });
        expect([err.code, relayReasonOf(err)], what).to.deep.equal([code, reason]);
        const grpcErr = await grpcFailure(grpcServerStream(grpcClient, "SubscribeServingLoad", request));
        expect([grpcErr.code, trailerReason(grpcErr)], what).to.deep.equal([grpcCode, `RELAY_ERROR_REASON_${reason}`]);
        expect(grpcErr.received, what).to.have.length(0);
      }
    });
  });

  describe("load semantics shared by both load streams", () => {
    it("kv_expected_ranks is 0 (unknown) unless configured; a configured count above what reports is degraded coverage", async () => {
      const server = await startRelay({
        pools: [
          { name: "unknown", expectedBlocks: 64, endpoint: { component: "unknown" } },
          { name: "configured", expectedBlocks: 64, expectedRanks: 4, endpoint: { component: "configured" } },
        ],
        loadWindowMs: HOUR_MS,
      });
      try {
        for (const pool of ["unknown", "configured"]) await publish(server, pool, [chain(1n, 10n, 3), chain(2n, 100n, 2)]);
        server.relay.nextLoadWindow();
        for await (const update of relayClient(server).subscribeKvPoolLoad({ subscriberId: "ranks", contractMarker: MARKER })) {
          expect(update.pools.map((p) => [p.kvUsedBlocks, p.kvObservedRanks, p.kvExpectedRanks])).to.deep.equal([
            [5n, 2, 0],
            [5n, 2, 4],
          ]);
          break;
        }
        expect(await metricValue(server.host.metrics.registry, "kv_dc_relay_degraded_load_coverage_pool_count")).to.equal(1);
      } finally {
        await server.close();
      }
    });

    it("a subscriber that falls behind the kept windows ends SUBSCRIBER_LAGGED and counts as lagged{stream=\"load\"}, on either RPC", async () => {
      const server = await startRelay({ pools: [{ name: "default", expectedBlocks: 64 }], loadWindowMs: HOUR_MS, loadFanoutCapacity: 2 });
      const lagged = () => metricValue(server.host.metrics.registry, "kv_dc_relay_subscriber_lagged_total", { stream: "load" });
      try {
        const err = await connectErrorOf(async () => {
          for await (const _ of relayClient(server).subscribeServingLoad({ subscriberId: "slow", contractMarker: MARKER })) {
            // Four windows in one turn: the next one this stream needs has left the two kept.
            for (let i = 0; i < 4; i++) server.relay.nextLoadWindow();
          }
        });
        expect([err.code, relayReasonOf(err)]).to.deep.equal([Code.ResourceExhausted, "SUBSCRIBER_LAGGED"]);
        expect(await lagged()).to.equal(1);

        const grpcClient = server.grpcClient("dynamo/kvrelay/v1/relay.proto", "dynamo.kvrelay.v1.KvEventRelay");
        const grpcErr = await grpcFailure(
          grpcServerStream(grpcClient, "SubscribeKvPoolLoad", { subscriberId: "slow", contractMarker: MARKER }, {
            onMessage: () => {
              for (let i = 0; i < 4; i++) server.relay.nextLoadWindow();
            },
          }),
        );
        expect([grpcErr.code, trailerReason(grpcErr)]).to.deep.equal([grpc.status.RESOURCE_EXHAUSTED, "RELAY_ERROR_REASON_SUBSCRIBER_LAGGED"]);
        expect(await lagged()).to.equal(2);
      } finally {
        await server.close();
      }
    });

    it("both load RPCs share the load stream limit", async () => {
      const server = await startRelay({ pools: [{ name: "default", expectedBlocks: 64 }], loadWindowMs: HOUR_MS, maxLoadSubscribers: 1 });
      try {
        const client = relayClient(server);
        const open = client.subscribeKvPoolLoad({ subscriberId: "first", contractMarker: MARKER })[Symbol.asyncIterator]();
        try {
          await open.next();
          const err = await connectErrorOf(async () => {
            for await (const _ of client.subscribeServingLoad({ subscriberId: "second", contractMarker: MARKER })) void _;
          });
          expect([err.code, relayReasonOf(err), err.rawMessage]).to.deep.equal([Code.ResourceExhausted, "RESOURCE_LIMIT", "Relay load stream limit 1 reached"]);
        } finally {
          await open.return?.();
        }
      } finally {
        await server.close();
      }
    });

    it("the server's drain ends every open load stream PUBLICATION_UNAVAILABLE (UNAVAILABLE), to both clients", async () => {
      const server = await startRelay({ pools: [{ name: "default", expectedBlocks: 64 }], loadWindowMs: HOUR_MS });
      let shutdown: Promise<void> | undefined;
      try {
        const client = relayClient(server);
        const serving = client.subscribeServingLoad({ subscriberId: "drain", contractMarker: MARKER })[Symbol.asyncIterator]();
        const pool = client.subscribeKvPoolLoad({ subscriberId: "drain", contractMarker: MARKER })[Symbol.asyncIterator]();
        await serving.next();
        await pool.next();
        const grpcClient = server.grpcClient("dynamo/kvrelay/v1/relay.proto", "dynamo.kvrelay.v1.KvEventRelay");
        const grpcServing = grpcStream<GrpcServingLoad>(grpcClient, "SubscribeServingLoad", { subscriberId: "drain", contractMarker: MARKER });
        const grpcPool = grpcStream(grpcClient, "SubscribeKvPoolLoad", { subscriberId: "drain", contractMarker: MARKER });
        await grpcServing.first;
        await grpcPool.first;

        shutdown = server.host.shutdown();
        for (const [what, next] of [
          ["connect serving", () => serving.next()],
          ["connect pool", () => pool.next()],
        ] as const) {
          const err = await connectErrorOf(next);
          expect([err.code, relayReasonOf(err)], what).to.deep.equal([Code.Unavailable, "PUBLICATION_UNAVAILABLE"]);
        }
        for (const [what, end] of [
          ["grpc-js serving", grpcServing.end],
          ["grpc-js pool", grpcPool.end],
        ] as const) {
          const err = await end;
          expect([err.code, trailerReason(err)], what).to.deep.equal([grpc.status.UNAVAILABLE, "RELAY_ERROR_REASON_PUBLICATION_UNAVAILABLE"]);
        }
      } finally {
        await (shutdown ?? server.close());
        await server.close();
      }
    });

    it("a window the relay cannot make ends the open load streams PUBLICATION_UNAVAILABLE; a new stream then gets a fresh window", async () => {
      const server = await startRelay({ pools: [{ name: "default", expectedBlocks: 64 }], loadWindowMs: HOUR_MS });
      try {
        const client = relayClient(server);
        const pool = server.relay.pool("default")!;
        let firstSequence = 0n;
        const err = await connectErrorOf(async () => {
          for await (const update of client.subscribeServingLoad({ subscriberId: "fails", contractMarker: MARKER })) {
            firstSequence = update.windowSequence;
            const occupancy = pool.occupancy;
            pool.occupancy = () => {
              throw new Error("the pool's state cannot be read");
            };
            try {
              server.relay.loadTick();
            } finally {
              pool.occupancy = occupancy;
            }
          }
        });
        expect([err.code, relayReasonOf(err)]).to.deep.equal([Code.Unavailable, "PUBLICATION_UNAVAILABLE"]);
        for await (const update of client.subscribeServingLoad({ subscriberId: "again", contractMarker: MARKER })) {
          expect(update.windowSequence > firstSequence + 1n).to.equal(true);
          expect(update.pools).to.have.length(1);
          break;
        }
      } finally {
        await server.close();
      }
    });
  });
});
