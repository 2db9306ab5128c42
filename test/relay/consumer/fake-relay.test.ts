import { expect } from "chai";
import { createClient } from "@connectrpc/connect";
import { KvEventRelay, type FilterUpdate } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { RELAY_CONTRACT_MARKER, producerToWire } from "../../../src/relay/index.js";
import { FakePool, FakeRelay } from "./fake-relay.js";
import { producer } from "./mirror-helpers.js";

describe("relay consumer: the fake relay", () => {
  it("serves its catalog and a pool's snapshot over HTTP/2", async () => {
    const relay = await FakeRelay.start();
    try {
      const id = producer();
      relay.addPool(new FakePool(id, undefined, 4n));
      relay.setCatalog([]);
      const client = createClient(KvEventRelay, relay.transport);
      const controller = new AbortController();
      for await (const update of client.watchKvPoolCatalog({ subscriberId: "t", contractMarker: RELAY_CONTRACT_MARKER }, { signal: controller.signal })) {
        expect(update.snapshot?.pools).to.deep.equal([]);
        break;
      }
      const updates: FilterUpdate[] = [];
      for await (const update of client.subscribeKvPool({ subscriberId: "t", expectedProducer: producerToWire(id), contractMarker: RELAY_CONTRACT_MARKER })) {
        updates.push(update);
        break;
      }
      expect(updates[0]?.sequence).to.equal(4n);
      controller.abort();
    } finally {
      await relay.close();
    }
  });
});
