import { MediaError } from "./errors.js";

/**
 * BMP (Windows bitmap) decoding, in two steps so that the caller can check
 * its limits in between: `readBmpHeader` parses and validates the headers
 * and palette without touching the pixel data, `decodeBmpPixels` checks that
 * the pixel data is really there and only then allocates the tensor.
 *
 * Output follows the reference's image decoder: palette images (1, 2, 4, 8
 * bits, uncompressed or RLE) and 16/24/32-bit images give RGB; BITFIELDS
 * images whose header carries a non-zero alpha mask (V3 headers and later)
 * give RGBA. The fourth byte of a plain 32-bit image is not alpha. Channel
 * values narrower than 8 bits are widened as the reference widens them
 * (rounded scaling up to 6 bits, bit replication at 7). Rows are stored
 * bottom-up unless the height is negative; BGR becomes RGB.
 */

/** Storage kinds the decoder handles. */
export type BmpCompression = "rgb" | "rle8" | "rle4" | "bitfields";

/** One colour channel of a BITFIELDS (or implicit 16/32-bit) layout; bits 0 = absent. */
export interface BmpChannelMask {
  readonly shift: number;
  readonly bits: number;
}

export interface BmpHeader {
  readonly width: number;
  readonly height: number;
  readonly topDown: boolean;
  readonly bitsPerPixel: number;
  readonly compression: BmpCompression;
  /** 3 (RGB) or 4 (RGBA: BITFIELDS with an alpha mask). */
  readonly channels: 3 | 4;
  /** Where the pixel data starts, as the file header says; checked when decoding. */
  readonly dataOffset: number;
  /**
   * End of the file header, the info header and its masks: pixel data cannot
   * start before. (It may overlap a palette that claims more entries than
   * the file stores, as the reference allows.)
   */
  readonly headersEnd: number;
  /** 256 RGB entries (zero past the file's own); null for direct colour. */
  readonly palette: Uint8Array | null;
  /** Red, green, blue, alpha of 16/32-bit pixels; null for palettes and 24-bit. */
  readonly masks: readonly [BmpChannelMask, BmpChannelMask, BmpChannelMask, BmpChannelMask] | null;
}

const FILE_HEADER = 14;
const CORE_HEADER = 12;
const INFO_HEADER = 40;
const V3_HEADER = 56;
/** Core, info, V2, V3, V4 and V5 headers; other sizes are not BMP headers the reference reads. */
const HEADER_SIZES: ReadonlySet<number> = new Set([CORE_HEADER, INFO_HEADER, 52, V3_HEADER, 108, 124]);

/** Output bytes (or RLE instructions) between two yields to the event loop: a few ms of work. */
const YIELD_EVERY = 1024 * 1024;

function invalid(why: string): MediaError {
  return new MediaError("IMAGE_DECODE_FAILED", `Failed to decode image: BMP ${why}`);
}

function unsupported(what: string): MediaError {
  return new MediaError("IMAGE_FORMAT_UNSUPPORTED", `Unsupported image format: Bmp with ${what}`);
}

/** Bounds-checked little-endian reads of the header area. */
class HeaderReader {
  private readonly view: DataView;

  constructor(private readonly bytes: Uint8Array) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  private need(at: number, size: number): void {
    if (at + size > this.bytes.length) throw invalid("header is truncated");
  }

  u16(at: number): number {
    this.need(at, 2);
    return this.view.getUint16(at, true);
  }

  u32(at: number): number {
    this.need(at, 4);
    return this.view.getUint32(at, true);
  }

  i32(at: number): number {
    this.need(at, 4);
    return this.view.getInt32(at, true);
  }
}

/** A channel mask as shift and width, keeping at most its 8 most significant bits. */
function channelMask(mask: number, pixelBits: number): BmpChannelMask {
  if (mask === 0) return { shift: 0, bits: 0 };
  let shift = 0;
  while (((mask >>> shift) & 1) === 0) shift++;
  let bits = 0;
  while (shift + bits < 32 && ((mask >>> (shift + bits)) & 1) === 1) bits++;
  if (shift + bits < 32 && mask >>> (shift + bits) !== 0) throw invalid(`bit mask 0x${mask.toString(16)} is not contiguous`);
  if (shift + bits > pixelBits) throw invalid(`bit mask 0x${mask.toString(16)} does not fit ${pixelBits}-bit pixels`);
  return bits > 8 ? { shift: shift + bits - 8, bits: 8 } : { shift, bits };
}

