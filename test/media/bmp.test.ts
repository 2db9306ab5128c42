import { expect } from "chai";
import { decodeImage, DEFAULT_MAX_ALLOC, type ImageDecoderLimits } from "../../src/media/image-decoder.js";
import { readBmpHeader } from "../../src/media/bmp.js";
import { MediaError } from "../../src/media/errors.js";
import type { DecodedMedia } from "../../src/media/tensor.js";
import { expectRejection, prng } from "../support/index.js";
import { encodeRaw, pattern, ruleHash, sameBytes } from "./fixtures.js";
import { buildBmp, expandPalette, pack24, packIndices, packRle, packWords, type BmpFields } from "./fixtures/bmp.js";

const LIMITS: ImageDecoderLimits = { maxImageWidth: null, maxImageHeight: null, maxAlloc: DEFAULT_MAX_ALLOC };

const rejects = (promise: Promise<unknown>) => expectRejection(promise, { type: MediaError });



/** Odd sizes, so that every row of every depth needs padding. */
const W = 13;
const H = 6;
const RGB = pattern(W * H * 3, 31, 7);
const RGBA = pattern(W * H * 4, 13, 1);
const PALETTE = pattern(256 * 3, 17, 3);
/** Indices with runs and lone values, so RLE uses runs and literal groups. */
const INDICES = Uint8Array.from({ length: W * H }, (_, i) => [3, 3, 3, 3, 9, 200, 17, 17, 5, 77, 140, 2][i % 12]!);
const low = (bits: number): Uint8Array => INDICES.map((v) => v & ((1 << bits) - 1));

const widen5 = (v: number): number => Math.round((v * 255) / 31);
const widen6 = (v: number): number => Math.round((v * 255) / 63);
/** RGB reduced to 5-5-5 / 5-6-5 and widened back, as the decoder must give it. */
const rgb555 = Uint8Array.from(RGB, (v) => widen5(v >> 3));
const rgb565 = Uint8Array.from(RGB, (v, i) => (i % 3 === 1 ? widen6(v >> 2) : widen5(v >> 3)));

const at = (x: number, y: number, c: number, channels = 3, data = RGB): number => data[(y * W + x) * channels + c]!;
const word32 = (r: number, g: number, b: number, a = 0): number => ((a << 24) | (r << 16) | (g << 8) | b) >>> 0;

interface Case {
  readonly name: string;
  readonly bmp: () => Buffer;
  readonly channels: 3 | 4;
  readonly expected: Uint8Array;
}

