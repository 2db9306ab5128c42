import { expect } from "chai";
import fc from "fast-check";
import { DcCkfState, type ApplyOutcome, type DcCkfPublicationBatch, type StoredBlock } from "../../src/kv/ckf/index.js";
import { computeNextSeqHash } from "../../src/kv/hash/index.js";
import { applyImages, clearedEvent, external, removedEvent, sameWords, storedEvent } from "./ckf-helpers.js";

/** Members are (worker, rank) pairs from a small set, so that they share blocks. */
const WORKERS = [1n, 2n, 3n];
const RANKS = [0, 1];
type MemberKey = `${bigint}:${number}`;
const keyOf = (workerId: bigint, dpRank: number): MemberKey => `${workerId}:${dpRank}`;

type Op =
  | { kind: "stored"; worker: number; rank: number; parentPick: number | null; tokens: bigint[] }
  | { kind: "removed"; worker: number; rank: number; picks: number[]; unknown: bigint[] }
  | { kind: "cleared"; worker: number; rank: number }
  | { kind: "removeRank"; worker: number; rank: number }
  | { kind: "removeWorker"; worker: number }
  | { kind: "barrier" };

const member = { worker: fc.nat({ max: WORKERS.length - 1 }), rank: fc.nat({ max: RANKS.length - 1 }) };
/** Few token hashes, so chains from different members coincide. */
const tokens = fc.array(fc.bigInt({ min: 1n, max: 4n }), { minLength: 1, maxLength: 4 });
const op: fc.Arbitrary<Op> = fc.oneof(
  { weight: 6, arbitrary: fc.record({ kind: fc.constant("stored" as const), ...member, parentPick: fc.option(fc.nat(), { nil: null }), tokens }) },
  {
    weight: 3,
    arbitrary: fc.record({
      kind: fc.constant("removed" as const),
      ...member,
      picks: fc.array(fc.nat(), { maxLength: 3 }),
      unknown: fc.array(fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }), { maxLength: 1 }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("cleared" as const), ...member }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("removeRank" as const), ...member }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("removeWorker" as const), worker: member.worker }) },
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("barrier" as const) }) },
);

/** The reference model: each member's external -> canonical mappings, and each canonical's owning members. */
class Model {
  readonly lineages = new Map<MemberKey, Map<bigint, bigint>>();
  readonly owners = new Map<bigint, Set<MemberKey>>();

  lineage(key: MemberKey): Map<bigint, bigint> {
    let lineage = this.lineages.get(key);
    if (lineage === undefined) this.lineages.set(key, (lineage = new Map()));
    return lineage;
  }

  add(key: MemberKey, ext: bigint, canonical: bigint): void {
    const lineage = this.lineage(key);
    if (lineage.has(ext)) return;
    lineage.set(ext, canonical);
    let set = this.owners.get(canonical);
    if (set === undefined) this.owners.set(canonical, (set = new Set()));
    set.add(key);
  }

  remove(key: MemberKey, ext: bigint): void {
    const lineage = this.lineages.get(key);
    const canonical = lineage?.get(ext);
    if (canonical === undefined) return;
    lineage!.delete(ext);
    const set = this.owners.get(canonical)!;
    set.delete(key);
    if (set.size === 0) this.owners.delete(canonical);
  }

  clear(key: MemberKey): void {
    for (const ext of [...(this.lineages.get(key)?.keys() ?? [])]) this.remove(key, ext);
    this.lineages.delete(key);
  }
}

/**
 * Runs `ops` against a DcCkfState and the model, keeping a consumer mirror fed
 * only with published batches; checks ownership after every op and the mirror
 * at every barrier.
 */
