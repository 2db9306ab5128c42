import { createServer } from "node:net";
import { create } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import { Health, HealthCheckResponse_ServingStatus as Serving } from "../../gen/grpc/health/v1/health_pb.js";
import { KvEventService, PublishRequestSchema, type RouterEvent as WireRouterEvent } from "../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { OverlapService, PoolReadiness } from "../../gen/mmgate/kvrouter/v1/kvrouter_pb.js";
import { computeBlockHashForSeq, computeSeqHashForBlock } from "../../src/kv/index.js";
import { LaneProbe, poolKey } from "../../src/relay/index.js";
import { KvRouter, MAX_OVERLAP_TOKENS, RouterError, routerModule } from "../../src/relay/router/index.js";
import { ConfigError } from "../../src/server/index.js";
import { connectErrorOf, eventually, expectRejection, grpcUnary, runMmgate, startServer, type GrpcClient, type InProcessServer } from "../support/index.js";
import { startRelay, stored, type RelayServer } from "./service/support.js";

const BLOCK = 4;
const MODEL = "demo-model";
/** 42 tokens: 10 complete blocks of 4. */
const PROMPT = Array.from({ length: 42 }, (_, i) => (i * 7919 + 13) % 50_000);
const BLOCK_HASHES = computeBlockHashForSeq(PROMPT, BLOCK);

/** An address nothing listens on (yet): a port the kernel handed out and took back. */
async function freeAddress(): Promise<string> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return `127.0.0.1:${port}`;
}

type RelayHost = RelayServer;

/** A relay host listening on `listen` (the test support's startRelay picks its own port otherwise). */
function relayOn(listen: string, relayConfig: Record<string, unknown>): Promise<RelayHost> {
  return startRelay(relayConfig, { listen });
}

/** Stores the prompt's blocks `from`..`to` (exclusive) on worker 1, after block `from - 1` when there is one. */
async function storePrompt(server: RelayHost, from: number, to: number): Promise<void> {
  const blocks = BLOCK_HASHES.slice(from, to).map((tokensHash, i): [bigint, bigint] => [10_000n + BigInt(from + i), tokensHash]);
  const event: WireRouterEvent = stored(1n, blocks, from === 0 ? undefined : 10_000n + BigInt(from - 1));
  const client = createClient(KvEventService, server.connectTransport);
  async function* requests() {
    yield create(PublishRequestSchema, { pool: "default", events: [event] });
  }
  const summary = await client.publish(requests());
  expect(summary.rejected).to.equal(0n);
}

/** The leading blocks of the prompt the producer's own lane holds: the truth the router must report. */
function truth(server: RelayHost): number {
  const pool = server.relay.pool("default")!;
  const probe = new LaneProbe(pool.producer.format, pool.words());
  const seq = computeSeqHashForBlock(BLOCK_HASHES);
  let depth = 0;
  while (depth < seq.length && probe.contains(seq[depth]!)) depth++;
  return depth;
}

function poolConfig(dcId: number, component: string) {
  return {
    pools: [{ name: "default", dcId, expectedBlocks: 1024, blockSize: BLOCK, models: [{ model: MODEL, aliases: ["friendly"] }], endpoint: { component } }],
    poolHeartbeatIntervalMs: 100,
  };
}