const CASES: Case[] = [
  {
    name: "24-bit bottom-up",
    bmp: () => buildBmp({ width: W, height: H, bitsPerPixel: 24, pixelData: pack24(RGB, W, H) }),
    channels: 3,
    expected: RGB,
  },
  {
    name: "24-bit top-down (negative height)",
    bmp: () => buildBmp({ width: W, height: -H, bitsPerPixel: 24, pixelData: pack24(RGB, W, H, true) }),
    channels: 3,
    expected: RGB,
  },
  {
    name: "24-bit with a core (OS/2 1.x) header",
    bmp: () => buildBmp({ headerSize: 12, width: W, height: H, bitsPerPixel: 24, pixelData: pack24(RGB, W, H) }),
    channels: 3,
    expected: RGB,
  },
  {
    name: "24-bit with a V5 header",
    bmp: () => buildBmp({ headerSize: 124, width: W, height: H, bitsPerPixel: 24, pixelData: pack24(RGB, W, H) }),
    channels: 3,
    expected: RGB,
  },
  {
    name: "32-bit BITFIELDS with alpha (V4 header)",
    bmp: () =>
      buildBmp({
        headerSize: 108,
        width: W,
        height: H,
        bitsPerPixel: 32,
        compression: 3,
        masks: [0x00ff0000, 0x0000ff00, 0x000000ff, 0xff000000],
        pixelData: packWords(W, H, 32, (x, y) => word32(at(x, y, 0, 4, RGBA), at(x, y, 1, 4, RGBA), at(x, y, 2, 4, RGBA), at(x, y, 3, 4, RGBA))),
      }),
    channels: 4,
    expected: RGBA,
  },
  {
    name: "32-bit BITFIELDS with alpha, top-down, V5 header, masks in RGBA byte order",
    bmp: () =>
      buildBmp({
        headerSize: 124,
        width: W,
        height: -H,
        bitsPerPixel: 32,
        compression: 3,
        masks: [0x000000ff, 0x0000ff00, 0x00ff0000, 0xff000000],
        pixelData: packWords(
          W,
          H,
          32,
          (x, y) => word32(at(x, y, 2, 4, RGBA), at(x, y, 1, 4, RGBA), at(x, y, 0, 4, RGBA), at(x, y, 3, 4, RGBA)),
          true,
        ),
      }),
    channels: 4,
    expected: RGBA,
  },
  {
    name: "32-bit without alpha: the fourth byte is not alpha",
    bmp: () =>
      buildBmp({
        width: W,
        height: H,
        bitsPerPixel: 32,
        pixelData: packWords(W, H, 32, (x, y) => word32(at(x, y, 0), at(x, y, 1), at(x, y, 2), 0x5a)),
      }),
    channels: 3,
    expected: RGB,
  },
  {
    name: "32-bit BITFIELDS without an alpha mask (info header + masks)",
    bmp: () =>
      buildBmp({
        width: W,
        height: H,
        bitsPerPixel: 32,
        compression: 3,
        masks: [0x00ff0000, 0x0000ff00, 0x000000ff],
        pixelData: packWords(W, H, 32, (x, y) => word32(at(x, y, 0), at(x, y, 1), at(x, y, 2), 0xff)),
      }),
    channels: 3,
    expected: RGB,
  },
  {
    name: "32-bit with a V4 header but BI_RGB: still no alpha",
    bmp: () =>
      buildBmp({
        headerSize: 108,
        width: W,
        height: H,
        bitsPerPixel: 32,
        masks: [0x00ff0000, 0x0000ff00, 0x000000ff, 0xff000000],
        pixelData: packWords(W, H, 32, (x, y) => word32(at(x, y, 0), at(x, y, 1), at(x, y, 2), 0x11)),
      }),
    channels: 3,
    expected: RGB,
  },
  {
    name: "16-bit BI_RGB (5-5-5)",
    bmp: () =>
      buildBmp({
        width: W,
        height: H,
        bitsPerPixel: 16,
        pixelData: packWords(W, H, 16, (x, y) => ((at(x, y, 0) >> 3) << 10) | ((at(x, y, 1) >> 3) << 5) | (at(x, y, 2) >> 3)),
      }),
    channels: 3,
    expected: rgb555,
  },
  {
    name: "16-bit BITFIELDS (5-6-5)",
    bmp: () =>
      buildBmp({
        width: W,
        height: H,
        bitsPerPixel: 16,
        compression: 3,
        masks: [0xf800, 0x07e0, 0x001f],
        pixelData: packWords(W, H, 16, (x, y) => ((at(x, y, 0) >> 3) << 11) | ((at(x, y, 1) >> 2) << 5) | (at(x, y, 2) >> 3)),
      }),
    channels: 3,
    expected: rgb565,
  },
  {
    name: "8-bit palette",
    bmp: () => buildBmp({ width: W, height: H, bitsPerPixel: 8, palette: PALETTE, pixelData: packIndices(INDICES, W, H, 8) }),
    channels: 3,
    expected: expandPalette(INDICES, PALETTE),
  },
  {
    name: "8-bit palette, top-down",
    bmp: () => buildBmp({ width: W, height: -H, bitsPerPixel: 8, palette: PALETTE, pixelData: packIndices(INDICES, W, H, 8, true) }),
    channels: 3,
    expected: expandPalette(INDICES, PALETTE),
  },
  {
    name: "8-bit palette of 100 colours: indices past it are black",
    bmp: () =>
      buildBmp({ width: W, height: H, bitsPerPixel: 8, colorsUsed: 100, palette: PALETTE.subarray(0, 300), pixelData: packIndices(INDICES, W, H, 8) }),
    channels: 3,
    expected: expandPalette(INDICES, PALETTE.subarray(0, 300)),
  },
  {
    name: "8-bit palette with a core header (3-byte entries)",
    bmp: () => buildBmp({ headerSize: 12, width: W, height: H, bitsPerPixel: 8, palette: PALETTE, pixelData: packIndices(INDICES, W, H, 8) }),
    channels: 3,
    expected: expandPalette(INDICES, PALETTE),
  },
  ...[4, 2, 1].map(
    (bits): Case => ({
      name: `${bits}-bit palette`,
      bmp: () =>
        buildBmp({ width: W, height: H, bitsPerPixel: bits, palette: PALETTE.subarray(0, 3 << bits), pixelData: packIndices(low(bits), W, H, bits) }),
      channels: 3,
      expected: expandPalette(low(bits), PALETTE),
    }),
  ),
  {
    name: "RLE8",
    bmp: () => buildBmp({ width: W, height: H, bitsPerPixel: 8, compression: 1, palette: PALETTE, pixelData: packRle(INDICES, W, H, 8) }),
    channels: 3,
    expected: expandPalette(INDICES, PALETTE),
  },
  {
    name: "RLE4",
    bmp: () =>
      buildBmp({ width: W, height: H, bitsPerPixel: 4, compression: 2, palette: PALETTE.subarray(0, 48), pixelData: packRle(low(4), W, H, 4) }),
    channels: 3,
    expected: expandPalette(low(4), PALETTE),
  },
];

