/**
 * The KV relay (src/relay/service) served by mmgate's host, against peers
 * measured in the same run:
 *
 * 1. Bootstrap: SubscribeKvPool on a pool with a 2^24-bucket lane
 *    (expectedBlocks 50,331,648, the most the relay's config takes: 32
 *    snapshot chunks, 128 MiB), timed from the call to the last snapshot
 *    chunk received; MB/s of CBI1 payload. The lane holds
 *    BENCH_FILL_EVENTS Stored events of 4 blocks (published through Publish
 *    first), so most of it is still zeros: CBI1 does not compress and
 *    nothing on the path reads the content, so the figure does not depend on
 *    it. Before any subscription the pool's hub is opened as a first
 *    subscriber opens it: its barrier snapshot copies the 128 MiB lane over
 *    several turns; the time to the hub's snapshot, and the longest turn of
 *    the relay's event loop meanwhile (perf_hooks.monitorEventLoopDelay max,
 *    1 ms resolution, in the relay's process), are shown apart (target: no
 *    turn over 50 ms). The first subscription is untimed. Contenders:
 *    - relay -> grpc-js (the headline): @grpc/grpc-js with proto-loader on
 *      relay.proto, max_receive_message_length 8 MiB;
 *    - relay -> raw client: the same call from a bare node:http2 client that
 *      splits the gRPC frames and copies each message out, decoding nothing:
 *      the relay's side alone;
 *    - raw -> raw (the peer): a bare node:http2 server writing the same 32
 *      messages, byte for byte (captured from the relay before the rounds and
 *      checked against the pool's words), to the same raw client.
 *    Both clients open the same receive windows (BENCH_WINDOW_BYTES per
 *    stream and per connection: grpc-js's grpc-node.flow_control_window,
 *    and the raw client's settings). Target: relay -> grpc-js at >= 0.5x
 *    raw -> raw.
 * 2. Delta fan-out: BENCH_SUBSCRIBERS subscribers (one HTTP/2 connection
 *    each, as remote routers would have) bootstrapped on a small pool
 *    (expectedBlocks 4096, one chunk), publication threshold 1, while one
 *    publisher streams events through Publish: a Stored event of one new
 *    block, then a Removed event of that block, and so on, so that every
 *    event changes one bucket (one delta each) and the pool stays small
 *    however long the run. The publisher closes the loop on deliveries: it
 *    keeps at most N events not yet received by every subscriber, then
 *    waits for the rest. Two passes: N = BENCH_IN_FLIGHT (16, the default
 *    publication queue capacity, so no subscriber can lag) for
 *    BENCH_FANOUT_MS, the throughput; and N = 1 for BENCH_LATENCY_MS, the
 *    path's own latency (with 16 in flight the latency is mostly queueing:
 *    16 / the delta rate). Figures: delta frames delivered per second over
 *    all subscribers, and the latency of each delivery from the publisher's
 *    own clock (the moment the event is handed to the Publish stream) to
 *    the subscriber's 'data' callback in the same process:
 *    performance.now() at both ends, not FilterUpdate.send_ts_us, which is
 *    the relay's wall clock in whole milliseconds. Every subscriber checks
 *    its deltas are contiguous; the relay must report one delta per event.
 *    The publisher is the same for every contender: a raw node:http2 client
 *    stream that encodes each PublishRequest as its event comes. It shares
 *    the process with the subscribers, so it sets how many events reach the
 *    server in one read, and with that how many deltas the server writes in
 *    one go; with connect's client publishing to the relay and the raw one
 *    to the bare server, the ratio measured the two clients' pacing as much
 *    as the servers (0.27x against 0.45-1.03x). Contenders: the relay to
 *    grpc-js subscribers (the headline), the relay to raw subscribers, and
 *    the peer: a bare node:http2 server that, for each message of a raw
 *    client stream carrying the same PublishRequest bytes, writes one delta
 *    message captured from the relay (same bytes) to every open stream, the
 *    same buffer to each, to raw subscribers and to grpc-js ones. The
 *    headline is against that peer writing to BENCH_SUBSCRIBERS grpc-js
 *    subscribers (a generic grpc-js call on its fan-out stream, decoded as
 *    FilterUpdates): the relay's CPU per delivered frame against the bare
 *    server's, round by round (target: the relay at >= 0.5x of the bare
 *    server's frames per CPU-second). Next to the rates, the server
 *    process's CPU per delivered frame (the per-frame cost), and the client
 *    process's. The warm-up round of the first pass publishes for
 *    BENCH_FANOUT_WARMUP_MS: the relay's per-delta code (ingest, apply,
 *    encode, fan-out) runs a few hundred times a second, and V8 was still
 *    compiling it a few rounds into a 1 s warm-up, on threads whose CPU
 *    counts as the server's (a fifth of the relay's CPU in a perf profile
 *    of 1 s rounds), which a bare server, with next to no code, does not
 *    pay.
 * 3. Ingest to publication: BENCH_INGEST_EVENTS Stored events of 4 new
 *    blocks (8 workers) through one Publish stream in messages of 256, into
 *    a fresh pool per round (threshold 16, the default) whose hub is open
 *    (as a first subscriber opens it) with no subscribers, so every drain is
 *    published (delta encode, hub mirror) and nothing is fanned out (2.
 *    covers that; and an unpaced Publish stream at this rate ends a
 *    subscriber with the default 16-frame queue as lagged). Timed from the
 *    call to the PublishResponse, which the relay sends once every event is
 *    applied and published. Peer: DcCkfState.applyEvent in this process on
 *    the same events (converted before timing, same config, batches
 *    materialized): the ratio is what the RPC and the publication path
 *    cost. Checked every round: every event applied, the same delta count,
 *    and the same filter words (sha256) as the peer's.
 *
 * Process layout: each server (the relay host, and the bare node:http2
 * server) runs alone in its own child process (bench/_relay-server.ts), and
 * the clients (subscribers, publisher, the in-process peer) run in this one,
 * so that no server shares an event loop with its clients and each
 * server's CPU time is its own (read by the server itself, all threads).
 * The subscribers and the publisher of 2. share this process, which is what
 * lets the publisher close the loop on deliveries and time them on one
 * clock; they cost the same for every contender.
 *
 * Rounds interleave the contenders (forward, then reversed), after one
 * untimed warm-up round each; ratios are taken within a round and reported
 * as median (min–max), next to the ratio of the medians. Rates on a busy
 * machine move a lot; CPU per frame much less. No pass/fail on timing: the
 * bench exits 1 only on a real error (a stream that fails; a message count,
 * size, sequence, delta count or filter that differs).
 *
 * Env: BENCH_ROUNDS (5), BENCH_ONLY (sections, comma-separated:
 * bootstrap,fanout,ingest), BENCH_FILL_EVENTS (65536), BENCH_WINDOW_BYTES
 * (8388608), BENCH_SUBSCRIBERS (64), BENCH_FANOUT_MS (1000), BENCH_IN_FLIGHT
 * (16), BENCH_FANOUT_WARMUP_MS (5000), BENCH_LATENCY_MS (500), BENCH_INGEST_EVENTS (32768),
 * BENCH_SERVER_NODE_ARGS (extra node arguments for the server children,
 * space-separated, e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof").
 * Run: node --import tsx bench/relay.ts
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import * as http2 from "node:http2";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { FilterUpdateKind, FilterUpdateSchema, ProducerIdentitySchema, SubscribeKvPoolRequestSchema } from "../gen/dynamo/kvrelay/v1/relay_pb.js";
import {
  KvEventService,
  PublishRequestSchema,
  PublishResponseSchema,
  RouterEventSchema,
  type PublishRequest,
  type PublishResponse,
  type RouterEvent as WireRouterEvent,
} from "../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { bucketCount, DcCkfState, DEFAULT_PUBLICATION_THRESHOLD, type RouterEvent } from "../src/kv/ckf/index.js";
import { FilterFormat, SnapshotAssembly, snapshotChunkCount } from "../src/relay/cbi1/index.js";
import { routerEventFromWire } from "../src/relay/service/ingest.js";
import { RELAY_CONTRACT_MARKER } from "../src/relay/wire/index.js";
import { median, ratios, spread } from "./_stats.js";
import { frame, selected, writable } from "./_wire.js";

const MiB = 1024 * 1024;
const MB = 1e6;
const ROUNDS = Math.max(2, Number(process.env.BENCH_ROUNDS ?? 5));
const WARMUP = 1;
const FILL_EVENTS = Number(process.env.BENCH_FILL_EVENTS ?? 65_536);
const WINDOW = Number(process.env.BENCH_WINDOW_BYTES ?? 8 * MiB);
const SUBSCRIBERS = Number(process.env.BENCH_SUBSCRIBERS ?? 64);
const FANOUT_MS = Number(process.env.BENCH_FANOUT_MS ?? 1000);
const IN_FLIGHT = Number(process.env.BENCH_IN_FLIGHT ?? 16);
const LATENCY_MS = Number(process.env.BENCH_LATENCY_MS ?? 500);
const FANOUT_WARMUP_MS = Number(process.env.BENCH_FANOUT_WARMUP_MS ?? 5000);
const INGEST_EVENTS = Number(process.env.BENCH_INGEST_EVENTS ?? 32_768);
const BATCH = 256;
const BLOCKS_PER_EVENT = 4;
const THRESHOLD = DEFAULT_PUBLICATION_THRESHOLD;
/** The largest pool the relay takes (MAX_EXPECTED_BLOCKS): 2^24 buckets, a 128 MiB lane, 32 chunks. */
const BOOT_EXPECTED = 53_687_091;
const FAN_EXPECTED = 4096;
/** Four times the blocks a round stores: the lane ends a round about a sixth full. */
const INGEST_EXPECTED = 4 * INGEST_EVENTS * BLOCKS_PER_EVENT;
const EIGHT_MIB = 8 * MiB;
const TARGET_BOOTSTRAP = 0.5;
const SUBSCRIBE_PATH = "/dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPool";
const RAW_SUBSCRIBE_PATH = "/mmgate.bench.v1.RawFanout/Subscribe";
const RAW_PUBLISH_PATH = "/mmgate.bench.v1.RawFanout/Publish";
/** A fresh pool for every ingest round through the relay: two clients (raw, connect), warm-up rounds included. */
const INGEST_POOLS = 2 * (WARMUP + ROUNDS);

