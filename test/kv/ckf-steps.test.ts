import { createHash } from "node:crypto";
import { expect } from "chai";
import { CkfError, DcCkfState, type ApplyOutcome, type DcCkfStateOptions, type RouterEvent } from "../../src/kv/ckf/index.js";
import { applyImages, sameWords, storedEvent } from "./ckf-helpers.js";
import { ckfWorkload } from "./ckf-workload.js";

/** What an event did, comparable across runs: its first error's code and message, and whether it drained a batch. */
const outcomeOf = (o: ApplyOutcome) => ({ code: o.firstError?.code, message: o.firstError?.message, published: o.publication !== undefined });

/** A 32-bucket filter (128 slots), too small for the workload: inserts fail mid-event. */
const SMALL = { expectedBlocksPerDc: 64, publishEveryNEvents: 7 };
const OPTIONS: DcCkfStateOptions = { maxOwners: 2, maxBlocksPerEvent: 40 };

function direct(events: readonly RouterEvent[]) {
  const state = new DcCkfState(SMALL, OPTIONS);
  return { state, outcomes: events.map((e) => outcomeOf(state.applyEvent(e))) };
}

/**
 * Applies every event in steps, pausing after every `every` blocks; at each
 * pause `inPause` runs (reads, drains). Counts the pauses.
 */
function stepped(events: readonly RouterEvent[], every: number, inPause: (state: DcCkfState) => void = () => undefined) {
  const state = new DcCkfState(SMALL, OPTIONS);
  let n = 0;
  let pauses = 0;
  const outcomes = events.map((event) => {
    const steps = state.applyEventInSteps(event, () => ++n % every === 0);
    for (;;) {
      const step = steps.next();
      if (step.done === true) return outcomeOf(step.value);
      pauses += 1;
      expect(state.applying).to.equal(true);
      inPause(state);
    }
  });
  expect(state.applying).to.equal(false);
  return { state, outcomes, pauses };
}

/** The same as `stepped`, through applyEventUntil / continueEvent (no generator). */
function steppedUntil(events: readonly RouterEvent[], every: number) {
  const state = new DcCkfState(SMALL, OPTIONS);
  let n = 0;
  let pauses = 0;
  const pause = () => ++n % every === 0;
  const outcomes = events.map((event) => {
    let outcome = state.applyEventUntil(event, pause);
    while (outcome === undefined) {
      pauses += 1;
      expect(state.applying).to.equal(true);
      outcome = state.continueEvent(pause);
    }
    return outcomeOf(outcome);
  });
  expect(state.applying).to.equal(false);
  return { state, outcomes, pauses };
}

/**
 * SHA-256 over every event's outcome (first error's code and message, the
 * images of the batch it drained) and the final lane bytes, for the workload
 * below without over-limit events, `maxOwners` 2, a publication every 7
 * events. Computed with DcCkfState as it was before the application in steps
 * existed (one synchronous pass per event): the stepped code, paused or not,
 * must give exactly what that gave.
 */
const BEFORE_STEPS: Readonly<Record<number, string>> = {
  64: "3c96cd5fb0753e70e02ff201decc5d52621fbeab8e8c2603d9ccb544373c6bac",
  2048: "9da5934fd7dc61c0d2dda3ffaee5359c9c9959b2ced0c3a5ab12033855b357aa",
};

function digestRun(expectedBlocksPerDc: number, every: number | undefined): string {
  const events = ckfWorkload({ seed: 0x5eed, events: 1500, maxBlocks: 30 });
  const state = new DcCkfState({ expectedBlocksPerDc, publishEveryNEvents: 7 }, { maxOwners: 2 });
  const hash = createHash("sha256");
  let n = 0;
  for (const event of events) {
    let outcome: ApplyOutcome;
    if (every === undefined) {
      outcome = state.applyEvent(event);
    } else {
      const steps = state.applyEventInSteps(event, () => ++n % every === 0);
      let step = steps.next();
      while (step.done !== true) step = steps.next();
      outcome = step.value;
    }
    const images = outcome.publication?.images.map((i) => `${i.bucket}:${i.value}`).join(",");
    hash.update(`${outcome.firstError?.code}|${outcome.firstError?.message}|${images}\n`);
  }
  const words = state.words();
  hash.update(new Uint8Array(words.buffer, words.byteOffset, words.byteLength));
  return hash.digest("hex");
}

