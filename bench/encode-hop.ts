/**
 * Encode hop benchmark. First, and the figures the targets are judged on:
 *
 * - Text-only passthrough, every party in its own process:
 *   `EncodeHopService.Generate` through the hop (`mmgate serve --modules
 *   encodeHop`, encoders.discovery off, encodeHop.downstream the token
 *   worker) against `TokenWorkerService.Generate` called directly on the
 *   token worker (`mmgate token-worker`), the load generator being
 *   bench/_rpc-client.ts (raw node:http2, one connection, the request frame
 *   encoded once, BENCH_IN_FLIGHT calls in flight). Every call is checked
 *   against the token worker's exact sequence of messages, captured once per
 *   run with a connect client calling the token worker: the hop must relay
 *   them unchanged, so through the hop the same bytes must arrive. Rounds
 *   interleaved (hop, direct, then direct, hop); ratios taken within a
 *   round, reported as median (min–max). Next to the rates, each process's
 *   CPU time per call from /proc over the measured window: the hop's and the
 *   token worker's in the hop case, the token worker's in the direct one,
 *   and the load generator's in both. Targets: latency (p50) at most 1.3x,
 *   throughput at least 0.7x of the direct call. Both servers run as
 *   deployed (log level info: a request log line per call; their stdout
 *   goes to a file in a temp dir, which is removed unless the run fails).
 *   On a 2-core machine the hop case runs three busy processes (generator,
 *   hop, token worker) where the direct case runs two, so the rates there
 *   are bound by the cores, and CPU per call says more than calls/s.
 * - The same with the token worker pausing before each token
 *   (tokenWorker.tokenIntervalMs, BENCH_TOKEN_INTERVAL_MS): a real engine
 *   spends milliseconds per token, and this run shows what the hop adds to
 *   such a call rather than to an RPC that does nothing.
 *
 * Then, in-process figures kept for reference (the load generator is a
 * connect client in the bench's own process, so its cost is charged to the
 * hop's process; not the targets' measurement):
 *
 * - Text-only passthrough with the hop, the encode worker, the demo token
 *   worker (as `mmgate serve` runs them) and the load generator in one
 *   process, C calls in flight.
 * - The same with the token worker in its own process (the one above), the
 *   hop and the load generator in the bench's.
 * - Multimodal, one 1024x1024 PNG as a `data:` URL: the hop's end-to-end
 *   time against its parts measured alone in the same rounds (the encode
 *   call to the Encode worker, and the token worker call with the encoded
 *   request), so the remainder is the hop's own cost.
 *
 * Env: BENCH_ROUNDS (9), BENCH_MS per all-processes measurement (2000),
 * BENCH_WARMUP_MS before each (500), BENCH_TOKEN_INTERVAL_MS (the paced
 * run's pause before each token, 5), BENCH_ONLY (the parts to run,
 * comma-separated: instant, paced, in-process), BENCH_CALLS (calls per in-process
 * passthrough sample, 400), BENCH_IN_FLIGHT (16). MMGATE_* variables reach
 * both server processes (e.g. MMGATE_RPC__LEAN_PATH=false); BENCH_CPU_PROF=DIR
 * writes each server process's V8 CPU profile there. Exits 1 when a
 * checked call fails. Run: node --import tsx bench/encode-hop.ts
 */