const root = new URL("..", import.meta.url).pathname;
const started = performance.now();

// --- children ---------------------------------------------------------------

interface Child {
  proc: ChildProcess;
  address: string;
  command: (cmd: Record<string, unknown>) => Promise<Record<string, unknown>>;
  cpuUs: () => Promise<number>;
}

/** A server child; `command` sends one control command and reads its one-line answer. */
async function child(args: string[]): Promise<Child> {
  const nodeArgs = (process.env.BENCH_SERVER_NODE_ARGS ?? "").split(" ").filter((a) => a !== "");
  const proc = spawn(process.execPath, [...nodeArgs, "--import", "tsx", "bench/_relay-server.ts", ...args], { cwd: root, stdio: ["pipe", "pipe", "inherit"] });
  const lines = createInterface({ input: proc.stdout! })[Symbol.asyncIterator]();
  const next = async (): Promise<Record<string, unknown>> => {
    for (;;) {
      const { value, done } = await lines.next();
      if (done) throw new Error(`bench/_relay-server.ts ${args[0]} exited (${proc.exitCode ?? proc.signalCode})`);
      // What V8 prints on stdout under BENCH_SERVER_NODE_ARGS (--trace-deopt, ...) is passed on, not parsed.
      if (!(value as string).startsWith("{")) {
        process.stderr.write(`[${args[0]}] ${value as string}\n`);
        continue;
      }
      return JSON.parse(value as string) as Record<string, unknown>;
    }
  };
  let queue = Promise.resolve();
  const command = (cmd: Record<string, unknown>) => {
    const answer = queue.then(async () => {
      proc.stdin!.write(`${JSON.stringify(cmd)}\n`);
      const reply = await next();
      if (typeof reply.error === "string") throw new Error(`${args[0]} ${String(cmd.op)}: ${reply.error}`);
      return reply;
    });
    queue = answer.then(
      () => undefined,
      () => undefined,
    );
    return answer;
  };
  const address = String((await next()).address);
  return { proc, address, command, cpuUs: async () => Number((await command({ op: "cpu" })).cpuUs) };
}

const ingestPoolName = (i: number) => `ingest${i}`;
const relayConfig = {
  relay: {
    pools: [
      // Each pool at an endpoint of its own: two pools of one model may not share one (DuplicateTopologyMember).
      { name: "boot", expectedBlocks: BOOT_EXPECTED, endpoint: { component: "boot" } },
      // One delta per event, even for events that reach the relay in one turn: deliveries are matched to events.
      { name: "fan", expectedBlocks: FAN_EXPECTED, publicationThreshold: 1, coalesceWithinTurn: false, endpoint: { component: "fan" } },
      ...Array.from({ length: INGEST_POOLS }, (_, i) => ({ name: ingestPoolName(i), expectedBlocks: INGEST_EXPECTED, endpoint: { component: ingestPoolName(i) } })),
    ],
    // Room for every subscriber of a round while the previous round's are still being released.
    maxPoolStreamsTotal: 4 * SUBSCRIBERS + 16,
    maxSubscribersPerPool: 4 * SUBSCRIBERS + 16,
    // Every subscriber connects from this host: the per-address cap must take them all.
    maxPoolStreamsPerPeer: 4 * SUBSCRIBERS + 16,
    // No heartbeat within a round: every message after the snapshot is a delta.
    poolHeartbeatIntervalMs: 600_000,
  },
};

// --- gRPC framing and the raw client -----------------------------------------


/**
 * Splits a gRPC response body into messages as its DATA chunks arrive. A
 * message that lies in one chunk is handed out as a view of it; one spread
 * over several is copied into a buffer of its own, as any client that hands
 * whole messages to its caller must.
 */
class FrameReader {
  private header = Buffer.allocUnsafe(5);
  private headerFilled = 0;
  private body: Buffer | undefined;
  private filled = 0;
  constructor(private readonly onMessage: (message: Buffer) => void) {}

