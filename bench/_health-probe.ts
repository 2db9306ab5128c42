/**
 * A health prober for bench/ingest-stall.ts, alone in its process so that
 * the bench's own work (building and sending loads) does not delay it:
 *
 *   node --import tsx bench/_health-probe.ts http://127.0.0.1:PORT
 *
 * Calls grpc.health.v1.Health/Check every 100 ms on a connection of its
 * own, each call waited for (5 s deadline) before the next is due. Answers
 * one JSON line per stdin line: {"checks","failures","maxMs"} since the
 * previous line (the first line starts the count). Exits when stdin closes.
 */
import { createInterface } from "node:readline";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Health } from "../gen/grpc/health/v1/health_pb.js";

const EVERY_MS = 100;
const baseUrl = process.argv[2];
if (baseUrl === undefined) {
  process.stderr.write("usage: _health-probe.ts http://HOST:PORT\n");
  process.exit(2);
}
const client = createClient(Health, createGrpcTransport({ baseUrl }));
let figures = { checks: 0, failures: 0, maxMs: 0 };
let stopped = false;

const loop = (async () => {
  while (!stopped) {
    const t0 = performance.now();
    try {
      await client.check({ service: "" }, { timeoutMs: 5000 });
    } catch {
      figures.failures += 1;
    }
    const ms = performance.now() - t0;
    figures.checks += 1;
    figures.maxMs = Math.max(figures.maxMs, ms);
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, EVERY_MS - ms)));
  }
})();

process.stdout.write("{}\n");
for await (const _line of createInterface({ input: process.stdin })) {
  process.stdout.write(`${JSON.stringify(figures)}\n`);
  figures = { checks: 0, failures: 0, maxMs: 0 };
}
stopped = true;
await loop;
process.exit(0);
