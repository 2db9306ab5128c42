import { create } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { expect } from "chai";
import { FilterUpdateKind, KvEventRelay, ServingReadinessState } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { KvEventService, PublishRequestSchema, type RouterEvent as WireRouterEvent } from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { producerToWire, RELAY_CONTRACT_MARKER, relayModule, relayPoolConfigSchema, relayReasonOf } from "../../../src/relay/index.js";
import { loadConfig } from "../../../src/server/index.js";
import { connectErrorOf } from "../../support/index.js";
import { chain, printedConfig, startRelay, type RelayServer } from "./support.js";

const MARKER = RELAY_CONTRACT_MARKER;

async function publish(server: RelayServer, events: WireRouterEvent[]): Promise<void> {
  await createClient(KvEventService, server.connectTransport).publish(
    (async function* () {
      yield create(PublishRequestSchema, { pool: "default", events });
    })(),
  );
}

describe("relay readiness, load, progress timeout, metrics and config", function () {
  this.timeout(20_000);

  it("readiness: UNKNOWN before any event, READY once a worker publishes, repeated on every heartbeat tick", async () => {
    const server = await startRelay({ pools: [{ name: "default", expectedBlocks: 64, models: [{ model: "m1", aliases: ["m"] }] }], readinessHeartbeatIntervalMs: 50 });
    try {
      const client = createClient(KvEventRelay, server.transport);
      const states: ServingReadinessState[] = [];
      const revisions: bigint[] = [];
      for await (const update of client.subscribeServingReadiness({ subscriberId: "r", contractMarker: MARKER })) {
        expect(update.contractMarker).to.equal(MARKER);
        const entry = update.entries[0]!;
        expect([entry.namespace, entry.canonicalModelId]).to.deep.equal(["mmgate", "m1"]);
        expect(entry.members[0]!.poolId?.dcId).to.equal(1n);
        states.push(entry.state);
        revisions.push(update.revision);
        if (states.length === 2) await publish(server, [chain(1n, 10n, 2)]);
        if (entry.state === ServingReadinessState.READY) break;
      }
      expect(states[0]).to.equal(ServingReadinessState.UNKNOWN);
      expect(states[1]).to.equal(ServingReadinessState.UNKNOWN);
      expect(states.at(-1)).to.equal(ServingReadinessState.READY);
    } finally {
      await server.close();
    }
  });

  it("load: the current window, then every later one in order, with the pool's occupancy and ranks", async () => {
    const server = await startRelay({ pools: [{ name: "default", expectedBlocks: 64, expectedRanks: 4 }], loadWindowMs: 30 });
    try {
      await publish(server, [chain(1n, 10n, 3), chain(2n, 100n, 2)]);
      const client = createClient(KvEventRelay, server.transport);
      const sequences: bigint[] = [];
      for await (const update of client.subscribeKvPoolLoad({ subscriberId: "l", contractMarker: MARKER })) {
        sequences.push(update.windowSequence);
        const entry = update.pools[0]!;
        expect(entry.producer?.layoutGeneration).to.equal(1n);
        if (sequences.length > 1) {
          expect(entry.kvUsedBlocks).to.equal(5n);
          expect([entry.kvObservedRanks, entry.kvExpectedRanks]).to.deep.equal([2, 4]);
          expect(update.windowMs).to.equal(30n);
        }
        if (sequences.length === 4) break;
      }
      for (let i = 1; i < sequences.length; i++) expect(sequences[i]).to.equal(sequences[i - 1]! + 1n);
    } finally {
      await server.close();
    }
  });

  it("a snapshot chunk that cannot be handed over within the progress timeout ends the stream SNAPSHOT_PROGRESS_TIMEOUT", async () => {
    // Two 4 MiB chunks: the second cannot be written while the client does not read.
    const server = await startRelay({ pools: [{ name: "default", expectedBlocks: 2_097_152 }], snapshotProgressTimeoutMs: 200 });
    try {
      const client = createClient(KvEventRelay, server.transport);
      const expected = producerToWire(server.relay.pool("default")!.producer);
      const err = await connectErrorOf(async () => {
        let chunks = 0;
        for await (const update of client.subscribeKvPool({ subscriberId: "s", expectedProducer: expected, contractMarker: MARKER })) {
          expect(update.kind).to.equal(FilterUpdateKind.SNAPSHOT_CHUNK);
          chunks += 1;
          if (chunks === 1) await new Promise((resolve) => setTimeout(resolve, 600));
        }
      });
      expect([err.code, relayReasonOf(err)]).to.deep.equal([Code.ResourceExhausted, "SNAPSHOT_PROGRESS_TIMEOUT"]);
    } finally {
      await server.close();
    }
  });

  it("metrics carry the reference's names", async () => {
    const server = await startRelay({ pools: [{ name: "default", expectedBlocks: 64 }] });
    try {
      const client = createClient(KvEventRelay, server.transport);
      for await (const _ of client.watchKvPoolCatalog({ subscriberId: "m", contractMarker: MARKER })) break;
      const text = await (await fetch(`http://${server.adminAddr}/metrics`)).text();
      for (const name of [
        "kv_dc_relay_subscribers",
        "kv_dc_relay_subscriber_lagged_total",
        "kv_dc_relay_subscriber_limit_rejected_total",
        "kv_dc_relay_pool_heartbeats_total",
        "kv_dc_relay_load_updates_total",
        "kv_dc_relay_catalog_pool_count 1",
        "kv_dc_relay_initialized_publication_hub_count 0",
        "kv_dc_relay_terminal_publication_failures_total",
        'kv_dc_relay_serving_topology_count{state="unknown"} 1',
        "kv_dc_relay_degraded_load_coverage_pool_count",
      ]) {
        expect(text).to.include(name);
      }
    } finally {
      await server.close();
    }
  });

  it("the reference's DYN_RELAY_* names set the relay's keys; MMGATE_RELAY__* wins over them", () => {
    const config = loadConfig(
      {
        env: {
          DYN_RELAY_POOL_HEARTBEAT_INTERVAL_MS: "2500",
          DYN_RELAY_MAX_POOL_STREAMS_TOTAL: "8",
          DYN_RELAY_PUBLICATION_QUEUE_BYTES: "5000000",
          DYN_DC_ID: "18446744073709551615",
          DYN_RELAY_SNAPSHOT_PROGRESS_TIMEOUT_MS: "1000",
          MMGATE_RELAY__SNAPSHOT_PROGRESS_TIMEOUT_MS: "2000",
          MMGATE_MODULES: "relay",
        },
      },
      [relayModule],
    );
    const relay = config.sections["relay"] as Record<string, unknown>;
    expect(relay["poolHeartbeatIntervalMs"]).to.equal(2500);
    expect(relay["maxPoolStreamsTotal"]).to.equal(8);
    expect(relay["publicationQueueBytes"]).to.equal(5_000_000);
    expect(relay["dcId"]).to.equal(18446744073709551615n);
    expect(relay["snapshotProgressTimeoutMs"]).to.equal(2000);
    expect(JSON.stringify(printedConfig(config))).to.include('"dcId":"18446744073709551615"');
    // Below the spec's floors: a queue that cannot hold one largest frame, a zero timer.
    expect(() => loadConfig({ env: { DYN_RELAY_PUBLICATION_QUEUE_BYTES: "4194623", MMGATE_MODULES: "relay" } }, [relayModule])).to.throw(/publicationQueueBytes/);
    expect(() => loadConfig({ env: { DYN_RELAY_LOAD_WINDOW_MS: "0", MMGATE_MODULES: "relay" } }, [relayModule])).to.throw(/loadWindowMs/);
    // The largest pool: 53,687,091 expected blocks are 2^24 buckets; one more would need 2^25.
    expect(relayPoolConfigSchema.parse({ name: "big", expectedBlocks: 53_687_091 }).expectedBlocks).to.equal(53_687_091);
    expect(relayPoolConfigSchema.safeParse({ name: "big", expectedBlocks: 53_687_092 }).success).to.equal(false);
  });
});
