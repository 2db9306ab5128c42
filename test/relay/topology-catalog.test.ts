import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { expect } from "chai";
import type { KvPoolCatalogUpdate } from "../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { KvEventService, PublishRequestSchema } from "../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { publishDelta, validateTopologyEntry } from "../../src/relay/index.js";
import { eventually, expectThrown } from "../support/index.js";
import { catalogStream, CLIENT_STACKS, readinessNow } from "./readiness-support.js";
import { chain, startRelay, type RelayServer } from "./service/support.js";

/** The layout generations a catalog update lists, pool by pool. */
const generations = (update: KvPoolCatalogUpdate): bigint[] => update.snapshot!.pools.map((p) => p.producer!.layoutGeneration);

describe("catalog: a terminal publication failure withdraws the pool before its next generation is published", function () {
  this.timeout(30_000);
  let server: RelayServer;
  before(async () => {
    server = await startRelay({ pools: [{ name: "default", expectedBlocks: 64 }, { name: "other", expectedBlocks: 64, endpoint: { component: "other" } }] });
  });
  after(() => server?.close());

  const publish = async (events: ReturnType<typeof chain>[]) => {
    await createClient(KvEventService, server.connectTransport).publish(
      (async function* () {
        yield create(PublishRequestSchema, { pool: "default", events });
      })(),
    );
  };

  it("every WatchKvPoolCatalog subscriber sees the catalog without the pool, then with its next generation, revisions rising", async () => {
    const streams = CLIENT_STACKS.map((stack) => catalogStream(server, stack));
    try {
      const first = await Promise.all(streams.map((s) => s.next()));
      for (const update of first) expect(generations(update)).to.deep.equal([1n, 1n]);
      const pool = server.relay.pool("default")!;
      // The hub's mirror jumps ahead of the publisher (a delta it was never sent): the next real delta cannot
      // continue it, the publisher fences on the uncertain delivery, and the pool's generation fails terminally.
      const hub = pool.openHub();
      expectThrown(() => publishDelta(hub, { identity: hub.identity, lease: hub.lease, baseSequence: 100n, sequence: 101n, images: [{ bucket: 0, value: 1n }] }));
      await publish([chain(1n, 10n, 2)]);
      await eventually(() => expect(pool.producer.layoutGeneration).to.equal(2n));
      for (const [i, stream] of streams.entries()) {
        const withdrawn = await stream.next();
        const republished = await stream.next();
        const stack = CLIENT_STACKS[i];
        expect(withdrawn.revision > first[i]!.revision, `${stack}: the withdrawal's revision is later`).to.equal(true);
        expect(republished.revision > withdrawn.revision, `${stack}: the republication's revision is later`).to.equal(true);
        // Withdrawn: only the other pool is listed. Then the pool again, under layout generation 2.
        expect(withdrawn.snapshot!.pools.map((p) => p.servingEndpoint!.component), stack).to.deep.equal(["other"]);
        expect(generations(republished), stack).to.deep.equal([2n, 1n]);
        expect(republished.snapshot!.pools[0]!.producer!.poolId, stack).to.deep.equal(first[i]!.snapshot!.pools[0]!.producer!.poolId);
      }
    } finally {
      for (const stream of streams) stream.close();
    }
    // A stream opened now starts from the current catalog; readiness lists the pool again, every entry valid.
    for (const stack of CLIENT_STACKS) {
      const late = catalogStream(server, stack);
      try {
        expect(generations(await late.next())).to.deep.equal([2n, 1n]);
      } finally {
        late.close();
      }
      const readiness = await readinessNow(server, stack);
      for (const entry of readiness.entries) validateTopologyEntry(entry);
      expect(readiness.entries[0]!.members.map((m) => m.endpoint!.component)).to.deep.equal(["backend", "other"]);
    }
    const metrics = await (await fetch(`http://${server.adminAddr}/metrics`)).text();
    expect(metrics).to.match(/^kv_dc_relay_terminal_publication_failures_total 1$/m);
    expect(metrics).to.match(/^kv_dc_relay_catalog_pool_count 2$/m);
  });
});
