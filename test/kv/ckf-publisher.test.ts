import { expect } from "chai";
import {
  CkfError,
  DcCkfPublisher,
  DcCkfState,
  digestIdentity,
  laneLease,
  poolId,
  producerIdentity,
  relayLease,
  sameLease,
  sameProducerIdentity,
  type DcCkfDelta,
  type DcCkfPublicationBatch,
  type DeliverySink,
  type FenceReason,
  type ProducerIdentity,
} from "../../src/kv/ckf/index.js";
import { applyImages, sameWords, storedChain, U64_MAX } from "./ckf-helpers.js";

function identity(seed = 1): ProducerIdentity {
  const state = new DcCkfState({ expectedBlocksPerDc: 64 });
  return producerIdentity({
    poolId: poolId({
      cacheSemantics: digestIdentity(new Uint8Array(16).fill(seed), "Explicit"),
      routingScope: digestIdentity(new Uint8Array(16).fill(seed + 1), "Explicit"),
      dcId: 7n,
    }),
    producerIncarnation: 11n,
    layoutGeneration: 1n,
    format: state.format(),
  });
}

const LEASE = laneLease({ consumerInstance: 13n, physicalLane: 0, assignmentEpoch: 1n });
const NEXT_LEASE = laneLease({ consumerInstance: 13n, physicalLane: 0, assignmentEpoch: 2n });
const BATCH: DcCkfPublicationBatch = { images: [{ bucket: 3, value: 0xaaaa_bbbb_cccc_ddddn }] };

/** A sink that records deltas and answers `verdict` (or throws). */
function recorder(verdict: "accepted" | "rejected" | "throw" = "accepted") {
  const deltas: DcCkfDelta[] = [];
  const sink: DeliverySink = (delta) => {
    deltas.push(delta);
    if (verdict === "throw") throw new Error("transport broke mid-write");
    return verdict;
  };
  return { deltas, sink };
}

function fenceOf(f: () => unknown): FenceReason | undefined {
  try {
    f();
  } catch (error) {
    expect(error).to.be.instanceOf(CkfError);
    expect((error as CkfError).code).to.equal("Fenced");
    return (error as CkfError).fence;
  }
  expect.fail("expected a Fenced error");
}

