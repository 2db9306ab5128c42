/**
 * Scenario 8 of the end-to-end suite: a router behind a slow link. A relay
 * role of its own with one 2^21-bucket pool (a 16 MiB lane, four 4 MiB
 * snapshot chunks) and a 5 s snapshot progress timeout, fed over its
 * Publish RPC; a throttling TCP proxy in a process of its own
 * (test/support/throttled-proxy-main.ts) delivering 1 MB/s from the relay;
 * a second router role whose only relay is the proxy's address. The
 * router's start ends once its mirror is ready, that is once the whole
 * snapshot (about 17 s at that rate, each chunk about 4.2 s) came through:
 * it can finish only if the timeout is per chunk. Then fresh events,
 * sample prompts' blocks among them, must reach its Overlap answers over
 * the same link.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { create } from "@bufbuild/protobuf";
import { createClient, type Transport } from "@connectrpc/connect";
import { KvEventService, PublishRequestSchema } from "../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { routerEventToWire } from "../../src/relay/index.js";
import type { RoleInfo, Stack } from "../../src/stack/index.js";
import type { EventWorkload, WorkloadEvent } from "./events.js";

/** The pool's expected blocks: bucket_count(4,000,000) = 2^21. */
export const WIDE_EXPECTED_BLOCKS = 4_000_000;
export const WIDE_BUCKETS = 1 << 21;
export const WIDE_POOL = "wide";
/** The link's rate, and the relay's snapshot progress timeout: a chunk fits in it, the whole snapshot does not. */
export const LINK_BYTES_PER_SECOND = 1_000_000;
export const WIDE_PROGRESS_TIMEOUT_MS = 5_000;

const PROXY_MAIN = fileURLToPath(new URL("../support/throttled-proxy-main.ts", import.meta.url));

export interface ProxyProcess {
  readonly addr: string;
  /** Bytes delivered to clients so far. */
  delivered(): Promise<number>;
  /** SIGTERMs the proxy; resolves with the bytes it delivered to clients. */
  stop(): Promise<number>;
}

/** Starts the throttled proxy in its own process in front of `target`. */
export async function startProxyProcess(target: string, bytesPerSecond: number): Promise<ProxyProcess> {
  const child: ChildProcess = spawn(process.execPath, ["--import", "tsx", PROXY_MAIN, target, String(bytesPerSecond)], { stdio: ["ignore", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout! });
  const messages: Record<string, unknown>[] = [];
  const waiters: (() => void)[] = [];
  lines.on("line", (line) => {
    messages.push(JSON.parse(line) as Record<string, unknown>);
    for (const wake of waiters.splice(0)) wake();
  });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  /** The first line with `key` not read yet. */
  const next = async (key: string, what: string): Promise<unknown> => {
    for (;;) {
      const at = messages.findIndex((m) => key in m);
      if (at >= 0) return messages.splice(at, 1)[0]![key];
      if (child.exitCode !== null || child.signalCode !== null) throw new Error(`the throttled proxy exited before ${what}`);
      await Promise.race([new Promise<void>((resolve) => waiters.push(resolve)), exited]);
    }
  };
  const addr = (await next("addr", "listening")) as string;
  return {
    addr,
    delivered: async () => {
      child.kill("SIGUSR2");
      return (await next("delivered", "its count")) as number;
    },
    stop: async () => {
      child.kill("SIGTERM");
      const delivered = (await next("delivered", "its count")) as number;
      await exited;
      return delivered;
    },
  };
}

/** The wide pool's relay: the stack's relay config with one Publish-fed pool in place of the JetStream one. */
export function startWideRelay(stack: Stack): Promise<RoleInfo> {
  return stack.extend("relay-wide", "relay", { natsAddress: stack.address("nats") }, (config) => ({
    ...config,
    relay: { snapshotProgressTimeoutMs: WIDE_PROGRESS_TIMEOUT_MS, pools: [{ name: WIDE_POOL, expectedBlocks: WIDE_EXPECTED_BLOCKS }] },
  }));
}

/** The router behind the link: resolves once its mirror of the wide pool is ready (the snapshot came through). */
export function startSlowRouter(stack: Stack, relayAddress: string): Promise<RoleInfo> {
  return stack.extend("router-slow", "router", { relayAddress });
}

/** Publishes `events` to the relay's pool in messages of 256, over one Publish stream. */
export async function publishEvents(transport: Transport, token: string, pool: string, events: readonly WorkloadEvent[]): Promise<void> {
  const client = createClient(KvEventService, transport);
  await client.publish(
    (async function* () {
      for (let i = 0; i < events.length; i += 256) {
        yield create(PublishRequestSchema, { pool, events: events.slice(i, i + 256).map((e) => routerEventToWire(e.event)) });
      }
    })(),
    { headers: { authorization: `Bearer ${token}` }, timeoutMs: 30_000 },
  );
}

/** The workload's lanes, interleaved into one order that keeps each lane's. */
export function interleaved(workload: EventWorkload, count: number): WorkloadEvent[] {
  const lanes = workload.laneEvents(count);
  const out: WorkloadEvent[] = [];
  for (let i = 0; out.length < count; i++) for (const lane of lanes) if (i < lane.length) out.push(lane[i]!);
  return out;
}
