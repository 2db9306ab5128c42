/**
 * Encode hop benchmark, one process (the hop, the encode worker and the demo
 * token worker as `mmgate serve` runs them), clients over h2c:
 *
 * - Text-only passthrough: `EncodeHopService.Generate` against calling
 *   `TokenWorkerService.Generate` directly, C calls in flight, interleaved
 *   rounds (A B, then B A). Targets: latency at most 1.3x, throughput at
 *   least 0.7x of the direct call.
 * - Multimodal, one 1024x1024 PNG as a `data:` URL: the hop's end-to-end
 *   time against its parts measured alone in the same rounds (the encode
 *   call to the Encode worker, and the token worker call with the encoded
 *   request), so the remainder is the hop's own cost.
 *
 * In one process the hop's extra in-memory call to the token worker shares
 * the core with it, so the passthrough ratio there is the worst case; a
 * token worker on another machine takes its own cost off this one.
 *
 * Env: BENCH_ROUNDS (9), BENCH_CALLS (calls per passthrough sample, 400),
 * BENCH_IN_FLIGHT (16). Run: node --import tsx bench/encode-hop.ts
 */
import { spawn } from "node:child_process";
import { performance } from "node:perf_hooks";
import { createInterface } from "node:readline";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { pino } from "pino";
import sharp from "sharp";
import { EncodeHopService, EncodeWorkerService } from "../gen/mmgate/encode/v1/encode_pb.js";
import { PreprocessedRequestSchema, type PreprocessedRequest } from "../gen/mmgate/llm/v1/request_pb.js";
import { TokenWorkerService } from "../gen/mmgate/llm/v1/token_worker_pb.js";
import { consumeEncodeStream, encodeHopModule, encodeWorkerModule, tokenWorkerModule } from "../src/encode/index.js";
import { mediaModule } from "../src/media/index.js";
import { resolveConfig, startHost } from "../src/server/index.js";
import { interleave, median, ratios, summary } from "./_stats.js";

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 9);
const CALLS = Number(process.env.BENCH_CALLS ?? 400);
const IN_FLIGHT = Number(process.env.BENCH_IN_FLIGHT ?? 16);

const modules = [mediaModule, encodeWorkerModule, tokenWorkerModule, encodeHopModule];
const config = resolveConfig({ listen: "127.0.0.1:0", adminListen: "", modules: modules.map((m) => m.name) }, modules);
const host = await startHost({ config, modules, logger: pino({ level: "silent" }), version: "bench" });
const transport = createGrpcTransport({ baseUrl: `http://${host.address}` });
const hop = createClient(EncodeHopService, transport);
const tokens = createClient(TokenWorkerService, transport);
const encoder = createClient(EncodeWorkerService, transport);

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

// Text-only passthrough.
const text = create(PreprocessedRequestSchema, { tokenIds: [1, 2, 3, 4], stopConditions: { maxTokens: 8 } });
const samples = { hop: [] as { p50: number; p99: number; rps: number }[], direct: [] as { p50: number; p99: number; rps: number }[] };
const measure = (key: "hop" | "direct") => async () => {
  const t0 = performance.now();
  const latencies = await load(() => drain(key === "hop" ? hop.generate({ request: text }) : tokens.generate({ request: text })), CALLS);
  samples[key].push({ p50: pct(latencies, 50), p99: pct(latencies, 99), rps: CALLS / ((performance.now() - t0) / 1000) });
};
await interleave([measure("hop"), measure("direct")], ROUNDS, 1);
const col = (key: "hop" | "direct", f: "p50" | "p99" | "rps") => samples[key].map((s) => s[f]);
console.log(`encode hop: text-only passthrough, ${IN_FLIGHT} calls in flight, ${CALLS} calls per sample, ${ROUNDS} interleaved rounds; median (min–max)`);
for (const key of ["hop", "direct"] as const) {
  console.log(
    `  ${(key === "hop" ? "through the hop" : "token worker directly").padEnd(24)} p50 ${summary(col(key, "p50"), 2)} ms  p99 ${summary(col(key, "p99"), 2)} ms  ${summary(col(key, "rps"), 0)} calls/s`,
  );
}
const p50Ratio = ratios(col("hop", "p50"), col("direct", "p50"));
const rpsRatio = ratios(col("hop", "rps"), col("direct", "rps"));
console.log(`  hop / direct p50 latency ${summary(p50Ratio, 2)}x  target <= 1.3x: ${median(p50Ratio) <= 1.3 ? "met" : "NOT met"}`);
console.log(`  hop / direct throughput  ${summary(rpsRatio, 2)}x  target >= 0.7x: ${median(rpsRatio) >= 0.7 ? "met" : "NOT met"}`);