import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { create, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { pino } from "pino";
import sharp from "sharp";
import { EncodeHopService, EncodeWorkerService, GenerateRequestSchema as HopGenerateRequestSchema } from "../gen/mmgate/encode/v1/encode_pb.js";
import { PreprocessedRequestSchema, type PreprocessedRequest } from "../gen/mmgate/llm/v1/request_pb.js";
import { GenerateRequestSchema, GenerateResponseSchema, TokenWorkerService } from "../gen/mmgate/llm/v1/token_worker_pb.js";
import { consumeEncodeStream, encodeHopModule, encodeWorkerModule, tokenWorkerModule } from "../src/encode/index.js";
import { mediaModule } from "../src/media/index.js";
import { resolveConfig, startHost, type Host } from "../src/server/index.js";
import { interleave, median, medianInterval, ratios, spread, summary } from "./_stats.js";

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 9);
const CALLS = Number(process.env.BENCH_CALLS ?? 400);
const IN_FLIGHT = Number(process.env.BENCH_IN_FLIGHT ?? 16);
const DURATION_MS = Number(process.env.BENCH_MS ?? 2000);
const WARMUP_MS = Number(process.env.BENCH_WARMUP_MS ?? 500);
/** The paced run's pause before each token: a fast engine's decode step. */
const PACE_MS = Number(process.env.BENCH_TOKEN_INTERVAL_MS ?? 5);
/** BENCH_ONLY: which parts run (instant, paced, in-process; comma-separated), all by default. */
const PARTS = new Set((process.env.BENCH_ONLY ?? "instant,paced,in-process").split(",").map((part) => part.trim()));
const TARGET_LATENCY = 1.3;
const TARGET_THROUGHPUT = 0.7;
/** The unpaced run's target: the hop's CPU per call at most this many times the token worker's on the same calls. */
const TARGET_CPU = 1.5;

const root = new URL("..", import.meta.url).pathname;
const started = performance.now();

/** The servers' stdout (their JSON logs); removed at the end unless the run failed. */
const logDir = mkdtempSync(join(tmpdir(), "mmgate-bench-encode-hop-"));

// Every child this bench starts, ended however the bench ends.
const children = new Set<ChildProcess>();
const running = (proc: ChildProcess) => proc.exitCode === null && proc.signalCode === null;
const killAll = () => {
  for (const proc of children) if (running(proc)) proc.kill("SIGTERM");
};
process.once("exit", killAll);
for (const [signal, code] of [["SIGINT", 130], ["SIGTERM", 143]] as const) {
  process.once(signal, () => {
    killAll();
    rmSync(logDir, { recursive: true, force: true });
    process.exit(code);
  });
}

/** Ends a child: stdin closed or SIGTERM (`how`), SIGKILL if it has not exited within 10 s. */
async function stop(proc: ChildProcess, how: "stdin" | "SIGTERM"): Promise<void> {
  if (!running(proc)) return;
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
  if (how === "stdin") proc.stdin!.end();
  else proc.kill("SIGTERM");
  const timer = setTimeout(() => proc.kill("SIGKILL"), 10_000);
  await exited;
  clearTimeout(timer);
}

interface Server {
  proc: ChildProcess;
  pid: number;
  address: string;
  log: string;
}

/**
 * `node bin/mmgate.js <args>` on an ephemeral port, admin listener off, its
 * stdout (the JSON log) to a file: resolves with the address its "mmgate
 * serving" line gives. A file rather than a pipe, so that reading its
 * request log costs no process here anything.
 */
async function startMmgate(name: string, args: string[]): Promise<Server> {
  const log = join(logDir, `${name}.log`);
  const fd = openSync(log, "w");
  const profile = process.env.BENCH_CPU_PROF ? ["--cpu-prof", `--cpu-prof-dir=${process.env.BENCH_CPU_PROF}`, `--cpu-prof-name=${name}-${Date.now()}.cpuprofile`] : [];
  const proc = spawn(process.execPath, [...profile, "bin/mmgate.js", ...args, "--listen", "127.0.0.1:0", "--admin-listen", "", "--log-level", "info"], {
    cwd: root,
    stdio: ["ignore", fd, "inherit"],
  });
  closeSync(fd);
  children.add(proc);
  const deadline = Date.now() + 30_000;
  for (;;) {
    for (const line of readFileSync(log, "utf8").split("\n")) {
      if (!line.includes('"mmgate serving"')) continue;
      const entry = JSON.parse(line) as { msg?: string; address?: string };
      if (entry.msg === "mmgate serving" && entry.address) return { proc, pid: proc.pid!, address: entry.address, log };
    }
    if (!running(proc)) throw new Error(`${name} (mmgate ${args.join(" ")}) exited (${proc.exitCode ?? proc.signalCode}) before serving; log: ${log}`);
    if (Date.now() > deadline) throw new Error(`${name} (mmgate ${args.join(" ")}) did not start within 30 s; log: ${log}`);
    await sleep(50);
  }
}