  push(chunk: Buffer): void {
    let at = 0;
    while (at < chunk.length) {
      if (this.body === undefined) {
        const take = Math.min(5 - this.headerFilled, chunk.length - at);
        chunk.copy(this.header, this.headerFilled, at, at + take);
        this.headerFilled += take;
        at += take;
        if (this.headerFilled < 5) return;
        this.headerFilled = 0;
        const length = this.header.readUInt32BE(1);
        if (chunk.length - at >= length) {
          this.onMessage(chunk.subarray(at, at + length));
          at += length;
          continue;
        }
        this.body = Buffer.allocUnsafe(length);
        this.filled = 0;
        continue;
      }
      const take = Math.min(this.body.length - this.filled, chunk.length - at);
      chunk.copy(this.body, this.filled, at, at + take);
      this.filled += take;
      at += take;
      if (this.filled === this.body.length) {
        const message = this.body;
        this.body = undefined;
        this.onMessage(message);
      }
    }
  }
}

/** A raw HTTP/2 session with the bench's receive windows. */
function rawSession(address: string): Promise<http2.ClientHttp2Session> {
  const session = http2.connect(`http://${address}`, { settings: { initialWindowSize: WINDOW } });
  session.on("error", () => undefined);
  return new Promise((resolve, reject) => {
    session.once("connect", () => {
      session.setLocalWindowSize(WINDOW);
      resolve(session);
    });
    session.once("error", reject);
  });
}

interface RawCall {
  stream: http2.ClientHttp2Stream;
  /** Resolves with grpc-status when the call ends (or "reset"). */
  ended: Promise<string>;
  /** The response headers arrived. */
  responded: Promise<void>;
}

/** A gRPC call on a raw session: `body` is written (and ended unless `keepOpen`), every response message goes to `onMessage`. */
function rawCall(session: http2.ClientHttp2Session, path: string, body: Buffer | undefined, onMessage: (message: Buffer) => void): RawCall {
  const stream = session.request({ ":method": "POST", ":path": path, "content-type": "application/grpc+proto", te: "trailers" });
  const reader = new FrameReader(onMessage);
  stream.on("data", (chunk: Buffer) => reader.push(chunk));
  const responded = new Promise<void>((resolve) => stream.once("response", () => resolve()));
  const ended = new Promise<string>((resolve) => {
    let status = "reset";
    stream.once("response", (headers) => {
      if (headers["grpc-status"] !== undefined) status = String(headers["grpc-status"]);
    });
    stream.once("trailers", (trailers) => (status = String(trailers["grpc-status"])));
    stream.on("error", () => undefined);
    stream.once("close", () => resolve(status));
  });
  if (body !== undefined) stream.end(body);
  return { stream, ended, responded };
}

const cancel = (stream: http2.ClientHttp2Stream) => {
  if (!stream.destroyed) stream.close(http2.constants.NGHTTP2_CANCEL);
};

// --- grpc-js ------------------------------------------------------------------

const packageDefinition = protoLoader.loadSync("dynamo/kvrelay/v1/relay.proto", {
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [`${root}proto`],
});
const RelayClient = (grpc.loadPackageDefinition(packageDefinition) as unknown as { dynamo: { kvrelay: { v1: { KvEventRelay: grpc.ServiceClientConstructor } } } }).dynamo.kvrelay.v1
  .KvEventRelay;
const subscribeDefinition = RelayClient.service.SubscribeKvPool!;

/** A FilterUpdate as proto-loader decodes it (longs and enums as strings). */
interface GrpcUpdate {
  kind: string;
  baseSequence: string;
  sequence: string;
  payload: Buffer;
}

type RelayGrpcClient = grpc.Client & { SubscribeKvPool: (request: unknown) => grpc.ClientReadableStream<GrpcUpdate> };

/** A grpc-js client on a connection of its own, with the bench's window and an 8 MiB message limit. */
async function grpcClient(address: string): Promise<RelayGrpcClient> {
  const client = new RelayClient(address, grpc.credentials.createInsecure(), {
    // The default global subchannel pool would put every client on one connection.
    "grpc.use_local_subchannel_pool": 1,
    "grpc.max_receive_message_length": EIGHT_MIB,
    "grpc-node.flow_control_window": WINDOW,
  }) as unknown as RelayGrpcClient;
  await new Promise<void>((resolve, reject) => client.waitForReady(Date.now() + 10_000, (err) => (err ? reject(err) : resolve())));
  return client;
}

/** A SubscribeKvPool request for `producer`: its bytes, and the same request in proto-loader's object shape. */
function subscribeRequest(producer: Uint8Array, id: string): { bytes: Buffer; object: unknown } {
  const bytes = Buffer.from(
    toBinary(
      SubscribeKvPoolRequestSchema,
      create(SubscribeKvPoolRequestSchema, { subscriberId: id, expectedProducer: fromBinary(ProducerIdentitySchema, producer), contractMarker: RELAY_CONTRACT_MARKER }),
    ),
  );
  return { bytes, object: subscribeDefinition.requestDeserialize(bytes) };
}

const isCancel = (err: grpc.ServiceError) => err.code === grpc.status.CANCELLED;

// --- events -------------------------------------------------------------------

/** splitmix64: the tokens hash of block `i`. */
function tokensHash(i: bigint): bigint {
  let z = BigInt.asUintN(64, i * 0x9e37_79b9_7f4a_7c15n + 0x1234_5678n);
  z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xbf58_476d_1ce4_e5b9n);
  z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d0_49bb_1331_11ebn);
  return z ^ (z >> 31n);
}

/** A Stored event of `n` new blocks starting at block `first`, no parent. */
function storedEvent(workerId: bigint, first: bigint, n: number, eventId: bigint): WireRouterEvent {
  const blocks = Array.from({ length: n }, (_, b) => ({ blockHash: first + BigInt(b), tokensHash: tokensHash(first + BigInt(b)) }));
  return create(RouterEventSchema, { workerId, eventId, data: { case: "stored", value: { blocks } } });
}

/** `count` Stored events of BLOCKS_PER_EVENT blocks over 8 workers, blocks numbered from `base`. */
function storedEvents(count: number, base: bigint): WireRouterEvent[] {
  return Array.from({ length: count }, (_, e) => storedEvent(BigInt(e % 8) + 1n, base + BigInt(e * BLOCKS_PER_EVENT), BLOCKS_PER_EVENT, BigInt(e)));
}

/** Messages of BATCH events, the first naming the pool. */
function publishMessages(pool: string, events: WireRouterEvent[]): PublishRequest[] {
  const messages: PublishRequest[] = [];
  for (let at = 0; at < events.length; at += BATCH) messages.push(create(PublishRequestSchema, { pool: at === 0 ? pool : "", events: events.slice(at, at + BATCH) }));
  return messages;
}

/**
 * KvEventService.Publish over a raw node:http2 stream: `frames` (the
 * messages, encoded before timing) written as the stream takes them; the
 * PublishResponse once the relay answers. A client that costs next to
 * nothing, so that the relay, not the client's encoding, sets the pace.
 */
