/**
 * Outbound calls: what one call costs the calling process, on mmgate's
 * channel (src/rpc: deadlines, request id, metrics, the lean client
 * transport) against other clients of the same server in the same rounds.
 * This is the client half of the encode hop's cost per call (its server
 * half is the host's, measured by bench/rpc.ts).
 *
 * The server is the bare node:http2 one of bench/_rpc-server.ts (precomputed
 * answers, the floor under any RPC layer), in its own process. The clients
 * run in this process, one after another in interleaved rounds, each with
 * BENCH_IN_FLIGHT calls open on one connection, and are charged this
 * process's CPU time (process.cpuUsage) over their window:
 *
 * - http2: a bare node:http2 client (the request frame encoded once, the
 *   response frames counted and the status read), the floor;
 * - channel: mmgate's channel as the encode hop uses it (the lean client
 *   transport, client metrics on, the server stream's messages taken as
 *   their bytes as the hop relays them; unary answers parsed);
 * - channel-connect: the same channel with leanPath off (connect-node's
 *   gRPC transport);
 * - grpc-js: an @grpc/grpc-js client with pass-through serializers.
 *
 * Workloads: BenchRpc/Repeat (one request, BENCH_REPEAT messages back: the
 * shape of a token worker's Generate), and unary Health/Check. Every call
 * is checked (status OK, the message count). Reported: calls/s and CPU per
 * call, median (min-max) over rounds, and each client's CPU per call against
 * the bare client's, ratios taken within a round.
 *
 * Env: BENCH_ROUNDS (7), BENCH_MS per measurement (1000), BENCH_WARMUP_MS
 * (200), BENCH_IN_FLIGHT (16), BENCH_REPEAT (9), BENCH_CLIENTS
 * (comma-separated), BENCH_ONLY (repeat,unary).
 * Run: node --import tsx bench/channel.ts
 */
import { spawn } from "node:child_process";
import * as http2 from "node:http2";
import { createInterface } from "node:readline";
import type { DescMethodServerStreaming, DescMethodUnary } from "@bufbuild/protobuf";
import { create, toBinary } from "@bufbuild/protobuf";
import { createContextValues } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { Registry } from "prom-client";
import { Health, HealthCheckRequestSchema } from "../gen/grpc/health/v1/health_pb.js";
import { channelDefaults, createChannel, type Channel } from "../src/rpc/index.js";
import { EncodedMessage, encodedResponsesKey } from "../src/wire/index.js";
import { BenchRpc } from "./_bench-rpc.js";
import { median, medianInterval, ratios, spread } from "./_stats.js";
import { frame, selected } from "./_wire.js";

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 7);
const DURATION_MS = Number(process.env.BENCH_MS ?? 1000);
const WARMUP_MS = Number(process.env.BENCH_WARMUP_MS ?? 200);
const IN_FLIGHT = Number(process.env.BENCH_IN_FLIGHT ?? 16);
const REPEAT = Number(process.env.BENCH_REPEAT ?? 9);
const root = new URL("..", import.meta.url).pathname;

type Call = () => Promise<void>;
interface Client {
  readonly name: string;
  readonly call: Call;
  close(): void;
}
interface Workload {
  readonly title: string;
  readonly path: string;
  readonly stream: boolean;
  /** Messages a call must receive. */
  readonly expect: number;
}

const request = toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema));
const repeat = BenchRpc.method.repeat as DescMethodServerStreaming;
const check = Health.method.check as DescMethodUnary;
const WORKLOADS: Record<string, Workload> = {
  repeat: { title: `BenchRpc/Repeat, ${REPEAT} messages back`, path: `/${BenchRpc.typeName}/Repeat`, stream: true, expect: REPEAT },
  unary: { title: "unary Health/Check", path: `/${Health.typeName}/Check`, stream: false, expect: 1 },
};

function http2Client(addr: string, w: Workload): Client {
  const session = http2.connect(`http://${addr}`);
  session.on("error", () => undefined);
  const body = frame(request);
  const headers = { ":method": "POST", ":path": w.path, "content-type": "application/grpc+proto", te: "trailers" };
  const call: Call = () =>
    new Promise((resolve, reject) => {
      const stream = session.request(headers);
      stream.end(body);
      let status: unknown;
      let bytes = 0;
      stream.on("response", (h) => (status = h["grpc-status"] ?? status));
      stream.on("trailers", (t) => (status = t["grpc-status"]));
      // Counted, not parsed: every message here is the same small one, so the byte count says how many came.
      stream.on("data", (chunk: Buffer) => (bytes += chunk.length));
      stream.on("error", reject);
      stream.on("close", () => (String(status) === "0" && bytes > 0 ? resolve() : reject(new Error(`grpc-status ${String(status)}, ${bytes} bytes`))));
    });
  return { name: "http2", call, close: () => session.close() };
}