/** bench/_rpc-client.ts in its own process; `ask` sends it one command and reads its answer. */
function startLoadGenerator() {
  const proc = spawn(process.execPath, ["--import", "tsx", "bench/_rpc-client.ts"], { cwd: root, stdio: ["pipe", "pipe", "inherit"] });
  children.add(proc);
  const lines = createInterface({ input: proc.stdout! })[Symbol.asyncIterator]();
  const ask = async (cmd: Record<string, unknown>): Promise<Record<string, unknown>> => {
    proc.stdin!.write(`${JSON.stringify(cmd)}\n`);
    const { value, done } = await lines.next();
    if (done) throw new Error(`bench/_rpc-client.ts exited (${proc.exitCode ?? proc.signalCode})`);
    const answer = JSON.parse(value as string) as Record<string, unknown>;
    if (typeof answer.error === "string") throw new Error(`bench/_rpc-client.ts: ${answer.error}`);
    return answer;
  };
  return { proc, pid: proc.pid!, ask };
}

async function drain(stream: AsyncIterable<unknown>): Promise<void> {
  for await (const _ of stream) void _;
}

/** `count` calls of `call`, `IN_FLIGHT` at a time; returns each call's latency in ms. */
async function load(call: () => Promise<void>, count: number): Promise<number[]> {
  const latencies: number[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: IN_FLIGHT }, async () => {
      while (next++ < count) {
        const t0 = performance.now();
        await call();
        latencies.push(performance.now() - t0);
      }
    }),
  );
  return latencies;
}

const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))]!;
const verdict = (met: boolean) => (met ? "met" : "NOT met");

// The text-only request every passthrough measurement sends: several
// outputs per call (one per token, then the final one), each different.
const text = create(PreprocessedRequestSchema, { tokenIds: [1, 2, 3, 4], stopConditions: { maxTokens: 8 } });

let failedCalls = 0;
let tokenWorker: Server | undefined;
let pacedWorker: Server | undefined;
let hopServer: Server | undefined;
let generator: ReturnType<typeof startLoadGenerator> | undefined;
let host: Host | undefined;
let remoteHost: Host | undefined;

/**
 * The all-processes passthrough: the figures the targets are judged on.
 * `paceMs` is the token worker's pause before each token
 * (tokenWorker.tokenIntervalMs): 0 streams as fast as it can, so the
 * ratios measure RPC overhead alone; a few ms stands in for an engine's
 * decode step, so they measure what the hop adds to a real call.
 */