describe("router module: OverlapService over real relays", function () {
  this.timeout(10_000);
  let addrA: string;
  let addrB: string;
  let router: InProcessServer;
  let grpcClient: GrpcClient;
  let a: RelayHost | undefined;
  let b: RelayHost | undefined;
  const logLines: string[] = [];
  const overlap = (tokens: number[], model: string) => createClient(OverlapService, router.transport).overlap({ tokens, model });
  const health = (service = "") => createClient(Health, router.transport).check({ service });

  before(async () => {
    [addrA, addrB] = await Promise.all([freeAddress(), freeAddress()]);
    router = await startServer({
      modules: [routerModule],
      config: { router: { relays: [addrA, addrB], subscriberId: "router-under-test", backoff: { minMs: 10, maxMs: 50 } } },
      logLines,
    });
    grpcClient = router.grpcClient("mmgate/kvrouter/v1/kvrouter.proto", "mmgate.kvrouter.v1.OverlapService");
  });
  after(async () => {
    await router?.close();
    await Promise.all([a?.close(), b?.close()]);
  });

  it("is NOT_SERVING while no relay has a ready pool, then SERVING once one has", async () => {
    expect((await health()).status).to.equal(Serving.NOT_SERVING);
    expect((await health(OverlapService.typeName)).status).to.equal(Serving.NOT_SERVING);
    expect((await fetch(`http://${router.adminAddr}/readyz`)).status).to.equal(503);
    expect(logLines.some((l) => l.includes('"module":"router"') && l.includes("no KV pool of any relay is ready yet"))).to.equal(true);
    // Nothing mirrored: no pools, not an error.
    expect((await overlap(PROMPT, MODEL)).pools).to.deep.equal([]);
    const metrics = await (await fetch(`http://${router.adminAddr}/metrics`)).text();
    expect(metrics).to.include(`mmgate_router_relay_connected{relay="${addrA}"} 0`);

    a = await relayOn(addrA, poolConfig(1, "backend"));
    await eventually(async () => expect((await health()).status).to.equal(Serving.SERVING));
    expect((await health(OverlapService.typeName)).status).to.equal(Serving.SERVING);
    expect((await fetch(`http://${router.adminAddr}/readyz`)).status).to.equal(200);
  });

  it("answers the matched prefix the producers' filters hold, from every relay, over connect and grpc-js", async () => {
    b = await relayOn(addrB, poolConfig(2, "prefill"));
    await Promise.all([storePrompt(a!, 0, 6), storePrompt(b, 0, 3)]);
    expect([truth(a!), truth(b)]).to.deep.equal([6, 3]);
    const expected = [
      { relay: addrA, dcId: 1n, endpoint: "mmgate.backend.generate", matchedBlocks: 6, sequence: () => a!.relay.pool("default")!.sequence },
      { relay: addrB, dcId: 2n, endpoint: "mmgate.prefill.generate", matchedBlocks: 3, sequence: () => b!.relay.pool("default")!.sequence },
    ];
    // Until each relay's readiness stream reports the events' workers live, both pools answer UNKNOWN; the tests
    // that follow need both READY (an UNKNOWN pool is left out while another is READY).
    const response = await eventually(async () => {
      const res = await overlap(PROMPT, MODEL);
      expect(res.pools.map((p) => [p.relay, p.matchedBlocks, p.sequence, p.readiness])).to.deep.equal(
        expected.map((e) => [e.relay, e.matchedBlocks, e.sequence(), PoolReadiness.READY]),
      );
      return res;
    });
    response.pools.forEach((pool, i) => {
      const e = expected[i]!;
      expect(pool).to.deep.include({ relay: e.relay, dcId: e.dcId, endpoint: e.endpoint, totalBlocks: 10, blockSize: BLOCK, canonicalModelId: MODEL });
    });

    const viaGrpc = await grpcUnary<{ pools: Record<string, unknown>[] }>(grpcClient, "Overlap", { tokens: PROMPT, model: MODEL });
    expect(viaGrpc.pools.map((p) => ({ relay: p.relay, dcId: p.dcId, endpoint: p.endpoint, matchedBlocks: p.matchedBlocks, totalBlocks: p.totalBlocks, canonicalModelId: p.canonicalModelId }))).to.deep.equal(
      expected.map((e) => ({ relay: e.relay, dcId: String(e.dcId), endpoint: e.endpoint, matchedBlocks: e.matchedBlocks, totalBlocks: 10, canonicalModelId: MODEL })),
    );

    // A prompt that departs inside block 2 matches blocks 0 and 1 only.
    const departed = PROMPT.slice();
    departed[2 * BLOCK + 1] = 49_999;
    expect((await overlap(departed, MODEL)).pools.map((p) => p.matchedBlocks)).to.deep.equal([2, 2]);
  });

  it("resolves aliases to the canonical model; an unknown model gets no pools", async () => {
    const byAlias = await overlap(PROMPT, "friendly");
    expect(byAlias.pools.map((p) => [p.canonicalModelId, p.matchedBlocks])).to.deep.equal([
      [MODEL, 6],
      [MODEL, 3],
    ]);
    expect((await overlap(PROMPT, "another-model")).pools).to.deep.equal([]);
    const grpcUnknown = await grpcUnary<{ pools: unknown[] }>(grpcClient, "Overlap", { tokens: PROMPT, model: "another-model" });
    expect(grpcUnknown.pools).to.deep.equal([]);
  });

  it("follows the relays' deltas", async () => {
    await storePrompt(a!, 6, 8);
    expect(truth(a!)).to.equal(8);
    await eventually(async () => {
      const res = await overlap(PROMPT, MODEL);
      expect(res.pools.map((p) => [p.matchedBlocks, p.sequence])).to.deep.equal([
        [8, a!.relay.pool("default")!.sequence],
        [3, b!.relay.pool("default")!.sequence],
      ]);
    });
  });

  it("refuses an empty model and an oversized prompt with INVALID_ARGUMENT, over connect and grpc-js", async () => {
    const empty = await connectErrorOf(overlap(PROMPT, ""));
    expect(empty.code).to.equal(Code.InvalidArgument);
    expect(empty.rawMessage).to.match(/model is required/);
    const viaGrpc = await expectRejection<grpc.ServiceError>(grpcUnary(grpcClient, "Overlap", { tokens: PROMPT, model: "" }));
    expect(viaGrpc.code).to.equal(grpc.status.INVALID_ARGUMENT);
    // The token cap is checked before any hashing, here without the wire (a million tokens there would only time protobuf).
    const kvRouter = new KvRouter({ relays: [], transportOf: () => router.transport, subscriberId: "cap-check" });
    const error = await expectRejection(() => kvRouter.overlap(new Uint32Array(MAX_OVERLAP_TOKENS + 1), MODEL), { type: RouterError });
    expect(error).to.include({ code: "TooManyTokens" });
    expect(routerModule.mapError!(error)?.code).to.equal(Code.InvalidArgument);
    expect(kvRouter.overlap(new Uint32Array(MAX_OVERLAP_TOKENS), "another-model")).to.deep.equal([]);
  });

  it("exports per-pool metrics: ready, installed sequence, lag, last frame age, resubscribes; and relay connectivity", async () => {
    const keyA = poolKey(a!.relay.pool("default")!.producer.poolId);
    const keyB = poolKey(b!.relay.pool("default")!.producer.poolId);
    const text = await (await fetch(`http://${router.adminAddr}/metrics`)).text();
    for (const [relay, pool] of [
      [addrA, keyA],
      [addrB, keyB],
    ] as const) {
      const labels = `{relay="${relay}",pool="${pool}"}`;
      expect(text).to.include(`mmgate_router_pool_ready${labels} 1`);
      const sequence = new RegExp(`mmgate_router_pool_installed_sequence${escape(labels)} ([0-9]+)\\n`).exec(text)?.[1];
      expect(sequence, `installed sequence of ${relay}`).to.not.equal(undefined);
      expect(BigInt(sequence!)).to.equal((relay === addrA ? a : b)!.relay.pool("default")!.sequence);
      expect(text).to.match(new RegExp(`mmgate_router_pool_lag_seconds${escape(labels)} -?[0-9.e-]+\\n`));
      expect(text).to.match(new RegExp(`mmgate_router_pool_last_frame_age_seconds${escape(labels)} [0-9.e-]+\\n`));
      expect(text).to.include(`mmgate_router_pool_resubscribes_total${labels} 0`);
      expect(text).to.include(`mmgate_router_relay_connected{relay="${relay}"} 1`);
    }
  });
});

