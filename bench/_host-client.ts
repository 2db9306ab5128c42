/**
 * Load generator for bench/host.ts, in its own process so it never shares an
 * event loop with a server under test.
 *
 *   node --import tsx bench/_host-client.ts
 *
 * Reads one JSON command per stdin line and answers each with one JSON line
 * on stdout (nothing else is written there):
 *
 *   {"addr":"127.0.0.1:PORT","path":"/grpc.health.v1.Health/Check","stream":false,
 *    "expect":1,"inFlight":64,"warmupMs":300,"durationMs":1000,"client":"http2"}
 *   -> {"calls":N,"seconds":S,"rps":R,"p50":ms,"p99":ms,"serverCpuUs":µs|null}   or   {"error":"..."}
 *
 * Every command opens a fresh connection, keeps `inFlight` calls open on it
 * for the warm-up and then for the measured duration, and closes it. Each
 * call sends an empty request message (HealthCheckRequest{}); it succeeds
 * when the status is OK and exactly `expect` messages arrived, each of them
 * HealthCheckResponse{status: SERVING}.
 *
 * With "serverPid", serverCpuUs is the server process's CPU time (user +
 * system, every thread) per call over the measured window, from
 * /proc/PID/stat: a figure that other load on the machine disturbs far less
 * than calls per second.
 *
 * Two clients: "http2" (default) writes the gRPC frames itself on one
 * node:http2 session, so the generator's own cost per call stays small next
 * to the servers'; "grpc-js" goes through an @grpc/grpc-js channel.
 */
import * as http2 from "node:http2";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import * as grpc from "@grpc/grpc-js";

interface Command {
  addr: string;
  path: string;
  /** Server-streaming (true) or unary (false). */
  stream: boolean;
  expect: number;
  inFlight: number;
  warmupMs: number;
  durationMs: number;
  client?: "http2" | "grpc-js";
  /** The server's process id: its CPU time over the measured window is reported when /proc has it. */
  serverPid?: number;
}

type Call = () => Promise<void>;

/** A length-prefixed empty message: HealthCheckRequest{}. */
const EMPTY_REQUEST = Buffer.from([0, 0, 0, 0, 0]);

/** HealthCheckResponse{status: SERVING} is the two bytes 08 01. */
function isServing(buf: Buffer, at: number, length: number): boolean {
  return length === 2 && buf[at] === 0x08 && buf[at + 1] === 0x01;
}

function http2Client(cmd: Command): { call: Call; close: () => void; ready: Promise<void> } {
  const session = http2.connect(`http://${cmd.addr}`);
  const ready = new Promise<void>((resolve, reject) => {
    session.once("connect", () => resolve());
    session.once("error", reject);
  });
  const headers = {
    ":method": "POST",
    ":path": cmd.path,
    "content-type": "application/grpc",
    te: "trailers",
  };
  const call: Call = () =>
    new Promise((resolve, reject) => {
      const stream = session.request(headers);
      stream.end(EMPTY_REQUEST);
      let status: string | undefined;
      let messages = 0;
      let bad = false;
      let rest: Buffer | undefined;
      stream.on("response", (h) => {
        // Trailers-only responses carry the status in the headers.
        if (h["grpc-status"] !== undefined) status = String(h["grpc-status"]);
      });
      stream.on("trailers", (t) => {
        status = String(t["grpc-status"]);
      });
      stream.on("data", (chunk: Buffer) => {
        const buf = rest ? Buffer.concat([rest, chunk]) : chunk;
        let off = 0;
        while (buf.length - off >= 5) {
          const length = buf.readUInt32BE(off + 1);
          if (buf.length - off - 5 < length) break;
          if (buf[off] !== 0 || !isServing(buf, off + 5, length)) bad = true;
          messages++;
          off += 5 + length;
        }
        rest = off < buf.length ? buf.subarray(off) : undefined;
      });
      stream.on("error", reject);
      stream.on("close", () => {
        if (status === "0" && messages === cmd.expect && !bad && rest === undefined) resolve();
        else reject(new Error(`${cmd.path}: grpc-status ${status}, ${messages} messages${bad ? ", unexpected content" : ""}`));
      });
    });
  return { call, close: () => session.close(), ready };
}

