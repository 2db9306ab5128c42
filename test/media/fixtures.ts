import { xxh3 } from "@node-rs/xxhash";
import sharp from "sharp";
import { crc32, deflateSync } from "node:zlib";

/** Deterministic pixel bytes. */
export function pattern(length: number, mul = 31, add = 7): Uint8Array {
  return Uint8Array.from({ length }, (_, i) => (i * mul + add) & 0xff);
}

export async function encodeRaw(
  pixels: Uint8Array,
  width: number,
  height: number,
  channels: 1 | 2 | 3 | 4,
  format: "png" | "webp-lossless" | "jpeg" | "gif" | "tiff" | "avif",
): Promise<Buffer> {
  let s = sharp(Buffer.from(pixels), { raw: { width, height, channels } });
  if (channels <= 2) s = s.toColourspace("b-w");
  switch (format) {
    case "png":
      return s.png().toBuffer();
    case "webp-lossless":
      return s.webp({ lossless: true, exact: true }).toBuffer();
    case "jpeg":
      return s.jpeg({ quality: 95 }).toBuffer();
    case "gif":
      return s.gif().toBuffer();
    case "tiff":
      return s.tiff().toBuffer();
    case "avif":
      return s.avif().toBuffer();
  }
}

/** One PNG chunk: length, type, body, CRC. */
export function pngChunk(type: string, body: Uint8Array): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(body.length, 0);
  head.write(type, 4, "latin1");
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(Buffer.concat([Buffer.from(type, "latin1"), body])) >>> 0);
  return Buffer.concat([head, body, crc]);
}

/**
 * A small PNG whose header claims width × height (8-bit RGB) followed by a
 * tiny compressed stream: a decompression bomb when the claim is large.
 */
export function claimedPng(width: number, height: number, colorType = 2): Buffer {
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr[8] = 8;
  ihdr[9] = colorType;
  const idat = deflateSync(Buffer.alloc(64 * 1024));
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    pngChunk("IHDR", ihdr),
    pngChunk("IDAT", idat),
    pngChunk("IEND", new Uint8Array(0)),
  ]);
}

/** The spec's image hash rule (F.4), written out independently of src/media/hash.ts: rank, dims, dtype 0, bytes. */
export function ruleHash(shape: number[], bytes: Uint8Array): bigint {
  const head = Buffer.alloc(8 * (shape.length + 1) + 1);
  head.writeBigUInt64LE(BigInt(shape.length), 0);
  shape.forEach((d, i) => head.writeBigUInt64LE(BigInt(d), 8 * (i + 1)));
  return xxh3.xxh64(Buffer.concat([head, Buffer.from(bytes)]), 0n);
}

/** Whether two byte arrays hold the same bytes. */
export const sameBytes = (a: Uint8Array, b: Uint8Array): boolean => Buffer.from(a.buffer, a.byteOffset, a.length).equals(Buffer.from(b));
