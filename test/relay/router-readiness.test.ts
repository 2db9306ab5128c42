import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { expect } from "chai";
import { Health, HealthCheckResponse_ServingStatus as Serving } from "../../gen/grpc/health/v1/health_pb.js";
import { KvEventService, PublishRequestSchema } from "../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { PoolReadiness, type OverlapResponse } from "../../gen/mmgate/kvrouter/v1/kvrouter_pb.js";
import { EtcdRegistration } from "../../src/discovery/index.js";
import { computeBlockHashForSeq } from "../../src/kv/index.js";
import { poolKey } from "../../src/relay/index.js";
import { routerModule } from "../../src/relay/router/index.js";
import { eventually, requireEtcd, startEtcd, startServer, type EtcdServer, type InProcessServer } from "../support/index.js";
import { CLIENT_STACKS, overlapVia } from "./readiness-support.js";
import { startRelay, stored, type RelayServer } from "./service/support.js";

const BLOCK = 4;
const MODEL = "demo-model";
const PROMPT = Array.from({ length: 42 }, (_, i) => (i * 7919 + 13) % 50_000);
const BLOCK_HASHES = computeBlockHashForSeq(PROMPT, BLOCK);

/** Three pools of one model, each in a namespace of its own (three topology entries): two follow registrations, one event recency. */
const POOLS = [
  { name: "east", dcId: 1, expectedBlocks: 1024, blockSize: BLOCK, models: [{ model: MODEL }], endpoint: { namespace: "east" } },
  { name: "west", dcId: 2, expectedBlocks: 1024, blockSize: BLOCK, models: [{ model: MODEL }], endpoint: { namespace: "west" } },
  { name: "north", dcId: 3, expectedBlocks: 1024, blockSize: BLOCK, models: [{ model: MODEL }], endpoint: { namespace: "north" }, discovery: { source: "events" } },
];

type Answer = { pools: [string, string, number][]; excluded: [string, string, string][] };

/** Endpoint, readiness and matched blocks of each answer; endpoint, readiness and detail of each pool left out. */
function answer(response: OverlapResponse): Answer {
  return {
    pools: response.pools.map((p) => [p.endpoint, PoolReadiness[p.readiness], p.matchedBlocks]),
    excluded: response.excluded.map((p) => [p.endpoint, PoolReadiness[p.readiness], p.detail]),
  };
}

describe("router: overlap answers gated by the relays' serving readiness", function () {
  this.timeout(60_000);
  let etcd: EtcdServer;
  let relay: RelayServer;
  let router: InProcessServer;
  const registrations = new Map<string, EtcdRegistration>();

  before(async function () {
    requireEtcd(this);
    etcd = await startEtcd();
    relay = await startRelay({ discovery: { etcd: { endpoints: [etcd.endpoint] } }, pools: POOLS, loadWindowMs: 50, poolHeartbeatIntervalMs: 100 });
    router = await startServer({
      modules: [routerModule],
      config: { router: { relays: [relay.addr], subscriberId: "router-readiness", backoff: { minMs: 10, maxMs: 50 } } },
    });
    // East holds the prompt's first 6 blocks, west its first 3; north (event-fed) never hears from a worker.
    for (const [pool, depth] of [["east", 6], ["west", 3]] as const) {
      const blocks = BLOCK_HASHES.slice(0, depth).map((tokensHash, i): [bigint, bigint] => [10_000n + BigInt(i), tokensHash]);
      await createClient(KvEventService, relay.connectTransport).publish(
        (async function* () {
          yield create(PublishRequestSchema, { pool, events: [stored(1n, blocks)] });
        })(),
      );
    }
  });
  after(async () => {
    await Promise.all([...registrations.values()].map((r) => r.close().catch(() => undefined)));
    await router?.close();
    await relay?.close();
    await etcd?.stop();
  });

  async function register(namespace: string): Promise<void> {
    const registration = await EtcdRegistration.create({
      endpoints: [etcd.endpoint],
      namespace,
      component: "backend",
      endpoint: "generate",
      instanceId: `${namespace}-1`,
      address: "127.0.0.1:1",
      metadata: { worker_type: "aggregated" },
      leaseTtlSeconds: 5,
    });
    await registration.register();
    registrations.set(namespace, registration);
  }

  /** Waits until the router's answer over every client stack is `expected`. */
  async function answersOverEveryStack(expected: Answer): Promise<OverlapResponse> {
    let last: OverlapResponse | undefined;
    for (const stack of CLIENT_STACKS) {
      last = await eventually(
        async () => {
          const response = await overlapVia(router, stack, PROMPT, MODEL);
          expect(answer(response), stack).to.deep.equal(expected);
          return response;
        },
        { timeoutMs: 15_000 },
      );
    }
    return last!;
  }

  it("leaves an UNAVAILABLE pool out and names it, and an UNKNOWN one while a READY pool answers; READY answers carry their load", async () => {
    await register("east");
    const response = await answersOverEveryStack({
      pools: [["east.backend.generate", "READY", 6]],
      excluded: [
        ["west.backend.generate", "UNAVAILABLE", `the relay reports west/${MODEL} UNAVAILABLE: missing AGGREGATED`],
        ["north.backend.generate", "UNKNOWN", `the relay reports north/${MODEL} UNKNOWN (availability not known yet); left out while READY pools answer`],
      ],
    });
    // The load of the pool's current producer, from the relay's load stream.
    const load = await eventually(async () => {
      const pool = (await overlapVia(router, "connect", PROMPT, MODEL)).pools[0]!;
      expect(pool.load?.kvUsedBlocks).to.equal(6n);
      return pool.load!;
    });
    expect(load.windowSequence > 0n).to.equal(true);
    expect(load).to.deep.include({ totalKvBlocks: 0n, kvObservedRanks: 1 });
    expect(response.excluded.map((p) => p.dcId)).to.deep.equal([2n, 3n]);
    const metrics = await (await fetch(`http://${router.adminAddr}/metrics`)).text();
    const key = (name: string) => poolKey(relay.relay.pool(name)!.producer.poolId);
    expect(metrics).to.include(`mmgate_router_pool_serving_state{relay="${relay.addr}",pool="${key("east")}"} 2`);
    expect(metrics).to.include(`mmgate_router_pool_serving_state{relay="${relay.addr}",pool="${key("west")}"} 1`);
    expect(metrics).to.include(`mmgate_router_relay_stream_connected{relay="${relay.addr}",stream="readiness"} 1`);
  });

  it("a pool whose worker registers joins the answer", async () => {
    await register("west");
    await answersOverEveryStack({
      pools: [
        ["east.backend.generate", "READY", 6],
        ["west.backend.generate", "READY", 3],
      ],
      excluded: [["north.backend.generate", "UNKNOWN", `the relay reports north/${MODEL} UNKNOWN (availability not known yet); left out while READY pools answer`]],
    });
  });

  it("with no READY pool left, UNKNOWN pools answer (marked so) and UNAVAILABLE ones stay out; the router stays ready through them", async () => {
    await Promise.all([registrations.get("east")!.revoke(), registrations.get("west")!.revoke()]);
    await answersOverEveryStack({
      pools: [["north.backend.generate", "UNKNOWN", 0]],
      excluded: [
        ["east.backend.generate", "UNAVAILABLE", `the relay reports east/${MODEL} UNAVAILABLE: missing AGGREGATED`],
        ["west.backend.generate", "UNAVAILABLE", `the relay reports west/${MODEL} UNAVAILABLE: missing AGGREGATED`],
      ],
    });
    expect((await createClient(Health, router.transport).check({ service: "" })).status).to.equal(Serving.SERVING);
  });
});