describe("DcCkfPublisher", () => {
  it("without a lease answers NoSubscriber: the batch is dropped, the sequence stays", () => {
    const { deltas, sink } = recorder();
    const publisher = new DcCkfPublisher(identity(), { lastSequence: 5n, sink });
    expect(publisher.publish(BATCH)).to.deep.equal({ kind: "no_subscriber", sequence: 5n });
    expect(publisher.lastSequence).to.equal(5n);
    expect(deltas).to.deep.equal([]);
    expect(publisher.exactDrainMarker()).to.equal(undefined);
  });

  it("publishes last -> last + 1 on the lease and advances", () => {
    const { deltas, sink } = recorder();
    const id = identity();
    const publisher = new DcCkfPublisher(id, { lastSequence: 4n, sink, lease: LEASE });
    const first = publisher.publish(BATCH);
    expect(first.kind).to.equal("published");
    const delta = (first as { delta: DcCkfDelta }).delta;
    expect(delta).to.deep.equal({ identity: id, lease: LEASE, baseSequence: 4n, sequence: 5n, images: BATCH.images });
    publisher.publish(BATCH);
    expect(deltas.map((d) => [d.baseSequence, d.sequence])).to.deep.equal([
      [4n, 5n],
      [5n, 6n],
    ]);
    expect(publisher.exactDrainMarker()).to.deep.equal({ lease: LEASE, expectedSequence: 6n });
  });

  for (const verdict of ["rejected", "throw"] as const) {
    it(`fences DeliveryUncertain when the sink ${verdict === "throw" ? "throws" : "rejects"}, without advancing`, () => {
      const { deltas, sink } = recorder(verdict);
      const publisher = new DcCkfPublisher(identity(), { lastSequence: 4n, sink, lease: LEASE });
      expect(fenceOf(() => publisher.publish(BATCH))).to.equal("DeliveryUncertain");
      expect(publisher.lastSequence).to.equal(4n);
      expect(publisher.fenced).to.equal("DeliveryUncertain");
      expect(fenceOf(() => publisher.publish(BATCH))).to.equal("DeliveryUncertain");
      expect(deltas.length).to.equal(1);
    });
  }

  it("fences SequenceExhausted at u64::MAX, and refuses a barrier snapshot there", () => {
    const { deltas, sink } = recorder();
    const publisher = new DcCkfPublisher(identity(), { lastSequence: U64_MAX, sink, lease: LEASE });
    expect(fenceOf(() => publisher.publish(BATCH))).to.equal("SequenceExhausted");
    expect(deltas).to.deep.equal([]);
    const state = new DcCkfState({ expectedBlocksPerDc: 64 });
    expect(() => publisher.snapshotAfterBarrier(state, NEXT_LEASE)).to.throw(CkfError).with.property("code", "SequenceExhausted");
  });

  it("can be fenced from outside (LeaseStalled); the first reason sticks", () => {
    const { sink } = recorder();
    const publisher = new DcCkfPublisher(identity(), { lastSequence: 0n, sink, lease: LEASE });
    publisher.fence("LeaseStalled");
    publisher.fence("DeliveryUncertain");
    expect(fenceOf(() => publisher.publish(BATCH))).to.equal("LeaseStalled");
  });

  it("snapshotAfterBarrier publishes the pending tail on the old lease, then installs the new lease", () => {
    const { deltas, sink } = recorder();
    const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 100 });
    const publisher = new DcCkfPublisher(identity(), { lastSequence: 9n, sink, lease: LEASE });
    state.applyEvent(storedChain(1n, 0, [1n, 2n]).event);
    const snapshot = publisher.snapshotAfterBarrier(state, NEXT_LEASE);
    expect(deltas.length).to.equal(1);
    expect(sameLease(deltas[0]!.lease, LEASE)).to.equal(true);
    expect([deltas[0]!.baseSequence, deltas[0]!.sequence]).to.deep.equal([9n, 10n]);
    expect(snapshot.sequence).to.equal(10n);
    expect(snapshot.lease).to.equal(NEXT_LEASE);
    expect(sameWords(snapshot.buckets, state.words())).to.equal(true);
    // The first continuation is exactly N -> N + 1 on the new lease.
    state.applyEvent(storedChain(1n, 0, [3n]).event);
    const next = publisher.publish(state.flush()!);
    expect(next.kind === "published" && [next.delta.baseSequence, next.delta.sequence, next.delta.lease]).to.deep.equal([10n, 11n, NEXT_LEASE]);
  });

  it("a fenced publisher drops the tail (the snapshot carries it) and the barrier clears the fence", () => {
    const { deltas, sink } = recorder();
    const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 100 });
    const publisher = new DcCkfPublisher(identity(), { lastSequence: 3n, sink, lease: LEASE });
    publisher.fence("LeaseStalled");
    state.applyEvent(storedChain(1n, 0, [1n]).event);
    const snapshot = publisher.snapshotAfterBarrier(state, NEXT_LEASE);
    expect(deltas).to.deep.equal([]);
    expect(snapshot.sequence).to.equal(3n);
    expect(publisher.fenced).to.equal(undefined);
    expect(state.contains(1n)).to.equal(true);
    expect(snapshot.buckets.some((word) => word !== 0n)).to.equal(true);
  });

  it("a tail the old subscriber rejects still leaves a consistent snapshot for the new lease", () => {
    let accept = false;
    const deltas: DcCkfDelta[] = [];
    const publisher = new DcCkfPublisher(identity(), {
      lastSequence: 0n,
      lease: LEASE,
      sink: (delta) => {
        deltas.push(delta);
        return accept ? "accepted" : "rejected";
      },
    });
    const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 100 });
    state.applyEvent(storedChain(1n, 0, [1n]).event);
    const snapshot = publisher.snapshotAfterBarrier(state, NEXT_LEASE);
    expect(deltas.length).to.equal(1);
    expect(snapshot.sequence).to.equal(0n);
    expect(publisher.fenced).to.equal(undefined);
    accept = true;
    state.applyEvent(storedChain(1n, 0, [2n]).event);
    const mirror = snapshot.buckets.slice();
    const next = publisher.publish(state.flush()!);
    expect(next.kind).to.equal("published");
    if (next.kind === "published") applyImages(mirror, next.delta);
    expect(sameWords(mirror, state.words())).to.equal(true);
  });

  describe("EmptyDelta: a batch without images is refused (the consumer deactivates on an empty delta, B.9)", () => {
    const EMPTY: DcCkfPublicationBatch = { images: [] };
    for (const [what, lease, fence] of [
      ["on a lease", LEASE, undefined],
      ["without a lease", undefined, undefined],
      ["when fenced", LEASE, "LeaseStalled"],
    ] as const) {
      it(what, () => {
        const { deltas, sink } = recorder();
        const publisher = new DcCkfPublisher(identity(), { lastSequence: 4n, sink, lease });
        if (fence !== undefined) publisher.fence(fence);
        expect(() => publisher.publish(EMPTY)).to.throw(CkfError).with.property("code", "EmptyDelta");
        expect(deltas).to.deep.equal([]);
        expect(publisher.lastSequence).to.equal(4n);
        // A caller's bug, not a delivery problem: the refusal does not fence.
        expect(publisher.fenced).to.equal(fence);
        if (lease !== undefined && fence === undefined) {
          const next = publisher.publish(BATCH);
          expect(next.kind === "published" && [next.delta.baseSequence, next.delta.sequence]).to.deep.equal([4n, 5n]);
        }
      });
    }
  });

  it("snapshotAfterBarrier refuses a state of another format (FormatMismatch) before draining or publishing anything", () => {
    const { deltas, sink } = recorder();
    const publisher = new DcCkfPublisher(identity(), { lastSequence: 9n, sink, lease: LEASE });
    for (const config of [
      { expectedBlocksPerDc: 64, seed: 0x5eedn },
      { expectedBlocksPerDc: 4096 },
    ]) {
      const state = new DcCkfState({ ...config, publishEveryNEvents: 100 });
      state.applyEvent(storedChain(1n, 0, [1n]).event);
      expect(() => publisher.snapshotAfterBarrier(state, NEXT_LEASE)).to.throw(CkfError).with.property("code", "FormatMismatch");
      expect(state.stats().pendingEvents).to.equal(1);
      expect(deltas).to.deep.equal([]);
      expect(publisher.lease).to.equal(LEASE);
      expect(publisher.lastSequence).to.equal(9n);
    }
    // The matching format still works.
    const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 100 });
    expect(publisher.snapshotAfterBarrier(state, NEXT_LEASE).lease).to.equal(NEXT_LEASE);
  });

  describe("identity types", () => {
    it("rejects layoutGeneration 0, digests that are not 16 bytes, out-of-range fields", () => {
      const good = identity();
      const code = (f: () => unknown) => {
        try {
          f();
        } catch (error) {
          return (error as CkfError).code;
        }
        return undefined;
      };
      expect(code(() => producerIdentity({ ...good, layoutGeneration: 0n }))).to.equal("InvalidIdentity");
      expect(code(() => producerIdentity({ ...good, producerIncarnation: -1n }))).to.equal("InvalidIdentity");
      expect(code(() => digestIdentity(new Uint8Array(15), "Explicit"))).to.equal("InvalidIdentity");
      expect(code(() => digestIdentity(new Uint8Array(16), "Unspecified" as never))).to.equal("InvalidIdentity");
      expect(code(() => laneLease({ consumerInstance: 1n, physicalLane: 256, assignmentEpoch: 1n }))).to.equal("InvalidIdentity");
      expect(code(() => laneLease({ consumerInstance: 1n << 64n, physicalLane: 0, assignmentEpoch: 1n }))).to.equal("InvalidIdentity");
      expect(code(() => new DcCkfPublisher(good, { lastSequence: -1n, sink: () => "accepted" }))).to.equal("InvalidIdentity");
    });

    it("compares identities field by field (digest sources included)", () => {
      expect(sameProducerIdentity(identity(1), identity(1))).to.equal(true);
      expect(sameProducerIdentity(identity(1), identity(2))).to.equal(false);
      const a = identity(1);
      const derived = producerIdentity({
        ...a,
        poolId: poolId({
          cacheSemantics: digestIdentity(a.poolId.indexerDomain.cacheSemantics.digest, "DefaultDerived"),
          routingScope: a.poolId.indexerDomain.routingScope,
          dcId: a.poolId.dcId,
        }),
      });
      expect(sameProducerIdentity(a, derived)).to.equal(false);
      expect(sameProducerIdentity(a, producerIdentity({ ...a, layoutGeneration: 2n }))).to.equal(false);
    });

    it("derives the relay's own lease: consumer = incarnation, lane 0, epoch = layout generation", () => {
      const id = producerIdentity({ ...identity(), producerIncarnation: 77n, layoutGeneration: 5n });
      expect(relayLease(id)).to.deep.equal({ consumerInstance: 77n, physicalLane: 0, assignmentEpoch: 5n });
    });
  });
});
