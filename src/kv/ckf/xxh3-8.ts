/**
 * XXH3-64 of exactly eight bytes, in 32-bit integer arithmetic.
 *
 * Every filter probe hashes one u64 key; doing that through BigInt (or the
 * native binding, which takes and returns BigInt) costs far more than the
 * probe itself. An 8-byte input takes XXH3's "4 to 8 bytes" path, which is a
 * handful of xors, two rotations and two 64-bit multiplies, so it is written
 * out here on (hi, lo) halves. The test suite checks it bit for bit against
 * the library over random keys and seeds.
 *
 * The path, for input bytes b[0..8) read as the u64 key k (little-endian):
 *   seed' = seed ^ (bswap32(seed_lo) << 32)
 *   bitflip = (secret64[8] ^ secret64[16]) - seed'        (constant per seed)
 *   input64 = le32(b[4..8)) + (le32(b[0..4)) << 32)       = k with its halves swapped
 *   h = input64 ^ bitflip
 *   h ^= rotl(h, 49) ^ rotl(h, 24); h *= MX2; h ^= (h >> 35) + 8; h *= MX2; h ^= h >> 28
 */
import { U32_FIELD_INIT, U64_MAX } from "./u64.js";

/**
 * Bytes 8..15 and 16..23 of XXH3's default 192-byte secret, as little-endian
 * u64s: the only secret bytes the 4..8 path reads.
 */
const SECRET_8 = 0x1cad_21f7_2c81_017cn;
const SECRET_16 = 0xdb97_9083_e96d_d4den;

/** PRIME_MX2 of the rrmxmx finalizer, split into 32- and 16-bit parts for the multiplies. */
const MX2_HI = 0x9fb2_1c65;
const MX2_LO = 0x1e98_df25;
const MX2_LO_0 = MX2_LO & 0xffff;
const MX2_LO_1 = MX2_LO >>> 16;

/** bswap32 of a u32 number. */
function bswap32(x: number): number {
  return (((x & 0xff) << 24) | ((x & 0xff00) << 8) | ((x >>> 8) & 0xff00) | (x >>> 24)) >>> 0;
}

/**
 * The high 32 bits of the 64-bit product of two u32s, one of them MX2_LO:
 * 16-bit limbs keep every partial product exact in a double.
 */
function mulHiMx2Lo(a: number): number {
  const a0 = a & 0xffff;
  const a1 = a >>> 16;
  const p00 = a0 * MX2_LO_0;
  const p01 = a0 * MX2_LO_1;
  const p10 = a1 * MX2_LO_0;
  const p11 = a1 * MX2_LO_1;
  const mid = (p00 >>> 16) + (p01 & 0xffff) + (p10 & 0xffff);
  return (p11 + (p01 >>> 16) + (p10 >>> 16) + (mid >>> 16)) >>> 0;
}

/**
 * XXH3_64(le_u64(key), seed) for one fixed seed. `hash` writes the result to
 * `hi` and `lo` (u32 numbers) instead of returning a pair, so a probe
 * allocates nothing.
 */
export class Xxh3Of8 {
  readonly seed: bigint;
  /** Output of the last `hash`: high and low 32 bits. */
  hi = U32_FIELD_INIT;
  lo = U32_FIELD_INIT;
  private readonly bitflipHi: number;
  private readonly bitflipLo: number;

  constructor(seed: bigint) {
    this.seed = seed;
    const lo = Number(seed & 0xffff_ffffn);
    const mixedSeed = seed ^ (BigInt(bswap32(lo)) << 32n);
    const bitflip = ((SECRET_8 ^ SECRET_16) - mixedSeed) & U64_MAX;
    this.bitflipHi = Number(bitflip >> 32n);
    this.bitflipLo = Number(bitflip & 0xffff_ffffn);
  }

  /** Hashes the key (keyHi, keyLo), u32s or int32s of the same bits; the digest lands in `this.hi` / `this.lo` as u32s. */
  hash(keyHi: number, keyLo: number): void {
    // input64 has the key's halves swapped (the first four bytes are the key's low half).
    let hHi = keyLo ^ this.bitflipHi;
    let hLo = keyHi ^ this.bitflipLo;
    // h ^= rotl(h, 49) ^ rotl(h, 24); rotl 49 is rotr 15.
    const xHi = ((hHi >>> 15) | (hLo << 17)) ^ ((hHi << 24) | (hLo >>> 8));
    const xLo = ((hLo >>> 15) | (hHi << 17)) ^ ((hLo << 24) | (hHi >>> 8));
    hHi ^= xHi;
    hLo ^= xLo;
    // h *= MX2 (mod 2^64)
    let pHi = mulHiMx2Lo(hLo) + Math.imul(hLo, MX2_HI) + Math.imul(hHi, MX2_LO);
    let pLo = Math.imul(hLo, MX2_LO);
    // h ^= (h >> 35) + len; (h >> 35) has 29 bits, so adding 8 never carries into the high half.
    pLo ^= (pHi >>> 3) + 8;
    // h *= MX2
    hHi = mulHiMx2Lo(pLo) + Math.imul(pLo, MX2_HI) + Math.imul(pHi, MX2_LO);
    hLo = Math.imul(pLo, MX2_LO);
    // h ^= h >> 28
    pHi = hHi >>> 0;
    pLo = hLo ^ ((hLo >>> 28) | (hHi << 4));
    this.hi = (pHi ^ (pHi >>> 28)) >>> 0;
    this.lo = pLo >>> 0;
  }

  /** The same hash through BigInt, for callers off the hot path. */
  hashU64(key: bigint): bigint {
    this.hash(Number(key >> 32n), Number(key & 0xffff_ffffn));
    return (BigInt(this.hi) << 32n) | BigInt(this.lo);
  }
}