function grpcJsClient(cmd: Command): { call: Call; close: () => void; ready: Promise<void> } {
  // A channel of its own: the default global subchannel pool would hand the
  // previous command's connection to this one.
  const client = new grpc.Client(cmd.addr, grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 });
  const raw = (b: Buffer) => b;
  const ready = new Promise<void>((resolve, reject) =>
    client.waitForReady(Date.now() + 10_000, (err) => (err ? reject(err) : resolve())),
  );
  const check = (msg: Buffer) => isServing(msg, 0, msg.length);
  const call: Call =
    !cmd.stream
      ? () =>
          new Promise((resolve, reject) => {
            client.makeUnaryRequest(cmd.path, raw, raw, EMPTY_REQUEST.subarray(5), (err, msg) => {
              if (err) reject(err);
              else if (!msg || !check(msg)) reject(new Error(`${cmd.path}: unexpected content`));
              else resolve();
            });
          })
      : () =>
          new Promise((resolve, reject) => {
            const stream = client.makeServerStreamRequest(cmd.path, raw, raw, EMPTY_REQUEST.subarray(5));
            let messages = 0;
            let bad = false;
            stream.on("data", (msg: Buffer) => {
              messages++;
              if (!check(msg)) bad = true;
            });
            stream.on("error", reject);
            stream.on("status", (s: grpc.StatusObject) => {
              if (s.code === grpc.status.OK && messages === cmd.expect && !bad) resolve();
              else reject(new Error(`${cmd.path}: status ${s.code}, ${messages} messages${bad ? ", unexpected content" : ""}`));
            });
          });
  return { call, close: () => client.close(), ready };
}

const CLOCK_TICKS = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** CPU seconds (user + system, all threads) a process has used, or undefined without /proc. */
function cpuSeconds(pid: number | undefined): number | undefined {
  if (pid === undefined) return undefined;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command name, which may hold spaces: state is field 3, utime 14, stime 15.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
  } catch {
    return undefined;
  }
}

/** Keeps `inFlight` calls open until `ms` have passed; returns each call's latency in ms. */
async function drive(call: Call, inFlight: number, ms: number): Promise<{ latencies: number[]; seconds: number }> {
  const latencies: number[] = [];
  const t0 = performance.now();
  const end = t0 + ms;
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (performance.now() < end) {
        const start = performance.now();
        await call();
        latencies.push(performance.now() - start);
      }
    }),
  );
  return { latencies, seconds: (performance.now() - t0) / 1000 };
}

async function run(cmd: Command) {
  const client = cmd.client === "grpc-js" ? grpcJsClient(cmd) : http2Client(cmd);
  try {
    await client.ready;
    await drive(client.call, cmd.inFlight, cmd.warmupMs);
    const cpu0 = cpuSeconds(cmd.serverPid);
    const { latencies, seconds } = await drive(client.call, cmd.inFlight, cmd.durationMs);
    const cpu1 = cpuSeconds(cmd.serverPid);
    latencies.sort((a, b) => a - b);
    const pick = (q: number) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))]!;
    const serverCpuUs = cpu0 === undefined || cpu1 === undefined ? null : ((cpu1 - cpu0) * 1e6) / latencies.length;
    return { calls: latencies.length, seconds, rps: latencies.length / seconds, p50: pick(0.5), p99: pick(0.99), serverCpuUs };
  } finally {
    client.close();
  }
}

for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() === "") continue;
  let answer: unknown;
  try {
    answer = await run(JSON.parse(line) as Command);
  } catch (err) {
    answer = { error: (err as Error).message };
  }
  process.stdout.write(`${JSON.stringify(answer)}\n`);
}