function run(ops: Op[], expectedBlocksPerDc: number, publishEveryNEvents: number, roomy: boolean): void {
  const state = new DcCkfState({ expectedBlocksPerDc, publishEveryNEvents, maxKicks: 50 });
  const model = new Model();
  const [, initial] = state.barrierSnapshot();
  const mirror = initial.slice();

  const consume = (batch: DcCkfPublicationBatch | undefined) => {
    if (batch === undefined) return;
    expect(batch.images.length).to.be.greaterThan(0);
    const buckets = new Set<number>();
    for (const image of batch.images) {
      expect(buckets.has(image.bucket), "a bucket appears once per batch").to.equal(false);
      buckets.add(image.bucket);
      // Net-revert elimination: every image changes what the consumer holds.
      expect(image.value).not.to.equal(mirror[image.bucket]);
    }
    applyImages(mirror, batch);
  };
  const outcome = (result: ApplyOutcome) => {
    if (roomy) expect(result.firstError).to.equal(undefined);
    else if (result.firstError !== undefined) expect(result.firstError.code).to.equal("CapacityExhausted");
    consume(result.publication);
  };

  for (const o of ops) {
    if (o.kind === "barrier") {
      const [tail, words] = state.barrierSnapshot();
      consume(tail);
      expect(sameWords(mirror, words), "snapshot = previous snapshot + deltas").to.equal(true);
      continue;
    }
    const workerId = WORKERS[o.worker]!;
    if (o.kind === "removeWorker") {
      outcome(state.removeWorker(workerId));
      for (const rank of RANKS) model.clear(keyOf(workerId, rank));
      continue;
    }
    const dpRank = RANKS[o.rank]!;
    const key = keyOf(workerId, dpRank);
    const lineage = model.lineage(key);
    switch (o.kind) {
      case "stored": {
        let parent: bigint | undefined;
        const known = [...lineage.values()];
        if (o.parentPick !== null && known.length > 0) parent = known[o.parentPick % known.length];
        const blocks: StoredBlock[] = [];
        const canonicals: bigint[] = [];
        let previous = parent;
        for (const t of o.tokens) {
          previous = previous === undefined ? t : computeNextSeqHash(previous, t);
          canonicals.push(previous);
          blocks.push({ blockHash: external(previous, workerId, dpRank), tokensHash: t });
        }
        const extra = parent === undefined ? {} : { parentHash: external(parent, workerId, dpRank) };
        outcome(state.applyEvent(storedEvent(workerId, dpRank, blocks, extra)));
        canonicals.forEach((c, i) => model.add(key, blocks[i]!.blockHash, c));
        break;
      }
      case "removed": {
        const known = [...lineage.keys()];
        const hashes = [...o.picks.filter(() => known.length > 0).map((p) => known[p % known.length]!), ...o.unknown];
        outcome(state.applyEvent(removedEvent(workerId, dpRank, hashes)));
        for (const h of hashes) model.remove(key, h);
        break;
      }
      case "cleared":
        outcome(state.applyEvent(clearedEvent(workerId, dpRank)));
        model.clear(key);
        break;
      case "removeRank":
        outcome(state.removeRank(workerId, dpRank));
        model.clear(key);
        break;
    }

    // Ownership matches the model, and every resident key is in the filter.
    let resident = 0;
    let contributions = 0;
    for (const [canonical, set] of model.owners) {
      const ownership = state.ownership(canonical);
      expect(ownership?.owners, `owners of ${canonical}`).to.equal(set.size);
      contributions += set.size;
      if (roomy) expect(ownership!.resident).to.equal(true);
      if (ownership!.resident) {
        resident++;
        expect(state.contains(canonical)).to.equal(true);
      }
    }
    const stats = state.stats();
    expect(stats.uniqueBlocks).to.equal(model.owners.size);
    expect(stats.contributions).to.equal(contributions);
    expect(stats.occupiedSlots).to.equal(resident);
    if (roomy) expect(stats.capacityFailures).to.equal(0);
  }

  const [tail, words] = state.barrierSnapshot();
  consume(tail);
  expect(sameWords(mirror, words), "snapshot = previous snapshot + deltas").to.equal(true);
  expect(sameWords(words, state.words())).to.equal(true);
}

describe("DcCkfState properties (random Stored / Removed / Cleared streams from several members)", () => {
  it("with room for everything: owners match the model, resident keys are contained, deltas rebuild the snapshot", () => {
    fc.assert(
      fc.property(fc.array(op, { minLength: 1, maxLength: 40 }), fc.integer({ min: 1, max: 3 }), (ops, every) => run(ops, 4096, every, true)),
      { numRuns: 150 },
    );
  });

  it("in a filter too small to hold them: the same, with non-resident owners and rolled-back inserts", () => {
    fc.assert(
      fc.property(fc.array(op, { minLength: 1, maxLength: 40 }), fc.integer({ min: 1, max: 3 }), (ops, every) => run(ops, 4, every, false)),
      { numRuns: 150 },
    );
  });
});
