/**
 * The RPC host's throughput per call, against peers serving the same
 * methods with the same messages:
 * - host: mmgate's host with its default config (rpc.leanPath on, the lean
 *   request path for unary and server-streaming gRPC calls);
 * - host-connect: the same host with rpc.leanPath off, every call through
 *   connect-node's handler;
 * - host-traced: the host with OpenTelemetry tracing on, every call sampled
 *   (a server span each), its spans exported over OTLP/HTTP to a sink in
 *   this process that reads and discards them: what tracing costs, next to
 *   `host`, which runs with tracing off (the default);
 * - host-shim: the host's services and interceptors on connect's universal
 *   handlers, each ServerHttp2Stream handed to them by a thin shim
 *   (bench/_universal-shim.ts), without Node's compatibility objects: how
 *   much of the lean path's lead a shim in front of connect would keep;
 * - connect: bare connect-node (connectNodeAdapter + http2.createServer);
 * - grpc-js: a bare @grpc/grpc-js server;
 * - http2: a bare node:http2 server writing precomputed gRPC frames, the
 *   floor under any RPC layer.
 *
 * Every server runs alone in its own child process (bench/_rpc-server.ts),
 * and the load generator runs in another (bench/_rpc-client.ts), so no two
 * of them share an event loop and each server's CPU time is its own. Four
 * workloads, each on one HTTP/2 connection:
 * - unary: grpc.health.v1.Health/Check (answers SERVING), BENCH_IN_FLIGHT
 *   calls in flight;
 * - echo: mmgate.bench.v1.BenchRpc/Echo, a 64 KiB google.protobuf.BytesValue
 *   there and back, BENCH_IN_FLIGHT calls in flight;
 * - stream: BenchRpc/Stream, 4 BytesValue messages of BENCH_STREAM_BYTES per
 *   call, BENCH_STREAM_IN_FLIGHT calls in flight;
 * - repeat: BenchRpc/Repeat, 16 small messages per call, BENCH_IN_FLIGHT
 *   calls in flight.
 * The client checks every call (status OK in the trailers, the number,
 * length and content of the messages); a call that fails a check is counted
 * as a failure, not as a call, and any failure makes the bench exit 1.
 *
 * Rounds are interleaved: every round measures every server once per
 * workload, in the order above and then reversed in the next round, so load
 * elsewhere on the machine falls on all of them alike. Ratios are taken
 * within a round (calls/s, or MB/s for the stream) and reported as median
 * (min–max) over the rounds, next to the ratio of the medians; from 9 rounds
 * on, with the 95 % confidence interval of the median ratio, which is what
 * says whether a small difference (a change's cost) is shown or within noise.
 *
 * Next to the rates, each server's CPU time per call (all its threads, read
 * from /proc by the client over the measured window): rates move with
 * whatever else the machine runs, CPU per call much less, so a server's own
 * cost shows in it even on a busy machine. Its ratio is given the same way
 * round as the rates: the peer's CPU per call / the host's, so 0.95x means
 * the host spends 1/0.95 as much per call.
 *
 * Targets: unary calls (Check and Echo) at >= 0.8x bare grpc-js; the big
 * stream at >= 0.7x the node:http2 floor.
 *
 * Env: BENCH_ROUNDS (7), BENCH_MS per measurement (500), BENCH_WARMUP_MS
 * (150), BENCH_IN_FLIGHT (64), BENCH_STREAM_IN_FLIGHT (4),
 * BENCH_STREAM_BYTES (4194304), BENCH_ONLY (workloads, comma-separated:
 * unary,echo,stream,repeat), BENCH_SERVERS (server kinds, comma-separated),
 * BENCH_CLIENT (http2 | grpc-js; see bench/_rpc-client.ts), BENCH_BASELINE_TREE
 * (another checkout whose host runs beside this one as `host-baseline`),
 * BENCH_PAIRED (1: the servers measured side by side, see below).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createServer as createHttpServer } from "node:http";
import type { AddressInfo } from "node:net";
import { createInterface } from "node:readline";
import { create, toBinary } from "@bufbuild/protobuf";
import { BytesValueSchema, UInt32ValueSchema } from "@bufbuild/protobuf/wkt";
import { HealthCheckRequestSchema, HealthCheckResponse_ServingStatus, HealthCheckResponseSchema } from "../gen/grpc/health/v1/health_pb.js";
import { median, medianInterval, ratios, spread } from "./_stats.js";
import { selected } from "./_wire.js";

const KiB = 1024;
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 7);
/**
 * BENCH_PAIRED=1: every round measures the servers at the same time, each on
 * its own connection with BENCH_IN_FLIGHT calls, instead of one after the
 * other. They then share the machine's disturbances moment by moment, which
 * is what resolving a difference of a few per cent between two builds of one
 * server takes (host / host-baseline); their rates are then shares of the
 * cores, not each one's speed alone.
 */
