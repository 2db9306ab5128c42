/**
 * NATS ingest end to end: router events published as the reference's JSON
 * on a real nats-server reach the relay pool named in config, and a
 * consumer of the relay mirrors the resulting filter exactly.
 */
import { createGrpcTransport } from "@connectrpc/connect-node";
import { expect } from "chai";
import { connect, type NatsConnection } from "nats";
import { RelayConsumer } from "../../../src/relay/index.js";
import { eventually, requireNats, startNats, type NatsServer } from "../../support/index.js";
import { startRelay, type RelayServer } from "./support.js";

describe("relay NATS ingest, end to end", function () {
  this.timeout(20_000);
  let nats: NatsServer;
  let relay: RelayServer;
  let publisher: NatsConnection;
  before(async function () {
    requireNats(this);
    nats = await startNats();
    relay = await startRelay({ pools: [{ name: "default", expectedBlocks: 4096, nats: { servers: [nats.url], subject: "kv.events.>" } }] });
    publisher = await connect({ servers: nats.url });
  });
  after(async () => {
    await publisher?.close();
    await relay?.close();
    await nats?.stop();
  });

  it("events on the subject build the pool's filter, exact u64s included, and a consumer mirrors it", async () => {
    const pool = relay.relay.pool("default")!;
    const stop = new AbortController();
    const consumer = new RelayConsumer({ transport: createGrpcTransport({ baseUrl: `http://${relay.addr}` }), subscriberId: "nats-e2e", backoff: { minMs: 10, maxMs: 100 } });
    void consumer.run(stop.signal);
    try {
      // The source subscribes once the relay has started; events sent before that would be lost, so wait for it.
      await eventually(async () => {
        publisher.publish("kv.events.w9", JSON.stringify({ worker_id: 9, event: { event_id: 0, data: "cleared" } }));
        await publisher.flush();
        expect(pool.stats().eventsApplied).to.be.greaterThan(0);
      });
      const lines = [
        '{"worker_id":1,"event":{"event_id":1,"dp_rank":0,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":900000,"tokens_hash":9143094415614847814}]}}}}',
        '{"worker_id":1,"event":{"event_id":2,"dp_rank":0,"data":{"stored":{"parent_hash":900000,"blocks":[{"block_hash":900001,"tokens_hash":"18446744073709551615"},{"block_hash":900002,"tokens_hash":17}]}}}}',
        '{"worker_id":2,"storage_tier":"host_pinned","event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":5,"tokens_hash":6}]}}}}',
      ];
      publisher.publish("kv.events.w1", lines.slice(0, 2).join("\n"));
      publisher.publish("kv.events.w2", lines[2]!);
      publisher.publish("kv.events.w1", "{not json");
      await publisher.flush();
      // Three device-tier blocks of worker 1; worker 2's host tier is ignored.
      await eventually(() => expect(pool.occupancy()).to.deep.equal({ uniqueBlocks: 3, ranks: 1 }));
      await eventually(() => {
        const view = consumer.pools().find((p) => p.state === "ready");
        expect(view?.installedSequence).to.equal(pool.sequence);
        expect(Buffer.from(consumer.words(view!.key)!.buffer).equals(Buffer.from(pool.words().buffer))).to.equal(true);
      });
      const metrics = await (await fetch(`http://${relay.adminAddr}/metrics`)).text();
      expect(metrics).to.match(/mmgate_relay_nats_rejected_total\{code="NOT_JSON"\} 1/);
    } finally {
      stop.abort();
    }
  });
});
