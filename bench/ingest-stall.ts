/**
 * How long KV ingest holds the relay's event loop: the longest turn of the
 * server's event loop (perf_hooks.monitorEventLoopDelay in the server
 * process, 1 ms resolution) while KvEventService.Publish streams apply, and
 * the slowest of the Health/Check calls a second client makes every 100 ms
 * beside them, against a 50 ms target for the longest turn. Ingest applies
 * events in slices (src/relay/service/ingest.ts); what it cannot slice is the
 * transport's decoding of each message, which happens before the handler sees
 * it, so the loads are also shown with smaller messages.
 *
 * Loads (each into a pool of its own):
 *
 * 1. 640,000 blocks of one worker, split as maxBlocksPerEvent (65,536)
 *    requires: 10 chained Stored events (each continues the last block of the
 *    one before), one per message (about 1.2 MB each). Then the same from six
 *    streams at once (six workers), with the server's peak RSS. And for
 *    reference the unsplit 640,000-block event in one message (11.5 MB: the
 *    server's receive limit is raised to 16 MiB for it), which is refused as
 *    EventTooLarge: what remains is decoding the message.
 * 2. 65,536 single-block Stored events into a pool filled to capacity first
 *    (131,072 slots, untimed), so that every insert walks 500 kicks and fails
 *    (CapacityExhausted): in one message, then in 16 of 4,096.
 * 3. 64 messages of 65,536 single-block Stored events (8 workers) on one
 *    stream into a pool sized for them (BENCH_STALL_MESSAGES, 64), then the
 *    same count in messages of 4,096.
 *
 * Printed per load: the longest slice of the relay's slicer (what applying
 * events held the loop for by itself, apart from decoding, GC and whatever
 * else shared the turn), events applied and rejected (checked against what the
 * load must give: every event accounted for, all applied where nothing can
 * fail, EventTooLarge and CapacityExhausted where they must appear; the bench
 * exits 1 on a mismatch or a failed call, never on timing), the wall time, the server's slicer yields, the longest event-loop
 * turn and its p99, the slowest health check and how many there were, and
 * the longest turn against the target. Below the table: what decoding one
 * message of each shape costs in this process (fromBinary), for scale.
 *
 * The server runs alone in its process (bench/_relay-server.ts), a fresh
 * one for each of the three load groups, and so does the health prober
 * (bench/_health-probe.ts). Each load is encoded to gRPC frames before its
 * measurement and written by a bare node:http2 client here, so that the
 * bench's own work (building and serializing events) competes as little as
 * it can with the server for the two cores. On the shared 2-core machine the figures move with the
 * machine's load; compare them within one run.
 *
 * Env: BENCH_STALL_MESSAGES (64), BENCH_STALL_ONLY (loads, comma-separated:
 * split,full,stream), BENCH_SERVER_NODE_ARGS (extra node arguments for the
 * server, space-separated, e.g. "--trace-gc": its lines go to stderr).
 * Run: node --import tsx bench/ingest-stall.ts
 */
import { spawn, type ChildProcess } from "node:child_process";
import * as http2 from "node:http2";
import { createInterface } from "node:readline";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { PublishRequestSchema, PublishResponseSchema, RouterEventSchema, type RouterEvent as WireRouterEvent } from "../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { median } from "./_stats.js";
import { frame, writable } from "./_wire.js";

const MiB = 1024 * 1024;
const TARGET_MS = 50;
const HEALTH_EVERY_MS = 100;
const STREAM_MESSAGES = Number(process.env.BENCH_STALL_MESSAGES ?? 64);
const ONLY = (process.env.BENCH_STALL_ONLY ?? "split,full,stream").split(",").map((s) => s.trim());
const MAX_BLOCKS_PER_EVENT = 65_536;
const SPLIT_BLOCKS = 640_000;
const FULL_EXPECTED = 65_536;
const STREAM_EVENTS = 65_536;

const root = new URL("..", import.meta.url).pathname;

// --- the server child -----------------------------------------------------------