const PAIRED = process.env["BENCH_PAIRED"] === "1";
const DURATION_MS = Number(process.env.BENCH_MS ?? 500);
const WARMUP_MS = Number(process.env.BENCH_WARMUP_MS ?? 150);
const IN_FLIGHT = Number(process.env.BENCH_IN_FLIGHT ?? 64);
const STREAM_IN_FLIGHT = Number(process.env.BENCH_STREAM_IN_FLIGHT ?? 4);
const STREAM_BYTES = Number(process.env.BENCH_STREAM_BYTES ?? 4 * KiB * KiB);
const CLIENT = process.env.BENCH_CLIENT === "grpc-js" ? "grpc-js" : "http2";
const ECHO_BYTES = 64 * KiB;
const STREAM_MESSAGES = 4;
const REPEAT_MESSAGES = 16;
/**
 * The client compares response messages up to this many bytes: all of an
 * echo, the start of a big streamed message, whose every byte compared
 * would cost the generator more than receiving it.
 */
const CHECKED_BYTES = 128 * KiB;
const TARGET_UNARY_VS_GRPC_JS = 0.8;
const TARGET_STREAM_VS_HTTP2 = 0.7;


const root = new URL("..", import.meta.url).pathname;

/** A child running a bench script; `next()` reads its next stdout line as JSON. */
function child(script: string, args: string[], env: Record<string, string> = {}, tree = root): { proc: ChildProcess; next: () => Promise<Record<string, unknown>> } {
  const proc = spawn(process.execPath, ["--import", "tsx", `bench/${script}`, ...args], {
    cwd: tree,
    env: { ...process.env, ...env },
    stdio: ["pipe", "pipe", "inherit"],
  });
  const lines = createInterface({ input: proc.stdout! })[Symbol.asyncIterator]();
  const next = async () => {
    const { value, done } = await lines.next();
    if (done) throw new Error(`bench/${script} ${args.join(" ")} exited (${proc.exitCode ?? proc.signalCode})`);
    return JSON.parse(value as string) as Record<string, unknown>;
  };
  return { proc, next };
}

const SERVER_NAMES = {
  host: "mmgate host",
  "host-connect": "host, connect path",
  "host-traced": "host, tracing on",
  "host-shim": "host, universal shim",
  connect: "bare connect-node",
  "grpc-js": "bare @grpc/grpc-js",
  http2: "bare node:http2",
  "host-baseline": "host of BENCH_BASELINE_TREE",
} as const;
type ServerKind = keyof typeof SERVER_NAMES;

const serving = toBinary(HealthCheckResponseSchema, create(HealthCheckResponseSchema, { status: HealthCheckResponse_ServingStatus.SERVING }));
const emptyCheck = toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema));
const echoed = toBinary(BytesValueSchema, create(BytesValueSchema, { value: Uint8Array.from({ length: ECHO_BYTES }, (_, i) => (i * 31) & 0xff) }));
// All zeros, as the servers' preallocated payload is.
const streamed = toBinary(BytesValueSchema, create(BytesValueSchema, { value: new Uint8Array(STREAM_BYTES) }));

interface Workload {
  title: string;
  path: string;
  stream: boolean;
  inFlight: number;
  request: Uint8Array;
  expect: number;
  reply: Uint8Array;
  /** What the rates and ratios are of: calls, or response bytes (MB/s). */
  by: "calls" | "bytes";
  /** Also print MB/s received: the messages are big enough for it to say something next to calls/s. */
  showBytes?: true;
  /** The peer the host is held against, and the ratio it must reach. */
  target?: { peer: ServerKind; ratio: number };
}