// The same passthrough with the token worker in its own process (`mmgate
// token-worker`), the hop pointed at it over h2c: the token worker's cost
// leaves the hop's process. The hop still shares its process with the load
// generator here, and pays connect's per-call cost twice (the call it
// serves and the call it makes), which is what this figure shows.
{
  const child = spawn(process.execPath, ["bin/mmgate.js", "token-worker", "--listen", "127.0.0.1:0", "--admin-listen", "", "--log-level", "info"], {
    cwd: new URL("..", import.meta.url).pathname,
    stdio: ["ignore", "pipe", "inherit"],
  });
  const address = await new Promise<string>((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! });
    lines.on("line", (line) => {
      const entry = JSON.parse(line) as { msg?: string; address?: string };
      if (entry.msg === "mmgate serving" && entry.address) resolve(entry.address);
    });
    child.once("exit", (code) => reject(new Error(`token-worker exited (${code})`)));
  });
  const remoteModules = [mediaModule, encodeWorkerModule, encodeHopModule];
  const remoteConfig = resolveConfig(
    { listen: "127.0.0.1:0", adminListen: "", modules: remoteModules.map((m) => m.name), encodeHop: { downstream: address } },
    remoteModules,
  );
  const remoteHost = await startHost({ config: remoteConfig, modules: remoteModules, logger: pino({ level: "silent" }), version: "bench" });
  const remoteHop = createClient(EncodeHopService, createGrpcTransport({ baseUrl: `http://${remoteHost.address}` }));
  const remoteTokens = createClient(TokenWorkerService, createGrpcTransport({ baseUrl: `http://${address}` }));
  const remote = { hop: [] as { p50: number; rps: number }[], direct: [] as { p50: number; rps: number }[] };
  const measureRemote = (key: "hop" | "direct") => async () => {
    const t0 = performance.now();
    const latencies = await load(() => drain(key === "hop" ? remoteHop.generate({ request: text }) : remoteTokens.generate({ request: text })), CALLS);
    remote[key].push({ p50: pct(latencies, 50), rps: CALLS / ((performance.now() - t0) / 1000) });
  };
  await interleave([measureRemote("hop"), measureRemote("direct")], ROUNDS, 1);
  const rp50 = ratios(remote.hop.map((r) => r.p50), remote.direct.map((r) => r.p50));
  const rrps = ratios(remote.hop.map((r) => r.rps), remote.direct.map((r) => r.rps));
  console.log(`\nencode hop: text-only passthrough, token worker in its own process (${address})`);
  console.log(`  through the hop            p50 ${summary(remote.hop.map((r) => r.p50), 2)} ms  ${summary(remote.hop.map((r) => r.rps), 0)} calls/s`);
  console.log(`  token worker directly      p50 ${summary(remote.direct.map((r) => r.p50), 2)} ms  ${summary(remote.direct.map((r) => r.rps), 0)} calls/s`);
  console.log(`  hop / direct p50 latency ${summary(rp50, 2)}x  target <= 1.3x: ${median(rp50) <= 1.3 ? "met" : "NOT met"}`);
  console.log(`  hop / direct throughput  ${summary(rrps, 2)}x  target >= 0.7x: ${median(rrps) >= 0.7 ? "met" : "NOT met"}`);
  await remoteHost.shutdown();
  child.kill("SIGTERM");
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
console.log(`\nencode hop: multimodal, one 1024x1024 PNG (${(png.length / 1024).toFixed(0)} KiB as a data: URL); ms, median (min–max) over ${ROUNDS} rounds`);
console.log(`  through the hop            ${summary(whole!, 2)}`);
console.log(`  the encode call alone      ${summary(encode!, 2)}  (fetch, decode, hash, store, descriptor)`);
console.log(`  the token worker alone     ${summary(downstream!, 2)}`);
// The parts run in their own calls, so their sum can exceed the whole in a noisy round.
const share = (100 * median(own)) / median(whole!);
console.log(`  the hop's own share        ${summary(own, 2)}  (${share > 0 ? `${share.toFixed(1)} % of the whole` : "within the noise of the parts"})`);

await host.shutdown();
