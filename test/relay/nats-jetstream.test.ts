/**
 * The NATS source reading a JetStream stream, against a real nats-server
 * with JetStream on: events published while no relay runs, a relay
 * restarted mid-stream, duplicates and redeliveries, malformed messages.
 * Filters are compared word for word with a DcCkfState fed every event once,
 * in stream order.
 */
import { createHash } from "node:crypto";
import { expect } from "chai";
import { connect, type JetStreamClient, type JetStreamManager, type NatsConnection } from "nats";
import { Registry } from "prom-client";
import { DcCkfState, routerEventFromJson, type RouterEvent } from "../../src/kv/index.js";
import {
  EventKeyWindow,
  JETSTREAM_DEFAULTS,
  NatsEventSource,
  natsSourceConfigSchema,
  routerEventMessageId,
  type NatsSourceConfigInput,
} from "../../src/relay/nats/index.js";
import { WorkSlicer } from "../../src/util/index.js";
import { eventually, metricValue, prng, requireNats, startNats, type NatsServer } from "../support/index.js";
import { startRelay, type RelayServer } from "./service/support.js";

const WAIT = { timeoutMs: 15_000, intervalMs: 10 };
const EXPECTED_BLOCKS = 4096;

function issues(raw: unknown): string[] {
  const parsed = natsSourceConfigSchema.safeParse(raw);
  return parsed.success ? [] : parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`);
}

describe("relay: the jetstream part of natsSourceConfigSchema", () => {
  it("is absent by default, and `jetstream: {}` takes every named default", () => {
    expect(natsSourceConfigSchema.parse({ subject: "kv.events" })).to.not.have.property("jetstream");
    expect(natsSourceConfigSchema.parse({ subject: "kv.events", jetstream: {} }).jetstream).to.deep.equal({
      stream: JETSTREAM_DEFAULTS.stream,
      durable: JETSTREAM_DEFAULTS.durable,
      createStream: {
        enabled: true,
        maxAgeMs: 86_400_000,
        maxBytes: 1024 * 1024 * 1024,
        duplicateWindowMs: 120_000,
        storage: "file",
        replicas: 1,
      },
      ackWaitMs: 30_000,
      maxAckPending: 1024,
      deliverPolicy: "all",
      dedupeWindow: 65_536,
    });
  });

  it("names the field of each error", () => {
    const js = (jetstream: Record<string, unknown>, extra: Record<string, unknown> = {}) => issues({ subject: "kv.>", jetstream, ...extra });
    expect(js({}, { queue: "relays" })).to.deep.equal(["queue: a queue group is for core NATS: with jetstream, every relay reads the whole stream through a durable of its own"]);
    expect(js({ stream: "a.b" })[0]).to.match(/^jetstream\.stream: /);
    expect(js({ durable: "has space" })[0]).to.match(/^jetstream\.durable: /);
    expect(js({ filterSubject: "a..b" })[0]).to.match(/^jetstream\.filterSubject: not a NATS subject/);
    expect(js({ maxAckPending: 0 })[0]).to.match(/^jetstream\.maxAckPending: /);
    expect(js({ maxAckPending: 65_537 })[0]).to.match(/^jetstream\.maxAckPending: /);
    expect(js({ ackWaitMs: 999 })[0]).to.match(/^jetstream\.ackWaitMs: /);
    expect(js({ deliverPolicy: "last" })[0]).to.match(/^jetstream\.deliverPolicy: /);
    expect(js({ dedupeWindow: -1 })[0]).to.match(/^jetstream\.dedupeWindow: /);
    expect(js({ createStream: { maxAgeMs: 60_000 } })).to.deep.equal(["jetstream.createStream.duplicateWindowMs: the duplicate window cannot be longer than maxAgeMs"]);
    expect(js({ createStream: { subjects: [] } })[0]).to.match(/^jetstream\.createStream\.subjects: /);
    expect(js({ createStream: { storage: "disk" } })[0]).to.match(/^jetstream\.createStream\.storage: /);
    expect(js({ extra: 1 })).to.have.length(1);
    expect(js({ createStream: { maxAgeMs: 0, maxBytes: 0, enabled: false, subjects: ["kv.>", "other.*"] }, filterSubject: "kv.a.>", dedupeWindow: 0 })).to.deep.equal([]);
  });
});

describe("relay: EventKeyWindow", () => {
  const ev = (workerId: bigint, dpRank: number, eventId: bigint): RouterEvent => ({ workerId, dpRank, eventId, data: { kind: "cleared" } });

  it("drops a key it holds, tells worker, rank and id apart, and forgets the oldest past its capacity", () => {
    const window = new EventKeyWindow(3);
    expect(window.admit(ev(1n, 0, 1n))).to.equal(true);
    expect(window.admit(ev(1n, 0, 1n))).to.equal(false);
    expect(window.admit(ev(1n, 1, 1n))).to.equal(true);
    expect(window.admit(ev(2n, 0, 1n))).to.equal(true);
    expect(window.size).to.equal(3);
    // A fourth key evicts the first: memory stays at the capacity.
    expect(window.admit(ev(1n, 0, 2n))).to.equal(true);
    expect(window.size).to.equal(3);
    expect(window.admit(ev(1n, 0, 1n))).to.equal(true);
    expect(window.admit(ev(2n, 0, 1n))).to.equal(false);
  });

  it("admits everything with capacity 0", () => {
    const window = new EventKeyWindow(0);
    expect(window.admit(ev(1n, 0, 1n))).to.equal(true);
    expect(window.admit(ev(1n, 0, 1n))).to.equal(true);
    expect(window.size).to.equal(0);
  });

  it("routerEventMessageId is the event's key", () => {
    expect(routerEventMessageId({ workerId: 18446744073709551615n, dpRank: 3, eventId: 7n })).to.equal("18446744073709551615-3-7");
  });
});

/** One event of a workload: its JSON line and the event it reads as. */
interface WorkloadEvent {
  readonly line: string;
  readonly event: RouterEvent;
}

/**
 * A deterministic workload over 3 workers x 2 ranks: chained Stored runs,
 * Removed blocks (some of them parents of later runs, which the filter then
 * rejects), the odd Cleared; event ids count up per (worker, rank).
 */
function workload(count: number, seed: number, firstBlock = 1_000_000): WorkloadEvent[] {
  const random = prng(seed);
  const u64 = () => (BigInt(Math.floor(random() * 2 ** 32)) << 32n) | BigInt(Math.floor(random() * 2 ** 32));
  const ranks = new Map<string, { nextId: number; live: bigint[] }>();
  let nextBlock = BigInt(firstBlock);
  const out: WorkloadEvent[] = [];
  for (let i = 0; i < count; i++) {
    const worker = 1 + Math.floor(random() * 3);
    const rank = Math.floor(random() * 2);
    const key = `${worker}:${rank}`;
    const state = ranks.get(key) ?? { nextId: 1, live: [] };
    ranks.set(key, state);
    const id = state.nextId++;
    const roll = random();
    let data: string;
    if (roll < 0.7 || state.live.length === 0) {
      const parent = state.live.length > 0 && random() < 0.7 ? state.live[state.live.length - 1]! : undefined;
      const blocks: string[] = [];
      const n = 1 + Math.floor(random() * 3);
      for (let b = 0; b < n; b++) {
        const hash = nextBlock++;
        blocks.push(`{"block_hash":${hash},"tokens_hash":"${u64()}"}`);
        state.live.push(hash);
      }
      data = `{"stored":{"parent_hash":${parent === undefined ? "null" : String(parent)},"blocks":[${blocks.join(",")}]}}`;
    } else if (roll < 0.96) {
      const removed = state.live.splice(Math.floor(random() * state.live.length), 1);
      data = `{"removed":{"block_hashes":[${removed.join(",")}]}}`;
    } else {
      state.live = [];
      data = `"cleared"`;
    }
    const line = `{"worker_id":${worker},"event":{"event_id":${id},"dp_rank":${rank},"data":${data}}}`;
    out.push({ line, event: routerEventFromJson(line) });
  }
  return out;
}

/** A filter fed `events` directly, once each, in order: what the relay's must equal. */
function truthOf(events: readonly RouterEvent[]): DcCkfState {
  const state = new DcCkfState({ expectedBlocksPerDc: EXPECTED_BLOCKS });
  for (const event of events) state.applyEvent(event);
  return state;
}

function digest(words: BigUint64Array): string {
  return createHash("sha256").update(Buffer.from(words.buffer, words.byteOffset, words.byteLength)).digest("hex");
}

describe("relay: NatsEventSource on JetStream", function () {
  this.timeout(60_000);
  let server: NatsServer;
  let nc: NatsConnection;
  let js: JetStreamClient;
  let jsm: JetStreamManager;
  let seq = 0;
  let subject: string;
  let stream: string;
  const cleanup: (() => Promise<void>)[] = [];

  before(async function () {
    requireNats(this);
    server = await startNats({ jetstream: true });
    nc = await connect({ servers: server.url, reconnectTimeWait: 50, maxReconnectAttempts: -1 });
    js = nc.jetstream();
    jsm = await nc.jetstreamManager();
  });
  after(async () => {
    await nc?.close();
    await server?.stop();
  });
  beforeEach(() => {
    seq += 1;
    subject = `kv.js${seq}.events`;
    stream = `KV_JS_${seq}`;
  });
  afterEach(async () => {
    for (const fn of cleanup.splice(0).reverse()) await fn();
  });

  /** Publishes each line as one message, with its event's Nats-Msg-Id unless told otherwise; waits for every ack. */
  async function publish(events: readonly (WorkloadEvent | string)[], options: { msgId?: boolean } = {}): Promise<void> {
    const acks = events.map((e) =>
      typeof e === "string" ? js.publish(subject, e) : js.publish(subject, e.line, options.msgId === false ? {} : { msgID: routerEventMessageId(e.event) }),
    );
    await Promise.all(acks);
  }

  /** Creates the test's stream as an operator would, before any relay runs. */
  async function createStream(): Promise<void> {
    await jsm.streams.add({ name: stream, subjects: [subject] });
  }

  interface Running {
    readonly source: NatsEventSource;
    readonly state: DcCkfState;
    /** Events the sink received. */
    readonly received: RouterEvent[];
    stop(): Promise<void>;
    /** Runs the same source again (its position and duplicate window kept). */
    restart(): Promise<void>;
  }

  /**
   * A source on the test's stream whose sink applies events to a DcCkfState
   * in steps through the source's slicer, as the relay's pools do.
   */
  async function run(
    jetstream: Record<string, unknown> = {},
    options: { registry?: Registry; config?: Partial<NatsSourceConfigInput>; sink?: (event: RouterEvent, state: DcCkfState) => unknown } = {},
  ): Promise<Running> {
    const state = new DcCkfState({ expectedBlocksPerDc: EXPECTED_BLOCKS });
    const received: RouterEvent[] = [];
    const slicer = new WorkSlicer();
    const source = new NatsEventSource(
      { servers: [server.url], subject, reconnectWaitMs: 50, ...options.config, jetstream: { stream, durable: `relay-${seq}`, ...jetstream } },
      (event) => {
        received.push(event);
        return options.sink === undefined ? state.applyEventInSteps(event, slicer.due) : options.sink(event, state);
      },
      { slicer, ...(options.registry === undefined ? {} : { registry: options.registry }) },
    );
    let controller = new AbortController();
    let done = source.run(controller.signal);
    done.catch(() => undefined);
    const stop = async () => {
      controller.abort();
      await done;
    };
    const restart = async () => {
      await stop();
      controller = new AbortController();
      done = source.run(controller.signal);
      done.catch(() => undefined);
      await eventually(() => expect(source.stats().connected).to.equal(true), WAIT);
    };
    cleanup.push(() => stop().catch(() => undefined));
    await eventually(() => expect(source.stats().connected).to.equal(true), WAIT);
    return { source, state, received, stop, restart };
  }

  async function consumerInfo(durable = `relay-${seq}`) {
    return jsm.consumers.info(stream, durable);
  }

  it("applies the events published while no relay ran once it starts, each once, and acks them all", async () => {
    await createStream();
    const events = workload(300, 1);
    await publish(events);
    const registry = new Registry();
    const { source, state, received } = await run({}, { registry });
    const truth = truthOf(events.map((e) => e.event));
    await eventually(() => expect(digest(state.words())).to.equal(digest(truth.words())), WAIT);
    expect(received).to.have.length(300);
    await eventually(async () => {
      const info = await consumerInfo();
      expect(info.ack_floor.stream_seq).to.equal(300);
      expect(info.num_ack_pending).to.equal(0);
    }, WAIT);
    expect(source.stats().jetstream).to.deep.include({ acked: 300, terminated: 0, duplicateMessages: 0, duplicateEvents: 0, pending: 0, appliedSequence: 300 });
    expect(await metricValue(registry, "mmgate_relay_nats_jetstream_acked_total")).to.equal(300);
    expect(await metricValue(registry, "mmgate_relay_nats_jetstream_pending", { stream, consumer: `relay-${seq}` })).to.equal(0);
    expect(await metricValue(registry, "mmgate_relay_nats_messages_total")).to.equal(300);
  });

  it("creates a missing stream with the configured limits, and the stream drops a re-sent Nats-Msg-Id", async () => {
    await run({ createStream: { maxAgeMs: 3_600_000, maxBytes: 1_048_576, duplicateWindowMs: 60_000, storage: "memory" } });
    const info = await jsm.streams.info(stream);
    expect(info.config).to.deep.include({ subjects: [subject], retention: "limits", storage: "memory", discard: "old", max_bytes: 1_048_576, max_age: 3_600_000 * 1e6, duplicate_window: 60_000 * 1e6 });
    const [event] = workload(1, 2);
    const first = await js.publish(subject, event!.line, { msgID: routerEventMessageId(event!.event) });
    const again = await js.publish(subject, event!.line, { msgID: routerEventMessageId(event!.event) });
    expect(first.duplicate).to.equal(false);
    expect(again).to.deep.include({ duplicate: true, seq: first.seq });
    expect((await jsm.streams.info(stream)).state.messages).to.equal(1);
  });

  it("refuses to start when another stream holds the subject: the create's refusal, after one more look for the stream", async () => {
    // A create refused as a name in use or as overlapping subjects is taken for another relay's create of the same
    // stream (relays starting together race), and the stream is looked up again; here it is still missing.
    await jsm.streams.add({ name: `OTHER_${seq}`, subjects: [subject] });
    const source = new NatsEventSource({ servers: [server.url], subject, jetstream: { stream } }, () => undefined);
    const error = await source.run(new AbortController().signal).then(
      () => undefined,
      (failure: unknown) => failure,
    );
    expect(String(error)).to.match(new RegExp(`failed: cannot create JetStream stream ${stream}: subjects overlap with an existing stream$`));
    expect(source.stats().connected).to.equal(false);
  });

  it("a run of the same source after a stop resumes after the last message it applied (where it acked)", async () => {
    const events = workload(400, 3);
    const running = await run();
    await publish(events.slice(0, 200));
    await eventually(() => expect(running.source.stats().jetstream?.appliedSequence).to.equal(200), WAIT);
    await running.stop();
    await publish(events.slice(200));
    await running.restart();
    const truth = truthOf(events.map((e) => e.event));
    await eventually(() => expect(digest(running.state.words())).to.equal(digest(truth.words())), WAIT);
    // Nothing applied twice, nothing delivered again.
    expect(running.received).to.have.length(400);
    await eventually(async () => expect((await consumerInfo()).ack_floor.stream_seq).to.equal(400), WAIT);
    expect(running.source.stats().jetstream).to.deep.include({ acked: 400, duplicateMessages: 0, duplicateEvents: 0, appliedSequence: 400 });
  });

  it("drops an event stored twice (no Nats-Msg-Id) by (worker, dp_rank, event_id): the filter is as if it came once", async () => {
    const stored = `{"worker_id":7,"event":{"event_id":1,"dp_rank":2,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":11,"tokens_hash":"18446744073709551557"}]}}}}`;
    const removed = `{"worker_id":7,"event":{"event_id":2,"dp_rank":2,"data":{"removed":{"block_hashes":[11]}}}}`;
    const other = `{"worker_id":7,"event":{"event_id":1,"dp_rank":3,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":12,"tokens_hash":5}]}}}}`;
    const registry = new Registry();
    const { source, state, received } = await run({}, { registry });
    // The Stored event comes again after its block was removed: applied twice, the block would be back.
    await publish([stored, removed, stored, other]);
    const once = truthOf([stored, removed, other].map((line) => routerEventFromJson(line)));
    const twice = truthOf([stored, removed, stored, other].map((line) => routerEventFromJson(line)));
    expect(digest(once.words()), "the duplicate changes a filter fed it").to.not.equal(digest(twice.words()));
    await eventually(() => expect(source.stats().jetstream?.appliedSequence).to.equal(4), WAIT);
    expect(digest(state.words())).to.equal(digest(once.words()));
    expect(state.occupancy()).to.deep.equal({ uniqueBlocks: 1, members: 1 });
    expect(received.map((e) => `${e.dpRank}:${e.eventId}`)).to.deep.equal(["2:1", "2:2", "3:1"]);
    // Acks go out at the end of the turn that applied the messages.
    await eventually(() => expect(source.stats().jetstream).to.deep.include({ acked: 4, duplicateEvents: 1 }), WAIT);
    expect(await metricValue(registry, "mmgate_relay_nats_jetstream_duplicate_events_total")).to.equal(1);
  });

  it("a message redelivered after ackWait (it was still being applied) is acked again and not applied twice", async () => {
    const events = workload(3, 4);
    let released = false;
    const registry = new Registry();
    // The first event waits, step after step, until the test releases it; by then the server has redelivered.
    const { source, state, received } = await run(
      { ackWaitMs: 1000, maxAckPending: 8 },
      {
        registry,
        sink: (event, target) =>
          (function* () {
            while (!released) yield;
            return target.applyEvent(event);
          })(),
      },
    );
    await publish(events);
    await eventually(async () => expect((await consumerInfo()).num_redelivered).to.be.greaterThan(0), WAIT);
    released = true;
    const truth = truthOf(events.map((e) => e.event));
    await eventually(() => expect(source.stats().jetstream?.appliedSequence).to.equal(3), WAIT);
    await eventually(async () => {
      const info = await consumerInfo();
      expect(info.num_ack_pending).to.equal(0);
      expect(info.ack_floor.stream_seq).to.equal(3);
    }, WAIT);
    const stats = source.stats().jetstream!;
    expect(stats.redelivered).to.be.greaterThan(0);
    expect(stats.duplicateMessages).to.equal(stats.redelivered);
    expect(received).to.have.length(3);
    expect(digest(state.words())).to.equal(digest(truth.words()));
    expect(await metricValue(registry, "mmgate_relay_nats_jetstream_redelivered_total")).to.equal(stats.redelivered);
    expect(await metricValue(registry, "mmgate_relay_nats_jetstream_duplicate_messages_total")).to.equal(stats.duplicateMessages);
  });

  it("terminates a malformed or oversized message, counts and goes on: the stream does not stall on it", async () => {
    const events = workload(4, 5);
    const registry = new Registry();
    const { source, state } = await run({}, { registry, config: { maxPayloadBytes: 1024 } });
    const big = `{"worker_id":1,"event":{"event_id":99,"data":{"removed":{"block_hashes":[${Array.from({ length: 200 }, (_, i) => 10_000 + i).join(",")}]}}}}`;
    await publish([events[0]!, "{not json", events[1]!, big, `{"worker_id":1}`, events[2]!, events[3]!]);
    const truth = truthOf(events.map((e) => e.event));
    await eventually(() => expect(source.stats().jetstream?.appliedSequence).to.equal(7), WAIT);
    expect(digest(state.words())).to.equal(digest(truth.words()));
    await eventually(async () => {
      const info = await consumerInfo();
      expect(info.ack_floor.stream_seq).to.equal(7);
      expect(info.num_ack_pending).to.equal(0);
      expect(info.num_redelivered).to.equal(0);
    }, WAIT);
    const stats = source.stats();
    expect(stats.jetstream).to.deep.include({ acked: 4, terminated: 3 });
    expect(stats.rejected).to.deep.include({ NOT_JSON: 1, TOO_LARGE: 1, MISSING: 1 });
    expect(await metricValue(registry, "mmgate_relay_nats_jetstream_terminated_total")).to.equal(3);
    expect(await metricValue(registry, "mmgate_relay_nats_rejected_total", { code: "NOT_JSON" })).to.equal(1);
  });

  it("survives a nats-server restart mid-stream (the stream on disk): the filter equals one fed every event", async () => {
    // maxAckPending 16 and the default 30 s ackWait: acks lost with the server would hold the consumer for 30 s without a reposition.
    const events = workload(600, 6);
    const running = await run({ maxAckPending: 16 });
    await publish(events.slice(0, 300));
    await eventually(() => expect(running.source.stats().jetstream?.appliedSequence).to.be.greaterThan(0), WAIT);
    await server.halt();
    await server.restart();
    await eventually(() => expect(running.source.stats().connected).to.equal(true), WAIT);
    await eventually(() => publish(events.slice(300)), WAIT);
    const truth = truthOf(events.map((e) => e.event));
    await eventually(() => expect(digest(running.state.words())).to.equal(digest(truth.words())), WAIT);
    await eventually(() => expect(running.source.stats().jetstream?.appliedSequence).to.equal(600), WAIT);
    expect(running.received.length - running.source.stats().jetstream!.duplicateEvents).to.equal(600);
    // The reconnect restarted the consumer after the last applied message rather than wait out ackWait for lost acks.
    expect(running.source.stats().jetstream!.repositions).to.be.greaterThan(0);
  });

  it("refuses to start without the stream when creating it is off, and the run rejects", async () => {
    const source = new NatsEventSource({ servers: [server.url], subject, jetstream: { stream, createStream: { enabled: false } } }, () => undefined);
    const controller = new AbortController();
    let error: unknown;
    try {
      await source.run(controller.signal);
    } catch (e) {
      error = e;
    }
    expect(String(error)).to.match(new RegExp(`NatsSourceError: NATS JetStream source \\(stream ${stream}\\) failed: JetStream stream ${stream} does not exist \\(createStream.enabled is off\\)`));
    expect(source.stats().connected).to.equal(false);
  });

  it("deliverPolicy new: a relay process starts after what the stream held", async () => {
    await createStream();
    const events = workload(20, 8);
    await publish(events.slice(0, 10));
    const { source, received } = await run({ deliverPolicy: "new" });
    expect(source.stats().jetstream?.appliedSequence).to.equal(10);
    await publish(events.slice(10));
    await eventually(() => expect(received).to.have.length(10), WAIT);
    expect(received).to.deep.equal(events.slice(10).map((e) => e.event));
  });

  it("rejects when the server has no JetStream", async () => {
    const core = await startNats();
    try {
      const source = new NatsEventSource({ servers: [core.url], subject, jetstream: {} }, () => undefined);
      let error: unknown;
      try {
        await source.run(new AbortController().signal);
      } catch (e) {
        error = e;
      }
      expect(String(error)).to.match(/NatsSourceError: NATS JetStream source \(stream MMGATE_KV_EVENTS\) failed: JetStream is not available on the server/);
    } finally {
      await core.stop();
    }
  });

  describe("in the relay", () => {
    let relay: RelayServer | undefined;
    afterEach(async () => {
      await relay?.close();
      relay = undefined;
    });

    const relayConfig = () => ({
      pools: [
        {
          name: "default",
          expectedBlocks: EXPECTED_BLOCKS,
          nats: { servers: [server.url], subject, reconnectWaitMs: 50, jetstream: { stream, durable: "relay-a" } },
        },
      ],
    });

    it("a relay restarted mid-stream rebuilds its filter from the stream: equal to one fed every event once", async () => {
      const events = workload(2000, 7);
      relay = await startRelay(relayConfig());
      const first = relay.relay.pool("default")!;
      // The relay creates the stream; then half the events, and the relay stops while it applies them.
      await eventually(async () => expect((await jsm.streams.info(stream)).config.subjects).to.deep.equal([subject]), WAIT);
      await publish(events.slice(0, 1000));
      await eventually(() => expect(first.stats().eventsApplied + first.stats().eventsRejected).to.be.greaterThan(0), WAIT);
      await relay.close();
      relay = undefined;
      // The rest while no relay runs.
      await publish(events.slice(1000));
      relay = await startRelay(relayConfig());
      const pool = relay.relay.pool("default")!;
      const truth = truthOf(events.map((e) => e.event));
      await eventually(() => expect(digest(pool.words())).to.equal(digest(truth.words())), WAIT);
      // Each event applied once: the counts of the new pool are those of the truth's single pass.
      const stats = pool.stats();
      expect(stats.eventsApplied + stats.eventsRejected).to.equal(2000);
      expect(pool.occupancy().uniqueBlocks).to.equal(truth.occupancy().uniqueBlocks);
      const host = relay;
      await eventually(async () => {
        const metrics = await (await fetch(`http://${host.adminAddr}/metrics`)).text();
        expect(metrics).to.match(/^mmgate_relay_nats_jetstream_acked_total 2000$/m);
        expect(metrics).to.match(new RegExp(`^mmgate_relay_nats_jetstream_pending\\{stream="${stream}",consumer="relay-a"\\} 0$`, "m"));
        expect(metrics).to.match(/^mmgate_relay_nats_jetstream_duplicate_events_total 0$/m);
        expect(metrics).to.match(/^mmgate_relay_nats_jetstream_redelivered_total 0$/m);
      }, WAIT);
    });
  });
});