async function rawPublish(session: http2.ClientHttp2Session, frames: readonly Buffer[]): Promise<PublishResponse> {
  const stream = session.request({ ":method": "POST", ":path": `/${KvEventService.typeName}/Publish`, "content-type": "application/grpc", te: "trailers" });
  const chunks: Buffer[] = [];
  stream.on("data", (chunk: Buffer) => chunks.push(chunk));
  const trailers = new Promise<http2.IncomingHttpHeaders>((resolve, reject) => {
    stream.once("trailers", resolve);
    stream.once("error", reject);
    stream.once("close", () => reject(new Error(`Publish: the stream closed without trailers (code ${stream.rstCode})`)));
  });
  for (const f of frames) if (!stream.write(f)) await writable(stream, "close");
  stream.end();
  const status = await trailers;
  if (status["grpc-status"] !== "0") throw new Error(`Publish: grpc-status ${String(status["grpc-status"])} ${decodeURIComponent(String(status["grpc-message"] ?? ""))}`);
  const body = Buffer.concat(chunks);
  return fromBinary(PublishResponseSchema, body.subarray(5, 5 + body.readUInt32BE(1)));
}

/** Fan-out event `e` (global across rounds): a Stored block, then its removal; each changes one bucket. */
function fanEvent(e: number): WireRouterEvent {
  const block = 1n << 40n | BigInt(e >> 1);
  if (e % 2 === 0) return storedEvent(1n, block, 1, BigInt(e));
  return create(RouterEventSchema, { workerId: 1n, eventId: BigInt(e), data: { case: "removed", value: { blockHashes: [block] } } });
}

// --- statistics ----------------------------------------------------------------

function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}

/**
 * Runs each contender once per round, forward on even rounds and reversed on odd ones, after WARMUP untimed rounds
 * (each contender is told which rounds those are); contenders measure themselves.
 */
async function interleaveMeasured<T>(contenders: ((warmup: boolean) => Promise<T>)[], rounds: number): Promise<T[][]> {
  const results = contenders.map(() => [] as T[]);
  for (let round = -WARMUP; round < rounds; round++) {
    const order = contenders.map((_, i) => i);
    if (round % 2 !== 0) order.reverse();
    for (const i of order) {
      const result = await contenders[i]!(round < 0);
      if (round >= 0) results[i]!.push(result);
    }
  }
  return results;
}


const ratio = (xs: number[]) => `${median(xs).toFixed(2)}x (${spread(xs, 2)})`;
const clientCpuUs = () => {
  const { user, system } = process.cpuUsage();
  return user + system;
};

// --- start ---------------------------------------------------------------------

console.log(
  `relay bench — node ${process.version}; the relay host and the bare node:http2 server each in its own process, clients in this one; ` +
    `${ROUNDS} interleaved rounds after ${WARMUP} warm-up; median (min–max) over rounds`,
);
const sections = selected("BENCH_ONLY", ["bootstrap", "fanout", "ingest"] as const);
const relay = await child(["relay", JSON.stringify(relayConfig)]);
const raw = await child(["http2"]);
const scratch = mkdtempSync(join(tmpdir(), "mmgate-relay-bench-"));
const connectTransport = createGrpcTransport({ baseUrl: `http://${relay.address}` });
const ingest = createClient(KvEventService, connectTransport);
let failed = 0;

