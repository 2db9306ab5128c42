import { expect } from "chai";
import fc from "fast-check";
import { xxh3_64 } from "../../src/bytes/index.js";
import {
  CkfAddressing,
  CkfError,
  DEFAULT_CKF_CONFIG,
  hi32,
  laneSeed,
  lo32,
  locateKey,
  SplitMix64,
  splitMix64Reference,
  Xxh3Of8,
} from "../../src/kv/ckf/index.js";

const U64_MAX = (1n << 64n) - 1n;
const GAMMA = 0x9e37_79b9_7f4a_7c15n;
const u64 = fc.bigInt({ min: 0n, max: U64_MAX });
/** Seeds with the top bits set, the low half's byte swap mattering, and the edges. */
const EDGE_SEEDS = [0n, 1n, U64_MAX, 1n << 63n, 0xffff_ffff_0000_0000n, 0x0000_0000_ffff_ffffn, 0x8000_0000_8000_0000n, DEFAULT_CKF_CONFIG.seed];

function le64(value: bigint): Uint8Array {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, value, true);
  return out;
}

describe("CKF addressing", () => {
  describe("XXH3-64 of eight bytes in 32-bit arithmetic", () => {
    it("matches the library on random keys and random seeds", () => {
      fc.assert(
        fc.property(u64, u64, (key, seed) => {
          expect(new Xxh3Of8(seed).hashU64(key)).to.equal(xxh3_64(le64(key), seed));
        }),
        { numRuns: 3000 },
      );
    });

    it("matches the library on edge seeds and edge keys", () => {
      const keys = [0n, 1n, U64_MAX, 1n << 63n, 0xffff_ffffn, 0xffff_ffff_0000_0000n, 0x0123_4567_89ab_cdefn];
      for (const seed of EDGE_SEEDS) {
        const hasher = new Xxh3Of8(seed);
        for (const key of keys) expect(hasher.hashU64(key), `seed ${seed} key ${key}`).to.equal(xxh3_64(le64(key), seed));
        fc.assert(fc.property(u64, (key) => hasher.hashU64(key) === xxh3_64(le64(key), seed)), { numRuns: 300 });
      }
    });

    it("takes (hi, lo) halves and writes (hi, lo) halves", () => {
      const hasher = new Xxh3Of8(0x5eedn);
      const key = 0xdead_beef_0bad_f00dn;
      hasher.hash(0xdead_beef, 0x0bad_f00d);
      const expected = xxh3_64(le64(key), 0x5eedn);
      expect(hasher.hi).to.equal(Number(expected >> 32n));
      expect(hasher.lo).to.equal(Number(expected & 0xffff_ffffn));
    });
  });

  describe("SplitMix64 in 32-bit arithmetic", () => {
    it("follows the BigInt reference step by step from random states", () => {
      fc.assert(
        fc.property(u64, (start) => {
          const rng = new SplitMix64(start);
          let state = start;
          for (let i = 0; i < 20; i++) {
            const step = splitMix64Reference(state);
            state = step.state;
            expect(rng.next()).to.equal(step.value);
            expect(rng.state()).to.equal(state);
          }
        }),
        { numRuns: 300 },
      );
    });

    it("carries out of the low half and wraps at 2^64", () => {
      for (const start of [0xffff_ffffn, U64_MAX, U64_MAX - GAMMA, U64_MAX - GAMMA + 1n, 0x8000_0000n]) {
        const rng = new SplitMix64(start);
        expect(rng.next32()).to.equal(Number(splitMix64Reference(start).value & 0xffff_ffffn));
        expect(rng.state()).to.equal(splitMix64Reference(start).state);
      }
    });

    it("gives the well-known first outputs from state 0", () => {
      const rng = new SplitMix64(0n);
      expect(rng.next()).to.equal(0xe220_a839_7b1d_cdafn);
      expect(rng.next()).to.equal(0x6e78_9e6a_a1b9_65f4n);
    });

    it("seeds lane L with next_random(seed ^ ((L + 1) * gamma))", () => {
      for (const seed of EDGE_SEEDS) {
        for (const lane of [0, 1, 15]) {
          const mixed = (seed ^ ((BigInt(lane + 1) * GAMMA) & U64_MAX)) & U64_MAX;
          expect(laneSeed(seed, lane)).to.equal(splitMix64Reference(mixed).value);
        }
      }
      expect(laneSeed(0n, 0)).to.equal(splitMix64Reference(GAMMA).value);
    });
  });

  describe("key -> fingerprint and buckets", () => {
    for (const [seed, buckets] of [
      [DEFAULT_CKF_CONFIG.seed, 2],
      [DEFAULT_CKF_CONFIG.seed, 1024],
      [U64_MAX, 1 << 24],
      [1n << 63n, 524_288],
      [0x5eedn, 16],
    ] as const) {
      it(`agrees with the BigInt reference and keeps the invariants (seed ${seed.toString(16)}, ${buckets} buckets)`, () => {
        const addressing = new CkfAddressing(seed, buckets);
        fc.assert(
          fc.property(u64, (key) => {
            addressing.probe(hi32(key), lo32(key));
            const { fingerprint, bucketA, bucketB } = addressing;
            const reference = locateKey(key, { seed, bucketCount: buckets });
            expect({ fingerprint, bucketA, bucketB }).to.deep.equal({
              fingerprint: reference.fingerprint,
              bucketA: reference.bucketA,
              bucketB: reference.bucketB,
            });
            expect(fingerprint).to.be.within(1, 0xffff);
            expect(bucketA).to.be.within(0, buckets - 1);
            expect(bucketB).to.be.within(0, buckets - 1);
            expect(bucketB).not.to.equal(bucketA);
            expect(addressing.alternate(bucketA, fingerprint)).to.equal(bucketB);
            expect(addressing.alternate(bucketB, fingerprint)).to.equal(bucketA);
          }),
          { numRuns: 1500 },
        );
      });
    }

    it("follows B.2 literally: fp = mixed & 0xFFFF or 1, bucketA = (mixed >> 16) & mask, delta from le_u16(fp)", () => {
      const seed = 0x0123_4567_89ab_cdefn;
      const mask = 1023n;
      fc.assert(
        fc.property(u64, (key) => {
          const mixed = xxh3_64(le64(key), seed);
          const fp = Number(mixed & 0xffffn) || 1;
          const delta = (xxh3_64(Uint8Array.of(fp & 0xff, fp >> 8), seed ^ GAMMA) & mask) || 1n;
          const located = locateKey(key, { seed, bucketCount: 1024 });
          expect(located.mixed).to.equal(mixed);
          expect(located.fingerprint).to.equal(fp);
          expect(located.bucketA).to.equal(Number((mixed >> 16n) & mask));
          expect(located.bucketB).to.equal(Number(((mixed >> 16n) & mask) ^ delta));
        }),
        { numRuns: 500 },
      );
    });

    it("never uses delta 0, so the two buckets differ even with two buckets", () => {
      const addressing = new CkfAddressing(DEFAULT_CKF_CONFIG.seed, 2);
      expect(addressing.deltas.every((delta) => delta === 1)).to.equal(true);
      const wide = new CkfAddressing(DEFAULT_CKF_CONFIG.seed, 1 << 20);
      expect(wide.deltas.every((delta) => delta >= 1 && delta < 1 << 20)).to.equal(true);
    });

    it("locateKey refuses what CkfAddressing refuses, with the same codes, and keys outside u64 (InvalidKey)", () => {
      const code = (f: () => unknown) => {
        try {
          f();
        } catch (error) {
          expect(error).to.be.instanceOf(CkfError);
          return (error as CkfError).code;
        }
        return undefined;
      };
      const seed = DEFAULT_CKF_CONFIG.seed;
      for (const key of [-1n, 1n << 64n, U64_MAX + 5n, 7 as unknown as bigint, undefined as unknown as bigint]) {
        expect(code(() => locateKey(key, { seed, bucketCount: 1024 })), `key ${String(key)}`).to.equal("InvalidKey");
      }
      const layouts: [bigint, number][] = [
        [seed, 0],
        [seed, 1],
        [seed, 3],
        [seed, 1000],
        [seed, 1.5],
        [seed, Number.NaN],
        [seed, -2],
        [seed, 1 << 25],
        [seed, 2 ** 40],
        [-1n, 1024],
        [1n << 64n, 1024],
        [5 as unknown as bigint, 1024],
      ];
      for (const [layoutSeed, buckets] of layouts) {
        const expected = code(() => new CkfAddressing(layoutSeed, buckets));
        expect(expected, `seed ${String(layoutSeed)} buckets ${buckets}`).to.be.oneOf(["InvalidIdentity", "BucketCountTooLarge", "InvalidSeed"]);
        expect(code(() => locateKey(1n, { seed: layoutSeed, bucketCount: buckets })), `seed ${String(layoutSeed)} buckets ${buckets}`).to.equal(expected);
      }
      // The edges of the valid ranges still answer.
      expect(code(() => locateKey(U64_MAX, { seed: U64_MAX, bucketCount: 2 }))).to.equal(undefined);
      expect(code(() => locateKey(0n, { seed: 0n, bucketCount: 1 << 24 }))).to.equal(undefined);
    });

    it("rejects bucket counts that are not powers of two, or above 2^24", () => {
      expect(() => new CkfAddressing(1n, 3)).to.throw().with.property("code", "InvalidIdentity");
      expect(() => new CkfAddressing(1n, 1)).to.throw().with.property("code", "InvalidIdentity");
      expect(() => new CkfAddressing(1n, 1 << 25)).to.throw().with.property("code", "BucketCountTooLarge");
      expect(() => new CkfAddressing(-1n, 2)).to.throw().with.property("code", "InvalidSeed");
    });
  });
});
