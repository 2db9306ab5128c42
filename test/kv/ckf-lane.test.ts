import { expect } from "chai";
import fc from "fast-check";
import { CkfError, CkfLane, hi32, lo32, locateKey, type CkfWriteObserver } from "../../src/kv/ckf/index.js";

const SEED = 0x5dee_ce66_d1b5_4a33n;

/** Deterministic u64 keys (a murmur-style finalizer over a counter, independent of the code under test). */
function* keyStream(salt: bigint): Generator<bigint> {
  const mask = (1n << 64n) - 1n;
  let x = (salt * 0x1234_5678_9abc_def1n) & mask;
  for (;;) {
    x = (x + 0x9e37_79b9_7f4a_7c15n) & mask;
    let z = x;
    z = ((z ^ (z >> 33n)) * 0xff51_afd7_ed55_8ccdn) & mask;
    z = ((z ^ (z >> 33n)) * 0xc4ce_b9fe_1a85_ec53n) & mask;
    yield z ^ (z >> 33n);
  }
}

function keys(count: number, salt = 1n): bigint[] {
  const out: bigint[] = [];
  for (const key of keyStream(salt)) {
    if (out.length === count) break;
    out.push(key);
  }
  return out;
}

const insert = (lane: CkfLane, key: bigint, relocate = true) => lane.insert(hi32(key), lo32(key), relocate);
const contains = (lane: CkfLane, key: bigint) => lane.contains(hi32(key), lo32(key));
const remove = (lane: CkfLane, key: bigint) => lane.remove(hi32(key), lo32(key));

