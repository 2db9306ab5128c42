/**
 * SplitMix64 (B.3), the eviction walk's RNG, on (hi, lo) u32 halves: the walk
 * draws one or two values per kick and only needs their low bits, so BigInt
 * per draw would dominate a long walk.
 *
 *   state += 0x9E3779B97F4A7C15
 *   z = state; z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9; z = (z ^ z >> 27) * 0x94D049BB133111EB
 *   return z ^ z >> 31                                   (all mod 2^64)
 */
import { GOLDEN_GAMMA, U32_FIELD_INIT, U64_MAX } from "./u64.js";

const GAMMA_HI = 0x9e37_79b9;
const GAMMA_LO = 0x7f4a_7c15;
const M1_HI = 0xbf58_476d;
const M1_LO = 0x1ce4_e5b9;
const M2_HI = 0x94d0_49bb;
const M2_LO = 0x1331_11eb;

/** High 32 bits of the 64-bit product of two u32s (16-bit limbs keep it exact). */
function mulHi32(a: number, b: number): number {
  const a0 = a & 0xffff;
  const a1 = a >>> 16;
  const b0 = b & 0xffff;
  const b1 = b >>> 16;
  const p01 = a0 * b1;
  const p10 = a1 * b0;
  const mid = ((a0 * b0) >>> 16) + (p01 & 0xffff) + (p10 & 0xffff);
  return (a1 * b1 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)) >>> 0;
}

export class SplitMix64 {
  private stateHi: number;
  private stateLo: number;
  /** The last output's high and low 32 bits. */
  hi = U32_FIELD_INIT;
  lo = U32_FIELD_INIT;

  constructor(state: bigint) {
    const s = state & U64_MAX;
    this.stateHi = Number(s >> 32n);
    this.stateLo = Number(s & 0xffff_ffffn);
  }

  /** Advances once; the output lands in `hi` / `lo`, and its low 32 bits are returned. */
  next32(): number {
    // state += gamma, with the carry out of the low half.
    const sumLo = this.stateLo + GAMMA_LO;
    const carry = sumLo > 0xffff_ffff ? 1 : 0;
    this.stateLo = sumLo >>> 0;
    this.stateHi = (this.stateHi + GAMMA_HI + carry) >>> 0;
    let zHi = this.stateHi;
    let zLo = this.stateLo;
    // z = (z ^ z >> 30) * M1
    let xLo = (zLo ^ ((zLo >>> 30) | (zHi << 2))) >>> 0;
    let xHi = (zHi ^ (zHi >>> 30)) >>> 0;
    zHi = (mulHi32(xLo, M1_LO) + Math.imul(xLo, M1_HI) + Math.imul(xHi, M1_LO)) >>> 0;
    zLo = Math.imul(xLo, M1_LO) >>> 0;
    // z = (z ^ z >> 27) * M2
    xLo = (zLo ^ ((zLo >>> 27) | (zHi << 5))) >>> 0;
    xHi = (zHi ^ (zHi >>> 27)) >>> 0;
    zHi = (mulHi32(xLo, M2_LO) + Math.imul(xLo, M2_HI) + Math.imul(xHi, M2_LO)) >>> 0;
    zLo = Math.imul(xLo, M2_LO) >>> 0;
    // z ^ z >> 31
    this.lo = (zLo ^ ((zLo >>> 31) | (zHi << 1))) >>> 0;
    this.hi = (zHi ^ (zHi >>> 31)) >>> 0;
    return this.lo;
  }

  /** Advances once and returns the whole output (off the hot path). */
  next(): bigint {
    this.next32();
    return (BigInt(this.hi) << 32n) | BigInt(this.lo);
  }

  /** The current state, for tests and diagnostics. */
  state(): bigint {
    return (BigInt(this.stateHi) << 32n) | BigInt(this.stateLo);
  }
}

/** One SplitMix64 step from `state`, in BigInt: the reference the fast path is tested against. */
export function splitMix64Reference(state: bigint): { state: bigint; value: bigint } {
  const next = (state + GOLDEN_GAMMA) & U64_MAX;
  let z = next;
  z = ((z ^ (z >> 30n)) * 0xbf58_476d_1ce4_e5b9n) & U64_MAX;
  z = ((z ^ (z >> 27n)) * 0x94d0_49bb_1331_11ebn) & U64_MAX;
  return { state: next, value: z ^ (z >> 31n) };
}

/**
 * The RNG seed of `lane`: next_random(seed ^ ((lane + 1) * gamma)), one
 * SplitMix64 step so that neighbouring lanes get unrelated walks.
 */
export function laneSeed(seed: bigint, lane: number): bigint {
  return splitMix64Reference((seed ^ ((BigInt(lane) + 1n) * GOLDEN_GAMMA)) & U64_MAX).value;
}
