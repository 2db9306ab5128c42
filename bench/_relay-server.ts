/**
 * One server under test for bench/relay.ts, alone in its process:
 *
 *   node --import tsx bench/_relay-server.ts relay '<host config JSON>'
 *   node --import tsx bench/_relay-server.ts http2
 *
 * - relay: mmgate's host (default config: the lean gRPC path on) with the
 *   relay module over the pools of the given config, and a probe module
 *   that holds the live Relay for the control commands below.
 * - http2: the floor, a bare node:http2 server with the host's HTTP/2
 *   settings (stream window 4 MiB, connection window 16 MiB, session memory
 *   64 MB) that writes precomputed gRPC frames:
 *   - /dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPool: reads the request to
 *     its end, then writes the loaded bootstrap frames in order (waiting on
 *     the stream's buffer as any writer must) and ends with grpc-status 0;
 *   - /mmgate.bench.v1.RawFanout/Subscribe: answers with headers and keeps
 *     the stream open as a fan-out subscriber;
 *   - /mmgate.bench.v1.RawFanout/Publish: a client stream whose first
 *     message names the pool, as a relay Publish stream's does; for the k-th
 *     gRPC message after it (k from 0 per call) it writes the loaded delta
 *     frame k mod n to every open subscriber, the same Buffer to each, and
 *     answers grpc-status 0 once the request ends. No decoding anywhere:
 *     what is left is the HTTP/2 work of the same frames.
 *
 * Prints one JSON line, {"address":"127.0.0.1:PORT"}, once it listens; then
 * answers one JSON command per stdin line with one JSON line on stdout:
 *
 *   {"op":"cpu"}                      -> {"cpuUs": user + system µs of this process, every thread}
 *   relay only:
 *   {"op":"producer","pool":"boot"}   -> {"producer": "<base64 dynamo.kvrelay.v1.ProducerIdentity>"}
 *   {"op":"stats","pool":"boot"}      -> {"sequence","deltasPublished","eventsApplied","eventsRejected","hub":{...}|null}
 *   {"op":"wordsHash","pool":"boot"}  -> {"sha256": hex of the pool's filter words}
 *   {"op":"openHub","pool":"boot"}    -> {} (the pool's hub, opened as a first subscriber would)
 *   {"op":"openHubReady","pool":"boot"} -> {"ms"}: the same, answered once the hub has its barrier snapshot (a large
 *                                        lane's is copied over several turns), with how long that took
 *   {"op":"loopDelayStart"}           -> {} (a fresh perf_hooks.monitorEventLoopDelay, 1 ms resolution)
 *   {"op":"loopDelayStop"}            -> {"maxMs","p99Ms","meanMs","rssMB","peakRssMB"}: the event loop's delays since the start
 *                                        (and this process's RSS now, and its peak, sampled every 10 ms, since then)
 *   {"op":"slicer"}                   -> the relay slicer's stats ({"yields","tasks","waiting","longestSliceMs"})
 *   {"op":"slicerReset"}              -> {} (its longestSliceMs starts over)
 *   http2 only:
 *   {"op":"load","bootstrap":"<file>"} or {"op":"load","deltas":"<file>"}
 *                                     -> {"frames": n}; the file holds gRPC frames back to back
 *
 * A failed command answers {"error": "..."}. Exits when stdin closes.
 */
import { createHash } from "node:crypto";
import { monitorEventLoopDelay, type IntervalHistogram } from "node:perf_hooks";
import { readFileSync } from "node:fs";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { createInterface } from "node:readline";
import { toBinary } from "@bufbuild/protobuf";
import { pino } from "pino";
import { z } from "zod";
import { ProducerIdentitySchema } from "../gen/dynamo/kvrelay/v1/relay_pb.js";
import type { Relay } from "../src/relay/service/index.js";
import { writable } from "./_wire.js";

type Command = { op: string; pool?: string; bootstrap?: string; deltas?: string };
type Handler = (cmd: Command) => Record<string, unknown> | Promise<Record<string, unknown>>;


