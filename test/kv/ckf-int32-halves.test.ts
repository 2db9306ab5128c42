import { expect } from "chai";
import fc from "fast-check";
import { CkfLane } from "../../src/kv/ckf/lane.js";
import { asInt32 } from "../../src/kv/ckf/u64.js";
import { LineageMap, mixU64, OwnerTable } from "../../src/kv/ckf/u64-tables.js";
import { Xxh3Of16 } from "../../src/kv/ckf/xxh3-16.js";
import { Xxh3Of8 } from "../../src/kv/ckf/xxh3-8.js";

const u32 = fc.integer({ min: 0, max: 0xffff_ffff });

/**
 * Keys that all have mixU64 `hash`: mixU64 is a bijection of
 * lo ^ imul(hi, 0x9e3779b1), so lo = base ^ imul(hi, 0x9e3779b1) gives every
 * hi the same one. Their index words carry the same hash bits: only the
 * entries tell them apart.
 */
function sameHashKeys(count: number, base: number): [number, number][] {
  const keys: [number, number][] = [];
  for (let n = 0; n < count; n++) {
    // Spread over all four bytes, top bit set: halves that are not small integers.
    const hi = (n * 0x0101_0101 + 0x8000_0000) >>> 0;
    keys.push([hi, (base ^ Math.imul(hi, 0x9e37_79b1)) >>> 0]);
  }
  return keys;
}

describe("int32 halves and the lineage index's hash bits", () => {
  it("the hashes read only the bits of their halves: int32 and u32 inputs give the same u32 digest", () => {
    const chain = new Xxh3Of16(1337n);
    const mixer = new Xxh3Of8(0x5eedn);
    const lane = new CkfLane({ seed: 0x5eedn, bucketCount: 1 << 10, maxKicks: 16 });
    fc.assert(
      fc.property(u32, u32, u32, u32, (aHi, aLo, bHi, bLo) => {
        chain.hash(aHi, aLo, bHi, bLo);
        const expected = [chain.hi, chain.lo];
        chain.hash(asInt32(aHi), asInt32(aLo), asInt32(bHi), asInt32(bLo));
        expect([chain.hi, chain.lo]).to.deep.equal(expected);
        expect(expected[0]! >>> 0).to.equal(expected[0]);
        mixer.hash(aHi, aLo);
        const mixed = [mixer.hi, mixer.lo];
        mixer.hash(asInt32(aHi), asInt32(aLo));
        expect([mixer.hi, mixer.lo]).to.deep.equal(mixed);
        lane.address(aHi, aLo);
        const address = [lane.keyFingerprint, lane.keyBucket];
        lane.address(asInt32(aHi), asInt32(aLo));
        expect([lane.keyFingerprint, lane.keyBucket]).to.deep.equal(address);
        expect(mixU64(asInt32(aHi), asInt32(aLo))).to.equal(mixU64(aHi, aLo));
      }),
      { numRuns: 2000 },
    );
  });

  it("OwnerTable.find and LineageMap.find take either form of a half and leave u32 values", () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(u32, u32), { minLength: 1, maxLength: 200 }), (keys) => {
        const owners = new OwnerTable();
        const lineage = new LineageMap();
        for (const [hi, lo] of keys) {
          if (!owners.find(hi, lo)) owners.insert(hi, lo);
          owners.owners = owners.owners + 1;
          lineage.set(hi, lo, lo, hi);
        }
        for (const [hi, lo] of keys) {
          expect(owners.find(asInt32(hi), asInt32(lo))).to.equal(true);
          expect(lineage.find(asInt32(hi), asInt32(lo))).to.equal(true);
          expect([lineage.valueHi, lineage.valueLo]).to.deep.equal([lo, hi]);
        }
        const [hi, lo] = keys[0]!;
        expect(owners.find(asInt32(hi ^ 0x8000_0000), asInt32(lo))).to.equal(keys.some(([h, l]) => h === (hi ^ 0x8000_0000) >>> 0 && l === lo));
      }),
      { numRuns: 300 },
    );
  });

  // Each case: how many keys share one mixU64, the hash base, and which of them to delete before checking.
  const cases: { name: string; count: number; base: number; deletes: number[] }[] = [
    { name: "two keys, one hash", count: 2, base: 0x1234_5678, deletes: [] },
    { name: "a run of 40 through three rebuilds", count: 40, base: 0xffff_ffff, deletes: [] },
    { name: "the first of a run deleted (the rest shift back)", count: 12, base: 0, deletes: [0] },
    { name: "every other one deleted", count: 24, base: 0x8000_0001, deletes: [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22] },
    { name: "the last one deleted", count: 9, base: 0x7fff_ffff, deletes: [8] },
  ];
  for (const { name, count, base, deletes } of cases) {
    it(`LineageMap: keys of one hash (${name}) are told apart by their entries`, () => {
      const keys = sameHashKeys(count, base);
      const hash = mixU64(keys[0]![0], keys[0]![1]);
      for (const [hi, lo] of keys) expect(mixU64(hi, lo)).to.equal(hash);
      const map = new LineageMap();
      keys.forEach(([hi, lo], i) => map.add(hi, lo, i, ~i >>> 0));
      for (const i of deletes) expect(map.delete(keys[i]![0], keys[i]![1])).to.equal(true);
      keys.forEach(([hi, lo], i) => {
        const present = !deletes.includes(i);
        expect(map.find(hi, lo), `key ${i}`).to.equal(present);
        if (present) expect([map.valueHi, map.valueLo]).to.deep.equal([i, ~i >>> 0]);
      });
      // Another key of the same hash, never added.
      const [absentHi, absentLo] = sameHashKeys(count + 1, base)[count]!;
      expect(map.find(absentHi, absentLo)).to.equal(false);
      expect(map.size).to.equal(count - deletes.length);
    });
  }

  it("LineageMap: keys of one home slot and other hash bits are found, and an absent one of that slot is not", () => {
    // 4096 keys over 64 home slots of the first index (mask 7 at the start, wider after rebuilds).
    const map = new LineageMap();
    const keys: [number, number][] = [];
    for (let i = 0; keys.length < 4096; i++) {
      const key: [number, number] = [i >>> 3, (i * 0x9e37_79b9) >>> 0];
      if ((mixU64(key[0], key[1]) & 63) === 5) keys.push(key);
    }
    keys.slice(0, 2048).forEach(([hi, lo], i) => map.add(hi, lo, hi, i));
    keys.slice(0, 2048).forEach(([hi, lo], i) => {
      expect(map.find(hi, lo)).to.equal(true);
      expect(map.valueLo).to.equal(i);
    });
    for (const [hi, lo] of keys.slice(2048)) expect(map.find(hi, lo)).to.equal(false);
  });
});
