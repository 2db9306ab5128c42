/**
 * Replaying a JetStream stream into a fresh relay, against the core NATS
 * ingest rate measured in the same run.
 *
 * 1. BENCH_EVENTS (1,000,000) router events, one per message as workers
 *    publish them: 64 workers, each a chain of Stored events of one new
 *    block (a new chain every 32 blocks), and one event in five a Removed
 *    of one of the worker's live blocks (about 600,000 blocks live at the
 *    end). The same events applied with DcCkfState.applyEvent in this
 *    process are the truth, and the in-process rate.
 * 2. Published into a stream before any relay runs (core publishes on the
 *    stream's subject, each with its Nats-Msg-Id, a flush every
 *    BENCH_PUBLISH_BATCH (10,000), until the stream holds them all); the
 *    publish rate is shown too.
 * 3. JetStream replay (the headline): mmgate's host with the relay module,
 *    one pool (expectedBlocks 1,048,576, the default) reading the stream
 *    through its durable consumer (the defaults: maxAckPending 1,024),
 *    timed from the host's start to the last event applied; the pool's
 *    filter must then equal the truth's, word for word.
 * 4. Core NATS ingest (the peer): a fresh host with the same pool on a core
 *    subject (maxPendingBytes 1 GiB, and a nats-server max_pending of
 *    2 GiB, so that nothing is dropped), the same events published by a
 *    child process as fast as it can, timed from the go to the last event
 *    applied; its filter must equal the truth's too.
 *
 * Needs nats-server (Debian's nats-server). One round: a round is minutes
 * on the shared 2-core machine.
 *
 * Run: node --import tsx bench/jetstream-replay.ts (npm run bench -- jetstream-replay)
 * Env: BENCH_EVENTS (1000000), BENCH_PUBLISH_BATCH (10000),
 * BENCH_MAX_ACK_PENDING (the relay's maxAckPending; default its default, 1024).
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { connect, headers, type NatsConnection } from "nats";
import { pino } from "pino";
import type { Registry } from "prom-client";
import { z } from "zod";
import { DcCkfState, routerEventFromJson } from "../src/kv/index.js";
import { routerEventMessageId } from "../src/relay/nats/index.js";
import type { Relay, RelayPool } from "../src/relay/service/index.js";
import { freePort, natsGreets } from "../src/stack/index.js";

const EVENTS = Number(process.env.BENCH_EVENTS ?? 1_000_000);
const PUBLISH_BATCH = Number(process.env.BENCH_PUBLISH_BATCH ?? 10_000);
const EXPECTED_BLOCKS = 1_048_576;
const WORKERS = 64;
const CHAIN = 32;
const STREAM = "BENCH_KV_EVENTS";
const JS_SUBJECT = "bench.kv.js";
const CORE_SUBJECT = "bench.kv.core";
const GiB = 1024 * 1024 * 1024;
const root = new URL("..", import.meta.url).pathname;

/** The workload's JSON lines and their Nats-Msg-Id (routerEventMessageId), the same on every call (xorshift from a fixed seed). */
function* workload(count: number): Generator<readonly [line: string, msgId: string]> {
  let x = 0x2545f491;
  const next = () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return x >>> 0;
  };
  const workers = Array.from({ length: WORKERS }, () => ({ eventId: 0, live: [] as number[], last: undefined as number | undefined, chain: 0 }));
  for (let i = 0; i < count; i++) {
    const id = next() % WORKERS;
    const w = workers[id]!;
    w.eventId += 1;
    let data: string;
    if (next() % 5 !== 0 || w.live.length === 0) {
      const block = i + 1;
      const tokens = (BigInt(next()) << 32n) | BigInt(next());
      const parent = w.last !== undefined && w.chain < CHAIN ? w.last : undefined;
      w.chain = parent === undefined ? 1 : w.chain + 1;
      w.last = block;
      w.live.push(block);
      data = `{"stored":{"parent_hash":${parent ?? "null"},"blocks":[{"block_hash":${block},"tokens_hash":"${tokens}"}]}}`;
    } else {
      const at = next() % w.live.length;
      const block = w.live[at]!;
      w.live[at] = w.live[w.live.length - 1]!;
      w.live.pop();
      // A chain goes on from a live block only.
      if (block === w.last) w.last = undefined;
      data = `{"removed":{"block_hashes":[${block}]}}`;
    }
    const line = `{"worker_id":${id + 1},"event":{"event_id":${w.eventId},"dp_rank":0,"data":${data}}}`;
    yield [line, routerEventMessageId({ workerId: BigInt(id + 1), dpRank: 0, eventId: BigInt(w.eventId) })];
  }
}