describe("DcCkfState: application in steps", () => {
  const events = ckfWorkload({ seed: 0x5eed, events: 1500, maxBlocks: 30, overLimit: 41 });

  for (const expected of [64, 2048]) {
    it(`gives what the one-pass application gave before steps existed (${expected} expected blocks), with and without pauses`, () => {
      expect(digestRun(expected, undefined)).to.equal(BEFORE_STEPS[expected]);
      expect(digestRun(expected, 3)).to.equal(BEFORE_STEPS[expected]);
    });
  }

  it("the workload reaches every outcome the steps must keep", () => {
    const codes = new Set(direct(events).outcomes.map((o) => o.code));
    for (const code of [undefined, "CapacityExhausted", "OwnershipDegreeOverflow", "ParentBlockNotFound", "InvalidBlockSequence", "EventTooLarge"]) {
      expect(codes.has(code as never), String(code)).to.equal(true);
    }
  });

  for (const every of [1, 2, 3, 7, 64]) {
    it(`pausing every ${every} block(s) gives the same outcomes, lane bytes and stats as applying without a pause`, () => {
      const a = direct(events);
      const b = stepped(events, every);
      expect(b.pauses).to.be.greaterThan(every === 64 ? 100 : 1000);
      expect(b.outcomes).to.deep.equal(a.outcomes);
      expect(sameWords(b.state.words(), a.state.words())).to.equal(true);
      expect(b.state.stats()).to.deep.equal(a.state.stats());
    });
  }

  for (const every of [1, 3, 64]) {
    it(`applyEventUntil and continueEvent, pausing every ${every} block(s), pause where the generator does and give what it gives`, () => {
      const a = stepped(events, every);
      const b = steppedUntil(events, every);
      expect(b.pauses).to.equal(a.pauses);
      expect(b.outcomes).to.deep.equal(a.outcomes);
      expect(sameWords(b.state.words(), a.state.words())).to.equal(true);
      expect(b.state.stats()).to.deep.equal(a.state.stats());
    });
  }

  it("continueEvent without an application under way throws; abandonEvent releases the state, the event partly applied", () => {
    const state = new DcCkfState({ expectedBlocksPerDc: 1024 });
    expect(() => state.continueEvent(() => false)).to.throw(/no event is being applied in steps/);
    const blocks = Array.from({ length: 10 }, (_, i) => ({ blockHash: BigInt(100 + i), tokensHash: BigInt(7 + i) }));
    // Paused after the check of every block, then before the second block is owned.
    let asked = 0;
    let outcome = state.applyEventUntil(storedEvent(1n, 0, blocks), () => ++asked === 11);
    expect(outcome).to.equal(undefined);
    expect(state.applying).to.equal(true);
    expect(state.stats().uniqueBlocks).to.equal(1);
    expect(() => state.applyEventUntil(storedEvent(2n, 0, blocks), () => false)).to.throw(/being applied in steps/);
    state.abandonEvent();
    expect(state.applying).to.equal(false);
    state.abandonEvent();
    outcome = state.applyEventUntil(storedEvent(2n, 0, [{ blockHash: 1n, tokensHash: 2n }]), () => false);
    expect(outcome?.firstError).to.equal(undefined);
    expect(state.stats().uniqueBlocks).to.equal(2);
  });

  it("drains and reads in the pauses see a consistent lane, and a mirror of the drained batches ends equal to the lane", () => {
    const a = direct(events);
    const mirror = new BigUint64Array(a.state.words().length);
    let drains = 0;
    const b = stepped(events, 5, (state) => {
      // What a subscriber, the load window or a hub opening may do while an event is mid-way.
      state.occupancy();
      state.contains(12345n);
      applyImages(mirror, state.flush());
      drains += 1;
    });
    expect(drains).to.be.greaterThan(500);
    expect(b.outcomes.map(({ code, message }) => ({ code, message }))).to.deep.equal(a.outcomes.map(({ code, message }) => ({ code, message })));
    expect(sameWords(b.state.words(), a.state.words())).to.equal(true);
    applyImages(mirror, b.state.flush());
    expect(sameWords(mirror, b.state.words())).to.equal(true);
    // Ownership is the same too; only the window counters (what drained when) differ.
    const { distinctTouchedBuckets: _d, emittedImages: _e, netRevertedBuckets: _n, pendingEvents: _p, ...rest } = b.state.stats();
    const { distinctTouchedBuckets: _d2, emittedImages: _e2, netRevertedBuckets: _n2, pendingEvents: _p2, ...expected } = a.state.stats();
    expect(rest).to.deep.equal(expected);
  });

  it("nothing else may change the state while an event is mid-way; return() releases it", () => {
    const state = new DcCkfState({ expectedBlocksPerDc: 1024 });
    const blocks = Array.from({ length: 10 }, (_, i) => ({ blockHash: BigInt(100 + i), tokensHash: BigInt(7 + i) }));
    const steps = state.applyEventInSteps(storedEvent(1n, 0, blocks), () => true);
    expect(steps.next().done).to.equal(false);
    expect(state.applying).to.equal(true);
    const other = storedEvent(2n, 0, [{ blockHash: 1n, tokensHash: 2n }]);
    expect(() => state.applyEvent(other)).to.throw(/being applied in steps/);
    expect(() => state.applyEventInSteps(other, () => false)).to.throw(/being applied in steps/);
    expect(() => state.removeRank(1n, 0)).to.throw(/being applied in steps/);
    expect(() => state.removeWorker(1n)).to.throw(/being applied in steps/);
    // Drains and snapshots are allowed.
    expect(() => state.barrierSnapshot()).not.to.throw();
    steps.return(undefined as never);
    expect(state.applying).to.equal(false);
    expect(state.applyEvent(other).firstError).to.equal(undefined);
  });

  it("EventTooLarge: an event over maxBlocksPerEvent is refused whole, not counted, before its blocks are read", () => {
    const state = new DcCkfState({ expectedBlocksPerDc: 1024, publishEveryNEvents: 1 }, { maxBlocksPerEvent: 3 });
    const four = Array.from({ length: 4 }, (_, i) => ({ blockHash: BigInt(i + 1), tokensHash: BigInt(i + 10) }));
    // A malformed block past the limit is not reached: the size is checked first.
    const stored = state.applyEvent(storedEvent(1n, 0, [...four.slice(0, 3), null as never]));
    expect(stored.firstError).to.be.instanceOf(CkfError);
    expect(stored.firstError).to.include({ code: "EventTooLarge" });
    expect(stored.firstError!.message).to.equal("a stored event of 4 blocks is over the limit of 3 per event");
    const removed = state.applyEvent({ workerId: 1n, dpRank: 0, eventId: 2n, data: { kind: "removed", blockHashes: [1n, 2n, 3n, 4n] } });
    expect(removed.firstError!.message).to.equal("a removed event of 4 block hashes is over the limit of 3 per event");
    expect(state.stats()).to.include({ pendingEvents: 0, uniqueBlocks: 0, occupiedSlots: 0 });
    // At the limit it applies; for another tier the gate ignores it first, whatever its size.
    expect(state.applyEvent(storedEvent(1n, 0, four.slice(0, 3))).firstError).to.equal(undefined);
    expect(state.applyEvent(storedEvent(1n, 0, four, { storageTier: "host_pinned" }))).to.deep.equal({ firstError: undefined, publication: undefined });
    expect(state.stats().uniqueBlocks).to.equal(3);
  });
});