describe("CKF lane", () => {
  describe("bucket words", () => {
    it("packs slot i of bucket b into bits 16i..16i+15 of little-endian word b (bytes 34 12 00 00 cd ab 01 00)", () => {
      const lane = new CkfLane({ seed: SEED, bucketCount: 2, maxKicks: 10 });
      const bytes = Uint8Array.of(0x34, 0x12, 0x00, 0x00, 0xcd, 0xab, 0x01, 0x00);
      lane.loadWords(BigUint64Array.of(new DataView(bytes.buffer).getBigUint64(0, true), 0n));
      expect(Array.from(lane.slots.subarray(0, 4))).to.deep.equal([0x1234, 0, 0xabcd, 1]);
      expect(lane.word(0)).to.equal(0x0001_abcd_0000_1234n);
      expect(lane.occupiedSlots()).to.equal(3);

      const fresh = new CkfLane({ seed: SEED, bucketCount: 2, maxKicks: 10 });
      fresh.slots.set([0x1234, 0, 0xabcd, 1], 4);
      expect(Array.from(new Uint8Array(fresh.slots.buffer, 8, 8))).to.deep.equal(Array.from(bytes));
      expect(fresh.words()[1]).to.equal(0x0001_abcd_0000_1234n);
      expect(fresh.word(1)).to.equal(0x0001_abcd_0000_1234n);
    });

    it("words() is a view of the slots, not a copy", () => {
      const lane = new CkfLane({ seed: SEED, bucketCount: 4, maxKicks: 10 });
      const words = lane.words();
      expect(words.buffer).to.equal(lane.slots.buffer);
      expect(words.length).to.equal(4);
      lane.slots[13] = 0xffff;
      expect(words[3]).to.equal(0xffff_0000n);
      expect(lane.byteLength).to.equal(32);
    });
  });

  describe("insert, contains, remove", () => {
    it("contains a key after insert and not after remove", () => {
      const lane = new CkfLane({ seed: SEED, bucketCount: 1024, maxKicks: 500 });
      const [a, b] = keys(2);
      expect(contains(lane, a!)).to.equal(false);
      expect(insert(lane, a!)).to.equal(true);
      expect(contains(lane, a!)).to.equal(true);
      expect(contains(lane, b!)).to.equal(false);
      remove(lane, a!);
      expect(contains(lane, a!)).to.equal(false);
      expect(lane.occupiedSlots()).to.equal(0);
      expect(Array.from(lane.slots).every((s) => s === 0)).to.equal(true);
    });

    it("writes the lowest empty slot of bucketA first, then of bucketB", () => {
      const lane = new CkfLane({ seed: SEED, bucketCount: 1024, maxKicks: 500 });
      const [key] = keys(1, 7n);
      const { fingerprint, bucketA, bucketB } = locateKey(key!, { seed: SEED, bucketCount: 1024 });
      lane.slots.set([9, 0, 9, 0], bucketA * 4);
      insert(lane, key!);
      expect(Array.from(lane.slots.subarray(bucketA * 4, bucketA * 4 + 4))).to.deep.equal([9, fingerprint, 9, 0]);
      lane.slots.set([9, 9, 9, 9], bucketA * 4);
      lane.slots.set([9, 9, 0, 0], bucketB * 4);
      insert(lane, key!);
      expect(Array.from(lane.slots.subarray(bucketB * 4, bucketB * 4 + 4))).to.deep.equal([9, 9, fingerprint, 0]);
    });

    it("keeps one copy per insert of the same key", () => {
      const lane = new CkfLane({ seed: SEED, bucketCount: 64, maxKicks: 100 });
      const [key] = keys(1, 3n);
      insert(lane, key!);
      insert(lane, key!);
      expect(lane.occupiedSlots()).to.equal(2);
      remove(lane, key!);
      expect(contains(lane, key!)).to.equal(true);
      remove(lane, key!);
      expect(contains(lane, key!)).to.equal(false);
    });

    it("throws IndexerInvariantViolation when removing a fingerprint that is in neither bucket", () => {
      const lane = new CkfLane({ seed: SEED, bucketCount: 64, maxKicks: 100 });
      const [key] = keys(1, 5n);
      expect(() => remove(lane, key!)).to.throw(CkfError).with.property("code", "IndexerInvariantViolation");
    });

    it("has no false negatives after eviction walks at 95% load", () => {
      const lane = new CkfLane({ seed: SEED, bucketCount: 1024, maxKicks: 500 });
      const inserted = keys(Math.floor(4096 * 0.95), 11n).filter((key) => insert(lane, key));
      expect(inserted.length).to.be.greaterThan(3800);
      expect(lane.occupiedSlots()).to.equal(inserted.length);
      for (const key of inserted) expect(contains(lane, key)).to.equal(true);
      // Removing every key empties the lane: each fingerprint sat in one of its own buckets.
      for (const key of inserted) remove(lane, key);
      expect(Array.from(lane.slots).every((s) => s === 0)).to.equal(true);
    });

    it("places deterministically for a seed: the same operations give the same bytes", () => {
      const make = () => new CkfLane({ seed: SEED, bucketCount: 256, maxKicks: 500 });
      const [x, y] = [make(), make()];
      for (const key of keys(1000, 13n)) {
        insert(x, key);
        insert(y, key);
      }
      expect(Buffer.from(x.slots.buffer).equals(Buffer.from(y.slots.buffer))).to.equal(true);
    });
  });

  describe("capacity exhaustion", () => {
    /** Fills a lane until an insert fails; returns what went in and the key that did not. */
    function fillUntilFull(lane: CkfLane, salt: bigint) {
      const inserted: bigint[] = [];
      let tries = 0;
      for (const key of keyStream(salt)) {
        if (++tries > 100_000) break;
        const before = lane.slots.slice();
        if (insert(lane, key)) {
          inserted.push(key);
          continue;
        }
        return { inserted, failed: key, before };
      }
      expect.fail("the lane never filled");
    }

    it("rolls back every eviction of a failed insert: the lane is byte-for-byte unchanged", () => {
      const lane = new CkfLane({ seed: SEED, bucketCount: 4, maxKicks: 500 });
      const { inserted, failed, before } = fillUntilFull(lane, 17n);
      expect(Buffer.from(lane.slots.buffer).equals(Buffer.from(before.buffer))).to.equal(true);
      expect(lane.occupiedSlots()).to.equal(inserted.length);
      expect(inserted.length).to.be.at.most(16);
      for (const key of inserted) expect(contains(lane, key)).to.equal(true);
      // Further inserts fail the same way, removals and re-inserts still work.
      expect(insert(lane, failed)).to.equal(false);
      remove(lane, inserted[0]!);
      remove(lane, inserted[1]!);
      expect(contains(lane, inserted[2]!)).to.equal(true);
      expect(insert(lane, failed)).to.equal(true);
      expect(contains(lane, failed)).to.equal(true);
      for (const key of inserted.slice(2)) expect(contains(lane, key)).to.equal(true);
    });

    // A few seeds (each builds a 64 Ki-entry delta table); the keys and kick budgets vary freely.
    it("holds for any kick budget and key stream (property)", () => {
      fc.assert(
        fc.property(fc.constantFrom(SEED, 0n, (1n << 64n) - 1n, 1n << 63n), fc.integer({ min: 0, max: 64 }), fc.bigInt({ min: 1n, max: 1000n }), (seed, maxKicks, salt) => {
          const lane = new CkfLane({ seed, bucketCount: 2, maxKicks });
          const { inserted, before } = fillUntilFull(lane, salt);
          expect(Buffer.from(lane.slots.buffer).equals(Buffer.from(before.buffer))).to.equal(true);
          for (const key of inserted) expect(contains(lane, key)).to.equal(true);
        }),
        { numRuns: 60 },
      );
    });

    it("reports each write to the observer before it happens, including rolled-back ones", () => {
      const lane = new CkfLane({ seed: SEED, bucketCount: 8, maxKicks: 8 });
      // Each report: the bucket, the word the observer read, and the whole lane at that moment.
      const seen: { bucket: number; word: bigint; lane: Uint16Array }[] = [];
      const observer: CkfWriteObserver = { beforeWrite: (bucket) => seen.push({ bucket, word: lane.word(bucket), lane: lane.slots.slice() }) };
      lane.observer = observer;
      const wordOf = (slots: Uint16Array, bucket: number) => {
        const s = Array.from(slots.subarray(bucket * 4, bucket * 4 + 4), BigInt);
        return s[0]! | (s[1]! << 16n) | (s[2]! << 32n) | (s[3]! << 48n);
      };
      /**
       * Replays the reports of one operation that started from `start` and ended at `end`:
       * nothing is written before the first report, and between two reports (and after the
       * last) exactly the reported bucket changed, in at most one slot. So the word each
       * report carries is its bucket's word before that write.
       */
      const checkReports = (start: Uint16Array, end: Uint16Array | undefined) => {
        let previous = start;
        for (let k = 0; k <= seen.length; k++) {
          const now = k < seen.length ? seen[k]!.lane : end;
          if (now === undefined) break;
          if (k > 0) {
            const written = seen[k - 1]!.bucket;
            const changed = Array.from(now.keys()).filter((i) => now[i] !== previous[i]);
            expect(changed.length, `report ${k - 1}: slots written between reports`).to.be.at.most(1);
            for (const i of changed) expect(i >> 2, `report ${k - 1}: the written slot's bucket`).to.equal(written);
          } else {
            expect(Array.from(now), "nothing written before the first report").to.deep.equal(Array.from(previous));
          }
          // `now` is the lane after exactly the writes reported before this one.
          if (k < seen.length) expect(seen[k]!.word, `report ${k}: the word before the write`).to.equal(wordOf(now, seen[k]!.bucket));
          previous = now;
        }
      };
      // Inserts until one fails, each checked on its own; successful eviction walks happen on the way.
      const keyList = keys(64, 19n);
      let failedAt = -1;
      let walks = 0;
      for (let i = 0; i < keyList.length; i++) {
        seen.length = 0;
        const start = lane.slots.slice();
        const ok = insert(lane, keyList[i]!);
        checkReports(start, ok ? lane.slots.slice() : undefined);
        if (ok) {
          expect(seen.length, `insert ${i}`).to.equal(lane.lastWrites);
          if (lane.lastWrites > 1) walks++;
          continue;
        }
        failedAt = i;
        // A failed walk reports every kick before writing it, then rolls back unreported.
        expect(seen.length).to.equal(8);
        expect(seen[0]!.word).to.equal(wordOf(start, seen[0]!.bucket));
        expect(Buffer.from(lane.slots.buffer).equals(Buffer.from(start.buffer))).to.equal(true);
        break;
      }
      expect(failedAt, "the lane filled up").to.be.greaterThan(16);
      expect(walks, "successful eviction walks").to.be.greaterThan(0);
      // Removals report too.
      seen.length = 0;
      const start = lane.slots.slice();
      remove(lane, keyList[0]!);
      checkReports(start, lane.slots.slice());
      expect(seen.length).to.equal(1);
      expect(seen[0]!.word).not.to.equal(lane.word(seen[0]!.bucket));
    });

    it("with maxKicks 0 (or relocate off) tries only the two home buckets and writes nothing when both are full", () => {
      const lane = new CkfLane({ seed: SEED, bucketCount: 2, maxKicks: 0 });
      let writes = 0;
      lane.observer = { beforeWrite: () => writes++ };
      const results = keys(9, 29n).map((key) => insert(lane, key));
      expect(results.slice(0, 8).every(Boolean)).to.equal(true);
      expect(results[8]).to.equal(false);
      expect(writes).to.equal(8);

      const relocating = new CkfLane({ seed: SEED, bucketCount: 2, maxKicks: 100 });
      for (const key of keys(8, 29n)) insert(relocating, key);
      const before = relocating.slots.slice();
      expect(insert(relocating, keys(1, 31n)[0]!, false)).to.equal(false);
      expect(Array.from(relocating.slots)).to.deep.equal(Array.from(before));
    });
  });

  it("rejects a lane that is not an integer in 0..15 with a typed error (InvalidIdentity)", () => {
    for (const lane of [-1, 16, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 53, "1" as unknown as number, 1n as unknown as number]) {
      expect(() => new CkfLane({ seed: SEED, bucketCount: 2, maxKicks: 1, lane }), String(lane)).to.throw(CkfError).with.property("code", "InvalidIdentity");
    }
    for (const lane of [undefined, 0, 15]) expect(new CkfLane({ seed: SEED, bucketCount: 2, maxKicks: 1, lane }).bucketCount).to.equal(2);
  });

  it("rejects maxKicks outside 0..4096", () => {
    expect(() => new CkfLane({ seed: SEED, bucketCount: 2, maxKicks: 4097 })).to.throw(CkfError).with.property("code", "InvalidMaxKicks");
    expect(() => new CkfLane({ seed: SEED, bucketCount: 2, maxKicks: -1 })).to.throw(CkfError).with.property("code", "InvalidMaxKicks");
  });
});