/** 1. Bootstrap; returns its summary line. */
async function bootstrapSection(): Promise<string> {
  {
    const fillEvents = storedEvents(FILL_EVENTS, 1n << 48n);
    const fill = await ingest.publish(
      (async function* () {
        yield* publishMessages("boot", fillEvents);
      })(),
    );
    if (fill.applied !== BigInt(FILL_EVENTS)) throw new Error(`fill: ${fill.applied} of ${FILL_EVENTS} events applied (${fill.rejected} rejected)`);
  }
  const bootProducer = Buffer.from(String((await relay.command({ op: "producer", pool: "boot" })).producer), "base64");
  const bootWireProducer = fromBinary(ProducerIdentitySchema, bootProducer);
  const bootBuckets = Number(bootWireProducer.ckfFormat!.bucketCount);
  if (bootBuckets !== 1 << 24) throw new Error(`the bootstrap pool has ${bootBuckets} buckets, not 2^24`);
  const chunks = snapshotChunkCount(bootBuckets);
  const bootRequest = subscribeRequest(bootProducer, "bench-bootstrap");

  // The first hub of the pool: its barrier snapshot copies the 128 MiB lane, over several turns; the relay's event loop meanwhile.
  await relay.command({ op: "loopDelayStart" });
  const barrierMs = Number((await relay.command({ op: "openHubReady", pool: "boot" })).ms);
  const barrierLoop = await relay.command({ op: "loopDelayStop" });
  const barrierMaxMs = Number(barrierLoop.maxMs);

  // Capture: the relay's bootstrap as raw frames, checked against the pool's words; the peer serves these bytes.
  const capturedFrames: Buffer[] = [];
  const chunkPayloadLengths: number[] = [];
  let payloadBytes = 0;
  let firstChunkMs = 0;
  {
    const session = await rawSession(relay.address);
    const t0 = performance.now();
    const assembly = new SnapshotAssembly(new FilterFormat(BigInt(bootWireProducer.ckfFormat!.seed), bootBuckets));
    let words: BigUint64Array | undefined;
    await new Promise<void>((resolve, reject) => {
      const call = rawCall(session, SUBSCRIBE_PATH, frame(bootRequest.bytes), (message) => {
        if (capturedFrames.length === 0) firstChunkMs = performance.now() - t0;
        capturedFrames.push(frame(message));
        const update = fromBinary(FilterUpdateSchema, message);
        if (update.kind !== FilterUpdateKind.SNAPSHOT_CHUNK) return reject(new Error(`capture: a ${FilterUpdateKind[update.kind]} before the snapshot ended`));
        payloadBytes += update.payload.length;
        chunkPayloadLengths.push(update.payload.length);
        const done = assembly.absorbBytes(update.payload);
        if (done !== undefined) {
          words = done.words;
          cancel(call.stream);
          resolve();
        }
      });
      void call.ended.then((status) => reject(new Error(`capture: the stream ended (${status}) before the snapshot`)));
    });
    session.close();
    const expected = String((await relay.command({ op: "wordsHash", pool: "boot" })).sha256);
    const got = createHash("sha256").update(new Uint8Array(words!.buffer, words!.byteOffset, words!.byteLength)).digest("hex");
    if (capturedFrames.length !== chunks || got !== expected) throw new Error(`capture: ${capturedFrames.length} chunks, assembled lane ${got === expected ? "matches" : "DIFFERS from"} the pool's`);
    const file = join(scratch, "bootstrap.bin");
    writeFileSync(file, Buffer.concat(capturedFrames));
    await raw.command({ op: "load", bootstrap: file });
    rmSync(file);
  }
  const chunkMessageLengths = capturedFrames.map((f) => f.length - 5);
  capturedFrames.length = 0;

  interface BootResult {
    ms: number;
    /** From the call to the first chunk. */
    firstMs: number;
    serverCpuUs: number;
    clientCpuUs: number;
  }

  /** Times one bootstrap: `run` resolves at the last chunk with the time of the first; CPU of the server child and of this process around it. */
  async function bootRound(server: Child, run: () => Promise<number>): Promise<BootResult> {
    const cpu0 = await server.cpuUs();
    const c0 = clientCpuUs();
    const t0 = performance.now();
    const first = await run();
    const ms = performance.now() - t0;
    const c1 = clientCpuUs();
    return { ms, firstMs: first - t0, serverCpuUs: (await server.cpuUs()) - cpu0, clientCpuUs: c1 - c0 };
  }

  const bootGrpc = await grpcClient(relay.address);
  const relayRawSession = await rawSession(relay.address);
  const rawRawSession = await rawSession(raw.address);

  const viaGrpcJs = () =>
    new Promise<number>((resolve, reject) => {
      const call = bootGrpc.SubscribeKvPool(bootRequest.object);
      let n = 0;
      let first = 0;
      call.on("data", (update: GrpcUpdate) => {
        if (update.kind !== "FILTER_UPDATE_KIND_SNAPSHOT_CHUNK" || update.payload.length !== chunkPayloadLengths[n]) {
          reject(new Error(`grpc-js: message ${n} is a ${update.kind} of ${update.payload.length} payload bytes, not the relay's chunk of ${chunkPayloadLengths[n]}`));
          return;
        }
        if (n++ === 0) first = performance.now();
        if (n === chunks) {
          call.cancel();
          resolve(first);
        }
      });
      call.on("error", (err: grpc.ServiceError) => {
        if (!isCancel(err)) reject(err);
      });
      call.on("end", () => (n < chunks ? reject(new Error(`grpc-js: the stream ended after ${n} of ${chunks} chunks`)) : undefined));
    });
  const viaRaw = (session: http2.ClientHttp2Session) => () =>
    new Promise<number>((resolve, reject) => {
      let n = 0;
      let first = 0;
      const call = rawCall(session, SUBSCRIBE_PATH, frame(bootRequest.bytes), (message) => {
        if (message.length !== chunkMessageLengths[n]) {
          reject(new Error(`raw: message ${n} is ${message.length} bytes, the relay's was ${chunkMessageLengths[n]}`));
          return;
        }
        if (n++ === 0) first = performance.now();
        if (n === chunks) {
          cancel(call.stream);
          resolve(first);
        }
      });
      void call.ended.then((status) => (n < chunks ? reject(new Error(`raw: the stream ended (${status}) after ${n} of ${chunks} chunks`)) : undefined));
    });

  const [bootGrpcJs, bootRelayRaw, bootRawRaw] = await interleaveMeasured(
    [() => bootRound(relay, viaGrpcJs), () => bootRound(relay, viaRaw(relayRawSession)), () => bootRound(raw, viaRaw(rawRawSession))],
    ROUNDS,
  );
  bootGrpc.close();
  relayRawSession.close();
  rawRawSession.close();

  const mbps = (rs: BootResult[]) => rs.map((r) => payloadBytes / MB / (r.ms / 1000));
  const bootRows: [string, BootResult[]][] = [
    ["relay -> grpc-js", bootGrpcJs!],
    ["relay -> raw client", bootRelayRaw!],
    ["raw -> raw (peer)", bootRawRaw!],
  ];
  console.log(`\n# 1. bootstrap: ${bootBuckets.toLocaleString("en")} buckets, ${chunks} chunks, ${(payloadBytes / MB).toFixed(1)} MB of CBI1 payload; SubscribeKvPool call to last chunk`);
  for (const [name, rs] of bootRows) {
    const ms = rs.map((r) => r.ms);
    console.log(
      `  ${name.padEnd(20)} ${median(mbps(rs)).toFixed(0).padStart(5)} MB/s (${spread(mbps(rs), 0)})  ${median(ms).toFixed(1)} ms, first chunk at ${median(rs.map((r) => r.firstMs)).toFixed(1)} ms` +
        `  server CPU ${median(rs.map((r) => r.serverCpuUs / 1000)).toFixed(0)} ms, client CPU ${median(rs.map((r) => r.clientCpuUs / 1000)).toFixed(0)} ms per bootstrap`,
    );
  }
  const bootRatio = ratios(mbps(bootGrpcJs!), mbps(bootRawRaw!));
  const bootServerRatio = ratios(mbps(bootRelayRaw!), mbps(bootRawRaw!));
  console.log(`  relay -> grpc-js / raw -> raw      ${ratio(bootRatio)}, of medians ${(median(mbps(bootGrpcJs!)) / median(mbps(bootRawRaw!))).toFixed(2)}x`);
  console.log(`  relay -> raw / raw -> raw          ${ratio(bootServerRatio)}  (the relay's side alone)`);
  console.log(`  (the first subscription, untimed: its first chunk came ${firstChunkMs.toFixed(0)} ms after the call, the hub already open)`);
  console.log(
    `  barrier snapshot (the pool's first hub, opened before the first subscription): ${barrierMs.toFixed(0)} ms to the hub's snapshot, ` +
      `longest event-loop turn meanwhile ${barrierMaxMs.toFixed(1)} ms (perf_hooks.monitorEventLoopDelay max; target <= 50 ms)`,
  );
  const met = median(bootRatio) >= TARGET_BOOTSTRAP;
  return (
    `  bootstrap, 2^24-bucket lane (${(payloadBytes / MB).toFixed(0)} MB, ${chunks} chunks), relay -> grpc-js: ${median(mbps(bootGrpcJs!)).toFixed(0)} MB/s; ` +
    `raw node:http2 -> raw ${median(mbps(bootRawRaw!)).toFixed(0)} MB/s; ours/raw ${median(bootRatio).toFixed(2)}x, target >= ${TARGET_BOOTSTRAP}x: ${met ? "met" : "NOT met"}; ` +
    `barrier snapshot ${barrierMs.toFixed(0)} ms, longest event-loop turn ${barrierMaxMs.toFixed(1)} ms (target <= 50)`
  );
}

