import { Writable } from "node:stream";
import { expect } from "chai";
import { connect, type NatsConnection } from "nats";
import pino from "pino";
import { Registry } from "prom-client";
import type { RouterEvent } from "../../src/kv/index.js";
import { NatsEventSource, NatsSourceError, natsSourceConfigSchema, type NatsSourceConfigInput } from "../../src/relay/nats/index.js";
import { eventually, requireNats, startNats, type NatsServer } from "../support/index.js";

const WAIT = { timeoutMs: 5000, intervalMs: 5 };

function issues(raw: unknown): string[] {
  const parsed = natsSourceConfigSchema.safeParse(raw);
  return parsed.success ? [] : parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`);
}

describe("relay: natsSourceConfigSchema", () => {
  it("defaults everything but the subject", () => {
    expect(natsSourceConfigSchema.parse({ subject: "kv.events" })).to.deep.equal({
      servers: ["127.0.0.1:4222"],
      subject: "kv.events",
      maxPayloadBytes: 1024 * 1024,
      maxPendingBytes: 64 * 1024 * 1024,
      name: "mmgate-relay",
      reconnectWaitMs: 1000,
      connectTimeoutMs: 5000,
    });
  });

  it("takes wildcards, queue groups, nats:// URLs and credentials", () => {
    for (const subject of ["kv.*.events", "kv.>", ">", "*", "namespace.dynamo.component.backend.kv_events"]) {
      expect(issues({ subject }), subject).to.deep.equal([]);
    }
    expect(issues({ subject: "s", servers: ["nats://10.0.0.1:4222", "[::1]:4222", "nats.local:4222", "nats://h"], queue: "relays", user: "u", pass: "p" })).to.deep.equal([]);
    expect(issues({ subject: "s", token: "t" })).to.deep.equal([]);
  });

  it("names the field of each error", () => {
    for (const subject of ["", "a..b", ".a", "a.", "a.>.b", "a b", "a.b*", "a.>x", "a\tb"]) {
      expect(issues({ subject }), JSON.stringify(subject)).to.have.length(1);
      expect(issues({ subject })[0], subject).to.match(/^subject: not a NATS subject: /);
    }
    expect(issues({ subject: "s", servers: ["http://h:1", "nope", "nats://u:p@h:1", "nats://h:1/x", "h:70000"] }).map((i) => i.split(":")[0])).to.deep.equal([
      "servers.0",
      "servers.1",
      "servers.2",
      "servers.3",
      "servers.4",
    ]);
    expect(issues({ subject: "s", servers: [] })[0]).to.match(/^servers: /);
    expect(issues({ subject: "s", queue: "a b" })[0]).to.match(/^queue: /);
    expect(issues({ subject: "s", maxPayloadBytes: 1024 * 1024 + 1 })[0]).to.match(/^maxPayloadBytes: /);
    expect(issues({ subject: "s", user: "u" })).to.deep.equal(["pass: user and pass go together"]);
    expect(issues({ subject: "s", token: "t", user: "u", pass: "p" })).to.deep.equal(["token: token and user/pass exclude each other"]);
    expect(issues({ subject: "s", extra: 1 })).to.have.length(1);
    expect(issues({})[0]).to.match(/^subject: /);
  });
});

/** Lines a pino logger writes, parsed. */
function capturingLogger(): { logger: pino.Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString().split("\n")) if (line !== "") lines.push(JSON.parse(line) as Record<string, unknown>);
      done();
    },
  });
  return { logger: pino({ level: "info" }, stream), lines };
}

const stored = (workerId: number, eventId: number, blockHash: string, tokensHash: string, parent = "null") =>
  `{"worker_id":${workerId},"event":{"event_id":${eventId},"dp_rank":0,"data":{"stored":{"parent_hash":${parent},"blocks":[{"block_hash":${blockHash},"tokens_hash":${tokensHash}}]}}}}`;
const cleared = (workerId: number, eventId: number) => `{"worker_id":${workerId},"event":{"event_id":${eventId},"data":"cleared"}}`;

describe("relay: NatsEventSource", function () {
  this.timeout(20000);
  let server: NatsServer;
  let publisher: NatsConnection;
  let seq = 0;
  let subject: string;
  const cleanup: (() => Promise<void>)[] = [];

  before(async function () {
    requireNats(this);
    server = await startNats();
    publisher = await connect({ servers: server.url, reconnectTimeWait: 50, maxReconnectAttempts: -1 });
  });
  after(async () => {
    await publisher?.close();
    await server?.stop();
  });
  beforeEach(() => {
    subject = `kv.events.t${++seq}`;
  });
  afterEach(async () => {
    for (const fn of cleanup.splice(0).reverse()) await fn();
  });

  interface Running {
    readonly source: NatsEventSource;
    readonly events: RouterEvent[];
    readonly done: Promise<void>;
    stop(): Promise<void>;
  }

  /** Runs a source on the test's subject and waits until the server has its subscription. */
  async function run(config: Partial<NatsSourceConfigInput> = {}, options: { sink?: (e: RouterEvent) => void; logger?: pino.Logger; registry?: Registry } = {}): Promise<Running> {
    const events: RouterEvent[] = [];
    const source = new NatsEventSource({ servers: [server.url], subject, reconnectWaitMs: 50, ...config }, options.sink ?? ((e) => events.push(e)), options);
    const controller = new AbortController();
    const done = source.run(controller.signal);
    // A run that fails is the test's to see through `done`; keep it from being unhandled meanwhile.
    done.catch(() => undefined);
    const stop = async () => {
      controller.abort();
      await done;
    };
    cleanup.push(() => stop().catch(() => undefined));
    await eventually(() => expect(source.stats().connected).to.equal(true), WAIT);
    return { source, events, done, stop };
  }

  async function publish(...payloads: (string | Uint8Array)[]): Promise<void> {
    for (const payload of payloads) publisher.publish(subject, payload);
    await publisher.flush();
  }

  it("hands each event on exactly: u64 above 2^53, null parent, removed, cleared, tiers and domains", async () => {
    const { source, events } = await run();
    await publish(
      stored(1, 1, "900000", "9143094415614847814"),
      `{"worker_id":18446744073709551615,"storage_tier":"host_pinned","event":{"event_id":"9007199254740993","dp_rank":3,"data":{"stored":{"parent_hash":"18446744073709551615","start_position":4,"blocks":[{"block_hash":9007199254740993,"tokens_hash":1}]}}}}`,
      `{"worker_id":1,"event":{"event_id":2,"dp_rank":0,"data":{"removed":{"block_hashes":[900000,18446744073709551614]}}}}`,
      `{"worker_id":1,"residency_domain":"cache_owner","event":{"event_id":3,"data":{"cleared":null}}}`,
      cleared(1, 4),
    );
    await eventually(() => expect(events).to.have.length(5), WAIT);
    expect(events).to.deep.equal([
      { workerId: 1n, dpRank: 0, eventId: 1n, data: { kind: "stored", blocks: [{ blockHash: 900000n, tokensHash: 9143094415614847814n }] } },
      {
        workerId: 18446744073709551615n,
        dpRank: 3,
        eventId: 9007199254740993n,
        storageTier: "host_pinned",
        data: { kind: "stored", parentHash: 18446744073709551615n, startPosition: 4, blocks: [{ blockHash: 9007199254740993n, tokensHash: 1n }] },
      },
      { workerId: 1n, dpRank: 0, eventId: 2n, data: { kind: "removed", blockHashes: [900000n, 18446744073709551614n] } },
      { workerId: 1n, dpRank: 0, eventId: 3n, residencyDomain: "cache_owner", data: { kind: "cleared" } },
      { workerId: 1n, dpRank: 0, eventId: 4n, data: { kind: "cleared" } },
    ]);
    expect(source.stats()).to.deep.include({ messages: 5, events: 5, sinkErrors: 0, connected: true });
  });

  it("reads JSON lines and keeps message order across single events and batches", async () => {
    const { source, events } = await run();
    const payloads: string[] = [];
    let id = 0;
    for (let m = 0; m < 200; m++) {
      if (m % 3 === 0) {
        const lines = [stored(7, ++id, String(id), "9223372036854775809"), cleared(7, ++id), stored(7, ++id, String(id), "1", String(id - 2))];
        payloads.push(m % 2 === 0 ? lines.join("\n") + "\n" : lines.join("\r\n"));
      } else {
        payloads.push(cleared(7, ++id));
      }
    }
    // A pretty-printed event is still one JSON document.
    payloads.push(JSON.stringify(JSON.parse(cleared(7, ++id)), null, 2));
    await publish(...payloads);
    await eventually(() => expect(events).to.have.length(id), WAIT);
    expect(events.map((e) => e.eventId)).to.deep.equal(Array.from({ length: id }, (_, i) => BigInt(i + 1)));
    expect(events[0]!.data).to.deep.equal({ kind: "stored", blocks: [{ blockHash: 1n, tokensHash: 9223372036854775809n }] });
    expect(source.stats()).to.deep.include({ messages: 201, events: id });
  });

  it("drops oversize and malformed messages, counted by code and logged at most once a second, and goes on", async () => {
    const { logger, lines } = capturingLogger();
    const registry = new Registry();
    const { source, events } = await run({ maxPayloadBytes: 512 }, { logger, registry });
    const big = `{"worker_id":1,"event":{"event_id":1,"data":{"removed":{"block_hashes":[${Array(300).fill("1").join(",")}]}}}}`;
    expect(big.length).to.be.greaterThan(512);
    await publish(
      big,
      "not json",
      new Uint8Array([0x7b, 0xff, 0xfe, 0x7d]),
      "",
      `{"worker_id":1}`,
      `{"worker_id":-1,"event":{"event_id":1,"data":"cleared"}}`,
      `{"worker_id":"01","event":{"event_id":1,"data":"cleared"}}`,
      `{"worker_id":1,"worker_id":2,"event":{"event_id":1,"data":"cleared"}}`,
      `{"worker_id":1,"event":{"event_id":1,"data":"evicted"}}`,
      `{"worker_id":1,"event":{"event_id":1,"data":["cleared"]}}`,
      // A batch with one bad line is dropped whole.
      `${cleared(2, 1)}\n{"worker_id":2,"event":{}}\n${cleared(2, 3)}`,
      cleared(3, 1),
    );
    await eventually(() => expect(source.stats().messages).to.equal(12), WAIT);
    expect(events).to.deep.equal([{ workerId: 3n, dpRank: 0, eventId: 1n, data: { kind: "cleared" } }]);
    const stats = source.stats();
    expect(stats.rejected).to.deep.equal({ TOO_LARGE: 1, NOT_JSON: 3, TOO_DEEP: 0, DUPLICATE_KEY: 1, TYPE: 1, MISSING: 2, RANGE: 1, FORMAT: 1, UNKNOWN_VARIANT: 1 });
    expect(stats).to.deep.include({ messages: 12, events: 1, sinkErrors: 0, connected: true });

    const warnings = lines.filter((l) => l["level"] === 40);
    expect(warnings.length).to.be.within(1, 2);
    expect(warnings[0]).to.deep.include({ subject, code: "TOO_LARGE", held: 0, msg: "dropped a NATS message that is not router-event JSON" });

    const metric = async (name: string) => (await registry.getSingleMetric(name)!.get()).values;
    expect((await metric("mmgate_relay_nats_messages_total"))[0]!.value).to.equal(12);
    expect((await metric("mmgate_relay_nats_events_total"))[0]!.value).to.equal(1);
    const rejected = Object.fromEntries((await metric("mmgate_relay_nats_rejected_total")).map((v) => [v.labels["code"], v.value]));
    expect(rejected).to.deep.equal({ TOO_LARGE: 1, NOT_JSON: 3, DUPLICATE_KEY: 1, TYPE: 1, MISSING: 2, RANGE: 1, FORMAT: 1, UNKNOWN_VARIANT: 1 });
    // A second source on the registry shares the counters.
    expect(() => new NatsEventSource({ subject }, () => undefined, { registry })).not.to.throw();
  });

  it("splits a subject between the sources of one queue group", async () => {
    const a = await run({ queue: "relays" });
    const b = await run({ queue: "relays" });
    await publish(...Array.from({ length: 100 }, (_, i) => cleared(1, i + 1)));
    await eventually(() => expect(a.events.length + b.events.length).to.equal(100), WAIT);
    expect(a.events.length, "both members get a share").to.be.greaterThan(0);
    expect(b.events.length, "both members get a share").to.be.greaterThan(0);
    const ids = [...a.events, ...b.events].map((e) => Number(e.eventId)).sort((x, y) => x - y);
    expect(ids).to.deep.equal(Array.from({ length: 100 }, (_, i) => i + 1));
  });

  it("counts and logs a sink that throws, and goes on with the next event", async () => {
    const { logger, lines } = capturingLogger();
    const seen: bigint[] = [];
    const { source } = await run(
      {},
      {
        logger,
        sink: (e) => {
          seen.push(e.eventId);
          if (e.eventId % 2n === 0n) throw new Error(`sink refused ${e.eventId}`);
        },
      },
    );
    await publish(...Array.from({ length: 10 }, (_, i) => cleared(1, i + 1)), [cleared(1, 11), cleared(1, 12)].join("\n"));
    await eventually(() => expect(seen).to.have.length(12), WAIT);
    expect(seen).to.deep.equal(Array.from({ length: 12 }, (_, i) => BigInt(i + 1)));
    expect(source.stats()).to.deep.include({ messages: 11, events: 12, sinkErrors: 6 });
    const errors = lines.filter((l) => l["level"] === 50);
    expect(errors.length).to.be.within(1, 2);
    expect(errors[0]).to.deep.include({ subject, held: 0 });
  });

  it("stops cleanly when its signal fires: run resolves and nothing more is delivered", async () => {
    const { source, events, stop } = await run();
    await publish(cleared(1, 1));
    await eventually(() => expect(events).to.have.length(1), WAIT);
    await stop();
    expect(source.stats().connected).to.equal(false);
    await publish(cleared(1, 2));
    // A later source on the subject sees the next message; the stopped one does not.
    const later = await run();
    await publish(cleared(1, 3));
    await eventually(() => expect(later.events).to.have.length(1), WAIT);
    expect(events).to.have.length(1);
    expect(source.stats().messages).to.equal(1);

    // A signal that has fired already: run returns at once. Running twice at once is refused.
    const idle = new NatsEventSource({ servers: [server.url], subject }, () => undefined);
    await idle.run(AbortSignal.abort());
    const controller = new AbortController();
    const first = idle.run(controller.signal);
    let second: unknown;
    try {
      await idle.run(controller.signal);
    } catch (error) {
      second = error;
    }
    expect(String(second)).to.match(/already running/);
    controller.abort();
    await first;
  });

  it("a stop while connecting resolves", async () => {
    const source = new NatsEventSource({ servers: [server.url], subject }, () => undefined);
    const controller = new AbortController();
    const running = source.run(controller.signal);
    controller.abort();
    await running;
    expect(source.stats().connected).to.equal(false);
  });

  it("survives a nats-server restart: events published after it arrive", async function () {
    const { source, events, done } = await run();
    await publish(cleared(1, 1));
    await eventually(() => expect(events).to.have.length(1), WAIT);

    await server.halt();
    await eventually(() => expect(source.stats().connected).to.equal(false), WAIT);
    await server.restart();
    await eventually(() => expect(source.stats().connected).to.equal(true), WAIT);
    // The publisher reconnects on its own schedule: publish until an event gets through.
    let id = 1;
    await eventually(
      async () => {
        await publish(cleared(1, ++id));
        await new Promise((resolve) => setTimeout(resolve, 20));
        expect(events.length).to.be.greaterThan(1);
      },
      { timeoutMs: 10000, intervalMs: 0 },
    );
    expect(Number(events.at(-1)!.eventId)).to.be.greaterThan(1);
    let settled = false;
    void done.finally(() => (settled = true));
    await new Promise((resolve) => setImmediate(resolve));
    expect(settled, "the run goes on through the restart").to.equal(false);
  });

  it("stops promptly while the server is away", async () => {
    const own = await startNats();
    cleanup.push(() => own.stop());
    const source = new NatsEventSource({ servers: [own.url], subject, reconnectWaitMs: 50 }, () => undefined);
    const controller = new AbortController();
    const running = source.run(controller.signal);
    await eventually(() => expect(source.stats().connected).to.equal(true), WAIT);
    await own.halt();
    await eventually(() => expect(source.stats().connected).to.equal(false), WAIT);
    const started = performance.now();
    controller.abort();
    await running;
    expect(performance.now() - started).to.be.lessThan(1000);
  });

  it("rejects when the connection closes for good: the server comes back demanding a token", async () => {
    const open = await startNats();
    cleanup.push(() => open.stop());
    const { logger, lines } = capturingLogger();
    const source = new NatsEventSource({ servers: [open.url], subject, reconnectWaitMs: 20 }, () => undefined, { logger });
    const running = source.run(new AbortController().signal);
    running.catch(() => undefined);
    await eventually(() => expect(source.stats().connected).to.equal(true), WAIT);
    await open.halt();
    const guarded = await startNats({ port: open.port, token: "s3cret" });
    cleanup.push(() => guarded.stop());
    let error: unknown;
    try {
      await running;
    } catch (e) {
      error = e;
    }
    expect(error).to.be.instanceOf(NatsSourceError);
    expect(String(error)).to.match(/NATS connection closed/);
    expect(source.stats().connected).to.equal(false);
    expect(lines.some((l) => l["msg"] === "NATS disconnected; reconnecting")).to.equal(true);
  });

  it("rejects when the server refuses the subscription, and authenticates with user and pass", async () => {
    const guarded = await startNats({
      config: `authorization { users = [ { user: "relay", password: "pw", permissions: { subscribe: { deny: ["secret.>"] } } } ] }`,
    });
    cleanup.push(() => guarded.stop());
    const denied = new NatsEventSource({ servers: [guarded.url], subject: "secret.kv", user: "relay", pass: "pw" }, () => undefined);
    let error: unknown;
    try {
      await denied.run(new AbortController().signal);
    } catch (e) {
      error = e;
    }
    expect(error).to.be.instanceOf(NatsSourceError);
    expect(String(error)).to.match(/subscription to secret\.kv failed/);

    const events: RouterEvent[] = [];
    const allowed = new NatsEventSource({ servers: [guarded.url], subject, user: "relay", pass: "pw" }, (e) => events.push(e));
    const controller = new AbortController();
    const running = allowed.run(controller.signal);
    cleanup.push(async () => {
      controller.abort();
      await running;
    });
    await eventually(() => expect(allowed.stats().connected).to.equal(true), WAIT);
    const pub = await connect({ servers: guarded.url, user: "relay", pass: "pw" });
    pub.publish(subject, cleared(6, 1));
    await pub.flush();
    await pub.close();
    await eventually(() => expect(events).to.have.length(1), WAIT);
  });

  it("rejects when it cannot connect at start-up", async () => {
    const stopped = await startNats();
    const port = stopped.port;
    await stopped.stop();
    const source = new NatsEventSource({ servers: [`127.0.0.1:${port}`], subject }, () => undefined);
    const started = performance.now();
    let error: unknown;
    try {
      await source.run(new AbortController().signal);
    } catch (e) {
      error = e;
    }
    expect(error).to.be.instanceOf(NatsSourceError);
    expect(String(error)).to.match(/cannot connect to NATS/);
    expect(performance.now() - started).to.be.lessThan(5000);
    expect(source.stats().connected).to.equal(false);
  });

  it("authenticates with a token, and rejects a wrong one at start-up", async () => {
    const guarded = await startNats({ token: "s3cret" });
    cleanup.push(() => guarded.stop());
    const wrong = new NatsEventSource({ servers: [guarded.url], subject, token: "nope" }, () => undefined);
    let error: unknown;
    try {
      await wrong.run(new AbortController().signal);
    } catch (e) {
      error = e;
    }
    expect(error).to.be.instanceOf(NatsSourceError);
    expect(String(error)).to.match(/AUTHORIZATION_VIOLATION|Authorization/i);

    const events: RouterEvent[] = [];
    const right = new NatsEventSource({ servers: [guarded.url], subject, token: "s3cret" }, (e) => events.push(e));
    const controller = new AbortController();
    const running = right.run(controller.signal);
    cleanup.push(async () => {
      controller.abort();
      await running;
    });
    await eventually(() => expect(right.stats().connected).to.equal(true), WAIT);
    const pub = await connect({ servers: guarded.url, token: "s3cret" });
    pub.publish(subject, cleared(5, 1));
    await pub.flush();
    await pub.close();
    await eventually(() => expect(events).to.deep.equal([{ workerId: 5n, dpRank: 0, eventId: 1n, data: { kind: "cleared" } }]), WAIT);
  });
});