const NO_ALPHA: BmpChannelMask = { shift: 0, bits: 0 };
const RGB555: BmpHeader["masks"] = [{ shift: 10, bits: 5 }, { shift: 5, bits: 5 }, { shift: 0, bits: 5 }, NO_ALPHA];
const RGB888: BmpHeader["masks"] = [{ shift: 16, bits: 8 }, { shift: 8, bits: 8 }, { shift: 0, bits: 8 }, NO_ALPHA];

/**
 * Parses and validates the BMP headers and palette. Reads nothing past the
 * palette and allocates at most the 768-byte palette, whatever the header
 * claims. Throws a MediaError (INVALID_ARGUMENT) for anything malformed.
 */
export function readBmpHeader(bytes: Uint8Array): BmpHeader {
  const r = new HeaderReader(bytes);
  if (bytes[0] !== 0x42 || bytes[1] !== 0x4d) throw invalid("signature is missing");
  const dataOffset = r.u32(10);
  const headerSize = r.u32(FILE_HEADER);
  if (!HEADER_SIZES.has(headerSize)) throw invalid(`info header size ${headerSize} is not a known BMP header size`);
  if (FILE_HEADER + headerSize > bytes.length) throw invalid("header is truncated");
  const core = headerSize === CORE_HEADER;

  let width: number;
  let storedHeight: number;
  let planes: number;
  let bitsPerPixel: number;
  let code = 0;
  let colorsUsed = 0;
  if (core) {
    width = r.u16(18);
    storedHeight = r.u16(20);
    planes = r.u16(22);
    bitsPerPixel = r.u16(24);
  } else {
    width = r.i32(18);
    storedHeight = r.i32(22);
    planes = r.u16(26);
    bitsPerPixel = r.u16(28);
    code = r.u32(30);
    colorsUsed = r.u32(46);
  }
  if (width <= 0) throw invalid(`width ${width} is not positive`);
  if (storedHeight === 0) throw invalid("height is zero");
  if (storedHeight === -0x80000000) throw invalid(`height ${storedHeight} is invalid`);
  const topDown = storedHeight < 0;
  const height = Math.abs(storedHeight);
  if (planes !== 1) throw invalid(`has ${planes} planes, not 1`);

  let compression: BmpCompression;
  let masks: BmpHeader["masks"] = null;
  let channels: 3 | 4 = 3;
  let headersEnd = FILE_HEADER + headerSize;
  switch (code) {
    case 0: {
      const depths = core ? [1, 4, 8, 24] : [1, 2, 4, 8, 16, 24, 32];
      if (!depths.includes(bitsPerPixel)) throw invalid(`${bitsPerPixel} bits per pixel is not a valid depth`);
      compression = "rgb";
      if (bitsPerPixel === 16) masks = RGB555;
      else if (bitsPerPixel === 32) masks = RGB888;
      break;
    }
    case 1:
      if (bitsPerPixel !== 8) throw invalid(`RLE8 with ${bitsPerPixel} bits per pixel`);
      compression = "rle8";
      break;
    case 2:
      if (bitsPerPixel !== 4) throw invalid(`RLE4 with ${bitsPerPixel} bits per pixel`);
      compression = "rle4";
      break;
    case 3: {
      if (bitsPerPixel !== 16 && bitsPerPixel !== 32) throw invalid(`BITFIELDS with ${bitsPerPixel} bits per pixel`);
      compression = "bitfields";
      // Colour masks follow a 40-byte info header and sit inside the longer ones;
      // only V3 headers and later carry an alpha mask.
      const at = FILE_HEADER + INFO_HEADER;
      const [red, green, blue] = [r.u32(at), r.u32(at + 4), r.u32(at + 8)];
      const alpha = headerSize >= V3_HEADER ? r.u32(at + 12) : 0;
      masks = [
        channelMask(red, bitsPerPixel),
        channelMask(green, bitsPerPixel),
        channelMask(blue, bitsPerPixel),
        channelMask(alpha, bitsPerPixel),
      ];
      if (masks[0].bits === 0 || masks[1].bits === 0 || masks[2].bits === 0) throw invalid("BITFIELDS masks are missing a colour");
      if (alpha !== 0) channels = 4;
      headersEnd = Math.max(headersEnd, at + 12);
      break;
    }
    case 4:
      throw unsupported("JPEG compression");
    case 5:
      throw unsupported("PNG compression");
    case 11:
    case 12:
    case 13:
      throw unsupported("CMYK data");
    default:
      throw invalid(`compression type ${code} is unknown`);
  }
  if (topDown && compression !== "rgb" && compression !== "bitfields") {
    throw invalid("top-down images cannot be RLE compressed");
  }

  let palette: Uint8Array | null = null;
  if (bitsPerPixel <= 8) {
    const capacity = 2 ** bitsPerPixel;
    if (colorsUsed > capacity) throw invalid(`palette of ${colorsUsed} colours exceeds ${capacity} for ${bitsPerPixel} bits per pixel`);
    const count = colorsUsed === 0 ? capacity : colorsUsed;
    const entry = core ? 3 : 4;
    const start = FILE_HEADER + headerSize;
    if (start + count * entry > bytes.length) throw invalid("palette extends past the end of the file");
    palette = new Uint8Array(256 * 3);
    for (let i = 0; i < count; i++) {
      const at = start + i * entry;
      palette[3 * i] = bytes[at + 2]!;
      palette[3 * i + 1] = bytes[at + 1]!;
      palette[3 * i + 2] = bytes[at]!;
    }
  }
  return { width, height, topDown, bitsPerPixel, compression, channels, dataOffset, headersEnd, palette, masks };
}

