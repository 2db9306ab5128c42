/**
 * What the host's layers (HTTP observer, interceptors, metrics, logging at
 * "silent") cost per call, against two peers with the same handlers:
 * a bare connect-node server (connectNodeAdapter + http2.createServer) and a
 * bare @grpc/grpc-js server.
 *
 * Every server runs alone in its own child process (bench/_host-server.ts),
 * and the load generator runs in another (bench/_host-client.ts), so no two
 * of them share an event loop. Two workloads, each with BENCH_IN_FLIGHT calls
 * in flight on one HTTP/2 connection:
 * - unary grpc.health.v1.Health/Check (answers SERVING);
 * - server streaming: mmgate.bench.v1.BenchStream/Repeat, a bench-only
 *   method sending BENCH_STREAM_MESSAGES messages per call (why not
 *   Health/Watch: see bench/_host-server.ts).
 *
 * Rounds are interleaved: every round measures every server once, in the
 * order host, connect, grpc-js and then reversed in the next round, so load
 * elsewhere on the machine falls on all of them alike. Ratios are taken
 * within a round and reported as median (min–max) over the rounds.
 *
 * Next to calls/s, each server's CPU time per call (all its threads, read
 * from /proc by the client over the measured window): calls/s moves with
 * whatever else the machine runs, CPU per call much less, so the host's own
 * cost shows in it even on a busy machine. Its ratio is given the same way
 * round: bare server's CPU per call / host's, so 0.95x means the host spends
 * 1/0.95 as much per call.
 *
 * Env: BENCH_ROUNDS (9), BENCH_MS per measurement (500), BENCH_WARMUP_MS
 * (150), BENCH_IN_FLIGHT (64), BENCH_STREAM_MESSAGES (16), BENCH_CLIENT
 * (http2 | grpc-js; see bench/_host-client.ts).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { median, spread } from "./_stats.js";

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 9);
const DURATION_MS = Number(process.env.BENCH_MS ?? 500);
const WARMUP_MS = Number(process.env.BENCH_WARMUP_MS ?? 150);
const IN_FLIGHT = Number(process.env.BENCH_IN_FLIGHT ?? 64);
const STREAM_MESSAGES = Number(process.env.BENCH_STREAM_MESSAGES ?? 16);
const CLIENT = process.env.BENCH_CLIENT === "grpc-js" ? "grpc-js" : "http2";
const TARGET_VS_CONNECT = 0.95;

const root = new URL("..", import.meta.url).pathname;

/** A child running a bench script; `next()` reads its next stdout line as JSON. */
function child(script: string, args: string[]): { proc: ChildProcess; next: () => Promise<Record<string, unknown>> } {
  const proc = spawn(process.execPath, ["--import", "tsx", `bench/${script}`, ...args], {
    cwd: root,
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

const servers = [
  { key: "host", name: "mmgate host" },
  { key: "connect", name: "bare connect-node" },
  { key: "grpc-js", name: "bare @grpc/grpc-js" },
].map((s) => ({ ...s, ...child("_host-server.ts", [s.key, String(STREAM_MESSAGES)]), address: "" }));
for (const s of servers) s.address = String((await s.next()).address);
const client = child("_host-client.ts", []);

const workloads = [
  { key: "unary", title: "unary Health/Check", path: "/grpc.health.v1.Health/Check", stream: false, expect: 1 },
  {
    key: "stream",
    title: `server streaming BenchStream/Repeat, ${STREAM_MESSAGES} messages per call`,
    path: "/mmgate.bench.v1.BenchStream/Repeat",
    stream: true,
    expect: STREAM_MESSAGES,
  },
];

interface Result {
  rps: number;
  p50: number;
  p99: number;
  serverCpuUs: number | null;
}

async function measure(server: (typeof servers)[number], w: (typeof workloads)[number]): Promise<Result> {
  const cmd = {
    addr: server.address,
    path: w.path,
    stream: w.stream,
    expect: w.expect,
    inFlight: IN_FLIGHT,
    warmupMs: WARMUP_MS,
    durationMs: DURATION_MS,
    client: CLIENT,
    serverPid: server.proc.pid,
  };
  client.proc.stdin!.write(`${JSON.stringify(cmd)}\n`);
  const answer = await client.next();
  if (typeof answer.error === "string") throw new Error(`${server.name} ${w.path}: ${answer.error}`);
  return answer as unknown as Result;
}

const started = performance.now();
// results[workload][server][round]
const results = workloads.map(() => servers.map(() => [] as Result[]));
try {
  for (let round = 0; round < ROUNDS; round++) {
    const order = round % 2 === 0 ? [0, 1, 2] : [2, 1, 0];
    for (const [wi, w] of workloads.entries()) {
      for (const si of order) results[wi]![si]!.push(await measure(servers[si]!, w));
    }
  }
} finally {
  client.proc.stdin!.end();
  for (const s of servers) s.proc.stdin!.end();
}

const ratio = (xs: number[]) => `${median(xs).toFixed(2)}x (${spread(xs, 2)})`;

console.log(
  `host bench: client ${CLIENT} in its own process, ${IN_FLIGHT} calls in flight on one connection, each server in its own process; ` +
    `${ROUNDS} interleaved rounds of ${DURATION_MS} ms (+${WARMUP_MS} ms warm-up); median (min–max) over rounds`,
);
const cpuOf = (rs: Result[]) => (rs.every((r) => r.serverCpuUs !== null) ? rs.map((r) => r.serverCpuUs!) : undefined);
const verdict = (xs: number[]) => `target >= ${TARGET_VS_CONNECT}x: ${median(xs) >= TARGET_VS_CONNECT ? "met" : "NOT met"}`;
for (const [wi, w] of workloads.entries()) {
  console.log(`\n# ${w.title}`);
  const per = results[wi]!;
  for (const [si, s] of servers.entries()) {
    const rs = per[si]!;
    const rps = rs.map((r) => r.rps);
    const cpu = cpuOf(rs);
    console.log(
      `  ${s.name.padEnd(20)} ${median(rps).toFixed(0).padStart(6)} calls/s (${spread(rps, 0)})` +
        `  p50 ${median(rs.map((r) => r.p50)).toFixed(2)} ms  p99 ${median(rs.map((r) => r.p99)).toFixed(2)} ms` +
        (cpu ? `  server CPU ${median(cpu).toFixed(0)} µs/call (${spread(cpu, 0)})` : "") +
        (w.stream ? `  ${((median(rps) * w.expect) / 1000).toFixed(1)}k messages/s` : ""),
    );
  }
  for (const [pi, label] of [
    [1, "bare connect-node"],
    [2, "bare grpc-js"],
  ] as const) {
    const byRate = per[0]!.map((r, i) => r.rps / per[pi]![i]!.rps);
    const host = cpuOf(per[0]!);
    const peer = cpuOf(per[pi]!);
    const byCpu = host && peer ? host.map((c, i) => peer[i]! / c) : undefined;
    // The median of per-round ratios pairs measurements taken close together;
    // the ratio of the medians is steadier when single rounds are disturbed.
    const ofMedians = median(per[0]!.map((r) => r.rps)) / median(per[pi]!.map((r) => r.rps));
    const cpuOfMedians = host && peer ? median(peer) / median(host) : undefined;
    console.log(
      `  host / ${label.padEnd(17)} calls/s ${ratio(byRate)}` +
        (pi === 1 ? ` ${verdict(byRate)}` : "") +
        `, ratio of medians ${ofMedians.toFixed(2)}x` +
        (byCpu ? `;  calls per server CPU-second ${ratio(byCpu)}${pi === 1 ? ` ${verdict(byCpu)}` : ""}` : "") +
        (cpuOfMedians !== undefined ? `, ratio of medians ${cpuOfMedians.toFixed(2)}x` : ""),
    );
  }
}
console.log(`\n(${((performance.now() - started) / 1000).toFixed(1)} s)`);
