/**
 * Ingest applies events in slices: the event loop turns between them (and
 * between the blocks of a large event), an event over maxBlocksPerEvent is
 * rejected on its own, and the filter a sliced ingest builds is byte for byte
 * the one applying the same events directly gives. Structure, not timing: the
 * tests look at what callbacks saw while an ingest was under way.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { expect } from "chai";
import { connect, type NatsConnection } from "nats";
import { Health, HealthCheckResponse_ServingStatus as S } from "../../../gen/grpc/health/v1/health_pb.js";
import { KvEventService, PublishRequestSchema, RouterEventSchema, type RouterEvent as WireRouterEvent } from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { DcCkfState, DEFAULT_CKF_CONFIG, type RouterEvent } from "../../../src/kv/index.js";
import { routerEventToWire } from "../../../src/relay/publish-cli.js";
import { APPLY_PAUSED } from "../../../src/relay/service/pool.js";
import { Relay, relayConfigSchema } from "../../../src/relay/service/index.js";
import { eventually, requireNats, startNats, type NatsServer } from "../../support/index.js";
import { ckfWorkload } from "../../kv/ckf-workload.js";
import { chain, startRelay, stored, type RelayServer } from "./support.js";

async function publish(server: RelayServer, pool: string, messages: readonly (readonly WireRouterEvent[])[]) {
  const client = createClient(KvEventService, server.connectTransport);
  async function* requests() {
    for (const [i, events] of messages.entries()) yield create(PublishRequestSchema, { pool: i === 0 ? pool : "", events: [...events] });
  }
  return client.publish(requests());
}

/** Messages of `size` events. */
function messagesOf(events: readonly WireRouterEvent[], size: number): WireRouterEvent[][] {
  const out: WireRouterEvent[][] = [];
  for (let i = 0; i < events.length; i += size) out.push(events.slice(i, i + size));
  return out;
}

/** Repeats `probe` on every turn of the event loop until stopped; what it returned each time. */
function everyTurn<T>(probe: () => T): { readonly seen: T[]; stop(): void } {
  const seen: T[] = [];
  let stopped = false;
  const tick = () => {
    if (stopped) return;
    seen.push(probe());
    setImmediate(tick);
  };
  setImmediate(tick);
  return {
    seen,
    stop: () => {
      stopped = true;
    },
  };
}