/** Widening tables for channel values of 0..8 bits, as the reference widens them. */
const WIDEN: readonly Uint8Array[] = Array.from({ length: 9 }, (_, bits) => {
  const size = 1 << bits;
  const max = size - 1;
  return Uint8Array.from({ length: size }, (_, v) => {
    if (bits === 0) return 0;
    if (bits === 7) return (v << 1) | (v >> 6);
    if (bits === 8) return v;
    return Math.round((v * 255) / max);
  });
});

const yieldToLoop = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/**
 * Counts work; `tick` says when YIELD_EVERY units have passed, and `pause`
 * then lets the event loop run and honours the signal.
 */
class Pacer {
  private done = 0;

  constructor(private readonly signal: AbortSignal | undefined) {}

  tick(units: number): boolean {
    this.done += units;
    return this.done >= YIELD_EVERY;
  }

  async pause(): Promise<void> {
    this.done = 0;
    await yieldToLoop();
    this.signal?.throwIfAborted();
  }
}

/**
 * Decodes the pixel data of a BMP whose header was read (and whose limits
 * were checked) to `height × width × channels` bytes, top row first.
 * `channels` is the header's, or 3 to drop alpha. The pixel data is checked
 * to be in the file before the tensor is allocated; truncated or overrunning
 * data is a MediaError. Large images yield to the event loop now and then,
 * and an aborted signal stops the decode there.
 */
export async function decodeBmpPixels(
  bytes: Uint8Array,
  header: BmpHeader,
  channels: 3 | 4,
  signal?: AbortSignal,
): Promise<Uint8Array> {
  signal?.throwIfAborted();
  if (channels > header.channels) throw invalid(`has no alpha to decode ${channels} channels`);
  const { dataOffset } = header;
  if (dataOffset < header.headersEnd) throw invalid(`pixel data offset ${dataOffset} points into the headers`);
  if (dataOffset >= bytes.length) throw invalid(`pixel data offset ${dataOffset} is past the end of the file`);
  if (header.compression === "rle8" || header.compression === "rle4") {
    return decodeRle(bytes, header, new Pacer(signal));
  }
  const stride = Math.ceil((header.width * header.bitsPerPixel) / 32) * 4;
  const needed = stride * header.height;
  if (!Number.isSafeInteger(needed) || dataOffset + needed > bytes.length) {
    throw invalid(`pixel data is truncated: ${needed} bytes needed at offset ${dataOffset}, the file has ${bytes.length}`);
  }
  const out = new Uint8Array(header.width * header.height * channels);
  const rowBytes = header.width * channels;
  const decodeRow = rowDecoder(bytes, header, channels);
  const pacer = new Pacer(signal);
  for (let row = 0; row < header.height; row++) {
    const target = header.topDown ? row : header.height - 1 - row;
    decodeRow(dataOffset + row * stride, out, target * rowBytes);
    if (pacer.tick(rowBytes)) await pacer.pause();
  }
  return out;
}

type RowDecoder = (from: number, out: Uint8Array, to: number) => void;

