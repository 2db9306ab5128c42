/**
 * u64 plumbing for the hot path. Events and maps carry u64 hashes as bigint;
 * the filter works on (hi, lo) pairs of u32 numbers so that no BigInt
 * arithmetic runs per probe.
 */
import { CkfError } from "./errors.js";

/** 2^64 - 1. */
export const U64_MAX = (1n << 64n) - 1n;

/**
 * The first value of an object field that holds u32s: a u32 outside V8's
 * small-integer range, so that the field holds doubles from the start. A
 * field made with a small integer changes its object's shape when the first
 * large u32 is stored, and optimized code that relied on the old shape is
 * thrown away when the next object of the class is made (a second
 * DcCkfState deoptimized the event path).
 */
export const U32_FIELD_INIT = 0xffff_ffff;

/** The golden-ratio increment shared by SplitMix64, the lane seed and the delta seed. */
export const GOLDEN_GAMMA = 0x9e37_79b9_7f4a_7c15n;

/** True for a bigint in 0..2^64-1. */
export function isU64(value: unknown): value is bigint {
  return typeof value === "bigint" && value >= 0n && value <= U64_MAX;
}

/** True for a number in 0..2^32-1. */
export function isU32(value: unknown): value is number {
  return typeof value === "number" && Number.isInteger(value) && value >= 0 && value <= 0xffff_ffff;
}

/** Checked once at module load; the answer cannot change while the process runs. */
const HOST_IS_LITTLE_ENDIAN = new Uint8Array(Uint16Array.of(0x0102).buffer)[0] === 0x02;

/**
 * Scratch for splitting a u64 into halves without BigInt arithmetic:
 * `value >> 32n` and `value & mask` would each allocate a BigInt, and the
 * state splits every admitted, removed and probed hash. Storing into a
 * BigUint64Array wraps mod 2^64 and allocates nothing; the two u32 views of
 * the same 8 bytes are the halves, in host byte order (hence the index pick,
 * which keeps the split right even on a host the lanes refuse).
 */
const SPLIT_U64 = new BigUint64Array(1);
const SPLIT_U32 = new Uint32Array(SPLIT_U64.buffer);
const HI_INDEX = HOST_IS_LITTLE_ENDIAN ? 1 : 0;
const LO_INDEX = 1 - HI_INDEX;

/** The high 32 bits of a u64 (a bigint outside 0..2^64-1 is taken mod 2^64). */
export function hi32(value: bigint): number {
  SPLIT_U64[0] = value;
  return SPLIT_U32[HI_INDEX]!;
}

/** The low 32 bits of a u64 (a bigint outside 0..2^64-1 is taken mod 2^64). */
export function lo32(value: bigint): number {
  SPLIT_U64[0] = value;
  return SPLIT_U32[LO_INDEX]!;
}

/**
 * A u32 half as the int32 of the same bits. A u32 of 2^31 or more is no
 * small integer to V8: passed to a function that is not inlined, it is boxed
 * as a heap number, an allocation per call. The event path passes its halves
 * to such calls this way; the functions it calls so read only the bits, or
 * take `>>> 0` first.
 */
export function asInt32(half: number): number {
  return half | 0;
}

/** (hi, lo) back to a u64: the halves stored (each taken mod 2^32), the one element read, one BigInt made. */
export function joinU64(hi: number, lo: number): bigint {
  SPLIT_U32[HI_INDEX] = hi;
  SPLIT_U32[LO_INDEX] = lo;
  return SPLIT_U64[0]!;
}

/** `value` as 8 little-endian bytes (the byte string every reference hash of a u64 reads). */
export function leU64(value: bigint): Uint8Array {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, value, true);
  return out;
}

/**
 * Throws unless the host stores typed arrays little-endian. A lane is both a
 * Uint16Array of slots and the little-endian u64 words of the wire; on a
 * big-endian host those two views would disagree, so refuse to run there.
 */
export function assertLittleEndianHost(): void {
  if (!HOST_IS_LITTLE_ENDIAN) {
    throw new CkfError("UnsupportedHost", "CKF lanes need a little-endian host: the u16 slot view and the u64 wire words would disagree");
  }
}
