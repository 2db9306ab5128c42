import { expect } from "chai";
import sharp from "sharp";
import { decodeImage, DEFAULT_MAX_ALLOC, type ImageDecoderLimits } from "../../src/media/image-decoder.js";
import { MediaError } from "../../src/media/errors.js";
import { expectRejection } from "../support/index.js";
import { claimedPng, encodeRaw, pattern, ruleHash } from "./fixtures.js";

const DEFAULT_LIMITS: ImageDecoderLimits = { maxImageWidth: null, maxImageHeight: null, maxAlloc: DEFAULT_MAX_ALLOC };

const rejects = (promise: Promise<unknown>) => expectRejection(promise, { type: MediaError });


describe("image decoder", () => {
  it("round-trips RGB PNG pixels exactly and hashes them by the canonical rule", async () => {
    const [w, h] = [37, 23];
    const raw = pattern(w * h * 3);
    const decoded = await decodeImage(await encodeRaw(raw, w, h, 3, "png"), DEFAULT_LIMITS);
    expect(decoded.tensorInfo.shape).to.deep.equal([h, w, 3]);
    expect(decoded.tensorInfo.dtype).to.equal("UINT8");
    expect(decoded.tensorInfo.metadata).to.deep.equal({ Image: { format: "Png", color_type: "Rgb8", layout: "HWC" } });
    expect(Buffer.from(decoded.data).equals(Buffer.from(raw))).to.equal(true);
    expect(decoded.contentHash).to.equal(ruleHash([h, w, 3], raw));
  });

  it("round-trips lossless WebP exactly, RGBA staying 4 channels", async () => {
    const raw = pattern(16 * 9 * 4, 13, 1);
    const decoded = await decodeImage(await encodeRaw(raw, 16, 9, 4, "webp-lossless"), DEFAULT_LIMITS);
    expect(decoded.tensorInfo.shape).to.deep.equal([9, 16, 4]);
    expect(decoded.tensorInfo.metadata).to.deep.equal({ Image: { format: "WebP", color_type: "Rgba8", layout: "HWC" } });
    expect(Buffer.from(decoded.data).equals(Buffer.from(raw))).to.equal(true);
  });

  it("keeps RGBA PNG at 4 channels", async () => {
    const raw = pattern(5 * 4 * 4, 5, 3);
    const decoded = await decodeImage(await encodeRaw(raw, 5, 4, 4, "png"), DEFAULT_LIMITS);
    expect(decoded.tensorInfo.shape).to.deep.equal([4, 5, 4]);
    expect(Buffer.from(decoded.data).equals(Buffer.from(raw))).to.equal(true);
  });

  it("keeps grey at 1 channel and grey+alpha at 2", async () => {
    const grey = pattern(7 * 3, 13, 0);
    const g = await decodeImage(await encodeRaw(grey, 7, 3, 1, "png"), DEFAULT_LIMITS);
    expect(g.tensorInfo.shape).to.deep.equal([3, 7, 1]);
    expect(g.tensorInfo.metadata).to.deep.equal({ Image: { format: "Png", color_type: "L8", layout: "HWC" } });
    expect(Buffer.from(g.data).equals(Buffer.from(grey))).to.equal(true);

    const la = pattern(7 * 3 * 2, 7, 0);
    const d = await decodeImage(await encodeRaw(la, 7, 3, 2, "png"), DEFAULT_LIMITS);
    expect(d.tensorInfo.shape).to.deep.equal([3, 7, 2]);
    expect((d.tensorInfo.metadata as { Image: { color_type: string } }).Image.color_type).to.equal("La8");
    expect(Buffer.from(d.data).equals(Buffer.from(la))).to.equal(true);
  });

  it("forces RGB when asked: alpha dropped, grey expanded", async () => {
    const raw = pattern(6 * 2 * 4);
    const d = await decodeImage(await encodeRaw(raw, 6, 2, 4, "png"), DEFAULT_LIMITS, { forceRgb: true });
    expect(d.tensorInfo.shape).to.deep.equal([2, 6, 3]);
    const rgb = Uint8Array.from({ length: 6 * 2 * 3 }, (_, i) => raw[Math.floor(i / 3) * 4 + (i % 3)]!);
    expect(Buffer.from(d.data).equals(Buffer.from(rgb))).to.equal(true);

    const grey = await decodeImage(await encodeRaw(pattern(4), 2, 2, 1, "png"), DEFAULT_LIMITS, { forceRgb: true });
    expect(grey.tensorInfo.shape).to.deep.equal([2, 2, 3]);
  });

  it("decodes JPEG, GIF (first frame), TIFF and AVIF to the right shapes", async () => {
    const raw = pattern(16 * 8 * 3, 1, 0);
    for (const [format, name] of [["jpeg", "Jpeg"], ["gif", "Gif"], ["tiff", "Tiff"], ["avif", "Avif"]] as const) {
      const d = await decodeImage(await encodeRaw(raw, 16, 8, 3, format), DEFAULT_LIMITS);
      expect(d.tensorInfo.shape.slice(0, 2), format).to.deep.equal([8, 16]);
      expect((d.tensorInfo.metadata as { Image: { format: string } }).Image.format).to.equal(name);
    }
  });

  it("decodes CMYK JPEG to RGB and 16-bit PNG to 8 bits", async () => {
    const cmyk = await sharp({ create: { width: 8, height: 4, channels: 3, background: "#ff0000" } }).toColourspace("cmyk").jpeg().toBuffer();
    const c = await decodeImage(cmyk, DEFAULT_LIMITS);
    expect(c.tensorInfo.shape).to.deep.equal([4, 8, 3]);
    const deep = await sharp({ create: { width: 8, height: 4, channels: 4, background: { r: 255, g: 0, b: 0, alpha: 0.5 } } })
      .toColourspace("rgb16")
      .png()
      .toBuffer();
    const d = await decodeImage(deep, DEFAULT_LIMITS);
    expect(d.tensorInfo.shape).to.deep.equal([4, 8, 4]);
    expect(Array.from(d.data.subarray(0, 4))).to.deep.equal([255, 0, 0, 128]);
  });

  it("ignores EXIF orientation by default and applies it on request", async () => {
    const jpeg = await sharp(Buffer.from(pattern(64 * 48 * 3)), { raw: { width: 64, height: 48, channels: 3 } })
      .jpeg()
      .withMetadata({ orientation: 6 })
      .toBuffer();
    expect((await decodeImage(jpeg, DEFAULT_LIMITS)).tensorInfo.shape).to.deep.equal([48, 64, 3]);
    expect((await decodeImage(jpeg, DEFAULT_LIMITS, { applyExifOrientation: true })).tensorInfo.shape).to.deep.equal([64, 48, 3]);
  });

  it("rejects images wider or taller than the limits, with the reference's message", async () => {
    const png = await encodeRaw(pattern(20 * 10 * 3), 20, 10, 3, "png");
    const wide = await rejects(decodeImage(png, { ...DEFAULT_LIMITS, maxImageWidth: 19 }));
    expect(wide.code).to.equal("IMAGE_DIMENSIONS_EXCEED_LIMITS");
    expect(wide.message).to.equal("Image dimensions exceed configured limits: 20x10");
    const tall = await rejects(decodeImage(png, { ...DEFAULT_LIMITS, maxImageHeight: 9 }));
    expect(tall.message).to.equal("Image dimensions exceed configured limits: 20x10");
    await decodeImage(png, { ...DEFAULT_LIMITS, maxImageWidth: 20, maxImageHeight: 10 });
  });

  it("rejects 8000x8000 RGB under the default 128 MiB allocation limit", async () => {
    const error = await rejects(decodeImage(claimedPng(8000, 8000), DEFAULT_LIMITS));
    expect(error.code).to.equal("IMAGE_ALLOCATION_EXCEEDS_LIMIT");
    expect(error.message).to.equal("Image allocation 192000000 bytes exceeds configured limit 134217728 bytes");
    expect(error.limit).to.equal(134217728n);
    expect(error.actual).to.equal(192000000n);
  });

  it("accepts 2000x2000 RGB under the default limit", async () => {
    const png = await sharp({ create: { width: 2000, height: 2000, channels: 3, background: { r: 1, g: 2, b: 3 } } }).png().toBuffer();
    const d = await decodeImage(png, DEFAULT_LIMITS);
    expect(d.tensorInfo.shape).to.deep.equal([2000, 2000, 3]);
    expect(d.data.length).to.equal(12_000_000);
  });

  it("counts channels in the allocation limit", async () => {
    const png = await encodeRaw(pattern(10 * 10 * 4), 10, 10, 4, "png");
    const error = await rejects(decodeImage(png, { ...DEFAULT_LIMITS, maxAlloc: 399 }));
    expect(error.message).to.equal("Image allocation 400 bytes exceeds configured limit 399 bytes");
    expect((await decodeImage(png, { ...DEFAULT_LIMITS, maxAlloc: 400 })).data.length).to.equal(400);
    expect((await decodeImage(png, { ...DEFAULT_LIMITS, maxAlloc: 300 }, { forceRgb: true })).data.length).to.equal(300);
  });

  it("rejects a decompression bomb from its header without decoding", async () => {
    const bomb = claimedPng(100_000, 100_000);
    expect(bomb.length).to.be.below(1024);
    const before = process.memoryUsage().rss;
    const error = await rejects(decodeImage(bomb, DEFAULT_LIMITS));
    expect(error.code).to.equal("IMAGE_ALLOCATION_EXCEEDS_LIMIT");
    expect(error.message).to.equal("Image allocation 30000000000 bytes exceeds configured limit 134217728 bytes");
    // Nothing near the claimed size was allocated.
    expect(process.memoryUsage().rss - before).to.be.below(256 * 1024 * 1024);
  });

  it("rejects truncated and garbage inputs as decode errors", async () => {
    const png = await encodeRaw(pattern(64 * 64 * 3, 97, 11), 64, 64, 3, "png");
    const jpeg = await encodeRaw(pattern(64 * 64 * 3, 97, 11), 64, 64, 3, "jpeg");
    for (const bad of [png.subarray(0, png.length / 2), png.subarray(0, 40), jpeg.subarray(0, jpeg.length / 2)]) {
      const error = await rejects(decodeImage(bad, DEFAULT_LIMITS));
      expect(error.code).to.equal("IMAGE_DECODE_FAILED");
      expect(error.status).to.equal(3);
    }
    const garbage = await rejects(decodeImage(Buffer.from("definitely not an image"), DEFAULT_LIMITS));
    expect(garbage.code).to.equal("IMAGE_FORMAT_UNSUPPORTED");
    const empty = await rejects(decodeImage(new Uint8Array(0), DEFAULT_LIMITS));
    expect(empty.code).to.equal("IMAGE_FORMAT_UNSUPPORTED");
    // BMP is decoded (test/media/bmp.test.ts); a truncated header is a decode error.
    const bmp = await rejects(decodeImage(Buffer.from("BM\0\0\0\0\0\0\0\0"), DEFAULT_LIMITS));
    expect(bmp.code).to.equal("IMAGE_DECODE_FAILED");
    expect(bmp.message).to.equal("Failed to decode image: BMP header is truncated");
    const svg = await rejects(decodeImage(Buffer.from('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>'), DEFAULT_LIMITS));
    expect(svg.code).to.equal("IMAGE_FORMAT_UNSUPPORTED");
  });
});
