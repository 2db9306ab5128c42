/**
 * The 48-byte CBI1 header (spec A.2): written by the encoder into the frame's
 * own buffer, read by the decoder from a DataView over the caller's bytes.
 */
import { xxh3Low32 } from "../../bytes/index.js";
import { FINGERPRINT_BITS, FORMAT_VERSION, IMAGES_HEADER_LEN, IMAGES_MAGIC, IMAGES_WIRE_VERSION, OFFSET, SLOTS_PER_BUCKET } from "./constants.js";
import type { FilterFormat } from "./format.js";

/** A decoded header. `bucketCount` equals the expected format's (decode checks it before handing a header out). */
export interface Cbi1Header {
  readonly wireVersion: number;
  readonly flags: number;
  readonly fingerprintBits: number;
  readonly slotsPerBucket: number;
  readonly formatVersion: number;
  readonly seed: bigint;
  readonly bucketCount: number;
  /** The producer's datacenter id; consumers check it against the enclosing identity, it does not pick a lane. */
  readonly dcId: bigint;
  /** The publication sequence: the snapshot's, or the delta's target sequence. */
  readonly epoch: bigint;
  readonly checksum: number;
}

/** Uint8Array allocation without zero-fill: the encoders write every byte of the frame. */
export function allocFrame(length: number): { bytes: Uint8Array; view: DataView } {
  // allocUnsafeSlow: an ArrayBuffer of its own (byteOffset 0, so the words of a
  // chunk start 8-aligned), never a slice of Node's shared pool.
  const buf = Buffer.allocUnsafeSlow(length);
  const bytes = new Uint8Array(buf.buffer, buf.byteOffset, length);
  return { bytes, view: new DataView(buf.buffer, buf.byteOffset, length) };
}

/** Writes the header with a zero checksum; `patchChecksum` fills it once the body is in place. */
export function writeHeader(view: DataView, flags: number, format: FilterFormat, dcId: bigint, epoch: bigint): void {
  for (let i = 0; i < 4; i++) view.setUint8(OFFSET.magic + i, IMAGES_MAGIC[i]!);
  view.setUint16(OFFSET.wireVersion, IMAGES_WIRE_VERSION, true);
  view.setUint16(OFFSET.flags, flags, true);
  view.setUint8(OFFSET.fingerprintBits, FINGERPRINT_BITS);
  view.setUint8(OFFSET.slotsPerBucket, SLOTS_PER_BUCKET);
  view.setUint16(OFFSET.formatVersion, FORMAT_VERSION, true);
  view.setBigUint64(OFFSET.seed, format.seed, true);
  view.setBigUint64(OFFSET.bucketCount, BigInt(format.bucketCount), true);
  view.setBigUint64(OFFSET.dcId, dcId, true);
  view.setBigUint64(OFFSET.epoch, epoch, true);
  view.setUint32(OFFSET.checksum, 0, true);
}

/** The body checksum: low 32 bits of XXH3-64 (seed 0) of bytes[48..]; large bodies go through the streaming hasher. */
export function bodyChecksum(frame: Uint8Array): number {
  return xxh3Low32(frame.subarray(IMAGES_HEADER_LEN), 0n);
}

export function patchChecksum(frame: Uint8Array, view: DataView): void {
  view.setUint32(OFFSET.checksum, bodyChecksum(frame), true);
}
