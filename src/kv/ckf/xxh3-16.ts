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
import { U64_MAX } from "./u64.js";

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
  return (a1 * b1 + (p01 >>> 16) + (p10 >>> 16) + Math.floor(mid / 0x1_0000)) >>> 0;
}

/**
 * XXH3_64 of 16 bytes for one fixed seed. `hash` writes the digest to `hi`
 * and `lo` (u32 numbers), so a call allocates nothing.
 */
export class Xxh3Of16 {
  readonly seed: bigint;
  /** Output of the last `hash`: high and low 32 bits. */
  hi = 0;
  lo = 0;
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

  /** Hashes le64(a) ‖ le64(b), each given as (hi, lo) u32 halves; the digest lands in `this.hi` / `this.lo`. */
  hash(aHi: number, aLo: number, bHi: number, bLo: number): void {
    const xHi = (aHi ^ this.flip1Hi) >>> 0;
    const xLo = (aLo ^ this.flip1Lo) >>> 0;
    const yHi = (bHi ^ this.flip2Hi) >>> 0;
    const yLo = (bLo ^ this.flip2Lo) >>> 0;

    // The 128-bit product x * y in 16-bit limbs, column by column (each column sum stays below 2^53).
    const x0 = xLo & 0xffff;
    const x1 = xLo >>> 16;
    const x2 = xHi & 0xffff;
    const x3 = xHi >>> 16;
    const y0 = yLo & 0xffff;
    const y1 = yLo >>> 16;
    const y2 = yHi & 0xffff;
    const y3 = yHi >>> 16;
    let c = x0 * y0;
    const r0 = c % 0x1_0000;
    c = Math.floor(c / 0x1_0000) + x0 * y1 + x1 * y0;
    const r1 = c % 0x1_0000;
    c = Math.floor(c / 0x1_0000) + x0 * y2 + x1 * y1 + x2 * y0;
    const r2 = c % 0x1_0000;
    c = Math.floor(c / 0x1_0000) + x0 * y3 + x1 * y2 + x2 * y1 + x3 * y0;
    const r3 = c % 0x1_0000;
    c = Math.floor(c / 0x1_0000) + x1 * y3 + x2 * y2 + x3 * y1;
    const r4 = c % 0x1_0000;
    c = Math.floor(c / 0x1_0000) + x2 * y3 + x3 * y2;
    const r5 = c % 0x1_0000;
    c = Math.floor(c / 0x1_0000) + x3 * y3;
    const r6 = c % 0x1_0000;
    const r7 = Math.floor(c / 0x1_0000);
    const foldHi = ((r3 * 0x1_0000 + r2) ^ (r7 * 0x1_0000 + r6)) >>> 0;
    const foldLo = ((r1 * 0x1_0000 + r0) ^ (r5 * 0x1_0000 + r4)) >>> 0;

    // acc = 16 + bswap64(x) + y + fold (mod 2^64); bswap64 swaps the halves and each half's bytes.
    let lo = 16 + bswap32(xHi) + yLo + foldLo;
    let hi = bswap32(xLo) + yHi + foldHi + Math.floor(lo / TWO_32);
    lo >>>= 0;
    hi >>>= 0;

    // Avalanche: h ^= h >> 37; h *= MX1; h ^= h >> 32.
    lo = (lo ^ (hi >>> 5)) >>> 0;
    const pHi = (mulHi32(lo, MX1_LO) + Math.imul(lo, MX1_HI) + Math.imul(hi, MX1_LO)) >>> 0;
    const pLo = Math.imul(lo, MX1_LO) >>> 0;
    this.hi = pHi;
    this.lo = (pLo ^ pHi) >>> 0;
  }
}