/** 2. Delta fan-out; returns its summary line. */
async function fanoutSection(): Promise<string> {
  const fanProducer = Buffer.from(String((await relay.command({ op: "producer", pool: "fan" })).producer), "base64");
  const fanBuckets = Number(fromBinary(ProducerIdentitySchema, fanProducer).ckfFormat!.bucketCount);
  const fanChunks = snapshotChunkCount(fanBuckets);
  const fanRequest = subscribeRequest(fanProducer, "bench-fanout");
  let nextFanEvent = 0;
  /** Delta messages as the relay sent them to a raw subscriber in the untimed first round: the peer's frames. */
  let capturedDeltas: Buffer[] | undefined;

  interface FanResult {
    ms: number;
    events: number;
    frames: number;
    p50: number;
    p99: number;
    serverCpuUs: number;
    clientCpuUs: number;
  }

  /** Subscribers of one round: opened (snapshot in hand) before the publisher starts. */
  interface Subscribers {
    close(): void;
  }

  /**
   * One fan-out round: `open` starts SUBSCRIBERS subscriptions that report
   * each delivery of event e (from 0) to `deliver`; `publish` streams events
   * through `next` until it returns undefined.
   */
  async function fanRound(
    server: Child,
    open: (deliver: (e: number) => void, fail: (error: Error) => void) => Promise<Subscribers>,
    publish: (next: () => Promise<WireRouterEvent | undefined>) => Promise<number>,
    inFlight: number,
    durationMs: number,
  ): Promise<FanResult> {
    const sentAt: number[] = [];
    const delivered: number[] = [];
    const latencies: number[] = [];
    let complete = 0;
    let waiters: (() => void)[] = [];
    const wake = () => {
      const woken = waiters;
      waiters = [];
      for (const w of woken) w();
    };
    let failure: Error | undefined;
    const deliver = (e: number) => {
      const now = performance.now();
      const at = sentAt[e];
      if (at === undefined) {
        failure ??= new Error(`a delivery of event ${e}, which was not sent`);
        return;
      }
      latencies.push(now - at);
      const n = (delivered[e] = (delivered[e] ?? 0) + 1);
      if (n === SUBSCRIBERS) {
        while (delivered[complete] === SUBSCRIBERS) complete += 1;
        wake();
      }
    };
    const fail = (error: Error) => {
      failure ??= error;
      wake();
    };
    const progress = () => new Promise<void>((resolve) => waiters.push(resolve));
    const subscribers = await open(deliver, fail);
    const base = nextFanEvent;
    const cpu0 = await server.cpuUs();
    const c0 = clientCpuUs();
    const t0 = performance.now();
    const deadline = t0 + durationMs;
    const next = async (): Promise<WireRouterEvent | undefined> => {
      while (failure === undefined && sentAt.length - complete >= inFlight) await progress();
      // Whole Stored / Removed pairs only, so that every round starts on a Stored and leaves no block behind.
      if (failure !== undefined || (performance.now() >= deadline && nextFanEvent % 2 === 0)) return undefined;
      const event = fanEvent(nextFanEvent++);
      sentAt.push(performance.now());
      return event;
    };
    const publishing = publish(next);
    const atDeadline = setTimeout(wake, durationMs + 1);
    const limit = setTimeout(() => fail(new Error(`fan-out: deliveries stopped at ${complete} of ${sentAt.length} events`)), durationMs + 10_000);
    while (failure === undefined && (complete < sentAt.length || performance.now() < deadline)) await progress();
    clearTimeout(atDeadline);
    clearTimeout(limit);
    const ms = performance.now() - t0;
    const c1 = clientCpuUs();
    const serverCpuUs = (await server.cpuUs()) - cpu0;
    if (failure !== undefined && server === relay) {
      const stats = await relay.command({ op: "stats", pool: "fan" });
      failure.message += ` (the relay's fan pool: ${JSON.stringify(stats)})`;
    }
    const deltas = await publishing;
    subscribers.close();
    if (failure !== undefined) throw failure;
    const events = nextFanEvent - base;
    if (deltas !== events) throw new Error(`fan-out: ${events} events sent, ${deltas} deltas published`);
    const sorted = Float64Array.from(latencies).sort();
    return { ms, events, frames: latencies.length, p50: percentile(sorted, 0.5), p99: percentile(sorted, 0.99), serverCpuUs, clientCpuUs: c1 - c0 };
  }

  /**
   * The publisher, the same for every contender: the PublishRequest messages of `next`, each encoded and written to a
   * raw client stream as it comes, at `path` of `session` (the relay's Publish, or the bare server's). The publisher
   * shares its process with the subscribers and sets how many events reach the server in one read; a different
   * client for each server would measure the clients' pacing as much as the servers. Returns the deltas the relay
   * reports for the stream, or, for the bare server, the events written (one delta each).
   */
  const streamPublish = (session: http2.ClientHttp2Session, path: string) => async (next: () => Promise<WireRouterEvent | undefined>): Promise<number> => {
    let response: PublishResponse | undefined;
    const call = rawCall(session, path, undefined, (message) => (response = fromBinary(PublishResponseSchema, message)));
    call.stream.write(frame(toBinary(PublishRequestSchema, create(PublishRequestSchema, { pool: "fan" }))));
    let n = 0;
    for (let event = await next(); event !== undefined; event = await next()) {
      call.stream.write(frame(toBinary(PublishRequestSchema, create(PublishRequestSchema, { events: [event] }))));
      n += 1;
    }
    call.stream.end();
    const status = await call.ended;
    if (status !== "0") throw new Error(`publish to ${path}: grpc-status ${status}`);
    if (path === RAW_PUBLISH_PATH) return n;
    if (response === undefined) throw new Error("fan-out: the relay ended Publish without a PublishResponse");
    if (response.rejected !== 0n) throw new Error(`fan-out: ${response.rejected} events rejected: ${response.rejections[0]?.message}`);
    return Number(response.deltasPublished);
  };

  const openGrpcJs = async (deliver: (e: number) => void, fail: (error: Error) => void): Promise<Subscribers> => {
    const clients = await Promise.all(Array.from({ length: SUBSCRIBERS }, () => grpcClient(relay.address)));
    const calls = await Promise.all(
      clients.map(
        (client) =>
          new Promise<grpc.ClientReadableStream<GrpcUpdate>>((resolve, reject) => {
            const call = client.SubscribeKvPool(fanRequest.object);
            let chunksSeen = 0;
            let snapshot = 0;
            let last = 0;
            call.on("data", (update: GrpcUpdate) => {
              if (update.kind === "FILTER_UPDATE_KIND_SNAPSHOT_CHUNK") {
                snapshot = last = Number(update.sequence);
                if (++chunksSeen === fanChunks) resolve(call);
                return;
              }
              const sequence = Number(update.sequence);
              if (update.kind !== "FILTER_UPDATE_KIND_DELTA" || Number(update.baseSequence) !== last || sequence !== last + 1) {
                fail(new Error(`grpc-js subscriber: at ${last}, got ${update.kind} ${update.baseSequence} -> ${update.sequence}`));
                return;
              }
              last = sequence;
              deliver(sequence - snapshot - 1);
            });
            call.on("error", (err: grpc.ServiceError) => {
              if (isCancel(err)) return;
              reject(err);
              fail(err);
            });
          }),
      ),
    );
    return {
      close() {
        for (const call of calls) call.cancel();
        for (const client of clients) client.close();
      },
    };
  };

  /**
   * grpc-js subscribers of the bare server's fan-out stream (a generic call
   * on RAW_SUBSCRIBE_PATH, decoded as FilterUpdates): the peer of the
   * headline, the same bytes to the same clients. The k-th message is event
   * k's delta; the captured frames carry the relay's sequences of the
   * capture round, so they are not checked for continuity here.
   */
  const openGrpcJsRaw = async (deliver: (e: number) => void, fail: (error: Error) => void): Promise<Subscribers> => {
    const clients = await Promise.all(
      Array.from({ length: SUBSCRIBERS }, async () => {
        const client = new grpc.Client(raw.address, grpc.credentials.createInsecure(), {
          "grpc.use_local_subchannel_pool": 1,
          "grpc.max_receive_message_length": EIGHT_MIB,
          "grpc-node.flow_control_window": WINDOW,
        });
        await new Promise<void>((resolve, reject) => client.waitForReady(Date.now() + 10_000, (err) => (err ? reject(err) : resolve())));
        return client;
      }),
    );
    const calls = await Promise.all(
      clients.map(
        (client) =>
          new Promise<grpc.ClientReadableStream<GrpcUpdate>>((resolve, reject) => {
            const call = client.makeServerStreamRequest<Buffer, GrpcUpdate>(
              RAW_SUBSCRIBE_PATH,
              (request) => request,
              (bytes) => subscribeDefinition.responseDeserialize(bytes) as GrpcUpdate,
              Buffer.alloc(0),
            );
            let n = 0;
            // The bare server answers with headers at once: subscribed.
            call.once("metadata", () => resolve(call));
            call.on("data", (update: GrpcUpdate) => {
              if (update.kind !== "FILTER_UPDATE_KIND_DELTA") {
                fail(new Error(`grpc-js subscriber of the bare server: got a ${update.kind}`));
                return;
              }
              deliver(n++);
            });
            call.on("error", (err: grpc.ServiceError) => {
              if (isCancel(err)) return;
              reject(err);
              fail(err);
            });
          }),
      ),
    );
    return {
      close() {
        for (const call of calls) call.cancel();
        for (const client of clients) client.close();
      },
    };
  };

  /** Raw subscribers on `address`: the first `skip` messages of each stream are its snapshot; the k-th after them is event k's delta. */
  const openRaw =
    (address: string, path: string, body: Buffer | undefined, skip: number, capture: boolean) =>
    async (deliver: (e: number) => void, fail: (error: Error) => void): Promise<Subscribers> => {
      const sessions = await Promise.all(Array.from({ length: SUBSCRIBERS }, () => rawSession(address)));
      const captured: Buffer[] = [];
      let ready!: () => void;
      let waiting = SUBSCRIBERS;
      const allReady = new Promise<void>((resolve) => (ready = resolve));
      const calls = sessions.map((session, i) => {
        let n = 0;
        const call = rawCall(session, path, body, (message) => {
          n += 1;
          if (n === skip && --waiting === 0) ready();
          if (n <= skip) return;
          if (capture && i === 0) captured.push(frame(message));
          deliver(n - skip - 1);
        });
        if (skip === 0) {
          void call.responded.then(() => {
            if (--waiting === 0) ready();
          });
        }
        void call.ended.then((status) => fail(new Error(`raw subscriber: the stream ended (${status})`)));
        return call;
      });
      await allReady;
      return {
        close() {
          if (capture) capturedDeltas = captured;
          for (const call of calls) cancel(call.stream);
          for (const session of sessions) session.close();
        },
      };
    };

  const fanRawSession = await rawSession(raw.address);
  const fanRelaySession = await rawSession(relay.address);
  const relayPublish = streamPublish(fanRelaySession, `/${KvEventService.typeName}/Publish`);
  const barePublish = streamPublish(fanRawSession, RAW_PUBLISH_PATH);
  // One round of relay -> raw subscribers first, untimed: its deltas, as the relay sent them, are the peer's frames.
  await fanRound(relay, openRaw(relay.address, SUBSCRIBE_PATH, frame(fanRequest.bytes), fanChunks, true), relayPublish, IN_FLIGHT, FANOUT_MS);
  {
    const file = join(scratch, "deltas.bin");
    writeFileSync(file, Buffer.concat(capturedDeltas!));
    await raw.command({ op: "load", deltas: file });
    rmSync(file);
  }
  const deltaBytes = median(capturedDeltas!.map((f) => f.length - 5));

  const names = ["relay -> grpc-js", "raw -> grpc-js (peer)", "relay -> raw clients", "raw -> raw clients"];
  const contenders = (inFlight: number, ms: number, warmupMs: number) => [
    (warmup: boolean) => fanRound(relay, openGrpcJs, relayPublish, inFlight, warmup ? warmupMs : ms),
    (warmup: boolean) => fanRound(raw, openGrpcJsRaw, barePublish, inFlight, warmup ? warmupMs : ms),
    (warmup: boolean) => fanRound(relay, openRaw(relay.address, SUBSCRIBE_PATH, frame(fanRequest.bytes), fanChunks, false), relayPublish, inFlight, warmup ? warmupMs : ms),
    (warmup: boolean) => fanRound(raw, openRaw(raw.address, RAW_SUBSCRIBE_PATH, undefined, 0, false), barePublish, inFlight, warmup ? warmupMs : ms),
  ];
  const loaded = await interleaveMeasured(contenders(IN_FLIGHT, FANOUT_MS, FANOUT_WARMUP_MS), ROUNDS);
  const light = await interleaveMeasured(contenders(1, LATENCY_MS, LATENCY_MS), ROUNDS);
  fanRawSession.close();
  fanRelaySession.close();

  const fps = (rs: FanResult[]) => rs.map((r) => r.frames / (r.ms / 1000));
  const p50 = (rs: FanResult[]) => rs.map((r) => r.p50);
  const p99 = (rs: FanResult[]) => rs.map((r) => r.p99);
  const perFrame = (rs: FanResult[], f: (r: FanResult) => number) => median(rs.map((r) => f(r) / r.frames));
  console.log(
    `\n# 2. delta fan-out: ${SUBSCRIBERS} subscribers (a connection each), threshold 1, delta messages of ${deltaBytes} bytes; ` +
      `latency from the publisher's send to the subscriber's callback`,
  );
  for (const [title, results] of [
    [`${IN_FLIGHT} events in flight, ${FANOUT_MS} ms of publishing per round`, loaded],
    [`one event in flight (the path's own latency), ${LATENCY_MS} ms per round`, light],
  ] as const) {
    console.log(`  ${title}`);
    for (const [i, name] of names.entries()) {
      const rs = results[i]!;
      console.log(
        `    ${name.padEnd(21)} ${median(fps(rs)).toFixed(0).padStart(6)} frames/s (${spread(fps(rs), 0)})  ${median(rs.map((r) => r.events / (r.ms / 1000))).toFixed(0)} deltas/s` +
          `  p50 ${median(p50(rs)).toFixed(2)} ms  p99 ${median(p99(rs)).toFixed(2)} ms` +
          `  server CPU ${perFrame(rs, (r) => r.serverCpuUs).toFixed(1)} µs/frame, client ${perFrame(rs, (r) => r.clientCpuUs).toFixed(1)} µs/frame`,
      );
    }
  }
  const [grpcJs, rawGrpcJs, relayRaw, rawRaw] = loaded as [FanResult[], FanResult[], FanResult[], FanResult[]];
  const [grpcJsLight, rawGrpcJsLight] = light as [FanResult[], FanResult[], FanResult[], FanResult[]];
  const cpuPerFrame = (rs: FanResult[]) => rs.map((r) => r.serverCpuUs / r.frames);
  // The headline: the relay's CPU per delivered frame against the bare server's, both to grpc-js subscribers, round by round.
  const grpcCpuRatio = ratios(cpuPerFrame(rawGrpcJs), cpuPerFrame(grpcJs));
  const grpcFpsRatio = ratios(fps(grpcJs), fps(rawGrpcJs));
  const rawCpuRatio = ratios(cpuPerFrame(rawRaw), cpuPerFrame(relayRaw));
  const rawFpsRatio = ratios(fps(relayRaw), fps(rawRaw));
  const lightRatio = ratios(p50(grpcJsLight), p50(rawGrpcJsLight));
  console.log(
    `  relay / bare, grpc-js subscribers  frames per server CPU-second ${ratio(grpcCpuRatio)} (target >= 0.5x); frames/s ${ratio(grpcFpsRatio)}; one in flight, p50 latency ${ratio(lightRatio)}`,
  );
  console.log(`  relay / bare, raw subscribers      frames per server CPU-second ${ratio(rawCpuRatio)}; frames/s ${ratio(rawFpsRatio)}`);
  return (
    `  delta fan-out, ${SUBSCRIBERS} grpc-js subscribers, threshold 1, ${IN_FLIGHT} in flight: relay CPU ${perFrame(grpcJs, (r) => r.serverCpuUs).toFixed(1)} µs per delivered frame, ` +
    `bare node:http2 writing the same bytes to grpc-js subscribers ${perFrame(rawGrpcJs, (r) => r.serverCpuUs).toFixed(1)} µs: ${median(grpcCpuRatio).toFixed(2)}x of it; ` +
    `${median(fps(grpcJs)).toFixed(0)} frames/s (bare ${median(fps(rawGrpcJs)).toFixed(0)}), p50 ${median(p50(grpcJs)).toFixed(1)} ms; one in flight p50 ${median(p50(grpcJsLight)).toFixed(2)} ms ` +
    `(bare ${median(p50(rawGrpcJsLight)).toFixed(2)} ms)`
  );
}