describe("relay ingest: sliced application", function () {
  this.timeout(60_000);

  describe("a large ingest", () => {
    let server: RelayServer;
    before(async () => {
      // The default slices (5 ms or 4,096 blocks) and the default per-event limit (65,536 blocks).
      // Two 65,536-block events in one message: over the default per-event and message limits, raised here.
      server = await startRelay({ pools: [{ name: "default", expectedBlocks: 262_144 }], maxBlocksPerEvent: 65_536, maxIngestMessageBytes: 8 * 1024 * 1024 });
    });
    after(async () => server?.close());

    it("lets the event loop turn between slices, within an event too: callbacks see it partly applied, a health check answers before it ends", async () => {
      const pool = server.relay.pool("default")!;
      const yieldsBefore = server.relay.slicer.stats().yields;
      // Two events at the per-event limit, in one message.
      const events = [chain(1n, 1_000_000n, 65_536), chain(2n, 3_000_000n, 65_536)];
      const samples = everyTurn(() => pool.occupancy().uniqueBlocks);
      const order: string[] = [];
      let health: Promise<unknown> | undefined;
      const watchHealth = setInterval(() => {
        if (health !== undefined || pool.occupancy().uniqueBlocks === 0) return;
        // Asked once applying has begun: it must answer while the ingest is still under way.
        health = createClient(Health, server.transport)
          .check({ service: "" })
          .then((res) => {
            order.push(`health ${res.status === S.SERVING ? "SERVING" : res.status}`);
          });
      }, 1);
      try {
        const summary = await publish(server, "default", [events]);
        order.push("publish");
        expect(summary).to.include({ applied: 2n, rejected: 0n });
      } finally {
        samples.stop();
        clearInterval(watchHealth);
      }
      await health;
      const mid = samples.seen.filter((n) => n > 0 && n < 131_072);
      // Callbacks ran while the message was half applied, and while its first event was.
      expect(mid.length, "turns while the message was applied").to.be.greaterThan(4);
      expect(mid.some((n) => n < 65_536), "a turn in the middle of the first event").to.equal(true);
      expect(server.relay.slicer.stats().yields - yieldsBefore).to.be.greaterThan(4);
      expect(order).to.deep.equal(["health SERVING", "publish"]);
      expect(pool.occupancy().uniqueBlocks).to.equal(131_072);
    });
  });

  describe("limits", () => {
    let server: RelayServer;
    before(async () => {
      server = await startRelay({ pools: [{ name: "default", expectedBlocks: 4096 }], maxBlocksPerEvent: 100, maxEventsPerMessage: 1000 });
    });
    after(async () => server?.close());

    it("an event over maxBlocksPerEvent is rejected as EventTooLarge with its position; the rest of the stream applies", async () => {
      const pool = server.relay.pool("default")!;
      const removedOver = create(RouterEventSchema, {
        workerId: 5n,
        data: { case: "removed", value: { blockHashes: Array.from({ length: 101 }, (_, i) => BigInt(i)) } },
      });
      const summary = await publish(server, "default", [[chain(1n, 100n, 100), chain(2n, 1000n, 101)], [removedOver, chain(3n, 5000n, 3)]]);
      expect(summary).to.include({ applied: 2n, rejected: 2n });
      expect(summary.rejections.map((r) => [r.index, r.code, r.message])).to.deep.equal([
        [1n, "EventTooLarge", "a stored event of 101 blocks is over the limit of 100 per event"],
        [2n, "EventTooLarge", "a removed event of 101 block hashes is over the limit of 100 per event"],
      ]);
      // The refused event changed nothing: the pool holds the 103 blocks of the other two.
      expect(pool.occupancy()).to.deep.equal({ uniqueBlocks: 103, ranks: 2 });
    });

    it("a message over maxIngestMessageBytes is refused before it is decoded (RESOURCE_EXHAUSTED), on both paths", async () => {
      const small = await startRelay({ pools: [{ name: "default", expectedBlocks: 4096 }], maxIngestMessageBytes: 4096 });
      try {
        // About 24 bytes a block: 400 blocks are well over 4 KiB.
        const error = await publish(small, "default", [[chain(1n, 1n << 60n, 400)]]).then(
          () => undefined,
          (e: unknown) => ConnectError.from(e),
        );
        expect(error?.code).to.equal(Code.ResourceExhausted);
        expect(small.relay.pool("default")!.occupancy().uniqueBlocks).to.equal(0);
        // Under the limit, the same stream shape is taken.
        expect(await publish(small, "default", [[chain(1n, 1n << 60n, 40)]])).to.include({ applied: 1n });
      } finally {
        await small.close();
      }
    });

    it("a message over maxEventsPerMessage still refuses the whole stream", async () => {
      const error = await publish(server, "default", [Array.from({ length: 1001 }, (_, i) => stored(9n, [[BigInt(i), 1n]]))]).then(
        () => undefined,
        (e: unknown) => e as Error,
      );
      expect(error?.message).to.match(/at most 1000 events, not 1001/);
    });
  });

  describe("the same filter as applying the events directly", () => {
    let server: RelayServer;
    before(async () => {
      // A pause after every block, a filter too small for the events (inserts fail mid-event), a per-event limit.
      server = await startRelay({ pools: [{ name: "small", expectedBlocks: 64 }], maxBlocksPerEvent: 40, ingestSliceBlocks: 1, maxEventsPerMessage: 1000 });
    });
    after(async () => server?.close());

    it("sliced ingest over several messages leaves the pool's lane byte-identical to DcCkfState.applyEvent on the same events", async () => {
      const events: RouterEvent[] = ckfWorkload({ seed: 7, events: 1200, maxBlocks: 30, overLimit: 41 });
      const direct = new DcCkfState({ expectedBlocksPerDc: 64, seed: DEFAULT_CKF_CONFIG.seed, publishEveryNEvents: Number.MAX_SAFE_INTEGER }, { maxBlocksPerEvent: 40 });
      const outcomes = events.map((e) => direct.applyEvent(e).firstError);
      const rejected = outcomes.flatMap((error, index) => (error === undefined ? [] : [{ index: BigInt(index), code: error.code, message: error.message }]));
      expect(new Set(rejected.map((r) => r.code))).to.include.keys("CapacityExhausted", "EventTooLarge", "ParentBlockNotFound", "InvalidBlockSequence");

      const pool = server.relay.pool("small")!;
      const yieldsBefore = server.relay.slicer.stats().yields;
      const summary = await publish(server, "small", messagesOf(events.map(routerEventToWire), 250));
      expect(server.relay.slicer.stats().yields - yieldsBefore, "a pause per block").to.be.greaterThan(5_000);
      expect(summary.applied).to.equal(BigInt(events.length - rejected.length));
      expect(summary.rejected).to.equal(BigInt(rejected.length));
      expect(summary.rejections.map((r) => ({ index: r.index, code: r.code, message: r.message }))).to.deep.equal(rejected.slice(0, 16));
      const lane = pool.words();
      const expected = direct.words();
      expect(Buffer.from(lane.buffer, lane.byteOffset, lane.byteLength).equals(Buffer.from(expected.buffer, expected.byteOffset, expected.byteLength))).to.equal(true);
      expect(pool.occupancy()).to.deep.equal({ uniqueBlocks: direct.stats().uniqueBlocks, ranks: direct.stats().members });
    });
  });

  describe("RelayPool: the stepped application with and without a generator", () => {
    const poolOf = () => new Relay(relayConfigSchema.parse({ pools: [{ name: "p", expectedBlocks: 64 }], maxBlocksPerEvent: 40 })).pool("p")!;

    it("applyUntil / continueApply pause where applyInSteps yields, and leave the same lane, counts and rejections", () => {
      const events: RouterEvent[] = ckfWorkload({ seed: 11, events: 400, maxBlocks: 30, overLimit: 41 });
      const a = poolOf();
      const b = poolOf();
      let n = 0;
      let m = 0;
      let yields = 0;
      let pauses = 0;
      for (const event of events) {
        const steps = a.applyInSteps(event, () => ++n % 3 === 0);
        let step = steps.next();
        while (step.done !== true) {
          yields += 1;
          step = steps.next();
        }
        const pause = () => ++m % 3 === 0;
        let done = b.applyUntil(event, pause);
        while (done === APPLY_PAUSED) {
          pauses += 1;
          done = b.continueApply(pause);
        }
        expect(done?.code).to.equal(step.value?.code);
      }
      expect(pauses).to.equal(yields).and.to.be.greaterThan(100);
      expect(Buffer.from(b.words().buffer).equals(Buffer.from(a.words().buffer))).to.equal(true);
      expect(b.stats()).to.deep.include({ eventsApplied: a.stats().eventsApplied, eventsRejected: a.stats().eventsRejected });
    });

    it("an applyInSteps generator returned mid-event releases the pool's state", () => {
      const pool = poolOf();
      const blocks = Array.from({ length: 10 }, (_, i) => ({ blockHash: BigInt(100 + i), tokensHash: BigInt(7 + i) }));
      const event: RouterEvent = { workerId: 1n, dpRank: 0, eventId: 1n, data: { kind: "stored", blocks } };
      const steps = pool.applyInSteps(event, () => true);
      expect(steps.next().done).to.equal(false);
      expect(() => pool.apply(event)).to.throw(/being applied in steps/);
      steps.return(undefined);
      expect(pool.apply({ ...event, workerId: 2n })).to.equal(undefined);
    });
  });

  describe("NATS ingest", () => {
    let nats: NatsServer;
    let server: RelayServer;
    let publisher: NatsConnection;
    before(async function () {
      requireNats(this);
      nats = await startNats();
      server = await startRelay({ pools: [{ name: "default", expectedBlocks: 65_536, nats: { servers: [nats.url], subject: "kv.slices" } }], ingestSliceBlocks: 256 });
      publisher = await connect({ servers: nats.url });
    });
    after(async () => {
      await publisher?.close();
      await server?.close();
      await nats?.stop();
    });

    it("applies a NATS message through the same slicer, pausing within a large event", async () => {
      const pool = server.relay.pool("default")!;
      await eventually(async () => {
        publisher.publish("kv.slices", JSON.stringify({ worker_id: 9, event: { event_id: 0, data: "cleared" } }));
        await publisher.flush();
        expect(pool.stats().eventsApplied).to.be.greaterThan(0);
      });
      const before = server.relay.slicer.stats();
      const blocks = Array.from({ length: 8_000 }, (_, i) => ({ block_hash: 10_000 + i, tokens_hash: 77_000 + i }));
      const samples = everyTurn(() => pool.occupancy().uniqueBlocks);
      try {
        publisher.publish("kv.slices", JSON.stringify({ worker_id: 1, event: { event_id: 1, data: { stored: { parent_hash: null, blocks } } } }));
        await publisher.flush();
        await eventually(() => expect(pool.occupancy().uniqueBlocks).to.equal(8_000));
      } finally {
        samples.stop();
      }
      const after = server.relay.slicer.stats();
      expect(after.tasks - before.tasks).to.be.at.least(1);
      expect(after.yields - before.yields).to.be.greaterThan(8_000 / 256);
      expect(samples.seen.some((n) => n > 0 && n < 8_000), "a turn in the middle of the event").to.equal(true);
    });
  });
});