function escape(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

describe("router module: configuration and the module set", () => {
  it("needs at least one relay, and checks the channel's receive limit and deadline", async () => {
    await expectRejection(startServer({ modules: [routerModule] }), { type: ConfigError, message: /router\.relays: at least one relay/ });
    await expectRejection(startServer({ modules: [routerModule], config: { router: { relays: ["127.0.0.1:1"], channel: { maxReceiveMessageBytes: 4 * 1024 * 1024 } } } }), {
      type: ConfigError,
      message: /router\.channel\.maxReceiveMessageBytes: must be at least 8388608/,
    });
    await expectRejection(startServer({ modules: [routerModule], config: { router: { relays: ["127.0.0.1:1"], channel: { defaultTimeoutMs: 1000 } } } }), {
      type: ConfigError,
      message: /router\.channel\.defaultTimeoutMs: must be 0/,
    });
  });

  it("runs under `mmgate router --relay`, never under plain `mmgate serve`", async () => {
    const routerConfig = await runMmgate(["router", "--relay", "127.0.0.1:7001", "--relay", "[::1]:7002", "--print-config"]);
    expect(routerConfig.code, routerConfig.stderr).to.equal(0);
    const config = JSON.parse(routerConfig.stdout) as { modules: string[]; router: { relays: string[]; subscriberId: string } };
    expect(config.modules).to.deep.equal(["router"]);
    expect(config.router.relays).to.deep.equal(["127.0.0.1:7001", "[::1]:7002"]);
    expect(config.router.subscriberId).to.match(/^mmgate-router-/);
    const serveConfig = await runMmgate(["serve", "--print-config"]);
    expect(serveConfig.code, serveConfig.stderr).to.equal(0);
    const served = JSON.parse(serveConfig.stdout) as Record<string, unknown> & { modules: string[] };
    expect(served.modules).to.not.include("router");
    expect(served).to.not.have.property("router");
    const badRelay = await runMmgate(["router", "--relay", "nope", "--print-config"]);
    expect(badRelay.code).to.equal(2); // a usage error
    expect(badRelay.stderr).to.match(/--relay.*expected HOST:PORT/);
  });
});
