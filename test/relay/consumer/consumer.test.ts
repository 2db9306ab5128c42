import { expect } from "chai";
import { create } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import { CkfFormatSchema, KvPoolCatalogUpdateSchema } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { canonicalModelId, computeBlockHashForSeq, createRegistration, DcCkfState, modelAlias, samePoolId, sameProducerIdentity, type ProducerIdentity } from "../../../src/kv/index.js";
import {
  backoffDelay,
  backoffOptions,
  poolKey,
  RelayConsumer,
  type ConsumerFailure,
  type RelayConsumerEvent,
  type RelayConsumerOptions,
  type RunResult,
} from "../../../src/relay/index.js";
import { descriptorToWire, isRelayError, producerFromWire, RELAY_CONTRACT_MARKER } from "../../../src/relay/wire/index.js";
import { eventually } from "../../support/eventually.js";
import { FakePool, FakeRelay, type SubscriptionFault } from "./fake-relay.js";
import { deltaUpdate, descriptor, MODEL, prng, producer, randomImages, randomWord, sameBytes } from "./mirror-helpers.js";

const random = prng(4242);

function lane(bucketCount: number): BigUint64Array {
  const words = new BigUint64Array(bucketCount);
  for (let i = 0; i < bucketCount; i++) if (random() < 0.5) words[i] = randomWord(random);
  return words;
}

const A = producer({ pool: 1 });
const B = producer({ pool: 2, dcId: 9n, bucketCount: 1024 });

interface Started {
  readonly consumer: RelayConsumer;
  readonly events: RelayConsumerEvent[];
  readonly controller: AbortController;
  readonly done: Promise<RunResult>;
}

let relay: FakeRelay;
let running: Started[] = [];

function start(options: Partial<RelayConsumerOptions> = {}): Started {
  const events: RelayConsumerEvent[] = [];
  const consumer = new RelayConsumer({
    transport: relay.transport,
    subscriberId: "router-under-test",
    relay: "fake-relay",
    backoff: { minMs: 5, maxMs: 40 },
    onEvent: (event) => events.push(event),
    ...options,
  });
  const controller = new AbortController();
  const started = { consumer, events, controller, done: consumer.run(controller.signal) };
  running.push(started);
  return started;
}

/** Two pools, A (16 buckets) and B (1,024), catalogued and served. */
function twoPools(): { a: FakePool; b: FakePool } {
  const a = relay.addPool(new FakePool(A, lane(16), 3n));
  const b = relay.addPool(new FakePool(B, lane(1024), 10n));
  relay.setCatalog([descriptor(A), descriptor(B)]);
  return { a, b };
}

/** The consumer's mirror of `pool` is ready, at the pool's sequence, byte for byte. */
function mirrors(consumer: RelayConsumer, pool: FakePool): void {
  const view = consumer.pool(pool.key);
  expect(view?.state, `state of ${pool.key}`).to.equal("ready");
  expect(view?.installedSequence).to.equal(pool.sequence);
  expect(sameBytes(consumer.words(pool.key), pool.words), "mirror equals the producer's lane").to.equal(true);
}

function eventsFor(events: readonly RelayConsumerEvent[], pool: string): RelayConsumerEvent[] {
  return events.filter((e) => "pool" in e && e.pool === pool);
}

function failuresOf(events: readonly RelayConsumerEvent[], pool: string): ConsumerFailure[] {
  return eventsFor(events, pool).flatMap((e) => (e.type === "invalidated" ? [e.error] : []));
}

