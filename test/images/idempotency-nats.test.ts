/**
 * The shared idempotency store (src/images/runtime/idempotency-nats.ts)
 * against a real nats-server with JetStream: two store instances on one
 * bucket stand for two replicas. Its record format's size checks need no
 * server.
 */
import { randomBytes } from "node:crypto";
import { expect } from "chai";
import { connect, type KV, type NatsConnection } from "nats";
import { pino } from "pino";
import { imagesConfigSchema, type IdempotencyNatsConfig } from "../../src/images/config.js";
import { ImageError } from "../../src/images/core/errors.js";
import { createImageRequest, zeroTimings, type ImageResponse } from "../../src/images/model.js";
import type { IdempotencyAnswer, IdempotencyLimits } from "../../src/images/runtime/idempotency.js";
import { NatsIdempotencyStore } from "../../src/images/runtime/idempotency-nats.js";
import { IdempotencyStoreError, NatsBucket } from "../../src/images/runtime/idempotency-nats-bucket.js";
import {
  checkLayout,
  decodeRecord,
  decodeResponse,
  encodeRecord,
  encodeResponse,
  IdempotencyRecordError,
  MAX_RECORD_BYTES,
  type CompletedRecord,
} from "../../src/images/runtime/idempotency-record.js";
import { eventually, expectRejection, expectThrown, requireNats, startNats, type NatsServer } from "../support/index.js";
import { freePort } from "../support/process.js";
import { rejection } from "./helpers.js";

const FP = "a".repeat(64);
const OTHER_FP = "b".repeat(64);
const LIMITS: IdempotencyLimits = { maxEntries: 100, maxCompletedBytes: 64 * 1024 * 1024, completedTtlMs: 60_000, unknownTtlMs: 120_000 };
const live = () => new AbortController().signal;

function response(id: string, bytes = 16): ImageResponse {
  const parameters = createImageRequest({ prompt: "p" }).parameters;
  const data = new Uint8Array(randomBytes(bytes));
  return {
    id,
    created: 1_700_000_000,
    provider: "x",
    model: "m",
    requested: parameters,
    effective: parameters,
    normalizations: [{ field: "parameters.size", requested: "auto", effective: "512x512", reason: "normalized_to_provider_size" }],
    data: [{ index: 0, format: "png", width: 1, height: 1, bytes, sha256: "0".repeat(64), data, generationMs: 3 }],
    failures: [{ index: 1, error: new ImageError("upstream", "one output failed", { details: { http_status: 502 } }), generationMs: 4 }],
    usage: { totalTokens: 3, provider: { images: 1 } },
    timings: zeroTimings(),
    warnings: ["w"],
  };
}

/** Work that counts its runs and finishes when told to. */
class Work {
  calls = 0;
  private finishers: ((outcome: ImageResponse | ImageError) => void)[] = [];

  readonly run = (): Promise<ImageResponse> => {
    this.calls += 1;
    return new Promise<ImageResponse>((resolve, reject) => {
      this.finishers.push((outcome) => (outcome instanceof ImageError ? reject(outcome) : resolve(outcome)));
    });
  };

  finish(outcome: ImageResponse | ImageError): void {
    for (const finish of this.finishers.splice(0)) finish(outcome);
  }
}

interface Replica {
  readonly store: NatsIdempotencyStore;
  readonly answers: IdempotencyAnswer[];
  readonly logs: string[];
  takeovers: number;
}

