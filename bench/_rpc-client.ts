/**
 * Load generator for bench/rpc.ts, in its own process so it never shares an
 * event loop with a server under test.
 *
 *   node --import tsx bench/_rpc-client.ts
 *
 * Reads one JSON command per stdin line and answers each with one JSON line
 * on stdout (nothing else is written there):
 *
 *   {"addr":"127.0.0.1:PORT","path":"/mmgate.bench.v1.BenchRpc/Echo","stream":false,
 *    "request":"<base64 message>","expect":1,"reply":"<base64>","replyLength":65540,
 *    "inFlight":64,"warmupMs":150,"durationMs":500,"client":"http2","serverPid":1234}
 *   -> {"calls":N,"failures":F,"failure":"first failure"|null,"seconds":S,"rps":R,
 *       "bytesPerSecond":B,"p50":ms|null,"p99":ms|null,"serverCpuUs":µs|null}   or   {"error":"..."}
 *
 * Two optional fields extend it:
 * - "replies": ["<base64>", ...] in place of expect, reply and replyLength:
 *   the exact messages each call must receive, in this order (for a stream
 *   whose messages differ, e.g. a token worker's outputs);
 * - "cpuPids": [1234, 5678, ...]: more processes (the client's own pid
 *   included, if wanted) whose CPU time per successful call over the
 *   measured window the answer reports as "cpuUs": [µs|null, ...], in the
 *   same order (null where /proc has no such process).
 *
 * {"concurrent": [command, command, ...]} runs the commands at the same
 * time, each on its own connection, and answers with the array of their
 * answers: servers measured side by side share whatever else the machine
 * does at that moment, so a small difference between them shows.
 *
 * Every command opens a fresh connection, keeps `inFlight` calls open on it
 * for the warm-up and then for the measured duration, and closes it. Each
 * call sends `request` as its one message. It succeeds when its status is
 * OK and exactly `expect` messages arrived, each `replyLength` bytes long
 * and starting with the bytes of `reply` (the whole message when it is that
 * long; for big messages a prefix, so that checking them does not cost the
 * generator more than receiving them) -- or, with `replies`, when exactly
 * those messages arrived, byte for byte and in order. A call that fails any
 * of that is counted as a failure, not as a call; a lost connection ends
 * the command with an error.
 *
 * bytesPerSecond counts the response bytes received in successful calls,
 * gRPC frame headers included. With "serverPid", serverCpuUs is the server
 * process's CPU time (user + system, every thread) per successful call over
 * the measured window, from /proc/PID/stat: a figure that other load on the
 * machine disturbs far less than calls per second.
 *
 * Two clients: "http2" (default) writes the gRPC frames itself on one
 * node:http2 session and parses responses as they arrive, without copying
 * them, so the generator's own cost stays small next to the servers';
 * "grpc-js" goes through an @grpc/grpc-js channel. Both open wide receive
 * windows, so that big streamed messages are not held back by flow control.
 */
import * as http2 from "node:http2";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import * as grpc from "@grpc/grpc-js";
import { frame } from "./_wire.js";

interface Command {
  addr: string;
  path: string;
  /** Server-streaming (true) or unary (false). */
  stream: boolean;
  /** The request message, base64. */
  request: string;
  /** Messages each call must receive (without `replies`). */
  expect?: number;
  /** What each response message starts with, base64 (without `replies`). */
  reply?: string;
  /** Each response message's length (without `replies`). */
  replyLength?: number;
  /** The exact messages each call must receive, in order, base64; replaces expect, reply and replyLength. */
  replies?: string[];
  inFlight: number;
  warmupMs: number;
  durationMs: number;
  client?: "http2" | "grpc-js";
  /** The server's process id: its CPU time over the measured window is reported when /proc has it. */
  serverPid?: number;
  /** More process ids whose CPU time per call over the measured window is reported, as `cpuUs`. */
  cpuPids?: number[];
}

/** What each call must receive: `count` messages, the i-th `length` bytes long and starting with `prefix`. */
interface Expected {
  count: number;
  /** The i-th message's expectation; undefined past the last one. */
  at(i: number): { prefix: Buffer; length: number } | undefined;
}

function expectation(cmd: Command): Expected {
  if (cmd.replies !== undefined) {
    const replies = cmd.replies.map((r) => {
      const prefix = Buffer.from(r, "base64");
      return { prefix, length: prefix.length };
    });
    return { count: replies.length, at: (i) => replies[i] };
  }
  const { expect, reply, replyLength } = cmd;
  if (expect === undefined || reply === undefined || replyLength === undefined) {
    throw new Error('a command needs "replies", or "expect", "reply" and "replyLength"');
  }
  const one = { prefix: Buffer.from(reply, "base64"), length: replyLength };
  return { count: expect, at: (i) => (i < expect ? one : undefined) };
}

