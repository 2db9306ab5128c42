/**
 * XXH3-64 of exactly sixteen bytes, in 32-bit integer arithmetic: the chain
 * recurrence XXH3-64(le64(parent) ‖ le64(block), 1337) on (hi, lo) halves.
 *
 * The state chains every block of a Stored event after its first; through
 * BigInt and the native binding that costs several times what the rest of
 * the block's work does, and allocates on every call. A 16-byte input takes
 * XXH3's "9 to 16 bytes" path, written out here. The test suite checks it bit
 * for bit against the library over random inputs.
 *
 * The path, for len = 16, input bytes read as the little-endian u64s a, b:
 *   lo = a ^ ((secret64[24] ^ secret64[32]) + seed)
 *   hi = b ^ ((secret64[40] ^ secret64[48]) - seed)
 *   acc = 16 + bswap64(lo) + hi + fold64(lo * hi)          (fold64: low ^ high half of the 128-bit product)
 *   acc ^= acc >> 37; acc *= 0x165667919E3779F9; acc ^= acc >> 32
 */
import { U32_FIELD_INIT, U64_MAX } from "./u64.js";

/** Bytes 24..55 of XXH3's default secret, as little-endian u64s: the only secret bytes the 9..16 path reads. */
const SECRET_24 = 0x1f67_b3b7_a4a4_4072n;
const SECRET_32 = 0x78e5_c0cc_4ee6_79cbn;
const SECRET_40 = 0x2172_ffcc_7dd0_5a82n;
const SECRET_48 = 0x8e24_43f7_7446_08b8n;

/** PRIME_MX1 of XXH3_avalanche, in 32-bit halves. */
const MX1_HI = 0x1656_6791;
const MX1_LO = 0x9e37_79f9;

const TWO_32 = 0x1_0000_0000;

function bswap32(x: number): number {
  return (((x & 0xff) << 24) | ((x & 0xff00) << 8) | ((x >>> 8) & 0xff00) | (x >>> 24)) >>> 0;
}

/** The high 32 bits of the 64-bit product of two u32s (16-bit limbs keep every partial product exact). */
function mulHi32(a: number, b: number): number {
  const a0 = a & 0xffff;
  const a1 = a >>> 16;
  const b0 = b & 0xffff;
  const b1 = b >>> 16;
  const p00 = a0 * b0;
  const p01 = a0 * b1;
  const p10 = a1 * b0;
  const mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff);
  return (a1 * b1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)) >>> 0;
}

/**
 * XXH3_64 of 16 bytes for one fixed seed. `hash` writes the digest to `hi`
 * and `lo` (u32 numbers), so a call allocates nothing.
 */
export class Xxh3Of16 {
  readonly seed: bigint;
  /** Output of the last `hash`: high and low 32 bits. */
  hi = U32_FIELD_INIT;
  lo = U32_FIELD_INIT;
  private readonly flip1Hi: number;
  private readonly flip1Lo: number;
  private readonly flip2Hi: number;
  private readonly flip2Lo: number;

  constructor(seed: bigint) {
    this.seed = seed;
    const flip1 = ((SECRET_24 ^ SECRET_32) + seed) & U64_MAX;
    const flip2 = ((SECRET_40 ^ SECRET_48) - seed) & U64_MAX;
    this.flip1Hi = Number(flip1 >> 32n);
    this.flip1Lo = Number(flip1 & 0xffff_ffffn);
    this.flip2Hi = Number(flip2 >> 32n);
    this.flip2Lo = Number(flip2 & 0xffff_ffffn);
  }

  /**
   * Hashes le64(a) ‖ le64(b), each given as (hi, lo) halves (u32s, or int32s
   * of the same bits: only the bits are read); the digest lands in
   * `this.hi` / `this.lo` as u32s.
   */
  hash(aHi: number, aLo: number, bHi: number, bLo: number): void {
    const xHi = (aHi ^ this.flip1Hi) >>> 0;
    const xLo = (aLo ^ this.flip1Lo) >>> 0;
    const yHi = (bHi ^ this.flip2Hi) >>> 0;
    const yLo = (bLo ^ this.flip2Lo) >>> 0;

    // The 128-bit product x * y from its four 32 x 32-bit partial products, each as (high, low) halves;
    // the column sums stay below 2^35, exact in a double, and their carries are exact divisions.
    const l0 = Math.imul(xLo, yLo) >>> 0;
    const h0 = mulHi32(xLo, yLo);
    const l1 = Math.imul(xLo, yHi) >>> 0;
    const h1 = mulHi32(xLo, yHi);
    const l2 = Math.imul(xHi, yLo) >>> 0;
    const h2 = mulHi32(xHi, yLo);
    const l3 = Math.imul(xHi, yHi) >>> 0;
    const h3 = mulHi32(xHi, yHi);
    const s1 = h0 + l1 + l2;
    const r1 = s1 >>> 0;
    const s2 = h1 + h2 + l3 + (s1 - r1) / TWO_32;
    const r2 = s2 >>> 0;
    const r3 = (h3 + (s2 - r2) / TWO_32) >>> 0;
    // fold64: the low half of the product (r1:l0) xor its high half (r3:r2).
    const foldHi = (r1 ^ r3) >>> 0;
    const foldLo = (l0 ^ r2) >>> 0;

    // acc = 16 + bswap64(x) + y + fold (mod 2^64); bswap64 swaps the halves and each half's bytes.
    const sum = 16 + bswap32(xHi) + yLo + foldLo;
    let lo = sum >>> 0;
    const hi = (bswap32(xLo) + yHi + foldHi + (sum - lo) / TWO_32) >>> 0;

    // Avalanche: h ^= h >> 37; h *= MX1; h ^= h >> 32.
    lo = (lo ^ (hi >>> 5)) >>> 0;
    const pHi = (mulHi32(lo, MX1_LO) + Math.imul(lo, MX1_HI) + Math.imul(hi, MX1_LO)) >>> 0;
    const pLo = Math.imul(lo, MX1_LO) >>> 0;
    this.hi = pHi;
    this.lo = (pLo ^ pHi) >>> 0;
  }
}
