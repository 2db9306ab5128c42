/**
 * The seed's producer scenario: a 13-token prompt stored as one event, a
 * barrier snapshot at sequence 1, then the 21-token continuation stored as a
 * second event whose parent is the prompt's last block; the published delta
 * applied to the snapshot reproduces the producer's lane exactly.
 */
import { expect } from "chai";
import {
  DcCkfPublisher,
  DcCkfState,
  digestIdentity,
  laneLease,
  poolId,
  producerIdentity,
  type DcCkfDelta,
} from "../../src/kv/ckf/index.js";
import { computeBlockHashForSeq, computeSeqHashForBlock } from "../../src/kv/hash/index.js";
import { applyImages, sameWords, SEED_EXTERNAL_MASK, seedStoredEvent } from "./ckf-helpers.js";

describe("CKF producer scenario (seed): prompt, snapshot, continuation delta", () => {
  for (const isEagle of [false, true]) {
    for (const lora of [undefined, "tenant-a"]) {
      it(`${isEagle ? "Eagle" : "standard"} blocks, ${lora === undefined ? "base model" : "LoRA"}: snapshot + delta = the producer's lane`, () => {
        const options = { loraName: lora, cacheNamespace: "tenant-ns", isEagle };
        const initialTokens = Array.from({ length: 13 }, (_, i) => i);
        const expandedTokens = Array.from({ length: 21 }, (_, i) => i);
        const initialLocal = computeBlockHashForSeq(initialTokens, 4, options);
        const expandedLocal = computeBlockHashForSeq(expandedTokens, 4, options);
        expect(expandedLocal.slice(0, initialLocal.length)).to.deep.equal(initialLocal);
        expect(expandedLocal.length).to.be.greaterThan(initialLocal.length);
        const initialSequence = computeSeqHashForBlock(initialLocal);
        const expandedSequence = computeSeqHashForBlock(expandedLocal);

        const producer = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 1 });
        const initial = producer.applyEvent(seedStoredEvent(1n, undefined, initialLocal, initialSequence));
        expect(initial.firstError).to.equal(undefined);
        expect(initial.publication).not.to.equal(undefined);
        const [tail, buckets] = producer.barrierSnapshot();
        expect(tail).to.equal(undefined);

        const identity = producerIdentity({
          poolId: poolId({
            cacheSemantics: digestIdentity(new Uint8Array(16).fill(isEagle ? 2 : 1), "Explicit"),
            routingScope: digestIdentity(new Uint8Array(16).fill(isEagle ? 3 : 2), "Explicit"),
            dcId: 7n,
          }),
          producerIncarnation: 11n,
          layoutGeneration: 1n,
          format: producer.format(),
        });
        const lease = laneLease({ consumerInstance: 13n, physicalLane: 0, assignmentEpoch: 1n });
        const sent: DcCkfDelta[] = [];
        const publisher = new DcCkfPublisher(identity, { lastSequence: 1n, lease, sink: (delta) => (sent.push(delta), "accepted") });
        // The consumer's copy of the sequence-1 snapshot.
        const decoded = buckets.slice();

        const continuation = producer.applyEvent(
          seedStoredEvent(2n, initialSequence.at(-1), expandedLocal.slice(initialLocal.length), expandedSequence.slice(initialSequence.length)),
        );
        expect(continuation.firstError).to.equal(undefined);
        const batch = continuation.publication;
        expect(batch, "the publication threshold emits the delta").not.to.equal(undefined);
        const result = publisher.publish(batch!);
        expect(result.kind).to.equal("published");
        expect([sent[0]!.baseSequence, sent[0]!.sequence]).to.deep.equal([1n, 2n]);
        applyImages(decoded, sent[0]);

        const [, expected] = producer.barrierSnapshot();
        expect(sameWords(decoded, expected)).to.equal(true);
        for (const sequence of expandedSequence) expect(producer.contains(sequence)).to.equal(true);
        expect(producer.canonicalOf(1n, 0, expandedSequence.at(-1)! ^ SEED_EXTERNAL_MASK)).to.equal(expandedSequence.at(-1));
      });
    }
  }
});