const ALPHA_CASE = CASES.find((c) => c.channels === 4)!;

/** A 4×3 RLE8 image from hand-written codes (rows bottom-up); skipped pixels are black. */
function rle8(codes: number[], width = 4, height = 3): Buffer {
  return buildBmp({ width, height, bitsPerPixel: 8, compression: 1, palette: PALETTE, pixelData: Buffer.from(codes) });
}

/** RGB rows (top first) of palette indices, -1 for black. */
function rgbOf(rows: number[][]): Uint8Array {
  return Uint8Array.from(rows.flat().flatMap((i) => (i < 0 ? [0, 0, 0] : Array.from(PALETTE.subarray(3 * i, 3 * i + 3)))));
}

async function expectPixels(decoded: DecodedMedia, shape: number[], expected: Uint8Array, name: string): Promise<void> {
  expect(decoded.tensorInfo.shape, name).to.deep.equal(shape);
  expect(decoded.tensorInfo.metadata, name).to.deep.equal({
    Image: { format: "Bmp", color_type: shape[2] === 4 ? "Rgba8" : "Rgb8", layout: "HWC" },
  });
  expect(sameBytes(decoded.data, expected), name).to.equal(true);
  expect(decoded.contentHash, name).to.equal(ruleHash(shape, expected));
}