/** 3. Ingest to publication; returns its summary line. */
async function ingestSection(): Promise<string> {
  const ingestWire = storedEvents(INGEST_EVENTS, 1n << 56n);
  const ingestEvents: RouterEvent[] = ingestWire.map((wire) => {
    const event = routerEventFromWire(wire);
    if (!("workerId" in event)) throw event;
    return event;
  });
  let peerDeltas = -1;
  let peerHash = "";
  let nextPool = 0;

  interface IngestResult {
    ms: number;
    deltas: number;
    serverCpuUs: number;
  }

  const rawSession = http2.connect(`http://${relay.address}`);
  rawSession.on("error", () => undefined);
  /** One round through the relay: with the connect client (messages serialized as they are sent), or the raw one (frames encoded before timing). */
  const relayIngest = async (client: "connect" | "raw"): Promise<IngestResult> => {
    const pool = ingestPoolName(nextPool++);
    await relay.command({ op: "openHub", pool });
    const messages = publishMessages(pool, ingestWire);
    const frames = client === "raw" ? messages.map((m) => frame(toBinary(PublishRequestSchema, m))) : [];
    const cpu0 = await relay.cpuUs();
    const t0 = performance.now();
    const response =
      client === "raw"
        ? await rawPublish(rawSession, frames)
        : await ingest.publish(
            (async function* () {
              yield* messages;
            })(),
          );
    const ms = performance.now() - t0;
    const serverCpuUs = (await relay.cpuUs()) - cpu0;
    const deltas = Number(response.deltasPublished);
    if (response.applied !== BigInt(INGEST_EVENTS)) throw new Error(`ingest: ${response.applied} of ${INGEST_EVENTS} events applied`);
    const hash = String((await relay.command({ op: "wordsHash", pool })).sha256);
    // The relay merges what reaches it in one event-loop turn into one delta, so it publishes fewer, larger deltas than the peer's one per 16 events.
    if (peerDeltas >= 0 && (deltas < 1 || deltas > peerDeltas || hash !== peerHash)) {
      throw new Error(`ingest: the relay published ${deltas} deltas (in-process ${peerDeltas}); its filter ${hash === peerHash ? "matches" : "DIFFERS"}`);
    }
    return { ms, deltas, serverCpuUs };
  };
  const inProcess = async (): Promise<IngestResult> => {
    const state = new DcCkfState({ expectedBlocksPerDc: INGEST_EXPECTED, publishEveryNEvents: THRESHOLD }, { materialize: true });
    let deltas = 0;
    const t0 = performance.now();
    for (const event of ingestEvents) if (state.applyEvent(event).publication !== undefined) deltas += 1;
    if (state.flush() !== undefined) deltas += 1;
    const ms = performance.now() - t0;
    const words = state.words();
    peerHash = createHash("sha256").update(new Uint8Array(words.buffer, words.byteOffset, words.byteLength)).digest("hex");
    peerDeltas = deltas;
    return { ms, deltas, serverCpuUs: 0 };
  };
  // The peer first, so that every relay round is checked against it.
  await inProcess();
  const [ingestRelay, ingestPeer, ingestConnect] = await interleaveMeasured([() => relayIngest("raw"), inProcess, () => relayIngest("connect")], ROUNDS);
  rawSession.close();
  const eps = (rs: IngestResult[]) => rs.map((r) => INGEST_EVENTS / (r.ms / 1000));
  console.log(
    `\n# 3. ingest to publication: ${INGEST_EVENTS.toLocaleString("en")} Stored events of ${BLOCKS_PER_EVENT} new blocks, ${BATCH} per Publish message, threshold ${THRESHOLD}, ` +
      `${peerDeltas.toLocaleString("en")} deltas in process; a fresh pool (${bucketCount(INGEST_EXPECTED).toLocaleString("en")} buckets) per round, its hub open, no subscribers`,
  );
  console.log(
    `  relay, raw client    ${median(eps(ingestRelay!)).toFixed(0).padStart(7)} events/s (${spread(eps(ingestRelay!), 0)})  ${median(ingestRelay!.map((r) => r.deltas)).toFixed(0)} deltas (bursts merged), ${median(ingestRelay!.map((r) => r.deltas / (r.ms / 1000))).toFixed(0)} deltas/s` +
      `  ${median(ingestRelay!.map((r) => r.ms)).toFixed(1)} ms  server CPU ${median(ingestRelay!.map((r) => r.serverCpuUs / INGEST_EVENTS)).toFixed(2)} µs/event`,
  );
  console.log(
    `  relay, connect client ${median(eps(ingestConnect!)).toFixed(0).padStart(7)} events/s (${spread(eps(ingestConnect!), 0)})  server CPU ${median(ingestConnect!.map((r) => r.serverCpuUs / INGEST_EVENTS)).toFixed(2)} µs/event ` +
      `(the client serializes its messages as it sends them, in this process)`,
  );
  console.log(`  in-process (peer)    ${median(eps(ingestPeer!)).toFixed(0).padStart(7)} events/s (${spread(eps(ingestPeer!), 0)})  ${median(ingestPeer!.map((r) => r.ms)).toFixed(1)} ms`);
  const ingestRatio = ratios(eps(ingestRelay!), eps(ingestPeer!));
  console.log(`  relay / in-process   ${ratio(ingestRatio)}, of medians ${(median(eps(ingestRelay!)) / median(eps(ingestPeer!))).toFixed(2)}x`);

  return (
    `  ingest to publication, ${BATCH}-event messages, threshold ${THRESHOLD}: ${median(eps(ingestRelay!)).toFixed(0)} events/s; ` +
    `DcCkfState.applyEvent in-process ${median(eps(ingestPeer!)).toFixed(0)} events/s; ours/in-process ${median(ingestRatio).toFixed(2)}x`
  );
}

const SECTIONS = { bootstrap: bootstrapSection, fanout: fanoutSection, ingest: ingestSection } as const;
const summaries: string[] = [];
try {
  for (const section of sections) summaries.push(await SECTIONS[section]());
  console.log(`\n# summary (median over ${ROUNDS} rounds; ratios of per-round figures)`);
  for (const line of summaries) console.log(line);
} catch (error) {
  failed += 1;
  console.log(`\nFAILED: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
} finally {
  relay.proc.stdin!.end();
  raw.proc.stdin!.end();
  rmSync(scratch, { recursive: true, force: true });
}
console.log(`\n(${((performance.now() - started) / 1000).toFixed(1)} s)`);
// A failure can leave connections of the section it stopped open: do not wait for them.
if (failed > 0) process.exit(1);
