/**
 * Helpers for the relay service tests: a host with the relay module and a
 * probe module that hands the test the live Relay, router events built
 * like a worker's, and a test mirror fed by FilterUpdates.
 */
import { create } from "@bufbuild/protobuf";
import { z } from "zod";
import { type RouterEvent as WireRouterEvent, RouterEventSchema } from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import type { ProducerIdentity } from "../../../src/kv/index.js";
import { decode, FilterFormat, SnapshotAssembly } from "../../../src/relay/index.js";
import { relayModule, type Relay } from "../../../src/relay/index.js";
import { defineModule, redactedConfig, type MmgateConfig } from "../../../src/server/index.js";
import { startServer, type InProcessServer } from "../../support/index.js";

export interface RelayServer extends InProcessServer {
  readonly relay: Relay;
}

/** A host serving the relay module with `relayConfig` over the test defaults. */
export async function startRelay(relayConfig: Record<string, unknown> = {}, hostConfig: Record<string, unknown> = {}): Promise<RelayServer> {
  let relay: Relay | undefined;
  const probe = defineModule({
    name: "relayProbe",
    description: "hands the test the relay",
    configSchema: z.strictObject({}).prefault({}),
    requires: { relay: relayModule },
    create(ctx) {
      relay = ctx.deps.relay.relay;
      return { services: [] };
    },
  });
  const server = await startServer({ modules: [relayModule, probe], config: { ...hostConfig, relay: relayConfig } });
  if (relay === undefined) throw new Error("the relay module did not start");
  return Object.assign(server, { relay });
}

/** A Stored event of `blocks` [blockHash, tokensHash] pairs after `parent`. */
export function stored(workerId: bigint, blocks: readonly (readonly [bigint, bigint])[], parent?: bigint, eventId = 0n): WireRouterEvent {
  return create(RouterEventSchema, {
    workerId,
    eventId,
    data: { case: "stored", value: { parentHash: parent, blocks: blocks.map(([blockHash, tokensHash]) => ({ blockHash, tokensHash })) } },
  });
}

export function removed(workerId: bigint, hashes: readonly bigint[]): WireRouterEvent {
  return create(RouterEventSchema, { workerId, data: { case: "removed", value: { blockHashes: [...hashes] } } });
}

/** A deterministic chain of `n` blocks for one worker: block hashes from `base`, tokens hashes pseudo-random. */
export function chain(workerId: bigint, base: bigint, n: number): WireRouterEvent {
  const blocks: [bigint, bigint][] = [];
  let x = base * 0x9e3779b97f4a7c15n;
  for (let i = 0; i < n; i++) {
    x = BigInt.asUintN(64, x * 6364136223846793005n + 1442695040888963407n);
    blocks.push([base + BigInt(i), x]);
  }
  return stored(workerId, blocks);
}

/** The update fields the mirror reads, whichever client decoded them. */
export interface UpdateView {
  readonly kind: "SNAPSHOT_CHUNK" | "DELTA" | "HEARTBEAT";
  readonly baseSequence: bigint;
  readonly sequence: bigint;
  readonly payload: Uint8Array;
}

/** A subscriber-side mirror: snapshot chunks assembled, then deltas applied in order. */
export class TestMirror {
  readonly format: FilterFormat;
  private readonly assembly: SnapshotAssembly;
  words: BigUint64Array | undefined;
  sequence: bigint | undefined;
  chunks = 0;
  deltas = 0;
  heartbeats = 0;
  /** Index (in updates) of the first heartbeat, and how many chunks had arrived by then. */
  firstHeartbeatAfterChunks: number | undefined;

  constructor(seed: bigint, bucketCount: number) {
    this.format = new FilterFormat(seed, bucketCount);
    this.assembly = new SnapshotAssembly(this.format);
  }

  apply(update: UpdateView): void {
    switch (update.kind) {
      case "SNAPSHOT_CHUNK": {
        if (this.words !== undefined) throw new Error("a snapshot chunk after the snapshot");
        if (update.baseSequence !== update.sequence) throw new Error("a chunk moves the sequence");
        this.chunks += 1;
        const done = this.assembly.absorbBytes(update.payload);
        if (done !== undefined) {
          if (done.epoch !== update.sequence) throw new Error(`snapshot epoch ${done.epoch} at sequence ${update.sequence}`);
          this.words = done.words.slice();
          this.sequence = update.sequence;
        }
        return;
      }
      case "DELTA": {
        if (this.words === undefined || this.sequence === undefined) throw new Error("a delta before the snapshot");
        if (update.baseSequence !== this.sequence || update.sequence !== this.sequence + 1n) {
          throw new Error(`gap: at ${this.sequence}, delta ${update.baseSequence} -> ${update.sequence}`);
        }
        const frame = decode(this.format, update.payload);
        if (frame.kind !== "delta") throw new Error("a delta update without a delta frame");
        for (const image of frame.images) this.words[image.bucket] = image.value;
        this.sequence = update.sequence;
        this.deltas += 1;
        return;
      }
      case "HEARTBEAT":
        if (this.words === undefined) throw new Error("a heartbeat before the whole snapshot");
        if (update.baseSequence !== this.sequence || update.sequence !== this.sequence) throw new Error("a heartbeat off the current sequence");
        this.firstHeartbeatAfterChunks ??= this.chunks;
        this.heartbeats += 1;
        return;
    }
  }
}

/** The config as `serve --print-config` prints it (u64s as decimal strings). */
export function printedConfig(config: MmgateConfig): unknown {
  return JSON.parse(JSON.stringify(redactedConfig(config), (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v)));
}

/** The pool's producer in proto-loader's object shape (longs as strings, bytes as Buffers, enums as names). */
export function grpcProducer(pool: { producer: ProducerIdentity }): unknown {
  const p = pool.producer;
  const digest = (d: { digest: Uint8Array; source: string }) => ({
    digest: Buffer.from(d.digest),
    source: d.source === "Explicit" ? "IDENTITY_SOURCE_EXPLICIT" : "IDENTITY_SOURCE_DEFAULT_DERIVED",
  });
  return {
    poolId: {
      identityVersion: 1,
      indexerDomain: { cacheSemantics: digest(p.poolId.indexerDomain.cacheSemantics), routingScope: digest(p.poolId.indexerDomain.routingScope) },
      dcId: p.poolId.dcId.toString(),
    },
    producerIncarnation: p.producerIncarnation.toString(),
    layoutGeneration: p.layoutGeneration.toString(),
    ckfFormat: { formatVersion: 1, seed: p.format.seed.toString(), bucketCount: String(p.format.bucketCount), fingerprintBits: 16, slotsPerBucket: 4 },
  };
}