function rowDecoder(bytes: Uint8Array, header: BmpHeader, channels: 3 | 4): RowDecoder {
  const { width, bitsPerPixel, palette, masks } = header;
  if (palette !== null) {
    const perByte = 8 / bitsPerPixel;
    const indexMask = (1 << bitsPerPixel) - 1;
    return (from, out, to) => {
      for (let x = 0; x < width; x++) {
        const byte = bytes[from + Math.floor(x / perByte)]!;
        const index = (byte >> (8 - bitsPerPixel * ((x % perByte) + 1))) & indexMask;
        out[to++] = palette[3 * index]!;
        out[to++] = palette[3 * index + 1]!;
        out[to++] = palette[3 * index + 2]!;
      }
    };
  }
  if (masks === null) {
    // 24-bit: B, G, R.
    return (from, out, to) => {
      for (let x = 0; x < width; x++, from += 3) {
        out[to++] = bytes[from + 2]!;
        out[to++] = bytes[from + 1]!;
        out[to++] = bytes[from]!;
      }
    };
  }
  const [red, green, blue, alpha] = masks;
  const pick = (mask: BmpChannelMask): ((value: number) => number) => {
    const table = WIDEN[mask.bits]!;
    const valueMask = (1 << mask.bits) - 1;
    return (value) => table[(value >>> mask.shift) & valueMask]!;
  };
  const [r, g, b, a] = [pick(red), pick(green), pick(blue), pick(alpha)];
  const hasAlpha = alpha.bits > 0;
  const step = bitsPerPixel / 8;
  return (from, out, to) => {
    for (let x = 0; x < width; x++, from += step) {
      const value =
        step === 2
          ? bytes[from]! | (bytes[from + 1]! << 8)
          : (bytes[from]! | (bytes[from + 1]! << 8) | (bytes[from + 2]! << 16) | (bytes[from + 3]! << 24)) >>> 0;
      out[to++] = r(value);
      out[to++] = g(value);
      out[to++] = b(value);
      if (channels === 4) out[to++] = hasAlpha ? a(value) : 255;
    }
  };
}

/**
 * RLE8/RLE4, bottom-up, as the reference reads it: runs and literal groups
 * may not pass the end of a row, a delta may not leave the image, pixels that
 * are skipped (delta, end of line, end of bitmap) stay black, and the data
 * must reach the last row (or an end-of-bitmap code) before the file ends.
 */
async function decodeRle(bytes: Uint8Array, header: BmpHeader, pacer: Pacer): Promise<Uint8Array> {
  const { width, height } = header;
  const palette = header.palette!;
  const four = header.compression === "rle4";
  const out = new Uint8Array(width * height * 3);
  let at = header.dataOffset;
  const next = (): number => {
    if (at >= bytes.length) throw invalid("RLE data ends before the image does");
    return bytes[at++]!;
  };
  let row = 0;
  let x = 0;
  const put = (index: number): void => {
    const to = ((height - 1 - row) * width + x++) * 3;
    out[to] = palette[3 * index]!;
    out[to + 1] = palette[3 * index + 1]!;
    out[to + 2] = palette[3 * index + 2]!;
  };
  const overrun = (): MediaError => invalid(`RLE data overruns row ${row} of ${width} pixels`);
  while (row < height) {
    const count = next();
    const value = next();
    if (count > 0) {
      // A run: `count` pixels of one index (RLE4: two indices, alternating).
      if (x + count > width) throw overrun();
      for (let i = 0; i < count; i++) put(four ? (i % 2 === 0 ? value >> 4 : value & 0x0f) : value);
      if (pacer.tick(count + 1)) await pacer.pause();
    } else if (value === 0) {
      row++;
      x = 0;
      if (pacer.tick(1)) await pacer.pause();
    } else if (value === 1) {
      break;
    } else if (value === 2) {
      const dx = next();
      const dy = next();
      if (x + dx > width || row + dy >= height) throw invalid(`RLE delta (${dx}, ${dy}) leaves the image`);
      x += dx;
      row += dy;
      if (pacer.tick(1)) await pacer.pause();
    } else {
      // A literal group of `value` indices, padded to an even number of bytes.
      const length = value;
      const size = four ? Math.ceil(length / 2) : length;
      if (x + length > width) throw overrun();
      if (at + size > bytes.length) throw invalid("RLE data ends before the image does");
      for (let i = 0; i < length; i++) {
        const byte = bytes[at + (four ? i >> 1 : i)]!;
        put(four ? (i % 2 === 0 ? byte >> 4 : byte & 0x0f) : byte);
      }
      at += size + (size % 2);
      if (pacer.tick(length + 1)) await pacer.pause();
    }
  }
  return out;
}