async function allProcesses(paceMs: number): Promise<void> {
  generator = startLoadGenerator();
  const worker = await startMmgate(`token-worker-${paceMs}ms`, ["token-worker", ...(paceMs > 0 ? ["--set", `tokenWorker.tokenIntervalMs=${paceMs}`] : [])]);
  if (paceMs === 0) tokenWorker = worker;
  else pacedWorker = worker;
  hopServer = await startMmgate("hop", [
    "serve",
    "--modules",
    "encodeHop",
    "--set",
    `encodeHop.downstream=${worker.address}`,
    "--set",
    "encodeHop.encoders.discovery=off",
  ]);

  // The token worker's messages for `text`, as the connect client decodes
  // them and protobuf-es encodes them again: the exact sequence every call,
  // direct or through the hop, must receive.
  const replies: Uint8Array[] = [];
  const tokens = createClient(TokenWorkerService, createGrpcTransport({ baseUrl: `http://${worker.address}` }));
  for await (const res of tokens.generate({ request: text })) replies.push(toBinary(GenerateResponseSchema, res));
  const b64 = (bytes: Uint8Array) => Buffer.from(bytes).toString("base64");
  const expected = replies.map(b64);
  const replyBytes = replies.reduce((n, r) => n + 5 + r.length, 0);

  type Kind = "hop" | "direct";
  interface Sample {
    rps: number;
    p50: number;
    p99: number;
    /** CPU µs per call: the hop's (hop case only), the token worker's, the load generator's. */
    hop: number | null;
    tokenWorker: number | null;
    generator: number | null;
  }
  const command = (kind: Kind, warmupMs: number, durationMs: number) => ({
    addr: kind === "hop" ? hopServer!.address : worker.address,
    path: kind === "hop" ? `/${EncodeHopService.typeName}/${EncodeHopService.method.generate.name}` : `/${TokenWorkerService.typeName}/${TokenWorkerService.method.generate.name}`,
    stream: true,
    request: b64(
      kind === "hop"
        ? toBinary(HopGenerateRequestSchema, create(HopGenerateRequestSchema, { request: text }))
        : toBinary(GenerateRequestSchema, create(GenerateRequestSchema, { request: text })),
    ),
    replies: expected,
    inFlight: IN_FLIGHT,
    warmupMs,
    durationMs,
    client: "http2",
    cpuPids: kind === "hop" ? [hopServer!.pid, worker.pid, generator!.pid] : [worker.pid, generator!.pid],
  });
  let firstFailure: string | undefined;
  const measure = async (kind: Kind, warmupMs: number, durationMs: number): Promise<Sample> => {
    const a = (await generator!.ask(command(kind, warmupMs, durationMs))) as {
      failures: number;
      failure: string | null;
      rps: number;
      p50: number | null;
      p99: number | null;
      cpuUs: (number | null)[];
    };
    if (a.failures > 0) {
      failedCalls += a.failures;
      firstFailure ??= `${kind}: ${a.failure}`;
    }
    const [hop, tw, gen] = kind === "hop" ? a.cpuUs : [null, ...a.cpuUs];
    return { rps: a.rps, p50: a.p50 ?? NaN, p99: a.p99 ?? NaN, hop: hop ?? null, tokenWorker: tw ?? null, generator: gen ?? null };
  };

  // One untimed round first: the first calls of each path compile and
  // connect (the hop's channel to the token worker included).
  await measure("hop", 0, 1000);
  await measure("direct", 0, 1000);
  const samples: Record<Kind, Sample[]> = { hop: [], direct: [] };
  for (let round = 0; round < ROUNDS; round++) {
    const order: Kind[] = round % 2 === 0 ? ["hop", "direct"] : ["direct", "hop"];
    for (const kind of order) samples[kind].push(await measure(kind, WARMUP_MS, DURATION_MS));
  }

  const col = (kind: Kind, f: keyof Sample) => samples[kind].map((s) => s[f] ?? NaN);
  const known = (xs: number[]) => xs.every((x) => Number.isFinite(x));
  const cpu = (kind: Kind, f: "hop" | "tokenWorker" | "generator") => (known(col(kind, f)) ? `${summary(col(kind, f), 0)}` : "-");
  /** "median (min–max)", and from 9 rounds on the 95 % interval of the median (bench/_stats.ts). */
  const ratio = (xs: number[], digits = 2) => {
    if (!known(xs)) return "-";
    const interval = medianInterval(xs);
    return `${median(xs).toFixed(digits)}x (${spread(xs, digits)}${interval === undefined ? "" : `; median 95 % interval ${interval[0].toFixed(digits)}–${interval[1].toFixed(digits)}`})`;
  };

  console.log(
    `encode hop: text-only passthrough, every party in its own process; ${ROUNDS} interleaved rounds of ${DURATION_MS} ms ` +
      `(+${WARMUP_MS} ms warm-up), median (min–max) over rounds\n` +
      `  load generator bench/_rpc-client.ts (raw node:http2, one connection, ${IN_FLIGHT} calls in flight); ` +
      `hop \`mmgate serve --modules encodeHop\` (encoders.discovery off, downstream the token worker); ` +
      `token worker \`mmgate token-worker\`, ${paceMs > 0 ? `pausing ${paceMs} ms before each token (tokenIntervalMs, standing in for an engine's decode step)` : "streaming as fast as it can (RPC overhead alone)"}; ` +
      `both servers at log level info\n` +
      `  every call checked against the token worker's ${replies.length} messages (${replyBytes} bytes), byte for byte`,
  );
  for (const kind of ["hop", "direct"] as const) {
    console.log(
      `  ${(kind === "hop" ? "through the hop" : "token worker directly").padEnd(22)} ${summary(col(kind, "rps"), 0)} calls/s  ` +
        `p50 ${summary(col(kind, "p50"), 2)} ms  p99 ${summary(col(kind, "p99"), 2)} ms`,
    );
    console.log(
      `  ${"".padEnd(22)} CPU µs per call: ` +
        (kind === "hop" ? `hop ${cpu(kind, "hop")}, ` : "") +
        `token worker ${cpu(kind, "tokenWorker")}, load generator ${cpu(kind, "generator")}`,
    );
  }
  const rpsRatio = ratios(col("hop", "rps"), col("direct", "rps"));
  const p50Ratio = ratios(col("hop", "p50"), col("direct", "p50"));
  const p99Ratio = ratios(col("hop", "p99"), col("direct", "p99"));
  console.log(`  hop / direct calls/s   ${ratio(rpsRatio)}  target >= ${TARGET_THROUGHPUT}x: ${verdict(median(rpsRatio) >= TARGET_THROUGHPUT)}`);
  console.log(`  hop / direct p50       ${ratio(p50Ratio)}  target <= ${TARGET_LATENCY}x: ${verdict(median(p50Ratio) <= TARGET_LATENCY)}`);
  console.log(`  hop / direct p99       ${ratio(p99Ratio)}`);
  // CPU per call: what the hop's process adds, against what the token
  // worker spends on the same call; and the whole machine's CPU per call
  // (generator included), which bounds the throughput ratio when the cores
  // are the limit.
  const hopCpu = col("hop", "hop");
  const twViaHop = col("hop", "tokenWorker");
  const twDirect = col("direct", "tokenWorker");
  const allHop = samples.hop.map((s) => (s.hop ?? NaN) + (s.tokenWorker ?? NaN) + (s.generator ?? NaN));
  const allDirect = samples.direct.map((s) => (s.tokenWorker ?? NaN) + (s.generator ?? NaN));
  if (known(hopCpu) && known(twViaHop) && known(twDirect)) {
    console.log(
      `  CPU per call: the hop adds ${summary(hopCpu, 0)} µs next to the token worker's ${summary(twViaHop, 0)} µs ` +
        `(hop / token worker ${ratio(ratios(hopCpu, twViaHop))}); the token worker behind the hop / called directly ${ratio(ratios(twViaHop, twDirect))}`,
    );
    if (paceMs === 0) {
      const cpuRatio = ratios(hopCpu, twViaHop);
      console.log(`  hop / token worker CPU per call ${median(cpuRatio).toFixed(2)}x, target <= ${TARGET_CPU}x: ${verdict(median(cpuRatio) <= TARGET_CPU)}`);
    }
    console.log(
      `  every process's CPU per call (generator included), direct / hop: ${ratio(ratios(allDirect, allHop))} ` +
        `-- the throughput ratio this machine allows when its cores are the limit`,
    );
  } else {
    console.log("  CPU per call: not available (no /proc)");
  }
  if (firstFailure !== undefined) console.log(`  ${failedCalls} calls failed their check, the first: ${firstFailure}`);
  console.log(
    `\ntargets (all processes, token worker ${paceMs > 0 ? `pacing ${paceMs} ms per token` : "unpaced"}): latency p50 ${median(p50Ratio).toFixed(2)}x, target <= ${TARGET_LATENCY}x: ${verdict(median(p50Ratio) <= TARGET_LATENCY)}; ` +
      `throughput ${median(rpsRatio).toFixed(2)}x, target >= ${TARGET_THROUGHPUT}x: ${verdict(median(rpsRatio) >= TARGET_THROUGHPUT)}`,
  );

  await stop(generator.proc, "stdin");
  await stop(hopServer.proc, "SIGTERM");
  if (paceMs > 0) await stop(worker.proc, "SIGTERM");
}

/** The in-process figures, for reference. */
async function inProcess(): Promise<void> {
  const modules = [mediaModule, encodeWorkerModule, tokenWorkerModule, encodeHopModule];
  const config = resolveConfig({ listen: "127.0.0.1:0", adminListen: "", modules: modules.map((m) => m.name) }, modules);
  host = await startHost({ config, modules, logger: pino({ level: "silent" }), version: "bench" });
  const transport = createGrpcTransport({ baseUrl: `http://${host.address}` });
  const hop = createClient(EncodeHopService, transport);
  const tokens = createClient(TokenWorkerService, transport);
  const encoder = createClient(EncodeWorkerService, transport);

  console.log(
    "\n--- in-process figures, for reference: the load generator is a connect client in the bench's own process, " +
      "so its client cost is charged to the hop's process (the targets are judged on the all-processes figures above) ---",
  );

  // Text-only passthrough, everything in one process.
  const samples = { hop: [] as { p50: number; p99: number; rps: number }[], direct: [] as { p50: number; p99: number; rps: number }[] };
  const measure = (key: "hop" | "direct") => async () => {
    const t0 = performance.now();
    const latencies = await load(() => drain(key === "hop" ? hop.generate({ request: text }) : tokens.generate({ request: text })), CALLS);
    samples[key].push({ p50: pct(latencies, 50), p99: pct(latencies, 99), rps: CALLS / ((performance.now() - t0) / 1000) });
  };
  await interleave([measure("hop"), measure("direct")], ROUNDS, 1);
  const col = (key: "hop" | "direct", f: "p50" | "p99" | "rps") => samples[key].map((s) => s[f]);
  console.log(
    `\nencode hop, in one process (load generator, hop, encode worker and token worker, as \`mmgate serve\` runs them): text-only passthrough, ` +
      `${IN_FLIGHT} calls in flight, ${CALLS} calls per sample, ${ROUNDS} interleaved rounds; median (min–max)`,
  );
  for (const key of ["hop", "direct"] as const) {
    console.log(
      `  ${(key === "hop" ? "through the hop" : "token worker directly").padEnd(24)} p50 ${summary(col(key, "p50"), 2)} ms  p99 ${summary(col(key, "p99"), 2)} ms  ${summary(col(key, "rps"), 0)} calls/s`,
    );
  }
  console.log(`  hop / direct p50 latency ${summary(ratios(col("hop", "p50"), col("direct", "p50")), 2)}x`);
  console.log(`  hop / direct throughput  ${summary(ratios(col("hop", "rps"), col("direct", "rps")), 2)}x`);

  // The same passthrough with the token worker in its own process (the one
  // the all-processes figures used), the hop in this one: the token
  // worker's cost leaves the hop's process, the load generator's stays.
  if (tokenWorker && running(tokenWorker.proc)) {
    const remoteModules = [mediaModule, encodeWorkerModule, encodeHopModule];
    const remoteConfig = resolveConfig(
      { listen: "127.0.0.1:0", adminListen: "", modules: remoteModules.map((m) => m.name), encodeHop: { downstream: tokenWorker.address } },
      remoteModules,
    );
    remoteHost = await startHost({ config: remoteConfig, modules: remoteModules, logger: pino({ level: "silent" }), version: "bench" });
    const remoteHop = createClient(EncodeHopService, createGrpcTransport({ baseUrl: `http://${remoteHost.address}` }));
    const remoteTokens = createClient(TokenWorkerService, createGrpcTransport({ baseUrl: `http://${tokenWorker.address}` }));
    const remote = { hop: [] as { p50: number; rps: number }[], direct: [] as { p50: number; rps: number }[] };
    const measureRemote = (key: "hop" | "direct") => async () => {
      const t0 = performance.now();
      const latencies = await load(() => drain(key === "hop" ? remoteHop.generate({ request: text }) : remoteTokens.generate({ request: text })), CALLS);
      remote[key].push({ p50: pct(latencies, 50), rps: CALLS / ((performance.now() - t0) / 1000) });
    };
    await interleave([measureRemote("hop"), measureRemote("direct")], ROUNDS, 1);
    console.log(
      `\nencode hop, hop and load generator in one process, token worker in its own (\`mmgate token-worker\`, ${tokenWorker.address}): text-only passthrough`,
    );
    console.log(`  through the hop            p50 ${summary(remote.hop.map((r) => r.p50), 2)} ms  ${summary(remote.hop.map((r) => r.rps), 0)} calls/s`);
    console.log(`  token worker directly      p50 ${summary(remote.direct.map((r) => r.p50), 2)} ms  ${summary(remote.direct.map((r) => r.rps), 0)} calls/s`);
    console.log(`  hop / direct p50 latency ${summary(ratios(remote.hop.map((r) => r.p50), remote.direct.map((r) => r.p50)), 2)}x`);
    console.log(`  hop / direct throughput  ${summary(ratios(remote.hop.map((r) => r.rps), remote.direct.map((r) => r.rps)), 2)}x`);
    await remoteHost.shutdown();
    remoteHost = undefined;
  }

  // Multimodal: one 1024x1024 PNG.
  const png = await sharp({ create: { width: 1024, height: 1024, channels: 3, background: { r: 40, g: 120, b: 200 } } })
    .png()
    .toBuffer();
  const multimodal: PreprocessedRequest = create(PreprocessedRequestSchema, {
    tokenIds: [1, 2, 3],
    stopConditions: { maxTokens: 8 },
    multiModalData: { image: { items: [{ data: { case: "url", value: `data:image/png;base64,${png.toString("base64")}` } }] } },
  });
  let encoded: PreprocessedRequest | undefined;
  const parts = [
    async () => drain(hop.generate({ request: multimodal })),
    async () => {
      const outcome = await consumeEncodeStream(
        (async function* () {
          for await (const res of encoder.encode({ request: multimodal })) if (res.output) yield res.output;
        })(),
      );
      encoded ??= create(PreprocessedRequestSchema, { ...multimodal, encoderResult: outcome.encoderResult });
    },
    async () => drain(tokens.generate({ request: encoded ?? multimodal })),
  ];
  const [whole, encode, downstream] = await interleave(parts, ROUNDS, 2);
  const own = whole!.map((t, i) => t - encode![i]! - downstream![i]!);
  console.log(
    `\nencode hop, in one process: multimodal, one 1024x1024 PNG (${(png.length / 1024).toFixed(0)} KiB as a data: URL); ms, median (min–max) over ${ROUNDS} rounds`,
  );
  console.log(`  through the hop            ${summary(whole!, 2)}`);
  console.log(`  the encode call alone      ${summary(encode!, 2)}  (fetch, decode, hash, store, descriptor)`);
  console.log(`  the token worker alone     ${summary(downstream!, 2)}`);
  // The parts run in their own calls, so their sum can exceed the whole in a noisy round.
  const share = (100 * median(own)) / median(whole!);
  console.log(`  the hop's own share        ${summary(own, 2)}  (${share > 0 ? `${share.toFixed(1)} % of the whole` : "within the noise of the parts"})`);
}

let ok = false;
try {
  if (PARTS.has("instant")) await allProcesses(0);
  if (PARTS.has("paced")) {
    console.log();
    await allProcesses(PACE_MS);
  }
  if (PARTS.has("in-process")) await inProcess();
  ok = true;
} finally {
  await remoteHost?.shutdown().catch(() => undefined);
  await host?.shutdown().catch(() => undefined);
  if (generator) await stop(generator.proc, "stdin");
  for (const server of [hopServer, tokenWorker, pacedWorker]) if (server) await stop(server.proc, "SIGTERM");
  if (ok && failedCalls === 0) rmSync(logDir, { recursive: true, force: true });
  else console.log(`\nthe servers' logs are kept in ${logDir}`);
}
if (failedCalls > 0) {
  console.log(`\n${failedCalls} calls failed their check: the all-processes figures are not to be trusted`);
  process.exitCode = 1;
}
console.log(`\n(${((performance.now() - started) / 1000).toFixed(1)} s)`);