/** Pools of the loads; each load group runs on a server of its own, so that one group's heap does not weigh on the next. */
const POOLS: Record<string, { name: string; expectedBlocks: number }[]> = {
  split: [
    { name: "split", expectedBlocks: 1_048_576 },
    { name: "split6", expectedBlocks: 4_194_304 },
    { name: "unsplit", expectedBlocks: 1_048_576 },
  ],
  full: [{ name: "full", expectedBlocks: FULL_EXPECTED }],
  stream: [
    { name: "stream", expectedBlocks: STREAM_MESSAGES * STREAM_EVENTS },
    { name: "stream-small", expectedBlocks: STREAM_MESSAGES * STREAM_EVENTS },
  ],
};

interface Server {
  address: string;
  command(cmd: Record<string, unknown>): Promise<Record<string, unknown>>;
  /** The health prober's figures since the previous call. */
  health(): Promise<HealthFigures>;
  close(): void;
}

/** JSON lines of a child's stdout; lines that are not JSON objects go to stderr. */
function jsonLines(proc: ChildProcess, name: string): () => Promise<Record<string, unknown>> {
  const lines = createInterface({ input: proc.stdout! })[Symbol.asyncIterator]();
  return async () => {
    for (;;) {
      const { value, done } = await lines.next();
      if (done) throw new Error(`${name} exited (${proc.exitCode ?? proc.signalCode})`);
      const line = value as string;
      if (line.startsWith("{")) return JSON.parse(line) as Record<string, unknown>;
      process.stderr.write(`${name}: ${line}\n`);
    }
  };
}

/** A relay host in a child process (bench/_relay-server.ts) with `pools`; lines it prints that are not its answers (a --trace-gc of BENCH_SERVER_NODE_ARGS) go to stderr. */
async function startServer(pools: readonly { name: string; expectedBlocks: number }[]): Promise<Server> {
  const config = {
    // Room for the unsplit 640k-block message (11.5 MB) of the reference load.
    limits: { maxReceiveMessageBytes: 16 * MiB },
    relay: { pools },
  };
  const nodeArgs = (process.env.BENCH_SERVER_NODE_ARGS ?? "").split(" ").filter((a) => a !== "");
  const proc = spawn(process.execPath, [...nodeArgs, "--import", "tsx", "bench/_relay-server.ts", "relay", JSON.stringify(config)], { cwd: root, stdio: ["pipe", "pipe", "inherit"] });
  const next = jsonLines(proc, "server");
  const address = String((await next()).address);
  const probe = spawn(process.execPath, ["--import", "tsx", "bench/_health-probe.ts", `http://${address}`], { cwd: root, stdio: ["pipe", "pipe", "inherit"] });
  const probeNext = jsonLines(probe, "health probe");
  await probeNext();
  return {
    address,
    async command(cmd) {
      proc.stdin!.write(`${JSON.stringify(cmd)}\n`);
      const reply = await next();
      if (typeof reply.error === "string") throw new Error(`server ${String(cmd.op)}: ${reply.error}`);
      return reply;
    },
    async health() {
      probe.stdin!.write("\n");
      return (await probeNext()) as unknown as HealthFigures;
    },
    close: () => {
      probe.stdin!.end();
      proc.stdin!.end();
    },
  };
}

let server: Server;

// --- events -------------------------------------------------------------------

let lcg = 0x9e3779b97f4a7c15n;
/** A pseudo-random u64 (full width, as real tokens hashes are: 10-byte varints on the wire). */
function nextU64(): bigint {
  lcg = BigInt.asUintN(64, lcg * 6364136223846793005n + 1442695040888963407n);
  return lcg;
}

/** `n` chained blocks from block hash `first` (after `parent` when given). */
function storedRun(workerId: bigint, first: bigint, n: number, parent?: bigint): WireRouterEvent {
  const blocks = new Array(n);
  for (let i = 0; i < n; i++) blocks[i] = { blockHash: first + BigInt(i), tokensHash: nextU64() };
  return create(RouterEventSchema, { workerId, data: { case: "stored", value: { parentHash: parent, blocks } } });
}

/** `total` blocks of one worker as events of at most `per` blocks, each continuing the last block of the one before. */
function splitRun(workerId: bigint, base: bigint, total: number, per: number): WireRouterEvent[] {
  const events: WireRouterEvent[] = [];
  for (let at = 0; at < total; at += per) {
    const n = Math.min(per, total - at);
    events.push(storedRun(workerId, base + BigInt(at), n, at === 0 ? undefined : base + BigInt(at - 1)));
  }
  return events;
}