/** One finished call: its response bytes, or why it failed. */
type Outcome = { bytes: number; failure?: undefined } | { bytes?: undefined; failure: string };
type Call = () => Promise<Outcome>;
interface Client {
  call: Call;
  close: () => void;
  ready: Promise<void>;
}

const MiB = 1024 * 1024;
/** Receive windows: two big messages per stream, four streams' worth per connection. */
const STREAM_WINDOW = 8 * MiB;
const CONNECTION_WINDOW = 32 * MiB;


function http2Client(cmd: Command, expected: Expected): Client {
  const session = http2.connect(`http://${cmd.addr}`, { settings: { initialWindowSize: STREAM_WINDOW } });
  const ready = new Promise<void>((resolve, reject) => {
    session.once("connect", () => {
      session.setLocalWindowSize(CONNECTION_WINDOW);
      resolve();
    });
    session.once("error", reject);
  });
  // Later errors end the session: the calls on it fail, and the next one
  // finds it closed.
  session.on("error", () => undefined);
  const request = frame(Buffer.from(cmd.request, "base64"));
  const headers = {
    ":method": "POST",
    ":path": cmd.path,
    "content-type": "application/grpc+proto",
    te: "trailers",
  };
  const call: Call = () =>
    new Promise((resolve, reject) => {
      if (session.closed || session.destroyed) {
        reject(new Error("connection lost"));
        return;
      }
      const stream = session.request(headers);
      stream.end(request);
      let status: string | undefined;
      let error: string | undefined;
      let bytes = 0;
      let messages = 0;
      // The frame header being read (5 bytes, possibly split over chunks),
      // then the message body: `left` bytes still to come, `at` read so far,
      // `want` what it must start with (nothing once the call has failed).
      const header = Buffer.alloc(5);
      let headerFill = 0;
      let left = -1;
      let at = 0;
      let want: Buffer | undefined;
      const fail = (why: string) => (error ??= why);
      stream.on("response", (h) => {
        if (h[":status"] !== 200) fail(`HTTP ${h[":status"]}`);
        // Trailers-only responses carry the status in the headers.
        if (h["grpc-status"] !== undefined) status = String(h["grpc-status"]);
      });
      stream.on("trailers", (t) => {
        status = String(t["grpc-status"]);
      });
      stream.on("data", (chunk: Buffer) => {
        bytes += chunk.length;
        let off = 0;
        while (off < chunk.length) {
          if (left < 0) {
            const n = Math.min(5 - headerFill, chunk.length - off);
            chunk.copy(header, headerFill, off, off + n);
            headerFill += n;
            off += n;
            if (headerFill < 5) break;
            left = header.readUInt32BE(1);
            at = 0;
            const next = expected.at(messages);
            want = next?.prefix;
            if (next === undefined) fail(`more than ${expected.count} messages`);
            else if (header[0] !== 0 || left !== next.length) fail(`message ${messages + 1}: ${left} bytes (flags ${header[0]}), not ${next.length}`);
            if (error !== undefined) want = undefined;
          } else {
            const n = Math.min(left, chunk.length - off);
            const checked = want === undefined ? 0 : Math.min(n, want.length - at);
            if (checked > 0 && chunk.compare(want!, at, at + checked, off, off + checked) !== 0) {
              fail(`message ${messages + 1}: unexpected content`);
              want = undefined;
            }
            at += n;
            off += n;
            left -= n;
          }
          if (left === 0) {
            messages++;
            left = -1;
            headerFill = 0;
          }
        }
      });
      stream.on("error", (err) => fail(err.message));
      stream.on("close", () => {
        if (error === undefined && status !== "0") fail(`grpc-status ${status}`);
        if (error === undefined && (messages !== expected.count || headerFill !== 0 || left >= 0)) fail(`${messages} messages, ${expected.count} expected`);
        resolve(error === undefined ? { bytes } : { failure: error });
      });
    });
  return { call, close: () => session.close(), ready };
}