const WORKLOADS: Record<string, Workload> = {
  unary: {
    title: `unary Health/Check, ${IN_FLIGHT} in flight`,
    path: "/grpc.health.v1.Health/Check",
    stream: false,
    inFlight: IN_FLIGHT,
    request: emptyCheck,
    expect: 1,
    reply: serving,
    by: "calls",
    target: { peer: "grpc-js", ratio: TARGET_UNARY_VS_GRPC_JS },
  },
  echo: {
    title: `unary BenchRpc/Echo, ${ECHO_BYTES / KiB} KiB each way, ${IN_FLIGHT} in flight`,
    path: "/mmgate.bench.v1.BenchRpc/Echo",
    stream: false,
    inFlight: IN_FLIGHT,
    request: echoed,
    expect: 1,
    reply: echoed,
    by: "calls",
    showBytes: true,
    target: { peer: "grpc-js", ratio: TARGET_UNARY_VS_GRPC_JS },
  },
  stream: {
    title: `server streaming BenchRpc/Stream, ${STREAM_MESSAGES} messages of ${STREAM_BYTES} bytes per call, ${STREAM_IN_FLIGHT} in flight`,
    path: "/mmgate.bench.v1.BenchRpc/Stream",
    stream: true,
    inFlight: STREAM_IN_FLIGHT,
    request: toBinary(UInt32ValueSchema, create(UInt32ValueSchema, { value: STREAM_MESSAGES })),
    expect: STREAM_MESSAGES,
    reply: streamed,
    by: "bytes",
    target: { peer: "http2", ratio: TARGET_STREAM_VS_HTTP2 },
  },
  repeat: {
    title: `server streaming BenchRpc/Repeat, ${REPEAT_MESSAGES} small messages per call, ${IN_FLIGHT} in flight`,
    path: "/mmgate.bench.v1.BenchRpc/Repeat",
    stream: true,
    inFlight: IN_FLIGHT,
    request: emptyCheck,
    expect: REPEAT_MESSAGES,
    reply: serving,
    by: "calls",
  },
};

const workloads = selected("BENCH_ONLY", Object.keys(WORKLOADS)).map((key) => WORKLOADS[key]!);
/**
 * BENCH_BASELINE_TREE: another checkout of mmgate (a commit before a change,
 * with node_modules), whose host runs as `host-baseline` beside this one's:
 * what a change costs the host, measured in the same rounds. Only with it.
 */
const baselineTree = process.env["BENCH_BASELINE_TREE"];
const serverKinds = selected("BENCH_SERVERS", Object.keys(SERVER_NAMES) as ServerKind[]).filter((kind) => kind !== "host-baseline" || baselineTree !== undefined);

/**
 * Where host-traced exports: an OTLP/HTTP endpoint that reads each export
 * request to its end and answers success. It runs in this process, which
 * idles while a server is measured, so the traced host pays for making,
 * batching, encoding and sending its spans, and nothing for a collector.
 */
const sink = { requests: 0, bytes: 0 };
const sinkServer = serverKinds.includes("host-traced")
  ? createHttpServer((req, res) => {
      req.on("data", (chunk: Buffer) => (sink.bytes += chunk.length));
      req.on("end", () => {
        sink.requests += 1;
        res.writeHead(200, { "content-type": "application/x-protobuf" }).end();
      });
    })
  : undefined;
if (sinkServer) await new Promise<void>((resolve) => sinkServer.listen(0, "127.0.0.1", resolve));
const tracedEnv: Record<string, string> = sinkServer
  ? {
      BENCH_OTLP_ENDPOINT: `http://127.0.0.1:${(sinkServer.address() as AddressInfo).port}`,
      // Every span exported, none dropped: a queue that holds several seconds of calls, sent in large batches as it fills.
      OTEL_BSP_MAX_QUEUE_SIZE: "262144",
      OTEL_BSP_MAX_EXPORT_BATCH_SIZE: "4096",
      OTEL_BSP_SCHEDULE_DELAY: "200",
    }
  : {};