describe("BMP decoding", () => {
  describe("pixels", () => {
    for (const c of CASES) {
      it(`${c.name}: exact pixels, hashing as the same pixels in a PNG`, async () => {
        const decoded = await decodeImage(c.bmp(), LIMITS);
        await expectPixels(decoded, [H, W, c.channels], c.expected, c.name);
        const png = await decodeImage(await encodeRaw(c.expected, W, H, c.channels, "png"), LIMITS);
        expect(decoded.contentHash).to.equal(png.contentHash);
      });
    }

    it("drops alpha with forceRgb", async () => {
      const decoded = await decodeImage(ALPHA_CASE.bmp(), LIMITS, { forceRgb: true });
      expect(decoded.tensorInfo.shape).to.deep.equal([H, W, 3]);
      expect(sameBytes(decoded.data, Uint8Array.from({ length: W * H * 3 }, (_, i) => RGBA[Math.floor(i / 3) * 4 + (i % 3)]!))).to.equal(true);
    });

    it("widens 16-bit channels as the reference does (anchors)", async () => {
      // 5-6-5 white, a mid grey and the lowest non-zero steps.
      const words = [0xffff, 0x8410, 0x0821, 0x0000];
      const bmp = buildBmp({ width: 4, height: 1, bitsPerPixel: 16, compression: 3, masks: [0xf800, 0x07e0, 0x001f], pixelData: packWords(4, 1, 16, (x) => words[x]!) });
      const decoded = await decodeImage(bmp, LIMITS);
      expect(Array.from(decoded.data)).to.deep.equal([255, 255, 255, 132, 130, 132, 8, 4, 8, 0, 0, 0]);
    });

    it("follows RLE8 end-of-line, delta and end-of-bitmap codes, leaving skipped pixels black", async () => {
      const codes = [
        2, 1, 0, 0, // bottom row: a run of two 1s, end of line
        0, 2, 1, 0, // middle row: delta (+1, +0)
        0, 3, 5, 6, 7, 0, // a literal group of three, padded to an even length
        0, 0, // end of line
        1, 9, 0, 1, // top row: one 9, end of bitmap
      ];
      const decoded = await decodeImage(rle8(codes), LIMITS);
      const expected = rgbOf([
        [9, -1, -1, -1],
        [-1, 5, 6, 7],
        [1, 1, -1, -1],
      ]);
      await expectPixels(decoded, [3, 4, 3], expected, "rle8 codes");
    });

    it("accepts RLE8 whose last row ends with end-of-line instead of end-of-bitmap, and a delta across rows", async () => {
      const codes = [
        1, 4, // bottom: 4 . . .
        0, 2, 2, 2, // delta (+2, +2): top row, x=3
        1, 8, 0, 0, // top: . . . 8, EOL ends the image
      ];
      const decoded = await decodeImage(rle8(codes), LIMITS);
      await expectPixels(decoded, [3, 4, 3], rgbOf([[-1, -1, -1, 8], [-1, -1, -1, -1], [4, -1, -1, -1]]), "rle8 delta");
    });

    it("alternates the two indices of an RLE4 run and reads odd RLE4 literal groups", async () => {
      const codes = [5, 0x12, 0, 0, 0, 3, 0x34, 0x50, 0, 1];
      const bmp = buildBmp({ width: 5, height: 2, bitsPerPixel: 4, compression: 2, palette: PALETTE.subarray(0, 48), pixelData: Buffer.from(codes) });
      const decoded = await decodeImage(bmp, LIMITS);
      await expectPixels(decoded, [2, 5, 3], rgbOf([[3, 4, 5, -1, -1], [1, 2, 1, 2, 1]]), "rle4");
    });

    it("reads the header without touching the pixel data", () => {
      const header = readBmpHeader(ALPHA_CASE.bmp());
      expect([header.width, header.height, header.channels, header.compression, header.topDown]).to.deep.equal([W, H, 4, "bitfields", false]);
    });
  });

  describe("limits", () => {
    it("refuses a 100000x100000 header with the allocation error, fast and without allocating", async () => {
      for (const [bits, channels] of [[24, 3], [8, 3]] as const) {
        const bmp = buildBmp({ width: 100_000, height: 100_000, bitsPerPixel: bits, palette: bits === 8 ? PALETTE : undefined, pixelData: Buffer.alloc(64) });
        expect(bmp.length).to.be.below(2048);
        const before = process.memoryUsage();
        const started = performance.now();
        const error = await rejects(decodeImage(bmp, LIMITS));
        expect(performance.now() - started).to.be.below(250);
        expect(error.code).to.equal("IMAGE_ALLOCATION_EXCEEDS_LIMIT");
        expect(error.message).to.equal(`Image allocation ${100_000 * 100_000 * channels} bytes exceeds configured limit 134217728 bytes`);
        expect(error.status).to.equal(3);
        const after = process.memoryUsage();
        expect(after.arrayBuffers - before.arrayBuffers).to.be.below(16 * 1024 * 1024);
        expect(after.rss - before.rss).to.be.below(64 * 1024 * 1024);
      }
    });

    it("counts the alpha channel and checks width and height limits with the shared messages", async () => {
      const bmp = ALPHA_CASE.bmp();
      const error = await rejects(decodeImage(bmp, { ...LIMITS, maxAlloc: W * H * 4 - 1 }));
      expect(error.message).to.equal(`Image allocation ${W * H * 4} bytes exceeds configured limit ${W * H * 4 - 1} bytes`);
      expect((await decodeImage(bmp, { ...LIMITS, maxAlloc: W * H * 3 }, { forceRgb: true })).data.length).to.equal(W * H * 3);
      const wide = await rejects(decodeImage(bmp, { ...LIMITS, maxImageWidth: W - 1 }));
      expect(wide.code).to.equal("IMAGE_DIMENSIONS_EXCEED_LIMITS");
      expect(wide.message).to.equal(`Image dimensions exceed configured limits: ${W}x${H}`);
      const tall = await rejects(decodeImage(bmp, { ...LIMITS, maxImageHeight: H - 1 }));
      expect(tall.code).to.equal("IMAGE_DIMENSIONS_EXCEED_LIMITS");
    });

    it("refuses a header within the limits whose pixel data is not in the file, before allocating", async () => {
      const bmp = buildBmp({ width: 4000, height: 3000, bitsPerPixel: 24, pixelData: Buffer.alloc(64) });
      const before = process.memoryUsage().arrayBuffers;
      const error = await rejects(decodeImage(bmp, LIMITS));
      expect(error.code).to.equal("IMAGE_DECODE_FAILED");
      expect(error.message).to.match(/^Failed to decode image: BMP pixel data is truncated/);
      expect(process.memoryUsage().arrayBuffers - before).to.be.below(16 * 1024 * 1024);
    });
  });

  describe("hostile and truncated files", () => {
    const base: BmpFields = { width: 4, height: 3, bitsPerPixel: 24, pixelData: pack24(pattern(36), 4, 3) };
    const palette8: BmpFields = { width: 4, height: 3, bitsPerPixel: 8, palette: PALETTE, pixelData: packIndices(INDICES.subarray(0, 12), 4, 3, 8) };
    const HOSTILE: Array<[string, () => Buffer, RegExp]> = [
      ["pixel data offset past the end", () => buildBmp({ ...base, dataOffset: 10_000 }), /offset 10000 is past the end/],
      ["pixel data offset into the headers", () => buildBmp({ ...base, dataOffset: 20 }), /points into the headers/],
      ["pixel data offset 0xffffffff", () => buildBmp({ ...base, dataOffset: 0xffffffff }), /past the end/],
      ["pixel data offset leaving too little data", () => buildBmp({ ...base, dataOffset: 14 + 40 + 8 }), /pixel data is truncated/],
      ["palette larger than 2^bits", () => buildBmp({ ...palette8, colorsUsed: 257 }), /palette of 257 colours exceeds 256/],
      ["palette of 2^32-1 colours", () => buildBmp({ ...palette8, colorsUsed: 0xffffffff }), /exceeds 256/],
      ["palette larger than the file", () => buildBmp({ ...palette8, palette: PALETTE.subarray(0, 30), pixelData: Buffer.alloc(0) }), /palette extends past/],
      ["1-bit palette claiming 3 colours", () => buildBmp({ ...palette8, bitsPerPixel: 1, colorsUsed: 3 }), /exceeds 2 for 1 bits/],
      ["zero width", () => buildBmp({ ...base, width: 0 }), /width 0 is not positive/],
      ["negative width", () => buildBmp({ ...base, width: -4 }), /width -4 is not positive/],
      ["zero height", () => buildBmp({ ...base, height: 0 }), /height is zero/],
      ["height of -2^31", () => buildBmp({ ...base, height: -0x80000000 }), /height -2147483648 is invalid/],
      ["zero-width core header", () => buildBmp({ ...base, headerSize: 12, width: 0 }), /width 0/],
      ["header size 0", () => buildBmp({ ...base, headerSize: 0 }), /info header size 0 is not a known/],
      ["header size 41", () => buildBmp({ ...base, headerSize: 41 }), /info header size 41/],
      ["header size 0xffffffff", () => buildBmp({ ...base, headerSize: 0xffffffff }), /info header size 4294967295/],
      ["header size larger than the file", () => buildBmp({ ...base, headerSize: 124 }).subarray(0, 100), /header is truncated/],
      ["2 planes", () => buildBmp({ ...base, planes: 2 }), /2 planes/],
      ["0 bits per pixel", () => buildBmp({ ...base, bitsPerPixel: 0 }), /0 bits per pixel/],
      ["64 bits per pixel", () => buildBmp({ ...base, bitsPerPixel: 64 }), /64 bits per pixel/],
      ["RLE8 with 24 bits", () => buildBmp({ ...base, compression: 1 }), /RLE8 with 24/],
      ["RLE4 with 8 bits", () => buildBmp({ ...palette8, compression: 2 }), /RLE4 with 8/],
      ["BITFIELDS with 24 bits", () => buildBmp({ ...base, compression: 3, masks: [0xff0000, 0xff00, 0xff] }), /BITFIELDS with 24/],
      ["unknown compression", () => buildBmp({ ...base, compression: 99 }), /compression type 99 is unknown/],
      ["ALPHABITFIELDS (6)", () => buildBmp({ ...base, compression: 6 }), /compression type 6/],
      ["top-down RLE", () => buildBmp({ ...palette8, height: -3, compression: 1, pixelData: Buffer.from([4, 1, 0, 1]) }), /top-down images cannot be RLE/],
      ["non-contiguous mask", () => buildBmp({ ...base, bitsPerPixel: 32, compression: 3, masks: [0xff00ff, 0xff00, 0xff] }), /not contiguous/],
      ["16-bit mask wider than the pixel", () => buildBmp({ ...base, bitsPerPixel: 16, compression: 3, masks: [0x1f0000, 0x7e0, 0x1f] }), /does not fit 16-bit/],
      ["missing colour mask", () => buildBmp({ ...base, bitsPerPixel: 32, compression: 3, masks: [0xff0000, 0, 0xff] }), /missing a colour/],
      ["RLE run past the end of a row", () => rle8([5, 1, 0, 1]), /overruns row 0/],
      ["RLE literal past the end of a row", () => rle8([2, 1, 0, 3, 1, 2, 3, 0, 0, 1]), /overruns row 0/],
      ["RLE delta below the image", () => rle8([0, 2, 0, 3, 0, 1]), /delta \(0, 3\) leaves the image/],
      ["RLE delta past the right edge", () => rle8([0, 2, 5, 0, 0, 1]), /delta \(5, 0\) leaves/],
      ["RLE data without an end", () => rle8([4, 1, 0, 0, 4, 2]), /RLE data ends before the image does/],
      ["RLE literal cut by the end of the file", () => rle8([0, 4, 1, 2]), /RLE data ends/],
      ["RLE data that stops after two end-of-line codes", () => rle8([0, 0, 0, 0]), /RLE data ends/],
    ];

    for (const [name, make, message] of HOSTILE) {
      it(`${name}: a typed INVALID_ARGUMENT error`, async () => {
        const error = await rejects(decodeImage(make(), LIMITS));
        expect(error.code, name).to.equal("IMAGE_DECODE_FAILED");
        expect(error.status).to.equal(3);
        expect(error.message, name).to.match(/^Failed to decode image: BMP /);
        expect(error.message, name).to.match(message);
      });
    }

    it("refuses JPEG- and PNG-compressed and CMYK BMPs as unsupported", async () => {
      for (const [compression, what] of [[4, "JPEG compression"], [5, "PNG compression"], [11, "CMYK data"]] as const) {
        const error = await rejects(decodeImage(buildBmp({ ...base, compression }), LIMITS));
        expect(error.code).to.equal("IMAGE_FORMAT_UNSUPPORTED");
        expect(error.status).to.equal(3);
        expect(error.message).to.equal(`Unsupported image format: Bmp with ${what}`);
      }
    });

    it("refuses every truncation of valid files with a typed error", async () => {
      for (const c of CASES) {
        const bmp = c.bmp();
        for (let length = 0; length < bmp.length; length++) {
          const error = await rejects(decodeImage(bmp.subarray(0, length), LIMITS));
          expect(["IMAGE_DECODE_FAILED", "IMAGE_FORMAT_UNSUPPORTED"], `${c.name} cut at ${length}`).to.include(error.code);
          expect(error.status).to.equal(3);
        }
      }
    });

    it("gives pixels or the typed error for mutated files (seeded fuzz)", async function () {
      this.timeout(60_000);
      const random = prng(0x5eed);
      const int = (n: number): number => Math.floor(random() * n);
      const seeds = CASES.map((c) => c.bmp());
      const interesting = [0, 1, 2, 3, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x7fffffff, 0x80000000, 0xffffffff, 100_000];
      const limits: ImageDecoderLimits = { ...LIMITS, maxAlloc: 4 * 1024 * 1024 };
      const outcomes = { decoded: 0, refused: 0 };
      for (let round = 0; round < 3000; round++) {
        const bmp = Buffer.from(seeds[int(seeds.length)]!);
        for (let m = 1 + int(4); m > 0; m--) {
          const kind = int(4);
          // Mostly the headers (first 70 bytes), sometimes anywhere.
          const offset = int(kind === 3 ? bmp.length : Math.min(70, bmp.length - 4));
          if (kind === 0) bmp[offset] = int(256);
          else if (kind === 1) bmp.writeUInt32LE(interesting[int(interesting.length)]! >>> 0, offset);
          else if (kind === 2) bmp.writeUInt16LE(int(0x10000), offset);
          else bmp[offset] = bmp[offset]! ^ (1 << int(8));
        }
        const input = random() < 0.2 ? bmp.subarray(0, int(bmp.length)) : bmp;
        try {
          const decoded = await decodeImage(input, limits);
          const [h, w, c] = decoded.tensorInfo.shape as [number, number, number];
          expect(decoded.data.length).to.equal(h * w * c);
          expect([3, 4]).to.include(c);
          expect(decoded.contentHash).to.equal(ruleHash([h, w, c], decoded.data));
          outcomes.decoded++;
        } catch (error) {
          if (!(error instanceof MediaError)) throw new Error(`round ${round}: untyped ${String(error)}`, { cause: error });
          expect(error.status, error.message).to.equal(3);
          outcomes.refused++;
        }
      }
      // Both outcomes occur: the mutations are neither all harmless nor all fatal.
      expect(outcomes.decoded).to.be.above(100);
      expect(outcomes.refused).to.be.above(100);
    });
  });

  describe("cancellation", () => {
    it("honours an aborted signal before decoding", async () => {
      const controller = new AbortController();
      controller.abort();
      const error = await expectRejection(decodeImage(CASES[0]!.bmp(), LIMITS, { signal: controller.signal }));
      expect((error as Error).name).to.equal("AbortError");
    });

    it("yields to the event loop while decoding a large BMP and stops when aborted", async () => {
      const [w, h] = [2000, 2000];
      const bmp = buildBmp({ width: w, height: h, bitsPerPixel: 24, pixelData: Buffer.alloc(w * 3 * h, 0x40) });
      const controller = new AbortController();
      let ticks = 0;
      const ticker = setInterval(() => ticks++, 0);
      try {
        // Without abort: decodes, and timers ran during the decode.
        const decoded = await decodeImage(bmp, LIMITS);
        expect(decoded.data.length).to.equal(w * h * 3);
        const promise = decodeImage(bmp, LIMITS, { signal: controller.signal });
        setImmediate(() => controller.abort());
        const error = await expectRejection(promise);
        expect((error as Error).name).to.equal("AbortError");
      } finally {
        clearInterval(ticker);
      }
      expect(ticks).to.be.above(0);
    });
  });
});
