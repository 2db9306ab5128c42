import { expect } from "chai";
import {
  CkfError,
  DcCkfPublisher,
  DcCkfState,
  digestIdentity,
  imageCount,
  locateKey,
  poolId,
  producerIdentity,
  relayLease,
  targetsPrimary,
  type ApplyOutcome,
  type CkfErrorCode,
  type DcCkfDelta,
} from "../../src/kv/ckf/index.js";
import {
  applyImages,
  chain,
  clearedEvent,
  external,
  removedEvent,
  sameWords,
  storedChain,
  storedEvent,
  U64_MAX,
} from "./ckf-helpers.js";

const W1 = 1n;
const W2 = 2n;

function expectError(outcome: ApplyOutcome, code: CkfErrorCode): void {
  expect(outcome.firstError, `expected ${code}`).to.be.instanceOf(CkfError);
  expect(outcome.firstError!.code).to.equal(code);
}

/** The lane's bytes, copied, to show that a rejected event changed nothing. */
const laneCopy = (state: DcCkfState) => state.words().slice();

describe("DcCkfState", () => {
  describe("ownership and the filter", () => {
    it("inserts on 0 -> 1 and removes on 1 -> 0, counting shared ownership exactly", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      const a = storedChain(W1, 0, [11n, 12n, 13n]);
      const b = storedChain(W2, 0, [11n, 12n]);
      expect(state.applyEvent(a.event).firstError).to.equal(undefined);
      expect(state.applyEvent(b.event).firstError).to.equal(undefined);
      expect(b.canonicals).to.deep.equal(a.canonicals.slice(0, 2));
      expect(state.ownership(a.canonicals[0]!)).to.deep.equal({ owners: 2, resident: true });
      expect(state.ownership(a.canonicals[2]!)).to.deep.equal({ owners: 1, resident: true });
      expect(state.stats()).to.include({ members: 2, contributions: 5, uniqueBlocks: 3, occupiedSlots: 3 });

      state.applyEvent(removedEvent(W1, 0, [external(a.canonicals[0]!, W1, 0)]));
      expect(state.ownership(a.canonicals[0]!)).to.deep.equal({ owners: 1, resident: true });
      expect(state.contains(a.canonicals[0]!)).to.equal(true);
      state.applyEvent(removedEvent(W2, 0, [external(a.canonicals[0]!, W2, 0)]));
      expect(state.ownership(a.canonicals[0]!)).to.equal(undefined);
      expect(state.contains(a.canonicals[0]!)).to.equal(false);
      expect(state.stats()).to.include({ uniqueBlocks: 2, occupiedSlots: 2, contributions: 3 });
    });

    it("chains canonical hashes from the tokens hashes, whatever the worker calls its blocks", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      const [root, child] = chain([5n, 6n]);
      const first = storedEvent(W1, 3, [{ blockHash: 1000n, tokensHash: 5n }]);
      const second = storedEvent(W1, 3, [{ blockHash: 1001n, tokensHash: 6n }], { parentHash: 1000n });
      expect(state.applyEvent(first).firstError).to.equal(undefined);
      expect(state.applyEvent(second).firstError).to.equal(undefined);
      expect(state.canonicalOf(W1, 3, 1000n)).to.equal(root);
      expect(state.canonicalOf(W1, 3, 1001n)).to.equal(child);
      expect(state.contains(root!)).to.equal(true);
      expect(state.contains(child!)).to.equal(true);
    });

    it("treats a repeated Stored event as a re-offer: no owner changes", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      const { event, canonicals } = storedChain(W1, 0, [1n, 2n]);
      state.applyEvent(event);
      const outcome = state.applyEvent(event);
      expect(outcome.firstError).to.equal(undefined);
      expect(outcome.publication).to.equal(undefined);
      expect(state.ownership(canonicals[1]!)).to.deep.equal({ owners: 1, resident: true });
      expect(state.stats().occupiedSlots).to.equal(2);
    });

    it("counts unknown removals as no-ops", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      state.applyEvent(storedChain(W1, 0, [1n]).event);
      const before = laneCopy(state);
      const outcome = state.applyEvent(removedEvent(W1, 0, [999n, 998n]));
      expect(outcome.firstError).to.equal(undefined);
      state.applyEvent(removedEvent(W2, 7, [999n]));
      expect(state.stats().unknownRemovals).to.equal(3);
      expect(sameWords(before, state.words())).to.equal(true);
    });

    it("Cleared removes every mapping of that member only", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      const a = storedChain(W1, 0, [1n, 2n, 3n]);
      const b = storedChain(W1, 1, [1n, 9n]);
      state.applyEvent(a.event);
      state.applyEvent(b.event);
      state.applyEvent(clearedEvent(W1, 0));
      expect(state.ownership(a.canonicals[0]!)).to.deep.equal({ owners: 1, resident: true });
      expect(state.ownership(a.canonicals[1]!)).to.equal(undefined);
      expect(state.contains(a.canonicals[2]!)).to.equal(false);
      expect(state.contains(b.canonicals[1]!)).to.equal(true);
      expect(state.stats()).to.include({ members: 1, contributions: 2, occupiedSlots: 2 });
    });

    it("removeRank and removeWorker remove, then drain", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 100 });
      state.applyEvent(storedChain(W1, 0, [1n, 2n]).event);
      state.applyEvent(storedChain(W1, 1, [3n]).event);
      state.applyEvent(storedChain(W2, 0, [4n]).event);
      expect(state.flush()!.images.length).to.be.greaterThan(0);

      const rank = state.removeRank(W1, 0);
      expect(rank.firstError).to.equal(undefined);
      expect(rank.publication!.images.length).to.be.greaterThan(0);
      expect(state.stats()).to.include({ members: 2, occupiedSlots: 2, pendingEvents: 0 });

      const worker = state.removeWorker(W1);
      expect(worker.publication!.images.length).to.be.greaterThan(0);
      expect(state.stats()).to.include({ members: 1, occupiedSlots: 1 });
      expect(state.removeWorker(99n)).to.deep.equal({ firstError: undefined, publication: undefined });
    });

    it("an empty Stored event changes nothing but still counts toward publication", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 2 });
      state.applyEvent(storedEvent(W1, 0, []));
      expect(state.stats()).to.include({ pendingEvents: 1, members: 0 });
    });
  });

  describe("the residency gate", () => {
    for (const [what, extra] of [
      ["the host-pinned tier", { storageTier: "host_pinned" as const }],
      ["the disk tier", { storageTier: "disk" as const }],
      ["the cache-owner domain off the device tier", { residencyDomain: "cache_owner", storageTier: "host_pinned" as const }],
    ] as const) {
      it(`ignores Stored events for ${what} completely: no mutation, no pending count`, () => {
        const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 1 });
        const outcome = state.applyEvent(storedEvent(W1, 0, [{ blockHash: 1n, tokensHash: 1n }], extra));
        expect(outcome).to.deep.equal({ firstError: undefined, publication: undefined });
        expect(state.stats()).to.include({ pendingEvents: 0, members: 0, occupiedSlots: 0 });
      });
    }

    it("rejects Stored/Removed for the cache-owner domain on the device tier (explicit or by default) with UnsupportedResidencyDomain", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 1 });
      expectError(state.applyEvent(storedEvent(W1, 0, [{ blockHash: 1n, tokensHash: 1n }], { residencyDomain: "cache_owner" })), "UnsupportedResidencyDomain");
      expectError(state.applyEvent({ ...removedEvent(W1, 0, [1n]), storageTier: "device", residencyDomain: "cache_owner" }), "UnsupportedResidencyDomain");
      expect(state.stats()).to.include({ pendingEvents: 0, members: 0, occupiedSlots: 0 });
    });

    it("applies a Cleared whatever its tier, and ignores it only when scoped to the cache-owner domain", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 1000 });
      const a = storedChain(W1, 0, [1n, 2n]);
      state.applyEvent(a.event);
      expect(state.applyEvent({ ...clearedEvent(W1, 0), residencyDomain: "cache_owner", storageTier: "host_pinned" })).to.deep.equal({ firstError: undefined, publication: undefined });
      expect(state.contains(a.canonicals[1]!)).to.equal(true);
      expect(state.applyEvent({ ...clearedEvent(W1, 0), storageTier: "host_pinned" }).firstError).to.equal(undefined);
      expect(state.contains(a.canonicals[0]!)).to.equal(false);
      expect(state.stats()).to.include({ members: 0, occupiedSlots: 0, pendingEvents: 2 });
    });

    it("applies device-tier events in the primary domain (explicit or by default)", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      const outcome = state.applyEvent(storedEvent(W1, 0, [{ blockHash: 1n, tokensHash: 1n }], { storageTier: "device", residencyDomain: "primary" }));
      expect(outcome.firstError).to.equal(undefined);
      expect(state.contains(1n)).to.equal(true);
    });

    it("rejects an unknown residency domain or tier with UnsupportedResidencyDomain and no mutation", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 1 });
      expectError(state.applyEvent(storedEvent(W1, 0, [{ blockHash: 1n, tokensHash: 1n }], { residencyDomain: "mystery" })), "UnsupportedResidencyDomain");
      const tier = { ...storedEvent(W1, 0, [{ blockHash: 1n, tokensHash: 1n }]), storageTier: "tape" } as never;
      expectError(state.applyEvent(tier), "UnsupportedResidencyDomain");
      expect(state.stats()).to.include({ pendingEvents: 0, members: 0, occupiedSlots: 0 });
    });
  });

  describe("errors", () => {
    it("ParentBlockNotFound: a parent outside the member's lineage rejects the event", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      const root = storedChain(W1, 0, [1n]);
      state.applyEvent(root.event);
      const before = laneCopy(state);
      // The parent is W1's block, but the event is W2's.
      const outcome = state.applyEvent(storedEvent(W2, 0, [{ blockHash: 5n, tokensHash: 2n }], { parentHash: external(root.canonicals[0]!, W1, 0) }));
      expectError(outcome, "ParentBlockNotFound");
      expect(state.stats()).to.include({ parentNotFound: 1, members: 1, occupiedSlots: 1 });
      expect(sameWords(before, state.words())).to.equal(true);
    });

    it("InvalidBlockSequence: a start position other than 0 without a parent", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      expectError(state.applyEvent(storedEvent(W1, 0, [{ blockHash: 1n, tokensHash: 1n }], { startPosition: 4 })), "InvalidBlockSequence");
      expect(state.applyEvent(storedEvent(W1, 0, [{ blockHash: 1n, tokensHash: 1n }], { startPosition: 0 })).firstError).to.equal(undefined);
    });

    it("InvalidBlockSequence: an external hash remapped to another sequence rejects the whole event before any mutation", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      state.applyEvent(storedEvent(W1, 0, [{ blockHash: 100n, tokensHash: 1n }]));
      const before = laneCopy(state);
      const outcome = state.applyEvent(
        storedEvent(W1, 0, [
          { blockHash: 200n, tokensHash: 7n },
          { blockHash: 100n, tokensHash: 8n },
        ]),
      );
      expectError(outcome, "InvalidBlockSequence");
      expect(state.canonicalOf(W1, 0, 200n)).to.equal(undefined);
      expect(sameWords(before, state.words())).to.equal(true);
      expect(state.stats().contributions).to.equal(1);
    });

    it("InvalidBlockSequence: the same external hash twice in one event with different sequences", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      const outcome = state.applyEvent(
        storedEvent(W1, 0, [
          { blockHash: 300n, tokensHash: 1n },
          { blockHash: 300n, tokensHash: 2n },
        ]),
      );
      expectError(outcome, "InvalidBlockSequence");
      expect(state.stats()).to.include({ members: 0, occupiedSlots: 0 });
    });

    it("CapacityExhausted: ownership commits non-resident, later removal balances it, a re-offer admits it when room appears", () => {
      // 2 buckets, 8 slots.
      const state = new DcCkfState({ expectedBlocksPerDc: 1, maxKicks: 50 });
      // One run of 12 blocks: block i's canonical hash chains from block i - 1's.
      const tokens = Array.from({ length: 12 }, (_, i) => BigInt(i + 1) * 0x1111_1111_1111n);
      const canonicals = chain(tokens);
      const externalOf = (i: number) => BigInt(i + 1);
      const outcome = state.applyEvent(storedEvent(W1, 0, tokens.map((tokensHash, i) => ({ blockHash: externalOf(i), tokensHash }))));
      expectError(outcome, "CapacityExhausted");
      const stats = state.stats();
      expect(stats.contributions).to.equal(12);
      expect(stats.occupiedSlots).to.equal(8);
      expect(stats.capacityFailures).to.equal(4);
      expect(stats.nonResidentBlocks).to.equal(4);
      // Every sibling block stays applied, and every resident one is in the filter.
      const resident = canonicals.filter((c) => state.ownership(c)!.resident);
      const evicted = canonicals.filter((c) => !state.ownership(c)!.resident);
      expect(resident.length).to.equal(8);
      for (const c of resident) expect(state.contains(c)).to.equal(true);
      // Removing a non-resident block touches no fingerprint.
      const before = laneCopy(state);
      expect(state.applyEvent(removedEvent(W1, 0, [externalOf(canonicals.indexOf(evicted[0]!))])).firstError).to.equal(undefined);
      expect(sameWords(before, state.words())).to.equal(true);
      expect(state.stats().capacityFailures).to.equal(4);
      // The first 8 blocks fill the 8 slots; the last 4 find no room.
      expect(evicted).to.deep.equal(canonicals.slice(8));
      // Re-offering a known, non-resident mapping retries without relocation; still full, so it stays out, silently.
      const reoffer = storedEvent(W1, 0, [{ blockHash: externalOf(10), tokensHash: tokens[10]! }], { parentHash: externalOf(9) });
      expect(state.applyEvent(reoffer).firstError).to.equal(undefined);
      expect(state.ownership(canonicals[10]!)).to.deep.equal({ owners: 1, resident: false });
      expect(state.stats().capacityFailures).to.equal(4);
      // With a slot free, the same re-offer admits it.
      state.applyEvent(removedEvent(W1, 0, [externalOf(0)]));
      expect(state.applyEvent(reoffer).firstError).to.equal(undefined);
      expect(state.ownership(canonicals[10]!)).to.deep.equal({ owners: 1, resident: true });
      expect(state.contains(canonicals[10]!)).to.equal(true);
      expect(state.stats()).to.include({ occupiedSlots: 8, nonResidentBlocks: 2, contributions: 10 });
    });

    it("OwnershipDegreeOverflow: an owner count at its limit rejects that block, siblings still apply", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 }, { maxOwners: 2 });
      state.applyEvent(storedChain(1n, 0, [1n]).event);
      state.applyEvent(storedChain(2n, 0, [1n]).event);
      const third = storedChain(3n, 0, [1n, 2n]);
      const outcome = state.applyEvent(third.event);
      expectError(outcome, "OwnershipDegreeOverflow");
      expect(state.ownership(1n)).to.deep.equal({ owners: 2, resident: true });
      expect(state.ownership(third.canonicals[1]!)).to.deep.equal({ owners: 1, resident: true });
      expect(state.canonicalOf(3n, 0, external(1n, 3n, 0))).to.equal(undefined);
    });

    it("IndexerInvariantViolation: a resident fingerprint missing from the lane; the removal still completes", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      const { event, canonicals } = storedChain(W1, 0, [1n, 2n]);
      state.applyEvent(event);
      state.words().fill(0n); // corrupt the lane behind the state's back
      const outcome = state.applyEvent(clearedEvent(W1, 0));
      expectError(outcome, "IndexerInvariantViolation");
      expect(state.ownership(canonicals[0]!)).to.equal(undefined);
      expect(state.ownership(canonicals[1]!)).to.equal(undefined);
      expect(state.stats().members).to.equal(0);
    });

    it("InvalidEvent: out-of-range fields reject the event without counting it", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      expectError(state.applyEvent(storedEvent(W1, -1, [])), "InvalidEvent");
      expectError(state.applyEvent(storedEvent(U64_MAX + 1n, 0, [])), "InvalidEvent");
      expectError(state.applyEvent(storedEvent(W1, 0, [{ blockHash: 1n << 64n, tokensHash: 1n }])), "InvalidEvent");
      expectError(state.applyEvent(storedEvent(W1, 0, [{ blockHash: 1n, tokensHash: -1n }])), "InvalidEvent");
      expectError(state.applyEvent(removedEvent(W1, 0, [-5n])), "InvalidEvent");
      expectError(state.applyEvent({ workerId: W1, dpRank: 0, eventId: 1n, data: { kind: "mystery" } } as never), "InvalidEvent");
      expect(state.stats().pendingEvents).to.equal(0);
    });

    describe("InvalidEvent: a malformed shape is a returned error, never a throw, and changes nothing", () => {
      const stored = (data: unknown) => ({ workerId: W1, dpRank: 0, eventId: 1n, data });
      const noPrimitive = Object.create(null) as object;
      const cases: [string, unknown][] = [
        ["null", null],
        ["undefined", undefined],
        ["a number", 42],
        ["a string", "event"],
        ["data missing", { workerId: W1, dpRank: 0, eventId: 1n }],
        ["data null", stored(null)],
        ["data a number", stored(5)],
        ["data without a kind", stored({})],
        ["an unknown kind", stored({ kind: "mystery" })],
        ["a bigint kind", stored({ kind: 5n })],
        ["a kind without a primitive form", stored({ kind: noPrimitive })],
        ["Stored without blocks", stored({ kind: "stored" })],
        ["Stored with blocks null", stored({ kind: "stored", blocks: null })],
        ["Stored with blocks an array-like", stored({ kind: "stored", blocks: { length: 1, 0: { blockHash: 1n, tokensHash: 1n } } })],
        ["Stored with a null block", stored({ kind: "stored", blocks: [null] })],
        ["Stored with a hole for a block", stored({ kind: "stored", blocks: new Array(1) })],
        ["Stored with a number block", stored({ kind: "stored", blocks: [{ blockHash: 1n, tokensHash: 1n }, 7] })],
        ["Stored with a block missing its hashes", stored({ kind: "stored", blocks: [{}] })],
        ["Stored with a number hash", stored({ kind: "stored", blocks: [{ blockHash: 1, tokensHash: 1n }] })],
        ["Stored with a null parent", stored({ kind: "stored", parentHash: null, blocks: [] })],
        ["Stored with a fractional start position", stored({ kind: "stored", startPosition: 0.5, blocks: [] })],
        ["Removed without block hashes", stored({ kind: "removed" })],
        ["Removed with a null hash", stored({ kind: "removed", blockHashes: [null] })],
        ["Removed with a typed array", stored({ kind: "removed", blockHashes: BigUint64Array.of(1n) })],
        ["a worker id without a primitive form", { ...stored({ kind: "cleared" }), workerId: noPrimitive }],
        ["a non-string residency domain", { ...stored({ kind: "cleared" }), residencyDomain: 5 }],
        ["a null storage tier", { ...stored({ kind: "cleared" }), storageTier: null }],
      ];
      for (const [what, event] of cases) {
        it(what, () => {
          const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 1 });
          const existing = storedChain(W1, 0, [1n, 2n]);
          state.applyEvent(existing.event);
          const before = laneCopy(state);
          const statsBefore = state.stats();
          let outcome: ApplyOutcome | undefined;
          expect(() => (outcome = state.applyEvent(event as never))).not.to.throw();
          expectError(outcome!, "InvalidEvent");
          expect(outcome!.publication).to.equal(undefined);
          expect(sameWords(before, state.words())).to.equal(true);
          expect(state.stats()).to.deep.equal(statsBefore);
          expect(state.ownership(existing.canonicals[1]!)).to.deep.equal({ owners: 1, resident: true });
        });
      }
    });

    it("the residency gate comes first (B.4 step 1): a malformed event for another tier or domain is ignored, not refused", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 1 });
      const malformed = { workerId: -1n, dpRank: 0.5, eventId: 1n, data: { kind: "stored", blocks: [null] } };
      for (const residency of [{ storageTier: "host_pinned" }, { storageTier: "disk" }, { residencyDomain: "cache_owner", storageTier: "disk" }]) {
        expect(state.applyEvent({ ...malformed, ...residency } as never), JSON.stringify(residency)).to.deep.equal({ firstError: undefined, publication: undefined });
        expect(state.applyEvent({ ...residency, workerId: W1, dpRank: 0, eventId: 1n } as never)).to.deep.equal({ firstError: undefined, publication: undefined });
      }
      // A malformed Cleared scoped to the cache-owner domain is ignored whatever its tier.
      expect(state.applyEvent({ ...malformed, data: { kind: "cleared", extra: null }, workerId: null, residencyDomain: "cache_owner", storageTier: "device" } as never)).to.deep.equal({ firstError: undefined, publication: undefined });
      // An unknown domain or tier is still refused as such, whatever the body;
      // so is a cache-owner Stored on the device tier (explicit or by default).
      expectError(state.applyEvent({ ...malformed, residencyDomain: "mystery" } as never), "UnsupportedResidencyDomain");
      expectError(state.applyEvent({ ...malformed, storageTier: "tape" } as never), "UnsupportedResidencyDomain");
      expectError(state.applyEvent({ ...malformed, residencyDomain: "cache_owner" } as never), "UnsupportedResidencyDomain");
      expectError(state.applyEvent({ ...malformed, residencyDomain: "cache_owner", storageTier: "device" } as never), "UnsupportedResidencyDomain");
      // A Cleared off the device tier is not ignored: it reaches the shape check.
      expectError(state.applyEvent({ ...malformed, data: { kind: "cleared" }, storageTier: "host_pinned" } as never), "InvalidEvent");
      // A primary-tier malformed event reaches the shape check.
      expectError(state.applyEvent({ ...malformed, storageTier: "device" } as never), "InvalidEvent");
      expect(state.stats()).to.include({ pendingEvents: 0, members: 0, occupiedSlots: 0 });
      // targetsPrimary answers the same gate, throwing.
      expect(() => targetsPrimary({ ...malformed, storageTier: 7 } as never)).to.throw(CkfError).with.property("code", "InvalidEvent");
      expect(() => targetsPrimary(null as never)).to.throw(CkfError).with.property("code", "InvalidEvent");
      expect(targetsPrimary({ ...malformed, storageTier: "external" } as never)).to.equal(false);
    });

    it("keeps the first error and still applies later events' siblings", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      state.applyEvent(storedChain(W1, 0, [1n]).event);
      state.words().fill(0n);
      const second = storedChain(W1, 1, [5n]);
      state.applyEvent(second.event);
      const outcome = state.applyEvent(removedEvent(W1, 0, [external(1n, W1, 0), 777n]));
      expectError(outcome, "IndexerInvariantViolation");
      expect(state.stats().unknownRemovals).to.equal(1);
      expect(state.contains(second.canonicals[0]!)).to.equal(true);
    });
  });

  describe("publication", () => {
    it("drains at the publication boundary, every N applied events", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 3 });
      expect(state.applyEvent(storedChain(W1, 0, [1n]).event).publication).to.equal(undefined);
      expect(state.applyEvent(storedChain(W1, 1, [2n]).event).publication).to.equal(undefined);
      expect(state.stats().pendingEvents).to.equal(2);
      const third = state.applyEvent(storedChain(W1, 2, [3n]).event).publication!;
      expect(third.images.length).to.be.within(1, 3);
      const words = state.words();
      for (const image of third.images) expect(image.value).to.equal(words[image.bucket]);
      expect(state.stats()).to.include({ pendingEvents: 0, emittedImages: third.images.length });
    });

    it("lists buckets in first-dirtied order with their final values", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 4096, publishEveryNEvents: 10 });
      const { event, canonicals } = storedChain(W1, 0, [1n, 2n, 3n, 4n, 5n, 6n]);
      state.applyEvent(event);
      const batch = state.flush()!;
      // A nearly empty filter puts every key in its bucketA.
      const expected = [...new Set(canonicals.map((c) => locateKey(c, state.format()).bucketA))];
      expect(batch.images.map((image) => image.bucket)).to.deep.equal(expected);
      for (const image of batch.images) expect(image.value).to.equal(state.words()[image.bucket]);
      expect(state.flush()).to.equal(undefined);
    });

    it("drains its images as columns; `images` is made from them on first read, frozen, and kept", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 4096, publishEveryNEvents: 10 });
      state.applyEvent(storedChain(W1, 0, [1n, 2n, 3n, 4n, 5n, 6n]).event);
      const batch = state.flush()!;
      const { buckets, values } = batch.columns!;
      expect(buckets).to.be.instanceOf(Uint32Array);
      expect(values).to.be.instanceOf(BigUint64Array);
      expect(imageCount(batch)).to.equal(buckets.length);
      const images = batch.images;
      expect(images).to.deep.equal([...buckets].map((bucket, i) => ({ bucket, value: values[i] })));
      expect(Object.isFrozen(images) && images.every((image) => Object.isFrozen(image))).to.equal(true);
      expect(batch.images).to.equal(images);
      expect(Object.isFrozen(batch)).to.equal(true);
      // The publisher passes the columns on, and the delta's images are the batch's.
      const identity = producerIdentity({
        poolId: poolId({ cacheSemantics: digestIdentity(new Uint8Array(16), "Explicit"), routingScope: digestIdentity(new Uint8Array(16), "Explicit"), dcId: 1n }),
        producerIncarnation: 1n,
        layoutGeneration: 1n,
        format: state.format(),
      });
      const delivered: DcCkfDelta[] = [];
      const publisher = new DcCkfPublisher(identity, {
        lastSequence: 0n,
        sink: (d) => {
          delivered.push(d);
          return "accepted";
        },
      });
      publisher.snapshotAfterBarrier(state, relayLease(identity));
      state.applyEvent(storedChain(W1, 0, [7n, 8n]).event);
      const next = state.flush()!;
      publisher.publish(next);
      expect(delivered[0]!.columns).to.equal(next.columns);
      expect(delivered[0]!.images).to.equal(next.images);
      expect(Object.isFrozen(delivered[0])).to.equal(true);
    });

    it("eliminates net-reverted buckets: store then remove in one window publishes nothing", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 2 });
      const { event, canonicals } = storedChain(W1, 0, [1n, 2n]);
      expect(state.applyEvent(event).publication).to.equal(undefined);
      const outcome = state.applyEvent(removedEvent(W1, 0, canonicals.map((c) => external(c, W1, 0))));
      expect(outcome.publication).to.equal(undefined);
      const stats = state.stats();
      expect(stats.netRevertedBuckets).to.be.within(1, 2);
      expect(stats.emittedImages).to.equal(0);
      expect(stats.physicalTouches).to.equal(4);
      expect(stats.pendingEvents).to.equal(0);
    });

    it("yields no batch while materialization is off, and still resets the window", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 }, { materialize: false });
      expect(state.materializing).to.equal(false);
      expect(state.applyEvent(storedChain(W1, 0, [1n]).event).publication).to.equal(undefined);
      expect(state.stats().pendingEvents).to.equal(0);
      state.setMaterialization(true);
      expect(state.flush()).to.equal(undefined);
      expect(state.applyEvent(storedChain(W1, 0, [2n]).event).publication!.images.length).to.equal(1);
    });

    it("barrierSnapshot copies the words (tail included), then drains the tail", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 10 });
      const [, empty] = state.barrierSnapshot();
      const mirror = empty.slice();
      state.applyEvent(storedChain(W1, 0, [1n, 2n, 3n]).event);
      const [tail, words] = state.barrierSnapshot();
      expect(tail!.images.length).to.be.greaterThan(0);
      // A copy, not a view: its memory is not the lane's (words() makes a new view each call,
      // so comparing the arrays themselves could never fail).
      expect(words.buffer === state.words().buffer, "the snapshot shares the lane's memory").to.equal(false);
      expect(sameWords(words, state.words())).to.equal(true);
      applyImages(mirror, tail);
      expect(sameWords(mirror, words)).to.equal(true);
      const [none] = state.barrierSnapshot();
      expect(none).to.equal(undefined);
      // The copy does not follow later changes.
      state.applyEvent(clearedEvent(W1, 0));
      expect(sameWords(words, state.words())).to.equal(false);
    });

    it("reports its format identity and memory", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 1_048_576, seed: 0x5eedn });
      expect(state.format()).to.deep.equal({ formatVersion: 1, seed: 0x5eedn, bucketCount: 524_288, fingerprintBits: 16, slotsPerBucket: 4 });
      expect(state.stats().memory.filterBytes).to.equal(524_288 * 8);
    });
  });
});