function grpcJsClient(cmd: Command, expected: Expected): Client {
  // A channel of its own: the default global subchannel pool would hand the
  // previous command's connection to this one.
  const client = new grpc.Client(cmd.addr, grpc.credentials.createInsecure(), {
    "grpc.use_local_subchannel_pool": 1,
    "grpc.max_receive_message_length": -1,
    "grpc-node.flow_control_window": CONNECTION_WINDOW,
  });
  const raw = (b: Buffer) => b;
  const request = Buffer.from(cmd.request, "base64");
  const ready = new Promise<void>((resolve, reject) =>
    client.waitForReady(Date.now() + 10_000, (err) => (err ? reject(err) : resolve())),
  );
  const matches = (msg: Buffer, i: number) => {
    const want = expected.at(i);
    return want !== undefined && msg.length === want.length && msg.compare(want.prefix, 0, want.prefix.length, 0, want.prefix.length) === 0;
  };
  const call: Call = !cmd.stream
    ? () =>
        new Promise((resolve) => {
          client.makeUnaryRequest(cmd.path, raw, raw, request, (err, msg) => {
            if (err) resolve({ failure: err.message });
            else if (!msg || !matches(msg, 0)) resolve({ failure: "unexpected content" });
            else if (expected.count !== 1) resolve({ failure: `1 message, ${expected.count} expected` });
            else resolve({ bytes: 5 + msg.length });
          });
        })
    : () =>
        new Promise((resolve) => {
          const stream = client.makeServerStreamRequest(cmd.path, raw, raw, request);
          let messages = 0;
          let bytes = 0;
          let bad = false;
          stream.on("data", (msg: Buffer) => {
            if (!matches(msg, messages)) bad = true;
            messages++;
            bytes += 5 + msg.length;
          });
          // The status event follows an error too; it settles the call.
          stream.on("error", () => undefined);
          stream.on("status", (s: grpc.StatusObject) => {
            if (s.code !== grpc.status.OK) resolve({ failure: `status ${s.code}: ${s.details}` });
            else if (bad) resolve({ failure: "unexpected content" });
            else if (messages !== expected.count) resolve({ failure: `${messages} messages, ${expected.count} expected` });
            else resolve({ bytes });
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

interface Driven {
  /** Each successful call's latency in ms. */
  latencies: number[];
  bytes: number;
  failures: number;
  failure: string | null;
  seconds: number;
}

/** Keeps `inFlight` calls open until `ms` have passed. */
async function drive(call: Call, inFlight: number, ms: number): Promise<Driven> {
  const d: Driven = { latencies: [], bytes: 0, failures: 0, failure: null, seconds: 0 };
  const t0 = performance.now();
  const end = t0 + ms;
  await Promise.all(
    Array.from({ length: inFlight }, async () => {
      while (performance.now() < end) {
        const start = performance.now();
        const outcome = await call();
        if (outcome.failure === undefined) {
          d.latencies.push(performance.now() - start);
          d.bytes += outcome.bytes;
        } else {
          d.failures++;
          d.failure ??= outcome.failure;
        }
      }
    }),
  );
  d.seconds = (performance.now() - t0) / 1000;
  return d;
}

async function run(cmd: Command) {
  const expected = expectation(cmd);
  const client = cmd.client === "grpc-js" ? grpcJsClient(cmd, expected) : http2Client(cmd, expected);
  try {
    await client.ready;
    await drive(client.call, cmd.inFlight, cmd.warmupMs);
    const pids = cmd.cpuPids ?? [];
    const cpu0 = cpuSeconds(cmd.serverPid);
    const cpus0 = pids.map((pid) => cpuSeconds(pid));
    const { latencies, bytes, failures, failure, seconds } = await drive(client.call, cmd.inFlight, cmd.durationMs);
    const cpu1 = cpuSeconds(cmd.serverPid);
    const cpus1 = pids.map((pid) => cpuSeconds(pid));
    latencies.sort((a, b) => a - b);
    const pick = (q: number) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? null;
    const calls = latencies.length;
    const perCall = (a: number | undefined, b: number | undefined) => (a === undefined || b === undefined || calls === 0 ? null : ((b - a) * 1e6) / calls);
    const serverCpuUs = perCall(cpu0, cpu1);
    const answer = { calls, failures, failure, seconds, rps: calls / seconds, bytesPerSecond: bytes / seconds, p50: pick(0.5), p99: pick(0.99), serverCpuUs };
    return cmd.cpuPids === undefined ? answer : { ...answer, cpuUs: pids.map((_, i) => perCall(cpus0[i], cpus1[i])) };
  } finally {
    client.close();
  }
}

for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() === "") continue;
  let answer: unknown;
  try {
    const parsed = JSON.parse(line) as Command | { concurrent: Command[] };
    answer = "concurrent" in parsed ? await Promise.all(parsed.concurrent.map(run)) : await run(parsed);
  } catch (err) {
    answer = { error: (err as Error).message };
  }
  process.stdout.write(`${JSON.stringify(answer)}\n`);
}