describe("relay consumer: RelayConsumer", () => {
  beforeEach(async () => {
    relay = await FakeRelay.start();
  });

  afterEach(async () => {
    for (const { controller, done } of running) {
      controller.abort();
      await done;
    }
    running = [];
    await relay.close();
  });

  it("mirrors every catalogued pool exactly and follows its deltas and heartbeats", async () => {
    const { a, b } = twoPools();
    const { consumer, events } = start();
    await eventually(() => {
      mirrors(consumer, a);
      mirrors(consumer, b);
    });
    for (let i = 0; i < 5; i++) {
      a.publish(randomImages(random, 16, 3));
      b.publish(randomImages(random, 1024, 40));
    }
    a.heartbeat(123n);
    await eventually(() => {
      mirrors(consumer, a);
      mirrors(consumer, b);
      expect(consumer.pool(a.key)?.lastSendTsUs).to.equal(123n);
    });

    // Requests: the contract marker, the subscriber id, and the catalog's exact producer.
    expect(relay.catalogRequests.map((r) => [r.subscriberId, r.contractMarker])).to.deep.equal([["router-under-test", RELAY_CONTRACT_MARKER]]);
    expect(relay.subscribeRequests).to.have.length(2);
    for (const request of relay.subscribeRequests) {
      expect(request.subscriberId).to.equal("router-under-test");
      expect(request.contractMarker).to.equal(RELAY_CONTRACT_MARKER);
      const expected = producerFromWire(request.expectedProducer);
      expect(sameProducerIdentity(expected, A) || sameProducerIdentity(expected, B)).to.equal(true);
    }

    // Views and events.
    const view = consumer.pool(b.key)!;
    expect(view).to.deep.include({ key: poolKey(B.poolId), state: "ready", resubscribes: 0, lastError: undefined, retryAt: undefined });
    expect(view.progress).to.deep.equal({ chunksReceived: 1, chunksExpected: 1 });
    expect(sameProducerIdentity(view.descriptor!.producer, B)).to.equal(true);
    expect(view.lastFrameAt).to.be.a("number");
    expect(consumer.catalog()).to.deep.include({ connected: true, revision: 3n, rejected: [] });
    const catalogEvent = events.find((e) => e.type === "catalog");
    expect(catalogEvent).to.deep.include({ added: [a.key, b.key], removed: [], replaced: [], pools: 2 });
    expect(eventsFor(events, a.key).map((e) => e.type)).to.include.members(["subscribing", "snapshot-progress", "ready", "delta", "heartbeat"]);
    expect(events.find((e) => e.type === "ready" && e.pool === b.key)).to.deep.equal({ type: "ready", pool: b.key, sequence: 10n });
    expect(events.some((e) => e.type === "invalidated")).to.equal(false);
  });

  describe("invalidates only the failing pool, backs off, and resubscribes from a snapshot", () => {
    interface FaultCase {
      readonly name: string;
      /** Queued for A's first subscription. */
      readonly fault?: SubscriptionFault;
      /** Done to A's live stream once A is ready. */
      readonly inject?: (pool: FakePool) => void;
      readonly source: ConsumerFailure["source"];
      readonly reason: string;
    }
    const cases: readonly FaultCase[] = [
      { name: "a sequence gap", inject: (p) => p.pushRaw(deltaPastGap(p)), source: "violation", reason: "SequenceGap" },
      { name: "a snapshot from the wrong producer", fault: { kind: "wrong-producer" }, source: "violation", reason: "ProducerDrift" },
      { name: "a heartbeat during assembly", fault: { kind: "heartbeat-first" }, source: "violation", reason: "UnexpectedKind" },
      { name: "an error status with a reason trailer", fault: { kind: "error", reason: "SUBSCRIBER_LAGGED" }, source: "relay", reason: "SUBSCRIBER_LAGGED" },
      { name: "a reason trailer mid-stream", inject: (p) => p.failLive("RESOURCE_LIMIT"), source: "relay", reason: "RESOURCE_LIMIT" },
      { name: "a status without a reason", fault: { kind: "status", code: Code.Unavailable }, source: "transport", reason: "Unavailable" },
      { name: "a clean end after the snapshot", fault: { kind: "eof-after-snapshot" }, source: "eof", reason: "EOF" },
      { name: "a clean end while ready", inject: (p) => p.endLive(), source: "eof", reason: "EOF" },
    ];
    for (const c of cases) {
      it(c.name, async () => {
        const { a, b } = twoPools();
        if (c.fault !== undefined) a.faults.push(c.fault);
        const { consumer, events } = start();
        if (c.inject !== undefined) {
          await eventually(() => mirrors(consumer, a));
          c.inject(a);
        }
        await eventually(() => {
          expect(consumer.pool(a.key)?.resubscribes).to.be.at.least(1);
          mirrors(consumer, a);
          mirrors(consumer, b);
        });
        const failure = failuresOf(events, a.key)[0];
        expect(failure).to.deep.include({ source: c.source, reason: c.reason });
        expect(consumer.pool(a.key)?.lastError).to.deep.include({ source: c.source, reason: c.reason });
        // From a snapshot: a second subscription, and a second snapshot installed.
        expect(a.subscriptions).to.equal(2);
        expect(eventsFor(events, a.key).filter((e) => e.type === "ready")).to.have.length(c.fault?.kind === "eof-after-snapshot" || c.inject !== undefined ? 2 : 1);
        // The other pool never noticed.
        expect(failuresOf(events, b.key)).to.deep.equal([]);
        expect(b.subscriptions).to.equal(1);
        expect(consumer.pool(b.key)?.resubscribes).to.equal(0);
        // And the new mirror follows the producer again.
        a.publish(randomImages(random, 16, 4));
        await eventually(() => mirrors(consumer, a));
      });
    }
  });

  it("backs off exponentially, within bounds, and starts over once a snapshot is installed", async () => {
    const { a } = twoPools();
    a.faults.push({ kind: "error", reason: "RESOURCE_LIMIT" }, { kind: "error", reason: "RESOURCE_LIMIT" }, { kind: "error", reason: "RESOURCE_LIMIT" }, { kind: "error", reason: "RESOURCE_LIMIT" });
    const { consumer, events } = start({ backoff: { minMs: 5, maxMs: 25 }, random: () => 0 });
    await eventually(() => mirrors(consumer, a));
    const delays = () => eventsFor(events, a.key).flatMap((e) => (e.type === "invalidated" ? [e.retryInMs] : []));
    // The least of each range: [5, 10], [10, 20], then at the cap [12.5, 25].
    expect(delays()).to.deep.equal([5, 10, 13, 13]);
    expect(consumer.pool(a.key)?.resubscribes).to.equal(4);
    a.pushRaw(deltaPastGap(a));
    await eventually(() => expect(delays()).to.have.length(5));
    expect(delays()[4]).to.equal(5);
    await eventually(() => mirrors(consumer, a));
  });

  it("computes backoff delays within [max(min, top / 2), top], top = min(max, min * 2^(n+1))", () => {
    const options = backoffOptions({ minMs: 100, maxMs: 10_000 });
    expect(backoffDelay(0, options, () => 0)).to.equal(100);
    expect(backoffDelay(0, options, () => 0.999)).to.equal(200);
    expect(backoffDelay(3, options, () => 0.5)).to.equal(1_200);
    expect(backoffDelay(7, options, () => 0)).to.equal(5_000);
    expect(backoffDelay(7, options, () => 0.999)).to.equal(9_995);
    expect(backoffDelay(1_000, options, () => 0.7)).to.equal(8_500);
    expect(backoffOptions()).to.deep.equal({ minMs: 100, maxMs: 10_000 });
    expect(() => backoffOptions({ minMs: 50, maxMs: 10 })).to.throw(RangeError);
    expect(() => backoffOptions({ minMs: -1 })).to.throw(RangeError);
  });

  it("quarantines a pool the relay calls unsupported, only that pool, until its producer changes", async () => {
    const { a, b } = twoPools();
    a.faults.push({ kind: "error", reason: "UNSUPPORTED_FEATURE" });
    const { consumer, events } = start();
    await eventually(() => {
      expect(consumer.pool(a.key)?.state).to.equal("quarantined");
      mirrors(consumer, b);
    });
    expect(consumer.pool(a.key)?.lastError).to.deep.include({ source: "relay", reason: "UNSUPPORTED_FEATURE" });
    expect(events.some((e) => e.type === "quarantined" && e.pool === a.key)).to.equal(true);
    await new Promise((resolve) => setTimeout(resolve, 60));
    expect(a.subscriptions, "no retries while quarantined").to.equal(1);
    expect(consumer.overlap([1, 2, 3, 4], MODEL).map((o) => o.poolKey)).to.deep.equal([b.key]);

    // A new producer generation for the pool: a new replica, subscribed at once.
    const a2 = relay.addPool(new FakePool(producer({ pool: 1, incarnation: 12n }), lane(16), 1n));
    relay.setCatalog([descriptor(a2.producer), descriptor(B)]);
    await eventually(() => mirrors(consumer, a2));
    expect(events.filter((e) => e.type === "catalog").at(-1)).to.deep.include({ replaced: [a.key], added: [], removed: [] });
  });

  it("quarantines an unsupported descriptor and leaves a malformed one out of the catalog", async () => {
    const a = relay.addPool(new FakePool(A, lane(16), 3n));
    const unsupported = descriptorToWire(descriptor(producer({ pool: 3 })));
    unsupported.producer!.ckfFormat = create(CkfFormatSchema, { formatVersion: 1, seed: 5n, bucketCount: 16n, fingerprintBits: 8, slotsPerBucket: 4 });
    const malformed = descriptorToWire(descriptor(producer({ pool: 4 })));
    malformed.poolRoles = [];
    relay.setCatalog([descriptor(A), unsupported, malformed]);
    const { consumer } = start();
    await eventually(() => mirrors(consumer, a));
    const views = consumer.pools();
    expect(views.map((v) => v.key)).to.deep.equal([a.key, poolKey(producer({ pool: 3 }).poolId)]);
    expect(views[1]).to.deep.include({ state: "quarantined", descriptor: undefined });
    expect(views[1]?.lastError).to.deep.include({ source: "descriptor", reason: "UNSUPPORTED_FEATURE" });
    const rejected = consumer.catalog().rejected;
    expect(rejected.map((r) => [r.index, r.key, r.reason])).to.deep.equal([[2, poolKey(producer({ pool: 4 }).poolId), "INVALID_REQUEST"]]);
    expect(relay.subscribeRequests).to.have.length(1);
  });

  it("follows the catalog: withdraws, replaces the producer of a known pool, adds, and refreshes metadata in place", async () => {
    const { a, b } = twoPools();
    const { consumer, events } = start();
    await eventually(() => {
      mirrors(consumer, a);
      mirrors(consumer, b);
    });

    relay.setCatalog([descriptor(A)]);
    await eventually(() => expect(consumer.pools().map((v) => v.key)).to.deep.equal([a.key]));
    expect(events.some((e) => e.type === "withdrawn" && e.pool === b.key)).to.equal(true);
    await eventually(() => expect(b.live.size, "the withdrawn pool's stream is closed").to.equal(0));

    const a2 = new FakePool(producer({ pool: 1, layoutGeneration: 2n }), lane(16), 40n);
    relay.addPool(a2);
    relay.setCatalog([descriptor(a2.producer), descriptor(B)]);
    await eventually(() => {
      mirrors(consumer, a2);
      mirrors(consumer, b);
    });
    expect(events.filter((e) => e.type === "catalog").at(-1)).to.deep.include({ replaced: [a.key], added: [b.key], removed: [] });
    const lastForPool = relay.subscribeRequests.map((r) => producerFromWire(r.expectedProducer)).filter((p) => samePoolId(p.poolId, A.poolId)).at(-1);
    expect(sameProducerIdentity(lastForPool!, a2.producer), "subscribed with the new expected producer").to.equal(true);
    await eventually(() => expect(a.live.size, "the old producer's stream is closed").to.equal(0));

    // Metadata changes keep the replica: no new subscription, the new descriptor is used.
    const subscriptions = a2.subscriptions;
    relay.setCatalog([descriptor(a2.producer, { endpoint: "generate-v2", registrations: [createRegistration(MODEL, [modelAlias("nickname")])] }), descriptor(B)]);
    await eventually(() => expect(consumer.pool(a2.key)?.descriptor?.servingEndpoint.endpoint).to.equal("generate-v2"));
    expect(a2.subscriptions).to.equal(subscriptions);
    expect(consumer.overlap([1, 2, 3, 4], "nickname").map((o) => [o.poolKey, o.endpoint])).to.deep.equal([[a2.key, "ns.backend.generate-v2"]]);
  });

  it("waits for the catalog after PRODUCER_CHANGED and subscribes to the new producer it names", async () => {
    const a2 = relay.addPool(new FakePool(producer({ pool: 1, incarnation: 99n }), lane(16), 7n));
    relay.setCatalog([descriptor(A)]); // the catalog still names the old producer
    const { consumer } = start({ backoff: { minMs: 5_000, maxMs: 5_000 } });
    await eventually(() => expect(consumer.pool(a2.key)).to.deep.include({ state: "backoff" }));
    expect(consumer.pool(a2.key)?.lastError).to.deep.include({ source: "relay", reason: "PRODUCER_CHANGED" });
    relay.setCatalog([descriptor(a2.producer)]);
    await eventually(() => mirrors(consumer, a2), { timeoutMs: 2_000 });
  });

  it("retries at the next catalog update after PUBLICATION_UNAVAILABLE instead of waiting out the backoff", async () => {
    const a = relay.addPool(new FakePool(A, lane(16), 3n));
    a.faults.push({ kind: "error", reason: "PUBLICATION_UNAVAILABLE" });
    relay.setCatalog([descriptor(A)]);
    const { consumer } = start({ backoff: { minMs: 5_000, maxMs: 5_000 } });
    await eventually(() => expect(consumer.pool(a.key)?.state).to.equal("backoff"));
    expect(consumer.pool(a.key)?.retryAt).to.be.a("number");
    relay.setCatalog([descriptor(A)]);
    await eventually(() => mirrors(consumer, a), { timeoutMs: 2_000 });
    expect(consumer.pool(a.key)?.resubscribes).to.equal(1);
  });

  it("stops on CONTRACT_MISMATCH from a pool stream, closing every stream", async () => {
    const { a, b } = twoPools();
    b.faults.push({ kind: "error", reason: "CONTRACT_MISMATCH" });
    const { done, events, consumer } = start();
    const result = await done;
    expect(result.stopped).to.equal("contract-mismatch");
    expect(result.stopped === "contract-mismatch" && result.error).to.deep.include({ source: "relay", reason: "CONTRACT_MISMATCH" });
    expect(events.at(-1)?.type).to.equal("stopped");
    expect(consumer.pools()).to.deep.equal([]);
    await eventually(() => {
      expect(relay.livePoolStreams()).to.equal(0);
      expect(relay.catalogStreams.size).to.equal(0);
    });
    expect(a.subscriptions).to.be.at.most(1);
  });

  it("stops on CONTRACT_MISMATCH from the catalog stream", async () => {
    relay.catalogFaults.push({ kind: "error", reason: "CONTRACT_MISMATCH" });
    const { done } = start();
    const result = await done;
    expect(result.stopped).to.equal("contract-mismatch");
  });

  it("reopens a catalog stream that breaks the envelope or fails, and leaves the pools alone", async () => {
    const { a, b } = twoPools();
    const { consumer, events } = start();
    await eventually(() => {
      mirrors(consumer, a);
      mirrors(consumer, b);
    });
    relay.pushCatalogRaw(relay.catalogUpdate({ contractMarker: 0 }));
    await eventually(() => expect(relay.catalogSubscriptions).to.equal(2));
    relay.pushCatalogRaw(relay.catalogUpdate({ protocolVersion: 2 }));
    await eventually(() => expect(relay.catalogSubscriptions).to.equal(3));
    relay.pushCatalogRaw(create(KvPoolCatalogUpdateSchema, { ...relay.catalogUpdate(), snapshot: undefined }));
    await eventually(() => expect(relay.catalogSubscriptions).to.equal(4));
    relay.catalogFaults.push({ kind: "error", reason: "INTERNAL" });
    relay.pushCatalogRaw(relay.catalogUpdate({ relay: { $typeName: "dynamo.kvrelay.v1.RelayIdentity", drtInstanceId: 5n, relayIncarnation: 5n } }));
    await eventually(() => expect(relay.catalogSubscriptions).to.equal(6));
    await eventually(() => expect(consumer.catalog().connected).to.equal(true));
    const reasons = events.flatMap((e) => (e.type === "catalog-error" ? [e.error.reason] : []));
    expect(reasons).to.deep.equal(["ContractMarker", "ProtocolVersion", "MalformedEnvelope", "RelayDrift", "INTERNAL"]);
    // Pools are independent of the catalog stream: never invalidated, still exact.
    expect(events.some((e) => e.type === "invalidated")).to.equal(false);
    a.publish(randomImages(random, 16, 2));
    await eventually(() => mirrors(consumer, a));
    expect(a.subscriptions).to.equal(1);
  });

  it("closes every stream and resolves when its signal fires", async () => {
    const { a, b } = twoPools();
    const { consumer, controller, done } = start();
    await eventually(() => {
      mirrors(consumer, a);
      mirrors(consumer, b);
    });
    controller.abort();
    expect(await done).to.deep.equal({ stopped: "aborted" });
    expect(consumer.pools()).to.deep.equal([]);
    expect(consumer.catalog().connected).to.equal(false);
    await eventually(() => {
      expect(relay.livePoolStreams()).to.equal(0);
      expect(relay.catalogStreams.size).to.equal(0);
    });
    const again = consumer.run(new AbortController().signal);
    await again.then(
      () => expect.fail("a consumer runs once"),
      (error: unknown) => expect(error).to.be.instanceOf(Error),
    );
  });

  it("answers overlap queries from every ready pool that serves the model", async () => {
    const state = new DcCkfState({ expectedBlocksPerDc: 64 });
    const prompt = Array.from({ length: 23 }, (_, i) => 1_000 + i * 3);
    const hashes = computeBlockHashForSeq(prompt, 4).slice(0, 3);
    state.applyEvent({ workerId: 1n, dpRank: 0, eventId: 1n, data: { kind: "stored", blocks: hashes.map((tokensHash, i) => ({ blockHash: 50n + BigInt(i), tokensHash })) } });
    const format = state.format();
    const id: ProducerIdentity = producer({ pool: 5, dcId: 12n, seed: format.seed, bucketCount: format.bucketCount });
    const pool = relay.addPool(new FakePool(id, state.words().slice(), 21n));
    const other = relay.addPool(new FakePool(A, lane(16), 3n));
    relay.setCatalog([
      descriptor(id, { registrations: [createRegistration(MODEL, [modelAlias("alias")])] }),
      descriptor(A, { registrations: [createRegistration(canonicalModelId("other-model"))] }),
    ]);
    const { consumer } = start();
    await eventually(() => {
      mirrors(consumer, pool);
      mirrors(consumer, other);
    });
    expect(consumer.overlap(prompt, "alias")).to.deep.equal([
      {
        poolKey: pool.key,
        relay: "fake-relay",
        dcId: 12n,
        endpoint: "ns.backend.generate",
        matchedBlocks: 3,
        totalBlocks: 5,
        blockSize: 4,
        sequence: 21n,
        canonicalModelId: MODEL,
      },
    ]);
    expect(consumer.overlap(prompt, "unknown-model")).to.deep.equal([]);
    expect(consumer.overlap(prompt, "other-model").map((o) => o.poolKey)).to.deep.equal([other.key]);
  });

  it("validates its subscriber id", () => {
    for (const subscriberId of ["", "bad\nid", "x".repeat(129)]) {
      expect(() => new RelayConsumer({ transport: relay.transport, subscriberId }), JSON.stringify(subscriberId)).to.throw().that.satisfies((e: unknown) => isRelayError(e, "INVALID_REQUEST"));
    }
    expect(new RelayConsumer({ transport: relay.transport }).subscriberId).to.match(/^mmgate-consumer-[0-9a-f]{12}$/);
    expect(() => new RelayConsumer({ transport: relay.transport, backoff: { minMs: 10, maxMs: 5 } })).to.throw(RangeError);
  });
});

/** A delta that skips one sequence past the pool's current one. */
function deltaPastGap(pool: FakePool) {
  return deltaUpdate(pool.producer, pool.sequence + 1n, [{ bucket: 1, value: 1n }]);
}
