import { expect } from "chai";
import { DcCkfState, type RouterEvent } from "../../src/kv/ckf/index.js";
import { Xxh3Of16 } from "../../src/kv/ckf/xxh3-16.js";
import { computeNextSeqHash } from "../../src/kv/hash/index.js";
import { xxh3_64 } from "../../src/bytes/index.js";
import { prng } from "../support/index.js";
import { sameWords } from "./ckf-helpers.js";
import { ckfWorkload } from "./ckf-workload.js";

/** A u64 from two draws. */
function u64(random: () => number): bigint {
  return (BigInt(Math.floor(random() * 2 ** 32)) << 32n) | BigInt(Math.floor(random() * 2 ** 32));
}

describe("DcCkfState: the barrier copied in steps", () => {
  it("ends exactly the lane of the instant it began, while events keep changing the lane between steps", () => {
    const events = ckfWorkload({ seed: 0xba44, events: 1200, maxBlocks: 20 });
    const state = new DcCkfState({ expectedBlocksPerDc: 2048, publishEveryNEvents: 5 }, { maxOwners: 3 });
    for (const event of events.slice(0, 400)) state.applyEvent(event);
    const before = state.words().slice();
    const [tail, copy] = state.beginBarrierCopy();
    // The tail is what barrierSnapshot would drain: the copy already holds it.
    expect(tail === undefined || tail.images.length > 0).to.equal(true);
    let next = 400;
    while (!copy.step(64)) {
      for (const event of events.slice(next, next + 20)) state.applyEvent(event);
      next += 20;
    }
    expect(copy.done).to.equal(true);
    expect(next).to.be.greaterThan(500);
    expect(sameWords(copy.words, before)).to.equal(true);
    // The lane moved on, and the state no longer feeds the copy.
    expect(sameWords(state.words(), before)).to.equal(false);
    const done = copy.words.slice();
    for (const event of events.slice(next)) state.applyEvent(event);
    expect(sameWords(copy.words, done)).to.equal(true);
  });

  it("one at a time; a cancelled copy stops following the lane, and a new one can begin", () => {
    const state = new DcCkfState({ expectedBlocksPerDc: 256 });
    const [, first] = state.beginBarrierCopy();
    expect(() => state.beginBarrierCopy()).to.throw(/already under way/);
    state.cancelBarrierCopy();
    const [, second] = state.beginBarrierCopy();
    expect(second).to.not.equal(first);
    while (!second.step(32)) {
      /* steps */
    }
    expect(sameWords(second.words, state.words())).to.equal(true);
  });

  it("the dirty window still sees every write while a copy follows the lane: drains are what they are without one", () => {
    const events: RouterEvent[] = ckfWorkload({ seed: 7, events: 600, maxBlocks: 12 });
    const plain = new DcCkfState({ expectedBlocksPerDc: 1024, publishEveryNEvents: 4 });
    const copied = new DcCkfState({ expectedBlocksPerDc: 1024, publishEveryNEvents: 4 });
    copied.beginBarrierCopy();
    plain.flush();
    for (const event of events) {
      const a = plain.applyEvent(event);
      const b = copied.applyEvent(event);
      expect(b.publication?.images).to.deep.equal(a.publication?.images);
      expect(b.firstError?.code).to.equal(a.firstError?.code);
    }
  });
});

describe("Xxh3Of16: the chain hash on halves", () => {
  it("matches XXH3-64 of the 16 bytes (the library) and computeNextSeqHash, bit for bit", () => {
    const random = prng(0x16);
    const specials = [0n, 1n, (1n << 64n) - 1n, 1n << 63n, 0xffff_ffffn, 1n << 32n];
    const bytes = new Uint8Array(16);
    const view = new DataView(bytes.buffer);
    for (const seed of [1337n, 0n, 1n, (1n << 64n) - 1n, 0x5deece66d1b54a33n]) {
      const hasher = new Xxh3Of16(seed);
      for (let i = 0; i < 3000; i++) {
        const a = i < 36 ? specials[i % 6]! : u64(random);
        const b = i < 36 ? specials[Math.floor(i / 6)]! : u64(random);
        hasher.hash(Number(a >> 32n), Number(a & 0xffff_ffffn), Number(b >> 32n), Number(b & 0xffff_ffffn));
        const got = (BigInt(hasher.hi) << 32n) | BigInt(hasher.lo);
        view.setBigUint64(0, a, true);
        view.setBigUint64(8, b, true);
        expect(got, `seed ${seed}: ${a}, ${b}`).to.equal(xxh3_64(bytes, seed));
        if (seed === 1337n) expect(got).to.equal(computeNextSeqHash(a, b));
      }
    }
  });
});