function digest(words: BigUint64Array): string {
  return createHash("sha256").update(Buffer.from(words.buffer, words.byteOffset, words.byteLength)).digest("hex").slice(0, 16);
}

const rate = (events: number, ms: number) => `${Math.round(events / (ms / 1000)).toLocaleString("en-US")} events/s`;

/** Child mode: publishes the workload on a core subject once told to go (a line on stdin), then prints "done". */
async function corePublisher(url: string): Promise<void> {
  const encoder = new TextEncoder();
  const payloads = Array.from(workload(EVENTS), ([line]) => encoder.encode(line));
  const nc = await connect({ servers: url });
  process.stdout.write("ready\n");
  const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
  await lines.next();
  for (const payload of payloads) nc.publish(CORE_SUBJECT, payload);
  await nc.flush();
  process.stdout.write("done\n");
  await nc.close();
}

/** nats-server with JetStream, its store and its config in a temporary directory. */
async function startNatsServer(): Promise<{ url: string; stop(): Promise<void> }> {
  const command = ["nats-server", "/usr/sbin/nats-server"].find((c) => (!c.startsWith("/") || existsSync(c)) && spawnSync(c, ["--version"], { stdio: "ignore" }).status === 0);
  if (command === undefined) throw new Error("nats-server is not installed (apt-get install nats-server)");
  const dir = mkdtempSync(join(tmpdir(), "mmgate-bench-js-"));
  const port = await freePort();
  // A slow consumer's allowance large enough for the whole core run: the peer must drop nothing.
  writeFileSync(join(dir, "nats.conf"), `max_pending: ${2 * GiB}\njetstream { store_dir: "${join(dir, "store")}" }\n`);
  const child: ChildProcess = spawn(command, ["--addr", "127.0.0.1", "--port", String(port), "--config", join(dir, "nats.conf")], { stdio: "ignore" });
  for (let attempt = 0; ; attempt++) {
    try {
      await natsGreets(port);
      break;
    } catch (error) {
      if (attempt > 200 || child.exitCode !== null) throw error;
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
  }
  return {
    url: `nats://127.0.0.1:${port}`,
    async stop() {
      child.kill("SIGKILL");
      if (child.exitCode === null) await new Promise((resolve) => child.once("exit", resolve));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** mmgate's host with the relay module and one pool, `nats` its NATS source. */
async function startRelayHost(nats: Record<string, unknown>): Promise<{ pool: RelayPool; registry: Registry; close(): Promise<void> }> {
  const { defineModule, resolveConfig, startHost } = await import("../src/server/index.js");
  const { relayModule } = await import("../src/relay/service/index.js");
  let relay: Relay | undefined;
  const probe = defineModule({
    name: "jetstreamBenchProbe",
    description: "hands the bench the live relay",
    configSchema: z.strictObject({}).prefault({}),
    requires: { relay: relayModule },
    create(ctx) {
      relay = ctx.deps.relay.relay;
      return { services: [] };
    },
  });
  const modules = [relayModule, probe];
  const config = resolveConfig(
    { listen: "127.0.0.1:0", adminListen: "", modules: modules.map((m) => m.name), relay: { pools: [{ name: "bench", expectedBlocks: EXPECTED_BLOCKS, nats }] } },
    modules,
  );
  const host = await startHost({ config, modules, logger: pino({ level: "warn" }), version: "bench" });
  const pool = relay?.pool("bench");
  if (pool === undefined) throw new Error("the relay module did not start");
  return { pool, registry: host.metrics.registry, close: () => host.shutdown() };
}

/** Events the pool applied or rejected. RelayPool.stats() scans the filter: not something to poll. */
const handled = (pool: RelayPool) => {
  const s = pool.stats();
  return s.eventsApplied + s.eventsRejected;
};

/** Events the relay's NATS sources handed on (a counter: cheap to poll). */
async function eventsHandedOn(registry: Registry): Promise<number> {
  const metric = registry.getSingleMetric("mmgate_relay_nats_events_total");
  return metric === undefined ? 0 : ((await metric.get()).values[0]?.value ?? 0);
}

/**
 * Resolves with the time the pool had handled `count` events: polls the
 * sources' event counter, then the pool's own count (an event handed on may
 * still be applying). Fails when nothing moves for a minute (something was
 * dropped).
 */
async function untilHandled(host: { pool: RelayPool; registry: Registry }, count: number): Promise<number> {
  let last = -1;
  let since = performance.now();
  for (;;) {
    const now = await eventsHandedOn(host.registry);
    if (now >= count) break;
    if (now !== last) {
      last = now;
      since = performance.now();
    } else if (performance.now() - since > 60_000) {
      throw new Error(`stalled at ${now} of ${count} events`);
    }
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
  while (handled(host.pool) < count) await new Promise((resolve) => setImmediate(resolve));
  return performance.now();
}

async function main(): Promise<void> {
  process.stdout.write(`JetStream replay of ${EVENTS.toLocaleString("en-US")} router events (one a message, ${WORKERS} workers) into a fresh relay, against core NATS ingest\n\n`);

  // 1. The truth, and the in-process rate.
  const truth = new DcCkfState({ expectedBlocksPerDc: EXPECTED_BLOCKS });
  let t0 = performance.now();
  let truthRejected = 0;
  for (const [line] of workload(EVENTS)) if (truth.applyEvent(routerEventFromJson(line)).firstError !== undefined) truthRejected++;
  const directMs = performance.now() - t0;
  const want = digest(truth.words());
  process.stdout.write(`  in-process (routerEventFromJson + DcCkfState.applyEvent): ${rate(EVENTS, directMs)}; ${truth.occupancy().uniqueBlocks.toLocaleString("en-US")} blocks live, ${truthRejected} rejected, filter ${want}\n`);

  const server = await startNatsServer();
  let nc: NatsConnection | undefined;
  try {
    nc = await connect({ servers: server.url });
    const jsm = await nc.jetstreamManager();
    // The stream as the relay's defaults create it (file storage, 24 h, 1 GiB).
    await jsm.streams.add({ name: STREAM, subjects: [JS_SUBJECT], max_age: 86_400_000 * 1e6, max_bytes: GiB });

    // 2. Publish: core publishes on the stream's subject, each with its Nats-Msg-Id, a flush every
    //    PUBLISH_BATCH; stored once the stream holds them all (a JetStream publish awaits an ack each,
    //    a few thousand a second here, which would make this step take minutes).
    t0 = performance.now();
    let batch = 0;
    for (const [line, msgId] of workload(EVENTS)) {
      const h = headers();
      h.set("Nats-Msg-Id", msgId);
      nc.publish(JS_SUBJECT, line, { headers: h });
      if (++batch === PUBLISH_BATCH) {
        batch = 0;
        await nc.flush();
      }
    }
    await nc.flush();
    let stored = await jsm.streams.info(STREAM);
    for (let idle = 0; stored.state.messages < EVENTS; ) {
      const before = stored.state.messages;
      await new Promise((resolve) => setTimeout(resolve, 20));
      stored = await jsm.streams.info(STREAM);
      idle = stored.state.messages === before ? idle + 1 : 0;
      if (idle > 500) throw new Error(`the stream holds ${stored.state.messages} messages, not ${EVENTS}`);
    }
    const publishMs = performance.now() - t0;
    process.stdout.write(`  published into the stream (Nats-Msg-Id each): ${rate(EVENTS, publishMs)}; stream ${(stored.state.bytes / 1024 / 1024).toFixed(0)} MiB\n`);

    // 3. JetStream replay into a fresh relay.
    t0 = performance.now();
    const maxAckPending = process.env.BENCH_MAX_ACK_PENDING === undefined ? {} : { maxAckPending: Number(process.env.BENCH_MAX_ACK_PENDING) };
    const jsRelay = await startRelayHost({ servers: [server.url], subject: JS_SUBJECT, jetstream: { stream: STREAM, durable: "bench-relay", ...maxAckPending } });
    let replayMs: number;
    let replayDigest: string;
    try {
      replayMs = (await untilHandled(jsRelay, EVENTS)) - t0;
      replayDigest = digest(jsRelay.pool.words());
    } finally {
      await jsRelay.close();
    }
    if (replayDigest !== want) throw new Error(`the replayed filter ${replayDigest} is not the truth's ${want}`);

    // 4. Core NATS ingest, the publisher in a process of its own.
    const coreRelay = await startRelayHost({ servers: [server.url], subject: CORE_SUBJECT, maxPendingBytes: GiB });
    let coreMs: number;
    let coreDigest: string;
    try {
      // Subscribed once a probe arrives (a Cleared of a worker that holds nothing: the filter stays as it is).
      for (;;) {
        nc.publish(CORE_SUBJECT, `{"worker_id":999999,"event":{"event_id":0,"data":"cleared"}}`);
        await nc.flush();
        await new Promise((resolve) => setTimeout(resolve, 20));
        if ((await eventsHandedOn(coreRelay.registry)) > 0) break;
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
      const base = await eventsHandedOn(coreRelay.registry);
      if (handled(coreRelay.pool) !== base) throw new Error("the probes are not all applied");
      const publisher = spawn(process.execPath, ["--import", "tsx", "bench/jetstream-replay.ts", "--core-publisher", server.url], { cwd: root, stdio: ["pipe", "pipe", "inherit"] });
      const out = createInterface({ input: publisher.stdout! })[Symbol.asyncIterator]();
      if ((await out.next()).value !== "ready") throw new Error("the core publisher did not start");
      t0 = performance.now();
      publisher.stdin!.write("go\n");
      coreMs = (await untilHandled(coreRelay, base + EVENTS)) - t0;
      coreDigest = digest(coreRelay.pool.words());
      publisher.stdin!.end();
      await new Promise((resolve) => (publisher.exitCode === null ? publisher.once("exit", resolve) : resolve(undefined)));
    } finally {
      await coreRelay.close();
    }
    if (coreDigest !== want) throw new Error(`the core-ingested filter ${coreDigest} is not the truth's ${want}`);

    process.stdout.write(`\n| path | events | seconds | events/s | filter |\n|---|---|---|---|---|\n`);
    process.stdout.write(`| JetStream replay, fresh relay (host start to last event applied) | ${EVENTS} | ${(replayMs / 1000).toFixed(1)} | ${Math.round(EVENTS / (replayMs / 1000))} | ${replayDigest} = truth |\n`);
    process.stdout.write(`| core NATS ingest, same run (go to last event applied) | ${EVENTS} | ${(coreMs / 1000).toFixed(1)} | ${Math.round(EVENTS / (coreMs / 1000))} | ${coreDigest} = truth |\n`);
    process.stdout.write(`\nJetStream replay / core ingest: ${(coreMs / replayMs).toFixed(2)}x the core rate\n`);
  } finally {
    await nc?.close();
    await server.stop();
  }
}

if (process.argv[2] === "--core-publisher") await corePublisher(process.argv[3]!);
else await main();