async function relayServer(rawConfig: string): Promise<{ address: string; handle: Handler }> {
  // Loaded here so the bare server's process holds no mmgate code.
  const { defineModule, resolveConfig, startHost } = await import("../src/server/index.js");
  const { relayModule } = await import("../src/relay/service/index.js");
  const { producerToWire } = await import("../src/relay/wire/index.js");
  let relay: Relay | undefined;
  const probe = defineModule({
    name: "relayBenchProbe",
    description: "hands the relay bench the live relay",
    configSchema: z.strictObject({}).prefault({}),
    requires: { relay: relayModule },
    create(ctx) {
      relay = ctx.deps.relay.relay;
      return { services: [] };
    },
  });
  const modules = [relayModule, probe];
  const config = resolveConfig({ listen: "127.0.0.1:0", adminListen: "", modules: modules.map((m) => m.name), ...(JSON.parse(rawConfig) as object) }, modules);
  const host = await startHost({ config, modules, logger: pino({ level: "silent" }), version: "bench" });
  if (relay === undefined) throw new Error("the relay module did not start");
  const live = relay;
  let delay: IntervalHistogram | undefined;
  let peakRss = 0;
  let rssTimer: ReturnType<typeof setInterval> | undefined;
  const poolOf = (cmd: Command) => {
    const pool = live.pool(cmd.pool ?? "");
    if (pool === undefined) throw new Error(`no pool ${cmd.pool}`);
    return pool;
  };
  const handle: Handler = (cmd) => {
    switch (cmd.op) {
      case "producer":
        return { producer: Buffer.from(toBinary(ProducerIdentitySchema, producerToWire(poolOf(cmd).producer))).toString("base64") };
      case "stats": {
        const pool = poolOf(cmd);
        const s = pool.stats();
        const hub = pool.hub?.stats();
        return {
          sequence: String(s.sequence),
          deltasPublished: s.deltasPublished,
          eventsApplied: s.eventsApplied,
          eventsRejected: s.eventsRejected,
          uniqueBlocks: s.uniqueBlocks,
          occupiedSlots: s.occupiedSlots,
          hub: hub === undefined ? null : { subscribers: hub.subscribers, queuedFrames: hub.queuedFrames, laneCopies: hub.laneCopies, recoveries: hub.recoveries, ended: hub.ended },
        };
      }
      case "wordsHash": {
        const words = poolOf(cmd).words();
        return { sha256: createHash("sha256").update(new Uint8Array(words.buffer, words.byteOffset, words.byteLength)).digest("hex") };
      }
      case "openHub":
        poolOf(cmd).openHub();
        return {};
      case "openHubReady": {
        const pool = poolOf(cmd) as ReturnType<typeof poolOf> & { hubReady?: () => Promise<unknown> };
        const t0 = performance.now();
        pool.openHub();
        // A relay that copies the barrier in one go has its hub ready here already.
        return (pool.hubReady?.() ?? Promise.resolve()).then(() => ({ ms: performance.now() - t0 }));
      }
      case "loopDelayStart":
        delay?.disable();
        delay = monitorEventLoopDelay({ resolution: 1 });
        delay.enable();
        peakRss = process.memoryUsage.rss();
        clearInterval(rssTimer);
        rssTimer = setInterval(() => (peakRss = Math.max(peakRss, process.memoryUsage.rss())), 10);
        return {};
      case "loopDelayStop": {
        if (delay === undefined) throw new Error("loopDelayStop before loopDelayStart");
        delay.disable();
        clearInterval(rssTimer);
        const rss = process.memoryUsage.rss();
        const ms = (ns: number) => ns / 1e6;
        return { maxMs: ms(delay.max), p99Ms: ms(delay.percentile(99)), meanMs: ms(delay.mean), rssMB: rss / 1e6, peakRssMB: Math.max(peakRss, rss) / 1e6 };
      }
      case "slicer":
        return { ...live.slicer.stats() };
      case "slicerReset":
        live.slicer.resetLongestSlice();
        return {};
      default:
        throw new Error(`unknown op ${cmd.op}`);
    }
  };
  return { address: host.address, handle };
}

/** The host's default HTTP/2 settings, for the bare server. */
const HOST_HTTP2 = { settings: { initialWindowSize: 4 * 1024 * 1024 }, maxSessionMemory: 64 };
const HOST_CONNECTION_WINDOW = 16 * 1024 * 1024;
const BOOTSTRAP_PATH = "/dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPool";
const FANOUT_SUBSCRIBE_PATH = "/mmgate.bench.v1.RawFanout/Subscribe";
const FANOUT_PUBLISH_PATH = "/mmgate.bench.v1.RawFanout/Publish";

/** The gRPC frames of a file, back to back. */
function framesOf(file: string): Buffer[] {
  const bytes = readFileSync(file);
  const frames: Buffer[] = [];
  for (let at = 0; at < bytes.length; ) {
    const end = at + 5 + bytes.readUInt32BE(at + 1);
    if (end > bytes.length) throw new Error(`${file}: a frame runs past the end`);
    frames.push(bytes.subarray(at, end));
    at = end;
  }
  return frames;
}

