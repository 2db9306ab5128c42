import { expect } from "chai";
import fc from "fast-check";
import { hi32, joinU64, lo32 } from "../../src/kv/ckf/index.js";

const U64_MAX = (1n << 64n) - 1n;

describe("CKF u64 halves", () => {
  it("splits edge values into (hi, lo) u32 halves", () => {
    const cases: [bigint, number, number][] = [
      [0n, 0, 0],
      [1n, 0, 1],
      [0xffff_ffffn, 0, 0xffff_ffff],
      [1n << 32n, 1, 0],
      [1n << 63n, 0x8000_0000, 0],
      [U64_MAX, 0xffff_ffff, 0xffff_ffff],
      [0x0123_4567_89ab_cdefn, 0x0123_4567, 0x89ab_cdef],
      [0x8000_0000_7fff_ffffn, 0x8000_0000, 0x7fff_ffff],
    ];
    for (const [value, hi, lo] of cases) {
      expect(hi32(value), `hi32(${value})`).to.equal(hi);
      expect(lo32(value), `lo32(${value})`).to.equal(lo);
      expect(joinU64(hi32(value), lo32(value))).to.equal(value);
    }
  });

  it("agrees with BigInt shifts on random u64s (interleaved calls share one scratch)", () => {
    fc.assert(
      fc.property(fc.bigInt({ min: 0n, max: U64_MAX }), fc.bigInt({ min: 0n, max: U64_MAX }), (a, b) => {
        const [ha, hb, la, lb] = [hi32(a), hi32(b), lo32(a), lo32(b)];
        expect([ha, la]).to.deep.equal([Number(a >> 32n), Number(a & 0xffff_ffffn)]);
        expect([hb, lb]).to.deep.equal([Number(b >> 32n), Number(b & 0xffff_ffffn)]);
      }),
      { numRuns: 2000 },
    );
  });

  it("always returns u32 numbers: a bigint outside u64 is taken mod 2^64", () => {
    for (const value of [-1n, 1n << 64n, (1n << 64n) + 3n, -(1n << 63n), (5n << 64n) + (7n << 32n) + 9n]) {
      const wrapped = BigInt.asUintN(64, value);
      expect(hi32(value), `hi32(${value})`).to.equal(Number(wrapped >> 32n));
      expect(lo32(value), `lo32(${value})`).to.equal(Number(wrapped & 0xffff_ffffn));
    }
  });
});
