/** Argument checks shared by the encoder and the format: u64s are bigints, never wrapped. */
import { U64_MAX } from "../../bytes/index.js";
import { Cbi1Error, describe } from "./errors.js";

export function isU64(value: unknown): value is bigint {
  return typeof value === "bigint" && value >= 0n && value <= U64_MAX;
}

export function isU32(value: unknown): value is number {
  return typeof value === "number" && value >>> 0 === value;
}

/** Returns `value` or throws InvalidArgument; DataView.setBigUint64 would silently wrap a negative or oversized bigint. */
export function u64Arg(value: unknown, what: string): bigint {
  if (!isU64(value)) throw new Cbi1Error("InvalidArgument", `${what} ${describe(value)} is not a u64 bigint`, { what, value: describe(value) });
  return value;
}

export function u32Arg(value: unknown, what: string): number {
  if (!isU32(value)) throw new Cbi1Error("InvalidArgument", `${what} ${describe(value)} is not a u32`, { what, value: describe(value) });
  return value;
}

/** Checked once: typed-array words are the wire's LE bytes only on a little-endian host. */
export const HOST_IS_LITTLE_ENDIAN = new Uint8Array(Uint16Array.of(0x0102).buffer)[0] === 0x02;

export function assertLittleEndianHost(): void {
  if (!HOST_IS_LITTLE_ENDIAN) {
    throw new Cbi1Error("UnsupportedHost", "CBI1 bulk word copies need a little-endian host");
  }
}