async function bareHttp2(): Promise<{ address: string; handle: Handler }> {
  let bootstrap: Buffer[] = [];
  let deltas: Buffer[] = [];
  const subscribers = new Set<http2.ServerHttp2Stream>();
  const server = http2.createServer(HOST_HTTP2);
  server.on("session", (session) =>
    session.once("localSettings", () => {
      try {
        session.setLocalWindowSize(HOST_CONNECTION_WINDOW);
      } catch {
        /* the session closed already */
      }
    }),
  );
  server.on("stream", (stream, headers) => {
    // A client that cancels its stream is no concern of the floor's.
    stream.on("error", () => undefined);
    const path = headers[":path"];
    const ok = () => stream.sendTrailers({ "grpc-status": "0" });
    if (path === FANOUT_SUBSCRIBE_PATH) {
      stream.respond({ ":status": 200, "content-type": "application/grpc+proto" });
      subscribers.add(stream);
      stream.on("close", () => subscribers.delete(stream));
      stream.resume();
      return;
    }
    if (path === FANOUT_PUBLISH_PATH) {
      // Splits the request body into gRPC messages; each one fans a frame out.
      let k = -1;
      let need = 5;
      let inHeader = true;
      let header = Buffer.alloc(0);
      stream.on("data", (chunk: Buffer) => {
        let at = 0;
        while (at < chunk.length) {
          const take = Math.min(need, chunk.length - at);
          if (inHeader) header = Buffer.concat([header, chunk.subarray(at, at + take)]);
          at += take;
          need -= take;
          if (need > 0) break;
          if (inHeader) {
            need = header.readUInt32BE(1);
            inHeader = false;
            header = Buffer.alloc(0);
          }
          if (!inHeader && need === 0) {
            if (k >= 0) {
              const frame = deltas[k % deltas.length]!;
              for (const s of subscribers) s.write(frame);
            }
            k += 1;
            inHeader = true;
            need = 5;
          }
        }
      });
      stream.on("end", () => {
        if (stream.destroyed) return;
        stream.respond({ ":status": 200, "content-type": "application/grpc+proto" }, { waitForTrailers: true });
        stream.once("wantTrailers", ok);
        stream.end();
      });
      return;
    }
    stream.resume();
    stream.on("end", () => {
      if (stream.destroyed) return;
      if (path !== BOOTSTRAP_PATH) {
        stream.respond({ ":status": 200, "content-type": "application/grpc+proto", "grpc-status": "12" }, { endStream: true });
        return;
      }
      stream.respond({ ":status": 200, "content-type": "application/grpc+proto" }, { waitForTrailers: true });
      stream.once("wantTrailers", ok);
      void (async () => {
        for (const frame of bootstrap) {
          if (stream.destroyed) return;
          if (!stream.write(frame)) await writable(stream, "close");
        }
        if (!stream.destroyed) stream.end();
      })();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const handle: Handler = (cmd) => {
    if (cmd.op !== "load") throw new Error(`unknown op ${cmd.op}`);
    if (cmd.bootstrap !== undefined) return { frames: (bootstrap = framesOf(cmd.bootstrap)).length };
    if (cmd.deltas !== undefined) return { frames: (deltas = framesOf(cmd.deltas)).length };
    throw new Error("load: name a bootstrap or a deltas file");
  };
  return { address: `127.0.0.1:${(server.address() as AddressInfo).port}`, handle };
}

const [kind, rawConfig] = process.argv.slice(2);
if (kind !== "relay" && kind !== "http2") {
  process.stderr.write("usage: _relay-server.ts relay '<host config JSON>' | http2\n");
  process.exit(2);
}
const { address, handle } = kind === "relay" ? await relayServer(rawConfig ?? "{}") : await bareHttp2();
process.stdout.write(`${JSON.stringify({ address })}\n`);
const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  let answer: Record<string, unknown>;
  try {
    const cmd = JSON.parse(line) as Command;
    if (cmd.op === "cpu") {
      const { user, system } = process.cpuUsage();
      answer = { cpuUs: user + system };
    } else {
      answer = await handle(cmd);
    }
  } catch (error) {
    answer = { error: error instanceof Error ? error.message : String(error) };
  }
  process.stdout.write(`${JSON.stringify(answer)}\n`);
}
process.exit(0);