/** `n` single-block Stored events of new blocks from `first`, over `workers` workers. */
function singles(first: bigint, n: number, workers: number): WireRouterEvent[] {
  const events = new Array<WireRouterEvent>(n);
  for (let i = 0; i < n; i++) {
    events[i] = create(RouterEventSchema, {
      workerId: BigInt(1 + (i % workers)),
      data: { case: "stored", value: { blocks: [{ blockHash: first + BigInt(i), tokensHash: nextU64() }] } },
    });
  }
  return events;
}

// --- running a load -------------------------------------------------------------

interface Summary {
  applied: bigint;
  rejected: bigint;
  codes: Map<string, number>;
}

/** A load's messages, encoded before the measurement as gRPC frames: sending them costs the client next to nothing. */
interface Encoded {
  frames: Buffer[];
  events: number;
}

/** Encodes the messages `messages()` yields (the first names the pool) as gRPC frames. */
function encode(pool: string, messages: Iterable<WireRouterEvent[]>): Encoded {
  const frames: Buffer[] = [];
  let events = 0;
  for (const batch of messages) {
    frames.push(frame(toBinary(PublishRequestSchema, create(PublishRequestSchema, { pool: frames.length === 0 ? pool : "", events: batch }))));
    events += batch.length;
  }
  return { frames, events };
}

/** One Publish stream of pre-encoded frames over a bare HTTP/2 client (the server's flow control paces the writes); its summary. */
async function publishStream(encoded: Encoded): Promise<Summary> {
  const session = http2.connect(`http://${server.address}`);
  session.on("error", () => undefined);
  try {
    const stream = session.request({ ":method": "POST", ":path": "/mmgate.kvevents.v1.KvEventService/Publish", "content-type": "application/grpc+proto", te: "trailers" });
    const chunks: Buffer[] = [];
    stream.on("data", (chunk: Buffer) => chunks.push(chunk));
    const ended = new Promise<{ status: string; message: string }>((resolve) => {
      let status = "no status";
      let message = "";
      const take = (headers: http2.IncomingHttpHeaders) => {
        if (headers["grpc-status"] !== undefined) status = String(headers["grpc-status"]);
        if (headers["grpc-message"] !== undefined) message = decodeURIComponent(String(headers["grpc-message"]));
      };
      stream.once("response", take);
      stream.once("trailers", take);
      stream.on("error", () => undefined);
      stream.once("close", () => resolve({ status, message }));
    });
    for (const f of encoded.frames) {
      if (stream.destroyed) break;
      if (!stream.write(f)) await writable(stream, "close");
    }
    stream.end();
    const { status, message } = await ended;
    if (status !== "0") throw new Error(`Publish ended with grpc-status ${status}: ${message}`);
    const body = Buffer.concat(chunks);
    const res = fromBinary(PublishResponseSchema, body.subarray(5, 5 + body.readUInt32BE(1)));
    const codes = new Map<string, number>();
    for (const r of res.rejections) codes.set(r.code, (codes.get(r.code) ?? 0) + 1);
    return { applied: res.applied, rejected: res.rejected, codes };
  } finally {
    session.close();
  }
}

interface HealthFigures {
  checks: number;
  failures: number;
  maxMs: number;
}

interface Row {
  load: string;
  applied: bigint;
  rejected: bigint;
  seconds: number;
  yields: number;
  /** The slicer's longest slice: what applying itself held the loop for. */
  sliceMs: number;
  maxMs: number;
  p99Ms: number;
  peakRssMB: number;
  health: HealthFigures;
}

const rows: Row[] = [];
let failed = false;

/**
 * Runs `streams` (each resolving with its summary) under the loop-delay
 * monitor and the health probe; checks that every event was accounted for
 * (`events`), and `exact` counts or a rejection `code` where the load fixes them.
 */
