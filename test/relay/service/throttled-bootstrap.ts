/**
 * A subscriber bootstrapping a large lane over a slow link (a throttled TCP
 * proxy, test/support/throttled-proxy.ts): the whole snapshot takes several
 * times the snapshot progress timeout to arrive, each chunk less than it, so
 * the stream must complete (the timeout is per chunk), and a delta published
 * after the snapshot must follow it. Shared by the unit suite (a smaller
 * lane, a faster link, a shorter timeout: the same proportions) and the e2e
 * suite (2^21 buckets at 1 MB/s with a 5 s timeout, scenario 8).
 */
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { expect } from "chai";
import { FilterUpdateKind, KvEventRelay } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { KvEventService, PublishRequestSchema } from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { producerToWire, RELAY_CONTRACT_MARKER, SNAPSHOT_CHUNK_BUCKETS } from "../../../src/relay/index.js";
import { metricValue } from "../../support/index.js";
import { startThrottledProxy } from "../../support/throttled-proxy.js";
import { chain, startRelay, TestMirror, type UpdateView } from "./support.js";

export interface ThrottledBootstrapCase {
  /** Buckets of the lane (a power of two). */
  readonly buckets: number;
  readonly bytesPerSecond: number;
  readonly snapshotProgressTimeoutMs: number;
}

const KINDS: Record<number, UpdateView["kind"]> = {
  [FilterUpdateKind.SNAPSHOT_CHUNK]: "SNAPSHOT_CHUNK",
  [FilterUpdateKind.DELTA]: "DELTA",
  [FilterUpdateKind.HEARTBEAT]: "HEARTBEAT",
};

export async function throttledBootstrap(c: ThrottledBootstrapCase): Promise<void> {
  const laneBytes = c.buckets * 8;
  const chunkBytes = Math.min(c.buckets, SNAPSHOT_CHUNK_BUCKETS) * 8;
  const perTimeout = (c.bytesPerSecond * c.snapshotProgressTimeoutMs) / 1000;
  // What the case proves: the link carries one chunk within the timeout (with room to spare), not the whole lane.
  expect(chunkBytes, "one chunk per timeout").to.be.below(perTimeout * 0.9);
  expect(laneBytes, "the lane takes several timeouts").to.be.above(perTimeout * 1.5);

  // expectedBlocks is twice the bucket count (four slots per bucket, kept half full).
  const server = await startRelay({ snapshotProgressTimeoutMs: c.snapshotProgressTimeoutMs, pools: [{ name: "default", expectedBlocks: c.buckets * 2 }] });
  const proxy = await startThrottledProxy({ target: server.addr, bytesPerSecond: c.bytesPerSecond });
  const abort = new AbortController();
  try {
    const pool = server.relay.pool("default")!;
    expect(pool.producer.format.bucketCount).to.equal(c.buckets);
    const publish = (i: number) =>
      createClient(KvEventService, server.connectTransport).publish(
        (async function* () {
          yield create(PublishRequestSchema, { pool: "default", events: [chain(BigInt(i) + 1n, 1_000_000n * BigInt(i + 1), 64)] });
        })(),
      );
    for (let i = 0; i < 8; i++) await publish(i);

    const client = createClient(KvEventRelay, createGrpcTransport({ baseUrl: `http://${proxy.addr}`, readMaxBytes: 8 * 1024 * 1024 }));
    const mirror = new TestMirror(pool.producer.format.seed, c.buckets);
    const request = { subscriberId: "throttled", expectedProducer: producerToWire(pool.producer), contractMarker: RELAY_CONTRACT_MARKER };
    let published = false;
    let snapshotBytes = 0;
    for await (const update of client.subscribeKvPool(request, { signal: abort.signal })) {
      if (update.kind === FilterUpdateKind.SNAPSHOT_CHUNK) snapshotBytes += update.payload.byteLength;
      mirror.apply({ kind: KINDS[update.kind]!, baseSequence: update.baseSequence, sequence: update.sequence, payload: update.payload });
      if (mirror.words !== undefined && !published) {
        // The snapshot is in: a delta published now must follow it over the same slow link.
        published = true;
        await publish(100);
      }
      if (mirror.deltas > 0) break;
    }
    expect(mirror.chunks).to.equal(Math.ceil(c.buckets / SNAPSHOT_CHUNK_BUCKETS));
    expect(mirror.deltas).to.equal(1);
    expect(proxy.delivered()).to.be.above(laneBytes);
    // The bytes the snapshot handed over, and one completed bootstrap, on /metrics.
    const registry = server.host.metrics.registry;
    expect(await metricValue(registry, "mmgate_relay_bootstrap_bytes_total", { pool: "default" })).to.equal(snapshotBytes);
    expect(await metricValue(registry, "mmgate_relay_bootstraps_total", { pool: "default", result: "completed" })).to.equal(1);
    const words = pool.words();
    expect(Buffer.from(mirror.words!.buffer).equals(Buffer.from(words.buffer, words.byteOffset, words.byteLength))).to.equal(true);
  } finally {
    abort.abort();
    await proxy.close();
    await server.close();
  }
}