const servers = serverKinds.map((kind) => ({
  kind,
  name: SERVER_NAMES[kind],
  ...(kind === "host-baseline"
    ? child("_rpc-server.ts", ["host", String(REPEAT_MESSAGES), String(STREAM_BYTES)], {}, baselineTree)
    : child("_rpc-server.ts", [kind, String(REPEAT_MESSAGES), String(STREAM_BYTES)], kind === "host-traced" ? tracedEnv : {})),
  address: "",
}));
const client = child("_rpc-client.ts", []);

interface Result {
  calls: number;
  failures: number;
  failure: string | null;
  rps: number;
  bytesPerSecond: number;
  p50: number | null;
  p99: number | null;
  serverCpuUs: number | null;
}

function commandFor(server: (typeof servers)[number], w: Workload) {
  const b64 = (bytes: Uint8Array) => Buffer.from(bytes).toString("base64");
  return {
    addr: server.address,
    path: w.path,
    stream: w.stream,
    request: b64(w.request),
    expect: w.expect,
    reply: b64(w.reply.subarray(0, CHECKED_BYTES)),
    replyLength: w.reply.length,
    inFlight: w.inFlight,
    warmupMs: WARMUP_MS,
    durationMs: DURATION_MS,
    client: CLIENT,
    serverPid: server.proc.pid,
  };
}

async function measure(server: (typeof servers)[number], w: Workload): Promise<Result> {
  client.proc.stdin!.write(`${JSON.stringify(commandFor(server, w))}\n`);
  const answer = await client.next();
  if (typeof answer.error === "string") throw new Error(`${server.name} ${w.path}: ${answer.error}`);
  return answer as unknown as Result;
}

/** Every server measured at once, each on its own connection (BENCH_PAIRED). */
async function measureTogether(w: Workload): Promise<Result[]> {
  client.proc.stdin!.write(`${JSON.stringify({ concurrent: servers.map((s) => commandFor(s, w)) })}\n`);
  const answer = (await client.next()) as unknown;
  if (!Array.isArray(answer)) throw new Error(`${w.path}: ${String((answer as { error?: unknown }).error)}`);
  return answer as Result[];
}

const started = performance.now();
// results[workload][server][round]
const results = workloads.map(() => servers.map(() => [] as Result[]));
try {
  for (const s of servers) s.address = String((await s.next()).address);
  for (let round = 0; round < ROUNDS; round++) {
    const order = servers.map((_, i) => i);
    if (round % 2 === 1) order.reverse();
    for (const [wi, w] of workloads.entries()) {
      if (PAIRED) {
        for (const [si, r] of (await measureTogether(w)).entries()) results[wi]![si]!.push(r);
        continue;
      }
      for (const si of order) results[wi]![si]!.push(await measure(servers[si]!, w));
    }
  }
} finally {
  client.proc.stdin!.end();
  for (const s of servers) s.proc.stdin!.end();
  sinkServer?.close();
}

const MB = 1e6;
const ratio = (xs: number[]) => {
  const ci = medianInterval(xs);
  return `${median(xs).toFixed(3)}x (${spread(xs, 2)}${ci ? `; median's 95 % interval ${ci[0].toFixed(3)}–${ci[1].toFixed(3)}` : ""})`;
};
const cpuOf = (rs: Result[]) => (rs.every((r) => r.serverCpuUs !== null) ? rs.map((r) => r.serverCpuUs!) : undefined);
const ms = (xs: (number | null)[]) => {
  const known = xs.filter((x) => x !== null);
  return known.length > 0 ? `${median(known).toFixed(2)} ms` : "-";
};
const index = (kind: ServerKind) => servers.findIndex((s) => s.kind === kind);