function channelClient(addr: string, w: Workload, leanPath: boolean): Client {
  const channel: Channel = createChannel(addr, { ...channelDefaults, leanPath }, { registry: new Registry() });
  const message = create(HealthCheckRequestSchema);
  const call: Call = w.stream
    ? async () => {
        const values = createContextValues().set(encodedResponsesKey, true);
        const res = await channel.stream(repeat, undefined, undefined, undefined, (async function* () {
          yield message;
        })(), values);
        let n = 0;
        for await (const m of res.message) {
          if (leanPath && !(m instanceof EncodedMessage)) throw new Error("a message came parsed");
          n++;
        }
        if (n !== w.expect) throw new Error(`${n} messages, ${w.expect} expected`);
      }
    : async () => {
        await channel.unary(check, undefined, undefined, undefined, message);
      };
  return { name: leanPath ? "channel" : "channel-connect", call, close: () => void channel.close() };
}

function grpcJsClient(addr: string, w: Workload): Client {
  const client = new grpc.Client(addr, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 });
  const raw = (b: Buffer) => b;
  const body = Buffer.from(request);
  const call: Call = w.stream
    ? () =>
        new Promise((resolve, reject) => {
          const stream = client.makeServerStreamRequest(w.path, raw, raw, body);
          let n = 0;
          stream.on("data", () => n++);
          stream.on("error", () => undefined);
          stream.on("status", (s: grpc.StatusObject) => (s.code === grpc.status.OK && n === w.expect ? resolve() : reject(new Error(`status ${s.code}, ${n} messages`))));
        })
    : () => new Promise((resolve, reject) => client.makeUnaryRequest(w.path, raw, raw, body, (err) => (err ? reject(err) : resolve())));
  return { name: "grpc-js", call, close: () => client.close() };
}

const CLIENTS: Record<string, (addr: string, w: Workload) => Client> = {
  http2: http2Client,
  channel: (addr, w) => channelClient(addr, w, true),
  "channel-connect": (addr, w) => channelClient(addr, w, false),
  "grpc-js": grpcJsClient,
};

/** Keeps IN_FLIGHT calls open for `ms`; returns the calls made and this process's CPU µs meanwhile. */
async function drive(call: Call, ms: number): Promise<{ calls: number; seconds: number; cpuUs: number }> {
  let calls = 0;
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const end = t0 + ms;
  await Promise.all(
    Array.from({ length: IN_FLIGHT }, async () => {
      while (performance.now() < end) {
        await call();
        calls++;
      }
    }),
  );
  const cpu = process.cpuUsage(cpu0);
  return { calls, seconds: (performance.now() - t0) / 1000, cpuUs: cpu.user + cpu.system };
}

const server = spawn(process.execPath, ["--import", "tsx", "bench/_rpc-server.ts", "http2", String(REPEAT), "1024"], { cwd: root, stdio: ["pipe", "pipe", "inherit"] });
const started = performance.now();
try {
  const first = await createInterface({ input: server.stdout! })[Symbol.asyncIterator]().next();
  const addr = String((JSON.parse(first.value as string) as { address: string }).address);
  const names = selected("BENCH_CLIENTS", Object.keys(CLIENTS));
  const workloads = selected("BENCH_ONLY", Object.keys(WORKLOADS)).map((k) => WORKLOADS[k]!);
  console.log(
    `channel bench: the clients in this process, one after another (${ROUNDS} interleaved rounds of ${DURATION_MS} ms + ${WARMUP_MS} ms warm-up), ` +
      `${IN_FLIGHT} calls in flight on one connection, against a bare node:http2 server in its own process; this process's CPU per call, median (min–max)`,
  );
  for (const w of workloads) {
    const perClient = names.map(() => [] as { rate: number; cpu: number }[]);
    for (let round = 0; round < ROUNDS; round++) {
      const order = names.map((_, i) => i);
      if (round % 2 === 1) order.reverse();
      for (const i of order) {
        const client = CLIENTS[names[i]!]!(addr, w);
        try {
          await drive(client.call, WARMUP_MS);
          const r = await drive(client.call, DURATION_MS);
          perClient[i]!.push({ rate: r.calls / r.seconds, cpu: r.cpuUs / r.calls });
        } finally {
          client.close();
        }
      }
    }
    console.log(`\n# ${w.title}`);
    const floor = names.indexOf("http2");
    for (const [i, name] of names.entries()) {
      const rs = perClient[i]!;
      const cpu = rs.map((r) => r.cpu);
      let against = "";
      if (floor >= 0 && i !== floor) {
        const xs = ratios(cpu, perClient[floor]!.map((r) => r.cpu));
        const ci = medianInterval(xs);
        against = `  CPU / http2's ${median(xs).toFixed(2)}x (${spread(xs, 2)}${ci ? `; 95 % ${ci[0].toFixed(2)}–${ci[1].toFixed(2)}` : ""})`;
      }
      console.log(
        `  ${name.padEnd(16)} ${median(rs.map((r) => r.rate)).toFixed(0).padStart(6)} calls/s (${spread(rs.map((r) => r.rate), 0)})  ` +
          `CPU ${median(cpu).toFixed(0)} µs/call (${spread(cpu, 0)})${against}`,
      );
    }
  }
} finally {
  server.stdin!.end();
}
console.log(`\n(${((performance.now() - started) / 1000).toFixed(1)} s)`);
