/**
 * Frame builders for the CBI1 tests, written from the spec's header layout
 * (A.2, A.3) field by field, independently of the encoder under test.
 */
import { xxh3 } from "@node-rs/xxhash";

export const SEED = 0x5eedn;

/** Every header field, settable one by one so that tests can break any of them. */
export interface Recipe {
  magic: [number, number, number, number];
  wireVersion: number;
  flags: number;
  fingerprintBits: number;
  slotsPerBucket: number;
  formatVersion: number;
  seed: bigint;
  bucketCount: bigint;
  dcId: bigint;
  epoch: bigint;
  body: Uint8Array;
  /** Write a checksum off by one instead of the right one. */
  badChecksum: boolean;
  /** Cut the finished frame to this many bytes. */
  truncateTo: number | undefined;
  /** Pad the finished frame with zeros to this many bytes. */
  padTo: number | undefined;
}

/** The peer's checksum: @node-rs/xxhash one-shot XXH3-64, seed 0, low 32 bits. */
export function peerChecksum(body: Uint8Array): number {
  return Number(xxh3.xxh64(body.slice(), 0n) & 0xffff_ffffn);
}

export function deltaBody(baseEpoch: bigint, images: readonly (readonly [number, bigint])[], countOverride?: number): Uint8Array {
  const body = new Uint8Array(12 + 12 * images.length);
  const v = new DataView(body.buffer);
  v.setBigUint64(0, baseEpoch, true);
  v.setUint32(8, countOverride ?? images.length, true);
  images.forEach(([bucket, value], i) => {
    v.setUint32(12 + 12 * i, bucket, true);
    v.setBigUint64(16 + 12 * i, value, true);
  });
  return body;
}

export function chunkBody(chunkIndex: number, chunkCount: number, bucketOffset: bigint, words: readonly bigint[]): Uint8Array {
  const body = new Uint8Array(16 + 8 * words.length);
  const v = new DataView(body.buffer);
  v.setUint32(0, chunkIndex, true);
  v.setUint32(4, chunkCount, true);
  v.setBigUint64(8, bucketOffset, true);
  words.forEach((w, i) => v.setBigUint64(16 + 8 * i, w, true));
  return body;
}

export function recipe(init: Partial<Recipe> = {}): Recipe {
  return {
    magic: [0x43, 0x42, 0x49, 0x31],
    wireVersion: 1,
    flags: 2,
    fingerprintBits: 16,
    slotsPerBucket: 4,
    formatVersion: 1,
    seed: SEED,
    bucketCount: 1024n,
    dcId: 7n,
    epoch: 5n,
    body: deltaBody(4n, [
      [3, 0xaaaa_bbbb_cccc_ddddn],
      [1000, 42n],
    ]),
    badChecksum: false,
    truncateTo: undefined,
    padTo: undefined,
    ...init,
  };
}

export function build(r: Recipe): Uint8Array {
  let frame = new Uint8Array(48 + r.body.length);
  const v = new DataView(frame.buffer);
  r.magic.forEach((b, i) => v.setUint8(i, b));
  v.setUint16(4, r.wireVersion, true);
  v.setUint16(6, r.flags, true);
  v.setUint8(8, r.fingerprintBits);
  v.setUint8(9, r.slotsPerBucket);
  v.setUint16(10, r.formatVersion, true);
  v.setBigUint64(12, r.seed, true);
  v.setBigUint64(20, r.bucketCount, true);
  v.setBigUint64(28, r.dcId, true);
  v.setBigUint64(36, r.epoch, true);
  frame.set(r.body, 48);
  v.setUint32(44, (peerChecksum(r.body) + (r.badChecksum ? 1 : 0)) >>> 0, true);
  if (r.truncateTo !== undefined) frame = frame.slice(0, r.truncateTo);
  if (r.padTo !== undefined) {
    const padded = new Uint8Array(r.padTo);
    padded.set(frame);
    frame = padded;
  }
  return frame;
}

/** Rewrites the checksum of `frame` in place to match its body (for mutations meant to get past the checksum). */
export function repatch(frame: Uint8Array): Uint8Array {
  if (frame.length >= 48) new DataView(frame.buffer, frame.byteOffset, frame.byteLength).setUint32(44, peerChecksum(frame.subarray(48)), true);
  return frame;
}

/** A copy of `frame` starting at byte offset `shift` of a fresh ArrayBuffer (as a pooled socket Buffer may). */
export function atOffset(frame: Uint8Array, shift: number): Uint8Array {
  const backing = new Uint8Array(frame.length + shift + 8);
  backing.set(frame, shift);
  return backing.subarray(shift, shift + frame.length);
}