console.log(
  `rpc bench: client ${CLIENT} in its own process, one HTTP/2 connection per measurement, each server in its own process; ` +
    `${ROUNDS} ${PAIRED ? "rounds, the servers measured side by side," : "interleaved rounds"} of ${DURATION_MS} ms (+${WARMUP_MS} ms warm-up); median (min–max) over rounds`,
);
const verdicts: string[] = [];
let failed = 0;
for (const [wi, w] of workloads.entries()) {
  console.log(`\n# ${w.title}`);
  const per = results[wi]!;
  const rate = (rs: Result[]) => rs.map((r) => (w.by === "bytes" ? r.bytesPerSecond / MB : r.rps));
  for (const [si, s] of servers.entries()) {
    const rs = per[si]!;
    const rates = rate(rs);
    const cpu = cpuOf(rs);
    const rps = median(rs.map((r) => r.rps));
    console.log(
      `  ${s.name.padEnd(20)} ${median(rates).toFixed(w.by === "bytes" ? 1 : 0).padStart(7)} ${w.by === "bytes" ? "MB/s" : "calls/s"} ` +
        `(${spread(rates, w.by === "bytes" ? 1 : 0)})` +
        (w.by === "bytes" ? `  ${rps.toFixed(1)} calls/s` : "") +
        `  p50 ${ms(rs.map((r) => r.p50))}  p99 ${ms(rs.map((r) => r.p99))}` +
        (cpu ? `  server CPU ${median(cpu).toFixed(0)} µs/call (${spread(cpu, 0)})` : "") +
        (w.showBytes ? `  ${(median(rs.map((r) => r.bytesPerSecond)) / MB).toFixed(1)} MB/s received` : "") +
        (w.stream ? `  ${(rps * w.expect).toFixed(0)} messages/s` : ""),
    );
    const failures = rs.reduce((n, r) => n + r.failures, 0);
    if (failures > 0) {
      failed += failures;
      console.log(`    ${failures} failed calls, the first: ${rs.find((r) => r.failure !== null)!.failure}`);
    }
  }
  const pairs: [ServerKind, ServerKind, string?][] = [
    ["host", "grpc-js"],
    ["host", "host-connect"],
    ["host", "host-shim", "the lean path / connect's universal handlers behind a thin shim"],
    ["host-shim", "host-connect", "what skipping Node's compatibility layer buys connect's path"],
    ["host", "connect"],
    ["host", "http2"],
    ["host-connect", "connect", "the host's layers on the connect path"],
    ["host-traced", "host", "tracing on, every call sampled and exported / tracing off"],
    ["host", "host-baseline", "this tree's host / BENCH_BASELINE_TREE's host"],
  ];
  for (const [a, b, note] of pairs) {
    const ai = index(a);
    const bi = index(b);
    if (ai < 0 || bi < 0) continue;
    const byRate = ratios(rate(per[ai]!), rate(per[bi]!));
    const cpuA = cpuOf(per[ai]!);
    const cpuB = cpuOf(per[bi]!);
    const byCpu = cpuA && cpuB ? ratios(cpuB, cpuA) : undefined;
    // The median of per-round ratios pairs measurements taken close together;
    // the ratio of the medians is steadier when single rounds are disturbed.
    const ofMedians = median(rate(per[ai]!)) / median(rate(per[bi]!));
    let verdict = "";
    if (a === "host" && b === w.target?.peer) {
      const met = median(byRate) >= w.target.ratio;
      verdict = `  target >= ${w.target.ratio}x: ${met ? "met" : "NOT met"}`;
      verdicts.push(`  ${w.title}: host / ${SERVER_NAMES[b]} ${median(byRate).toFixed(2)}x, target >= ${w.target.ratio}x: ${met ? "met" : "NOT met"}`);
    }
    console.log(
      `  ${`${a} / ${b}`.padEnd(23)} ${w.by === "bytes" ? "MB/s" : "calls/s"} ${ratio(byRate)}, of medians ${ofMedians.toFixed(2)}x` +
        (byCpu ? `;  calls per server CPU-second ${ratio(byCpu)}` : "") +
        verdict +
        (note ? `  (${note})` : ""),
    );
  }
}
if (sinkServer) console.log(`\nOTLP sink: ${sink.requests} export requests from host-traced, ${(sink.bytes / MB).toFixed(1)} MB of spans`);
if (verdicts.length > 0) console.log(`\ntargets:\n${verdicts.join("\n")}`);
if (failed > 0) {
  console.log(`\n${failed} calls failed: the figures above are not to be trusted`);
  process.exitCode = 1;
}
console.log(`\n(${((performance.now() - started) / 1000).toFixed(1)} s)`);
