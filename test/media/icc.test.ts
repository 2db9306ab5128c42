import { expect } from "chai";
import sharp from "sharp";
import { decodeImage, DEFAULT_MAX_ALLOC, type ImageDecoderLimits } from "../../src/media/image-decoder.js";
import { encodeRaw, pattern, ruleHash, sameBytes } from "./fixtures.js";
import {
  ADOBE_RGB_PRIMARIES,
  gifWithIcc,
  greyProfile,
  jpegWithIcc,
  jpegWithoutIcc,
  pngWithIcc,
  rgbProfile,
  webpWithIcc,
} from "./fixtures/icc.js";

const LIMITS: ImageDecoderLimits = { maxImageWidth: null, maxImageHeight: null, maxAlloc: DEFAULT_MAX_ALLOC };



/** What sharp gives by default: pixels converted through the embedded profile. */
async function sharpDefault(image: Buffer, channels: number): Promise<Buffer> {
  let s = sharp(image);
  if (channels === 1) s = s.toColourspace("b-w");
  return s.raw().toBuffer();
}

describe("embedded colour profiles", () => {
  const [w, h] = [19, 7];
  let adobe: Buffer;
  let p3: Buffer;
  let grey: Buffer;

  before(async () => {
    adobe = rgbProfile("Adobe RGB (1998) compatible test profile", ADOBE_RGB_PRIMARIES, 563 / 256);
    grey = greyProfile("Grey gamma 1.8 test profile", 1.8);
    // libvips' built-in Display P3 profile, as sharp embeds it.
    const tagged = await sharp({ create: { width: 1, height: 1, channels: 3, background: "#000" } }).withIccProfile("p3").png().toBuffer();
    p3 = (await sharp(tagged).metadata()).icc!;
    expect(p3.toString("latin1", 36, 40)).to.equal("acsp");
  });

  const profiles = (): Array<[string, Buffer]> => [
    ["Display P3", p3],
    ["Adobe RGB", adobe],
  ];

  for (const channels of [3, 4] as const) {
    it(`decodes ${channels}-channel PNG with P3 and Adobe RGB profiles to exactly the stored pixels`, async () => {
      const raw = pattern(w * h * channels, 37, 11);
      const plain = await encodeRaw(raw, w, h, channels, "png");
      for (const [name, icc] of profiles()) {
        const png = pngWithIcc(plain, icc);
        const meta = await sharp(png).metadata();
        expect(meta.hasProfile, name).to.equal(true);
        expect(meta.icc!.equals(icc), name).to.equal(true);
        // The profile is real: sharp's default output differs from the stored pixels.
        expect(sameBytes(await sharpDefault(png, channels), raw), name).to.equal(false);

        const decoded = await decodeImage(png, LIMITS);
        expect(decoded.tensorInfo.shape, name).to.deep.equal([h, w, channels]);
        expect(decoded.tensorInfo.metadata).to.deep.equal({
          Image: { format: "Png", color_type: channels === 3 ? "Rgb8" : "Rgba8", layout: "HWC" },
        });
        expect(decoded.data.length).to.equal(w * h * channels);
        expect(sameBytes(decoded.data, raw), name).to.equal(true);
        expect(decoded.contentHash, name).to.equal(ruleHash([h, w, channels], raw));
        // The same image without a profile decodes to the same tensor.
        expect((await decodeImage(plain, LIMITS)).contentHash).to.equal(decoded.contentHash);
      }
    });

    it(`decodes ${channels}-channel lossless WebP with P3 and Adobe RGB profiles to exactly the stored pixels`, async () => {
      const raw = pattern(w * h * channels, 53, 5);
      const plain = await encodeRaw(raw, w, h, channels, "webp-lossless");
      for (const [name, icc] of profiles()) {
        const webp = webpWithIcc(plain, icc, w, h, channels === 4);
        const meta = await sharp(webp).metadata();
        expect(meta.hasProfile, name).to.equal(true);
        expect(meta.format).to.equal("webp");
        expect(sameBytes(await sharpDefault(webp, channels), raw), name).to.equal(false);

        const decoded = await decodeImage(webp, LIMITS);
        expect(decoded.tensorInfo.shape, name).to.deep.equal([h, w, channels]);
        expect((decoded.tensorInfo.metadata as { Image: { format: string } }).Image.format).to.equal("WebP");
        expect(sameBytes(decoded.data, raw), name).to.equal(true);
        expect(decoded.contentHash, name).to.equal(ruleHash([h, w, channels], raw));
      }
    });
  }

  it("keeps a grey PNG with a grey profile at 1 channel with its stored values (and grey+alpha at 2)", async () => {
    const raw = pattern(w * h, 37, 11);
    const png = pngWithIcc(await encodeRaw(raw, w, h, 1, "png"), grey);
    expect((await sharp(png).metadata()).hasProfile).to.equal(true);
    expect(sameBytes(await sharpDefault(png, 1), raw)).to.equal(false);
    const decoded = await decodeImage(png, LIMITS);
    expect(decoded.tensorInfo.shape).to.deep.equal([h, w, 1]);
    expect((decoded.tensorInfo.metadata as { Image: { color_type: string } }).Image.color_type).to.equal("L8");
    expect(sameBytes(decoded.data, raw)).to.equal(true);
    expect(decoded.contentHash).to.equal(ruleHash([h, w, 1], raw));

    const rgb = await decodeImage(png, LIMITS, { forceRgb: true });
    expect(sameBytes(rgb.data, Uint8Array.from({ length: w * h * 3 }, (_, i) => raw[Math.floor(i / 3)]!))).to.equal(true);

    const la = pattern(w * h * 2, 29, 3);
    const laPng = pngWithIcc(await encodeRaw(la, w, h, 2, "png"), grey);
    const laDecoded = await decodeImage(laPng, LIMITS);
    expect(laDecoded.tensorInfo.shape).to.deep.equal([h, w, 2]);
    expect(sameBytes(laDecoded.data, la)).to.equal(true);
  });

  it("ignores a profile in JPEG: the same decode with and without the APP2 segment", async () => {
    const raw = pattern(32 * 16 * 3, 37, 11);
    const plain = await encodeRaw(raw, 32, 16, 3, "jpeg");
    const baseline = await decodeImage(plain, LIMITS);
    for (const [name, icc] of profiles()) {
      const jpeg = jpegWithIcc(plain, icc);
      expect((await sharp(jpeg).metadata()).hasProfile, name).to.equal(true);
      expect(sameBytes(await sharpDefault(jpeg, 3), baseline.data), name).to.equal(false);
      const decoded = await decodeImage(jpeg, LIMITS);
      expect(sameBytes(decoded.data, baseline.data), name).to.equal(true);
      expect(decoded.contentHash, name).to.equal(baseline.contentHash);
    }
  });

  it("converts CMYK JPEG the same way whatever profile it embeds", async () => {
    const cmyk = await sharp({ create: { width: 8, height: 4, channels: 3, background: "#3080c0" } })
      .toColourspace("cmyk")
      .withIccProfile("cmyk")
      .jpeg()
      .toBuffer();
    const meta = await sharp(cmyk).metadata();
    expect([meta.space, meta.hasProfile]).to.deep.equal(["cmyk", true]);
    const stripped = jpegWithoutIcc(cmyk);
    expect((await sharp(stripped).metadata()).hasProfile).to.equal(false);
    const a = await decodeImage(cmyk, LIMITS);
    const b = await decodeImage(stripped, LIMITS);
    expect(a.tensorInfo.shape).to.deep.equal([4, 8, 3]);
    expect(a.contentHash).to.equal(b.contentHash);
  });

  it("decodes TIFF with a profile to exactly the stored pixels, and AVIF as without its profile", async () => {
    const raw = pattern(w * h * 3, 37, 11);
    const png = pngWithIcc(await encodeRaw(raw, w, h, 3, "png"), adobe);
    // keepIccProfile copies the input profile without converting the pixels
    // (sharp's TIFF default is JPEG compression: ask for a lossless one).
    const tiff = await sharp(png).keepIccProfile().tiff({ compression: "lzw" }).toBuffer();
    expect((await sharp(tiff).metadata()).icc!.equals(adobe)).to.equal(true);
    const t = await decodeImage(tiff, LIMITS);
    expect(sameBytes(t.data, raw)).to.equal(true);
    expect(t.contentHash).to.equal(ruleHash([h, w, 3], raw));

    const avif = await sharp(png).keepIccProfile().avif().toBuffer();
    expect((await sharp(avif).metadata()).hasProfile).to.equal(true);
    const plainAvif = await encodeRaw(raw, w, h, 3, "avif");
    expect((await sharp(plainAvif).metadata()).hasProfile).to.equal(false);
    const a = await decodeImage(avif, LIMITS);
    expect(sameBytes(a.data, (await decodeImage(plainAvif, LIMITS)).data)).to.equal(true);
  });

  it("decodes GIF carrying an ICC application extension to its stored palette pixels", async () => {
    const raw = pattern(w * h * 3, 37, 11);
    const gif = await encodeRaw(raw, w, h, 3, "gif");
    const tagged = gifWithIcc(gif, adobe);
    const plain = await decodeImage(gif, LIMITS);
    const decoded = await decodeImage(tagged, LIMITS);
    expect(decoded.tensorInfo.shape.slice(0, 2)).to.deep.equal([h, w]);
    expect(decoded.contentHash).to.equal(plain.contentHash);
  });

  it("reduces 16-bit PNG with a profile as without it", async () => {
    const deep = await sharp({ create: { width: 8, height: 4, channels: 3, background: { r: 200, g: 30, b: 90 } } })
      .toColourspace("rgb16")
      .png()
      .toBuffer();
    const tagged = pngWithIcc(deep, adobe);
    expect((await sharp(tagged).metadata()).depth).to.equal("ushort");
    const a = await decodeImage(tagged, LIMITS);
    const b = await decodeImage(deep, LIMITS);
    expect(Array.from(a.data.subarray(0, 3))).to.deep.equal([200, 30, 90]);
    expect(a.contentHash).to.equal(b.contentHash);
  });
});
