/**
 * Unary throughput of the host (grpc.health.v1 Check through every layer:
 * HTTP observer, interceptors, metrics, logging at "silent") next to two
 * peers measured in the same run on the same client: a bare connect-node
 * server with the same handler and no host layers, and a bare
 * @grpc/grpc-js server. The client is grpc-js with a fixed number of calls
 * in flight, on one channel.
 */
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { pino } from "pino";
import { Health, HealthCheckResponse_ServingStatus } from "../gen/grpc/health/v1/health_pb.js";
import { resolveConfig, startHost } from "../src/server/index.js";

const DURATION_MS = Number(process.env.BENCH_MS ?? 1000);
const IN_FLIGHT = Number(process.env.BENCH_IN_FLIGHT ?? 64);
const protoRoot = new URL("../proto", import.meta.url).pathname;
const definition = grpc.loadPackageDefinition(protoLoader.loadSync("grpc/health/v1/health.proto", { includeDirs: [protoRoot] }));
const HealthClient = (definition.grpc as Record<string, Record<string, Record<string, grpc.ServiceClientConstructor>>>).health!.v1!.Health!;

async function measure(addr: string): Promise<{ rps: number; p50: number; p99: number }> {
  const client = new HealthClient(addr, grpc.credentials.createInsecure()) as unknown as grpc.Client & {
    Check(req: { service: string }, cb: (err: Error | null) => void): void;
  };
  const call = () =>
    new Promise<number>((resolve, reject) => {
      const t0 = performance.now();
      client.Check({ service: "" }, (err) => (err ? reject(err) : resolve(performance.now() - t0)));
    });
  for (let i = 0; i < 200; i++) await call(); // warm-up
  const latencies: number[] = [];
  const end = performance.now() + DURATION_MS;
  const worker = async () => {
    while (performance.now() < end) latencies.push(await call());
  };
  const t0 = performance.now();
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
  const seconds = (performance.now() - t0) / 1000;
  client.close();
  latencies.sort((a, b) => a - b);
  const pick = (q: number) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))]!;
  return { rps: latencies.length / seconds, p50: pick(0.5), p99: pick(0.99) };
}

async function bareConnect(): Promise<{ addr: string; close: () => Promise<void> }> {
  const handler = connectNodeAdapter({
    routes: (r) => r.service(Health, { check: () => ({ status: HealthCheckResponse_ServingStatus.SERVING }) }),
  });
  const server = http2.createServer(handler);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (s) => sessions.add(s));
  return {
    addr: `127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => {
      for (const s of sessions) s.destroy();
      return new Promise((r) => server.close(() => r()));
    },
  };
}

async function bareGrpcJs(): Promise<{ addr: string; close: () => Promise<void> }> {
  const server = new grpc.Server();
  server.addService(HealthClient.service, {
    Check: (_call: unknown, cb: grpc.sendUnaryData<unknown>) => cb(null, { status: "SERVING" }),
  });
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  return { addr: `127.0.0.1:${port}`, close: () => new Promise((r) => server.tryShutdown(() => r())) };
}

async function mmgateHost(): Promise<{ addr: string; close: () => Promise<void> }> {
  const config = resolveConfig({ listen: "127.0.0.1:0", adminListen: "", services: [] }, []);
  const host = await startHost({ config, modules: [], logger: pino({ level: "silent" }), version: "bench" });
  return { addr: host.address, close: () => host.shutdown() };
}

// Servers run side by side and are measured in interleaved rounds, so a
// burst of load elsewhere on the machine hits every target alike; each
// figure is the median of its rounds.
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5);
const targets = [
  { name: "mmgate host (connect-node + observer, interceptors, metrics)", server: await mmgateHost() },
  { name: "bare connect-node (same handler, no host layers)", server: await bareConnect() },
  { name: "bare @grpc/grpc-js server", server: await bareGrpcJs() },
];
const results = targets.map(() => [] as Awaited<ReturnType<typeof measure>>[]);
for (let round = 0; round < ROUNDS; round++) {
  for (const [i, t] of targets.entries()) results[i]!.push(await measure(t.server.addr));
}
for (const t of targets) await t.server.close();

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
console.log(`unary Health.Check, grpc-js client, ${IN_FLIGHT} calls in flight, ${ROUNDS} interleaved rounds of ${DURATION_MS} ms`);
const rows = targets.map((t, i) => ({
  name: t.name,
  rps: median(results[i]!.map((r) => r.rps)),
  p50: median(results[i]!.map((r) => r.p50)),
  p99: median(results[i]!.map((r) => r.p99)),
}));
const base = rows[0]!.rps;
for (const r of rows) {
  console.log(
    `${r.name.padEnd(62)} ${r.rps.toFixed(0).padStart(7)} req/s  p50 ${r.p50.toFixed(2)} ms  p99 ${r.p99.toFixed(2)} ms  mmgate/peer ${(base / r.rps).toFixed(2)}x`,
  );
}