describe("images: idempotency keys shared over NATS JetStream", function () {
  this.timeout(30_000);
  let nats: NatsServer;
  let bucket: string;
  let bucketCount = 0;
  const replicas: Replica[] = [];
  let clock: number | undefined;

  before(async function () {
    requireNats(this);
    nats = await startNats({ jetstream: true });
  });
  after(async () => {
    await nats?.stop();
  });
  beforeEach(() => {
    bucketCount += 1;
    bucket = `idem_${process.pid}_${bucketCount}`;
    clock = undefined;
  });
  afterEach(async () => {
    await Promise.all(replicas.splice(0).map((r) => r.store.close()));
  });

  function natsConfig(change: Partial<IdempotencyNatsConfig> = {}, servers = [nats.url]): IdempotencyNatsConfig {
    const parsed = imagesConfigSchema.parse({
      idempotency: { store: "nats", nats: { servers, bucket, heartbeatMs: 100, leaseMs: 2000, requestTimeoutMs: 1000, connectTimeoutMs: 1000, reconnectWaitMs: 100 } },
    }).idempotency.nats;
    // Not through the schema: some tests break its rules on purpose (a lease shorter than three heartbeats).
    return { ...parsed, ...change };
  }

  function replica(change: Partial<IdempotencyNatsConfig> = {}, options: { servers?: string[]; limits?: Partial<IdempotencyLimits> } = {}): Replica {
    const logs: string[] = [];
    const entry: Replica = {
      answers: [],
      logs,
      takeovers: 0,
      store: undefined as unknown as NatsIdempotencyStore,
    };
    const store = new NatsIdempotencyStore({
      limits: { ...LIMITS, ...options.limits },
      nats: natsConfig(change, options.servers),
      logger: pino({ level: "info" }, { write: (line: string) => void logs.push(line) }),
      observe: (answer) => entry.answers.push(answer),
      onTakeover: () => (entry.takeovers += 1),
      now: () => clock ?? Date.now(),
      owner: `replica-${replicas.length}`,
    });
    Object.assign(entry, { store });
    store.start();
    replicas.push(entry);
    return entry;
  }

  async function bucketView(): Promise<{ nc: NatsConnection; kv: KV; values: (prefix: string) => Promise<Map<string, Uint8Array>> }> {
    const nc = await connect({ servers: nats.url });
    const jsm = await nc.jetstreamManager();
    const stream = `KV_${bucket}`;
    const subjectPrefix = `$KV.${bucket}.`;
    /**
     * The live keys under `prefix` and their values, read message by message from the bucket's stream, again until
     * no write came meanwhile (a key written again moves past the sequences read). Not `kv.keys()`: on a loaded
     * machine its iteration (an ordered consumer) now and then never ended, and the test hung.
     */
    const values = async (prefix: string): Promise<Map<string, Uint8Array>> => {
      for (;;) {
        const { state } = await jsm.streams.info(stream);
        const found = new Map<string, Uint8Array>();
        for (let seq = state.first_seq; seq <= state.last_seq && state.messages > 0; seq++) {
          const message = await jsm.streams.getMessage(stream, { seq }).catch(() => undefined);
          const key = message?.subject.slice(subjectPrefix.length);
          if (message === undefined || key === undefined || !key.startsWith(prefix)) continue;
          const operation = message.header?.get("KV-Operation");
          if (operation === "DEL" || operation === "PURGE") found.delete(key);
          else found.set(key, message.data);
        }
        if ((await jsm.streams.info(stream)).state.last_seq === state.last_seq) return found;
      }
    };
    return { nc, kv: await nc.jetstream().views.kv(bucket), values };
  }

  const logged = (r: Replica, text: string) => r.logs.some((line) => line.includes(text));

  it("replicas that start together on a new bucket all share it: one that loses the race to create it binds to it", async () => {
    // Each store creates the bucket when it finds none. Started at once, the losers used to be refused by
    // JetStream now and then ("subjects overlap with an existing stream") and kept their keys to themselves
    // until their next attempt. Many rounds of many replicas make the race likely.
    for (let round = 0; round < 20; round++) {
      bucketCount += 1;
      bucket = `idem_${process.pid}_${bucketCount}`;
      const started = Array.from({ length: 16 }, () => replica());
      const settled = (r: Replica) => logged(r, "idempotency store connected") || logged(r, "unreachable");
      await eventually(() => expect(started.filter((r) => !settled(r)).length).to.equal(0));
      const degraded = started.flatMap((r) => r.logs.filter((line) => line.includes("unreachable")));
      expect(degraded, `round ${round}`).to.deep.equal([]);
      await Promise.all(replicas.splice(0).map((r) => r.store.close()));
    }
  });

  it("runs a key once across replicas: another replica joins it, then replays it; the owner's replica joins in memory", async () => {
    const [a, b] = [replica(), replica()];
    const work = new Work();
    const first = a.store.run("s", "k", FP, live(), work.run);
    await eventually(() => expect(work.calls).to.equal(1));
    const joined = b.store.run("s", "k", FP, live(), work.run);
    const local = a.store.run("s", "k", FP, live(), work.run);
    // b waits on the bucket: give its watch a moment to see the pending claim.
    await eventually(() => expect(b.answers).to.deep.equal(["joined"]));
    work.finish(response("first", 1000));
    const results = await Promise.all([first, joined, local]);
    expect(results.map((r) => [r.response.id, r.replayed])).to.deep.equal([
      ["first", false],
      ["first", true],
      ["first", true],
    ]);
    expect(results[1]!.response.data[0]!.data).to.deep.equal(results[0]!.response.data[0]!.data);
    const replay = await b.store.run("s", "k", FP, live(), work.run);
    expect(replay.replayed).to.equal(true);
    expect(replay.response).to.deep.equal(results[0]!.response);
    expect(work.calls).to.equal(1);
    expect(a.answers).to.deep.equal(["executed", "joined"]);
    expect(b.answers).to.deep.equal(["joined", "replayed"]);
    // Keys are per scope.
    expect((await b.store.run("other", "k", FP, live(), async () => response("second"))).replayed).to.equal(false);
  });

  it("refuses the key with another request on every replica, while it runs and once it completed", async () => {
    const [a, b] = [replica(), replica()];
    const work = new Work();
    const first = a.store.run("s", "k", FP, live(), work.run);
    await eventually(() => expect(work.calls).to.equal(1));
    for (const r of [a, b]) expect((await rejection(r.store.run("s", "k", OTHER_FP, live(), work.run))).code).to.equal("idempotency_conflict");
    work.finish(response("first"));
    await first;
    for (const r of [a, b]) expect((await rejection(r.store.run("s", "k", OTHER_FP, live(), work.run))).code).to.equal("idempotency_conflict");
    expect(work.calls).to.equal(1);
    expect(b.answers).to.deep.equal(["conflict", "conflict"]);
  });

  it("replays an unknown outcome everywhere for unknownTtlMs, then runs the key again", async () => {
    const [a, b] = [replica(), replica()];
    clock = 1_000_000;
    let calls = 0;
    const unknown = () => {
      calls += 1;
      return Promise.reject(new ImageError("timeout", "gone", { details: { outcome: "unknown" } }));
    };
    expect((await rejection(a.store.run("s", "u", FP, live(), unknown))).details["outcome"]).to.equal("unknown");
    // The owner records it after answering its caller.
    const replayed = await eventually(async () => {
      const error = await rejection(b.store.run("s", "u", FP, live(), unknown));
      expect(calls).to.equal(1);
      return error;
    });
    expect(replayed).to.deep.include({ code: "timeout", message: "gone", retryable: false });
    expect(replayed.details).to.deep.equal({ outcome: "unknown" });
    clock += LIMITS.unknownTtlMs;
    await rejection(b.store.run("s", "u", FP, live(), unknown));
    expect(calls).to.equal(2);
  });

  it("forgets a definite failure, and the calls that waited for that run get it", async () => {
    const [a, b] = [replica(), replica()];
    const work = new Work();
    const first = a.store.run("s", "k", FP, live(), work.run);
    await eventually(() => expect(work.calls).to.equal(1));
    const joined = b.store.run("s", "k", FP, live(), work.run);
    await eventually(() => expect(b.answers).to.deep.equal(["joined"]));
    work.finish(new ImageError("rate_limited", "slow down", { retryable: true, details: { retry_after_ms: 5 } }));
    expect((await rejection(first)).code).to.equal("rate_limited");
    const waited = await rejection(joined);
    expect(waited).to.deep.include({ code: "rate_limited", retryable: true });
    expect(waited.details).to.deep.equal({ retry_after_ms: 5 });
    // The key is free again, on either replica.
    await eventually(async () => expect((await b.store.run("s", "k", FP, live(), async () => response("again"))).replayed).to.equal(false));
    expect((await a.store.run("s", "k", FP, live(), work.run)).response.id).to.equal("again");
  });

  it("stores a response above the value limit in chunks and replays it byte for byte", async () => {
    const [a, b] = [replica({ maxValueBytes: 16 * 1024 }), replica({ maxValueBytes: 16 * 1024 })];
    const big = response("big", 100_000);
    await a.store.run("s", "big", FP, live(), async () => big);
    const replay = await eventually(async () => {
      const result = await b.store.run("s", "big", FP, live(), () => Promise.reject(new Error("must not run again")));
      expect(result.replayed).to.equal(true);
      return result;
    });
    expect(Buffer.from(replay.response.data[0]!.data!).equals(Buffer.from(big.data[0]!.data!))).to.equal(true);
    expect({ ...replay.response, data: [] }).to.deep.equal({ ...big, data: [] });
    const { nc, values } = await bucketView();
    try {
      expect((await values("d.")).size).to.equal(Math.ceil(encodeResponse(big).byteLength / (16 * 1024 - 1024)));
    } finally {
      await nc.close();
    }
  });

  it("does not replay, nor run again, a response over maxResponseBytes or one the bucket has no room for", async () => {
    const [a, b] = [replica({ maxResponseBytes: 50_000 }), replica({ maxResponseBytes: 50_000 })];
    const first = await a.store.run("s", "big", FP, live(), async () => response("big", 100_000));
    expect(first.response.data[0]!.bytes).to.equal(100_000);
    const refused = await eventually(() => rejection(b.store.run("s", "big", FP, live(), () => Promise.reject(new Error("must not run again")))));
    expect(refused).to.deep.include({ code: "overloaded", retryable: false });
    expect(refused.details).to.deep.include({ outcome: "completed_unreplayable" });

    // A bucket of 1 MiB cannot hold a 1.5 MB response.
    bucket = `${bucket}_small`;
    const [c, d] = [replica({ maxBucketBytes: 1024 * 1024 }), replica({ maxBucketBytes: 1024 * 1024 })];
    await c.store.run("s", "huge", FP, live(), async () => response("huge", 1_500_000));
    const full = await eventually(() => rejection(d.store.run("s", "huge", FP, live(), () => Promise.reject(new Error("must not run again")))), { timeoutMs: 10_000 });
    expect(full.details).to.deep.include({ outcome: "completed_unreplayable" });
    expect(logged(c, "has no room for a response")).to.equal(true);
  });

  it("expires a completed response after completedTtlMs", async () => {
    const [a, b] = [replica(), replica()];
    clock = 5_000_000;
    let calls = 0;
    const work = async () => {
      calls += 1;
      return response(`run-${calls}`, 100_000);
    };
    await a.store.run("s", "k", FP, live(), work);
    clock += LIMITS.completedTtlMs - 1;
    await eventually(async () => expect((await b.store.run("s", "k", FP, live(), work)).replayed).to.equal(true));
    clock += 1;
    const again = await b.store.run("s", "k", FP, live(), work);
    expect(again).to.deep.include({ replayed: false });
    expect(calls).to.equal(2);
    expect((await a.store.run("s", "k", FP, live(), work)).response.id).to.equal("run-2");
  });

  it("takes over a claim whose replica stopped refreshing it: the key answers an unknown outcome and never runs again", async () => {
    // The lease is the owner's, written in its claim.
    const [a, b] = [replica({ leaseMs: 600 }), replica()];
    const work = new Work();
    void a.store.run("s", "k", FP, live(), work.run).catch(() => undefined);
    await eventually(() => expect(work.calls).to.equal(1));
    // The owner dies: its connection goes, its claim is no longer refreshed.
    await a.store.close();
    const started = performance.now();
    const lost = await rejection(b.store.run("s", "k", FP, live(), work.run));
    expect(performance.now() - started).to.be.at.least(500);
    expect(lost).to.deep.include({ code: "timeout", retryable: false });
    expect(lost.details).to.deep.equal({ stage: "idempotency_owner_lost", outcome: "unknown" });
    expect(b.takeovers).to.equal(1);
    expect(logged(b, "took over an idempotency claim")).to.equal(true);
    const c = replica();
    expect((await rejection(c.store.run("s", "k", FP, live(), work.run))).details).to.deep.include({ outcome: "unknown" });
    expect(work.calls).to.equal(1);
  });

  it("leaves a claim taken over from a slow owner as it is; the owner's caller still gets its response", async () => {
    // The owner refreshes less often than its lease: a waiting replica takes the claim over.
    const a = replica({ heartbeatMs: 5000, leaseMs: 300 });
    const b = replica();
    const work = new Work();
    const first = a.store.run("s", "k", FP, live(), work.run);
    await eventually(() => expect(work.calls).to.equal(1));
    expect((await rejection(b.store.run("s", "k", FP, live(), work.run))).details).to.deep.include({ stage: "idempotency_owner_lost" });
    work.finish(response("late"));
    expect((await first).response.id).to.equal("late");
    await eventually(() => expect(logged(a, "was taken over before its outcome was recorded")).to.equal(true));
    expect((await rejection(b.store.run("s", "k", FP, live(), work.run))).details).to.deep.include({ outcome: "unknown" });
    expect(work.calls).to.equal(1);
  });

  it("a caller that gives up waiting is cancelled; the run goes on and is replayed", async () => {
    const [a, b] = [replica(), replica()];
    const work = new Work();
    const first = a.store.run("s", "k", FP, live(), work.run);
    await eventually(() => expect(work.calls).to.equal(1));
    const controller = new AbortController();
    const waiting = b.store.run("s", "k", FP, controller.signal, work.run);
    await eventually(() => expect(b.answers).to.deep.equal(["joined"]));
    controller.abort();
    expect((await rejection(waiting)).code).to.equal("cancelled");
    work.finish(response("first"));
    await first;
    await eventually(async () => expect((await b.store.run("s", "k", FP, live(), work.run)).response.id).to.equal("first"));
    expect(work.calls).to.equal(1);
  });

  it("answers a damaged record or a damaged chunk without running the key again", async () => {
    const [a, b] = [replica({ maxValueBytes: 16 * 1024 }), replica({ maxValueBytes: 16 * 1024 })];
    await a.store.run("s", "k", FP, live(), async () => response("first", 40_000));
    const { nc, kv, values } = await bucketView();
    // The response is the caller's before its record is written: damage what is stored once the records say completed.
    const completedRecords = (count: number) =>
      eventually(async () => {
        const records = await values("r.");
        expect([...records.values()].map((value) => decodeRecord(value).state)).to.deep.equal(Array(count).fill("completed"));
        return records;
      });
    try {
      await completedRecords(1);
      const chunks = [...(await values("d.")).keys()];
      expect(chunks).to.have.length(3);
      await kv.put(chunks[0]!, new Uint8Array(16 * 1024 - 1024));
      const damaged = await rejection(b.store.run("s", "k", FP, live(), () => Promise.reject(new Error("must not run again"))));
      expect(damaged.details).to.deep.include({ outcome: "completed_unreplayable" });
      expect(logged(b, "cannot be replayed")).to.equal(true);

      await a.store.run("s", "r", FP, live(), async () => response("second"));
      for (const key of (await completedRecords(2)).keys()) await kv.put(key, new TextEncoder().encode('{"v":1,"state":"completed"'));
      const unreadable = await rejection(b.store.run("s", "r", FP, live(), () => Promise.reject(new Error("must not run again"))));
      expect(unreadable).to.deep.include({ code: "internal", retryable: false });
      expect(unreadable.details).to.deep.equal({ outcome: "unknown" });
    } finally {
      await nc.close();
    }
  });

  describe("a moment without the bucket's stream (JetStream answers no responders)", () => {
    /** A bucket of the store's own, its reachability changes, and a view of its stream from another connection. */
    async function bareBucket() {
      const changes: boolean[] = [];
      const own = new NatsBucket(natsConfig(), { ttlMs: 60_000 }, (available) => changes.push(available));
      own.start();
      await own.started(live());
      expect(own.available).to.equal(true);
      const nc = await connect({ servers: nats.url });
      const jsm = await nc.jetstreamManager();
      // The stream goes: writes to its subjects now reach nobody, and the client answers 503.
      expect(await jsm.streams.delete(`KV_${bucket}`)).to.equal(true);
      return { own, changes, nc };
    }

    it("tries a write again until the stream is back: it lands, and the bucket never counted as lost", async () => {
      const { own, changes, nc } = await bareBucket();
      try {
        const write = own.put("k", new TextEncoder().encode("v"));
        await new Promise((resolve) => setTimeout(resolve, 100));
        // The stream set up again, as a replica that binds makes it.
        await nc.jetstream().views.kv(bucket, { history: 1, allow_direct: false });
        expect(await write).to.be.a("number");
        expect(changes).to.deep.equal([true]);
        expect(own.available).to.equal(true);
      } finally {
        await Promise.all([nc.close(), own.close()]);
      }
    });

    it("gives up after requestTimeoutMs: the write fails unavailable and the bucket is lost until it binds again", async () => {
      const { own, changes, nc } = await bareBucket();
      try {
        await expectRejection(own.put("k", new TextEncoder().encode("v")), { type: IdempotencyStoreError, code: "unavailable", message: /put: 503/ });
        // Binding again makes the stream anew.
        await eventually(() => expect(changes).to.deep.equal([true, false, true]));
      } finally {
        await Promise.all([nc.close(), own.close()]);
      }
    });
  });

  describe("when NATS goes away", () => {
    it("keeps new keys per replica with a warning, answers a call waiting on another replica an unknown outcome, and comes back", async function () {
      this.timeout(60_000);
      const [a, b] = [replica(), replica()];
      const held = new Work();
      const running = a.store.run("s", "held", FP, live(), held.run);
      await eventually(() => expect(held.calls).to.equal(1));
      const waiting = b.store.run("s", "held", FP, live(), held.run);
      await eventually(() => expect(b.answers).to.deep.equal(["joined"]));

      await nats.halt();
      await eventually(() => expect([a.store.degraded, b.store.degraded]).to.deep.equal([true, true]));
      for (const r of [a, b]) expect(logged(r, "idempotency keys are process-local until it is back")).to.equal(true);
      // The call that waited for a's run must not run it: after the lease, an unknown outcome.
      const lost = await rejection(waiting);
      expect(lost.details).to.deep.equal({ stage: "idempotency_store", outcome: "unknown" });
      expect(held.calls).to.equal(1);

      // Degraded: keys are per replica.
      let calls = 0;
      const work = async () => {
        calls += 1;
        return response(`local-${calls}`);
      };
      expect((await a.store.run("s", "k", FP, live(), work)).replayed).to.equal(false);
      expect((await a.store.run("s", "k", FP, live(), work)).replayed).to.equal(true);
      expect((await b.store.run("s", "k", FP, live(), work)).replayed).to.equal(false);
      expect(calls).to.equal(2);

      await nats.restart();
      await eventually(() => expect([a.store.degraded, b.store.degraded]).to.deep.equal([false, false]), { timeoutMs: 15_000 });
      for (const r of [a, b]) await eventually(() => expect(logged(r, "idempotency store reachable again")).to.equal(true));
      // The owner's claim survived the outage: its outcome is recorded and replayed by the other replica.
      held.finish(response("held"));
      expect((await running).response.id).to.equal("held");
      await eventually(async () => expect((await b.store.run("s", "held", FP, live(), held.run)).response.id).to.equal("held"), { timeoutMs: 10_000 });
      // Keys run while degraded stay answered from memory; new keys are shared again.
      expect((await a.store.run("s", "k", FP, live(), work)).response.id).to.equal("local-1");
      await a.store.run("s", "new", FP, live(), work);
      await eventually(async () => expect((await b.store.run("s", "new", FP, live(), work)).replayed).to.equal(true));
      expect(calls).to.equal(3);
      expect(held.calls).to.equal(1);
    });

    it("starts degraded when NATS is down, and shares keys once it is up", async () => {
      const port = await freePort();
      const a = replica({}, { servers: [`nats://127.0.0.1:${port}`] });
      let calls = 0;
      const work = async () => {
        calls += 1;
        return response(`run-${calls}`);
      };
      expect((await a.store.run("s", "k", FP, live(), work)).replayed).to.equal(false);
      expect(a.store.degraded).to.equal(true);
      expect(logged(a, "idempotency store unreachable")).to.equal(true);
      const late = await startNats({ jetstream: true, port });
      try {
        const b = replica({}, { servers: [late.url] });
        await eventually(() => expect(a.store.degraded).to.equal(false), { timeoutMs: 15_000 });
        await a.store.run("s", "shared", FP, live(), work);
        await eventually(async () => expect((await b.store.run("s", "shared", FP, live(), work)).replayed).to.equal(true));
        expect(calls).to.equal(2);
      } finally {
        await Promise.all(replicas.splice(0).map((r) => r.store.close()));
        await late.stop();
      }
    });

    it("with whenUnavailable: refuse, answers keyed calls overloaded (retryable) and runs nothing", async () => {
      const port = await freePort();
      const a = replica({ whenUnavailable: "refuse" }, { servers: [`127.0.0.1:${port}`] });
      const refused = await rejection(a.store.run("s", "k", FP, live(), () => Promise.reject(new Error("must not run"))));
      expect(refused).to.deep.include({ code: "overloaded", retryable: true });
      expect(refused.details).to.deep.include({ limit: "idempotency_store" });
      expect(logged(a, "requests with an idempotency key are refused until it is back")).to.equal(true);
      expect(a.answers).to.deep.equal([]);
    });
  });
});