async function measure(load: string, streams: () => Promise<Summary>[], expect: { events: number; applied?: number; code?: string }): Promise<void> {
  const yieldsBefore = Number((await server.command({ op: "slicer" })).yields);
  await server.command({ op: "slicerReset" });
  await server.command({ op: "loopDelayStart" });
  await server.health();
  const t0 = performance.now();
  let summaries: Summary[] = [];
  try {
    summaries = await Promise.all(streams());
  } catch (error) {
    failed = true;
    process.stdout.write(`ERROR ${load}: ${error instanceof Error ? error.message : String(error)}\n`);
  }
  const seconds = (performance.now() - t0) / 1000;
  const health = await server.health();
  const delay = await server.command({ op: "loopDelayStop" });
  const slicer = await server.command({ op: "slicer" });
  const yields = Number(slicer.yields) - yieldsBefore;
  const applied = summaries.reduce((n, s) => n + s.applied, 0n);
  const rejected = summaries.reduce((n, s) => n + s.rejected, 0n);
  if (applied + rejected !== BigInt(expect.events) || (expect.applied !== undefined && applied !== BigInt(expect.applied))) {
    failed = true;
    process.stdout.write(`ERROR ${load}: applied ${applied} rejected ${rejected}, expected ${expect.events} events${expect.applied === undefined ? "" : `, ${expect.applied} applied`}\n`);
  }
  if (expect.code !== undefined && !summaries.some((s) => s.codes.has(expect.code!))) {
    failed = true;
    process.stdout.write(`ERROR ${load}: no ${expect.code} among the reported rejections\n`);
  }
  rows.push({ load, applied, rejected, seconds, yields, sliceMs: Number(slicer.longestSliceMs), maxMs: Number(delay.maxMs), p99Ms: Number(delay.p99Ms), peakRssMB: Number(delay.peakRssMB), health });
  process.stdout.write(`  ${load}: ${seconds.toFixed(1)} s, longest turn ${Number(delay.maxMs).toFixed(1)} ms\n`);
}

/** Messages of `size` events over `events`. */
function* chunks(events: readonly WireRouterEvent[], size: number): Generator<WireRouterEvent[]> {
  for (let i = 0; i < events.length; i += size) yield events.slice(i, i + size);
}

/** fromBinary of one message, median of 3, in ms (what the server's transport spends before ingest sees the message). */
function decodeMs(events: WireRouterEvent[]): { ms: number; bytes: number } {
  const bytes = toBinary(PublishRequestSchema, create(PublishRequestSchema, { pool: "x", events }));
  const times: number[] = [];
  for (let i = 0; i < 3; i++) {
    const t0 = performance.now();
    fromBinary(PublishRequestSchema, bytes);
    times.push(performance.now() - t0);
  }
  return { ms: median(times), bytes: bytes.length };
}
const decodes: { shape: string; ms: number; bytes: number }[] = [];

process.stdout.write(`loads: ${ONLY.join(", ")}\n`);

if (ONLY.includes("split")) {
  server = await startServer(POOLS.split!);
  const one = splitRun(1n, 1_000_000n, SPLIT_BLOCKS, MAX_BLOCKS_PER_EVENT);
  decodes.push({ shape: "one event of 65,536 blocks", ...decodeMs([one[0]!]) });
  const oneEncoded = encode("split", chunks(one, 1));
  await measure(`640k blocks: ${one.length} events of <= 65,536, one a message`, () => [publishStream(oneEncoded)], { events: one.length, applied: one.length });
  const six = Array.from({ length: 6 }, (_, w) => encode("split6", chunks(splitRun(BigInt(w + 1), 10_000_000n * BigInt(w + 1), SPLIT_BLOCKS, MAX_BLOCKS_PER_EVENT), 1)));
  await measure("the same from 6 streams at once", () => six.map((encoded) => publishStream(encoded)), { events: 6 * one.length, applied: 6 * one.length });
  const unsplit = [storedRun(1n, 50_000_000n, SPLIT_BLOCKS)];
  decodes.push({ shape: "one event of 640,000 blocks", ...decodeMs(unsplit) });
  const unsplitEncoded = encode("unsplit", [unsplit]);
  await measure("reference: one 640k-block event, one message (EventTooLarge)", () => [publishStream(unsplitEncoded)], { events: 1, applied: 0, code: "EventTooLarge" });
  server.close();
}