describe("images: the shared idempotency store's record format", () => {
  it("round-trips a response, images and failures included", () => {
    const original = response("r", 3000);
    const decoded = decodeResponse(encodeResponse(original));
    expect(decoded).to.deep.equal({ ...original, data: decoded.data });
    expect(Buffer.from(decoded.data[0]!.data!).equals(Buffer.from(original.data[0]!.data!))).to.equal(true);
    expect(decoded.failures[0]!.error).to.be.instanceOf(ImageError);
    expect(decoded.failures[0]!.error.details).to.deep.equal({ http_status: 502 });
  });

  it("checks every length before it allocates or slices", () => {
    const blob = encodeResponse(response("r", 100));
    const code = (work: () => unknown) => expectThrown(work, { type: IdempotencyRecordError }).code;
    const header = Buffer.from(blob);
    header.writeUInt32BE(0xffffffff, 4);
    expect(code(() => decodeResponse(header))).to.equal("TOO_LARGE");
    const longHeader = Buffer.from(blob);
    longHeader.writeUInt32BE(blob.byteLength, 4);
    expect(code(() => decodeResponse(longHeader))).to.equal("MALFORMED");
    expect(code(() => decodeResponse(blob.subarray(0, blob.byteLength - 1)))).to.equal("MALFORMED");
    expect(code(() => decodeResponse(Buffer.concat([blob, Buffer.from([0])])))).to.equal("MALFORMED");
    expect(code(() => decodeResponse(Buffer.from("MIR2\0\0\0\0")))).to.equal("UNSUPPORTED_VERSION");
    expect(code(() => decodeResponse(Buffer.from("nope")))).to.equal("MALFORMED");

    const record: CompletedRecord = { state: "completed", fingerprint: FP, claim: "0123456789abcdef", expiresAt: 1, size: 100, sha256: FP, chunkBytes: 40, chunks: 3 };
    expect(() => checkLayout(record, 100, 64)).to.not.throw();
    expect(code(() => checkLayout(record, 99, 64))).to.equal("TOO_LARGE");
    expect(code(() => checkLayout({ ...record, chunkBytes: 1 << 30, chunks: 1 }, 100, 64))).to.equal("TOO_LARGE");
    expect(code(() => checkLayout({ ...record, chunks: 2 }, 100, 64))).to.equal("MALFORMED");
  });

  it("reads only records of its version and format, within their size", () => {
    const code = (value: Uint8Array) => expectThrown(() => decodeRecord(value), { type: IdempotencyRecordError }).code;
    const text = (s: string) => new TextEncoder().encode(s);
    expect(code(new Uint8Array(MAX_RECORD_BYTES + 1))).to.equal("TOO_LARGE");
    expect(code(text("{"))).to.equal("MALFORMED");
    expect(code(text('{"v":2,"state":"pending"}'))).to.equal("UNSUPPORTED_VERSION");
    expect(code(text('{"v":1,"state":"pending","fingerprint":"x"}'))).to.equal("MALFORMED");
    const pending = { state: "pending" as const, fingerprint: FP, claim: "0123456789abcdef", owner: "o", heartbeatAt: 1, leaseMs: 10 };
    expect(decodeRecord(encodeRecord(pending))).to.deep.equal(pending);
  });

  it("keeps an unknown outcome recorded when its error is too large to store whole", () => {
    const error = new ImageError("timeout", "gone", { details: { outcome: "unknown", huge: "x".repeat(MAX_RECORD_BYTES) } });
    const value = encodeRecord({
      state: "failed",
      fingerprint: FP,
      expiresAt: 1,
      error: { code: error.code, message: error.message, retryable: false, details: { ...error.details }, suggestions: [] },
    });
    expect(value.byteLength).to.be.at.most(MAX_RECORD_BYTES);
    const record = decodeRecord(value);
    expect(record.state === "failed" && record.error.details).to.deep.equal({ outcome: "unknown" });
  });

  it("refuses a lease shorter than three heartbeats, and servers that are not NATS addresses", () => {
    const parse = (nats: Record<string, unknown>) => imagesConfigSchema.safeParse({ idempotency: { store: "nats", nats } });
    expect(parse({ heartbeatMs: 1000, leaseMs: 2999 }).success).to.equal(false);
    expect(parse({ heartbeatMs: 1000, leaseMs: 3000 }).success).to.equal(true);
    expect(parse({ servers: ["http://x:1"] }).success).to.equal(false);
    expect(parse({ servers: ["nats://u:p@x:1"] }).success).to.equal(false);
    expect(parse({ servers: ["nats://x:4222", "y:4222"] }).success).to.equal(true);
    expect(imagesConfigSchema.parse({}).idempotency).to.deep.include({ store: "memory" });
  });
});