if (ONLY.includes("full")) {
  server = await startServer(POOLS.full!);
  // Fill the pool past its 131,072 slots: the last inserts already fail.
  const fill = splitRun(100n, 200_000_000n, 150_000, 64);
  const filled = await publishStream(encode("full", chunks(fill, 1024)));
  process.stdout.write(`  filled pool full: ${filled.applied} events applied, ${filled.rejected} with a failed insert\n`);
  const load = singles(300_000_000n, 65_536, 8);
  decodes.push({ shape: "65,536 single-block events", ...decodeMs(load) });
  decodes.push({ shape: "4,096 single-block events", ...decodeMs(load.slice(0, 4096)) });
  const loadEncoded = encode("full", [load]);
  await measure("65,536 single-block events, full pool: one message", () => [publishStream(loadEncoded)], { events: 65_536, code: "CapacityExhausted" });
  const again = encode("full", chunks(singles(400_000_000n, 65_536, 8), 4096));
  await measure("the same, in 16 messages of 4,096", () => [publishStream(again)], { events: 65_536, code: "CapacityExhausted" });
  server.close();
}

if (ONLY.includes("stream")) {
  server = await startServer(POOLS.stream!);
  let base = 1_000_000_000n;
  const message = (n: number) => {
    const events = singles(base, n, 8);
    base += BigInt(n);
    return events;
  };
  const total = STREAM_MESSAGES * STREAM_EVENTS;
  let encoded = encode("stream", (function* () {
    for (let m = 0; m < STREAM_MESSAGES; m++) yield message(STREAM_EVENTS);
  })());
  await measure(`${STREAM_MESSAGES} x 65,536 single-block events, one stream`, () => [publishStream(encoded)], { events: total, applied: total });
  encoded = encode("stream-small", (function* () {
    for (let m = 0; m < total / 4096; m++) yield message(4096);
  })());
  await measure(`the same count in messages of 4,096`, () => [publishStream(encoded)], { events: total, applied: total });
  server.close();
}

// --- report --------------------------------------------------------------------

const pad = (s: string, n: number) => s.padEnd(n);
const lpad = (s: string, n: number) => s.padStart(n);
process.stdout.write(`\nLongest event-loop turn of the relay while ingest applies (target: ${TARGET_MS} ms), and health checks every ${HEALTH_EVERY_MS} ms beside it\n\n`);
const width = Math.max(...rows.map((r) => r.load.length), 4);
process.stdout.write(
  `${pad("load", width)}  ${lpad("applied", 9)}  ${lpad("rejected", 9)}  ${lpad("wall s", 7)}  ${lpad("yields", 7)}  ${lpad("slice ms", 8)}  ${lpad("max turn ms", 11)}  ${lpad("p99 ms", 7)}  ${lpad("health max ms", 13)}  ${lpad("checks", 6)}  ${lpad("failed", 6)}  ${lpad("peak RSS MB", 11)}  vs ${TARGET_MS} ms\n`,
);
for (const r of rows) {
  process.stdout.write(
    `${pad(r.load, width)}  ${lpad(String(r.applied), 9)}  ${lpad(String(r.rejected), 9)}  ${lpad(r.seconds.toFixed(1), 7)}  ${lpad(String(r.yields), 7)}  ${lpad(r.sliceMs.toFixed(1), 8)}  ${lpad(r.maxMs.toFixed(1), 11)}  ${lpad(r.p99Ms.toFixed(1), 7)}  ${lpad(r.health.maxMs.toFixed(1), 13)}  ${lpad(String(r.health.checks), 6)}  ${lpad(String(r.health.failures), 6)}  ${lpad(r.peakRssMB.toFixed(0), 11)}  ${r.maxMs <= TARGET_MS ? "met" : `over (${(r.maxMs / TARGET_MS).toFixed(1)}x)`}\n`,
  );
}
if (decodes.length > 0) {
  process.stdout.write(`\nDecoding one message (fromBinary, in this process, median of 3): the server's transport does this before the handler runs, in one turn\n`);
  for (const d of decodes) process.stdout.write(`  ${pad(d.shape, 30)} ${lpad((d.bytes / 1e6).toFixed(2), 6)} MB  ${lpad(d.ms.toFixed(1), 7)} ms\n`);
}
process.exitCode = failed ? 1 : 0;
