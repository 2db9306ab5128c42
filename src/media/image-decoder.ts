import { availableParallelism } from "node:os";
import sharp from "sharp";
import type { Metadata, OutputInfo } from "sharp";
import { MediaError } from "./errors.js";
import { decodeBmpPixels, readBmpHeader } from "./bmp.js";
import { DECODABLE_FORMATS, guessImageFormat } from "./image-format.js";
import type { ColorType, DecodedMedia, ImageFormat } from "./tensor.js";
import { canonicalContentHash } from "./hash.js";
import { inSpanSync } from "../telemetry/index.js";

/** Server-side decoder limits; requests cannot change them. */
export interface ImageDecoderLimits {
  /** Widest accepted image, in pixels; null for no limit. */
  readonly maxImageWidth: number | null;
  /** Tallest accepted image, in pixels; null for no limit. */
  readonly maxImageHeight: number | null;
  /** Largest decoded tensor (W·H·C bytes). */
  readonly maxAlloc: number;
}

export const DEFAULT_MAX_ALLOC = 128 * 1024 * 1024;

export interface ImageDecodeOptions {
  /** Drop alpha and expand grey: always [H, W, 3]. */
  readonly forceRgb?: boolean;
  /** Apply the EXIF orientation tag (the reference does not). */
  readonly applyExifOrientation?: boolean;
  readonly signal?: AbortSignal;
}

/**
 * Process-wide sharp settings for a decoding server: libvips threads per
 * image (0 = one per core) and no operation cache (every input is new, so
 * the cache would only hold memory).
 */
export function configureSharp(threadsPerDecode: number): void {
  sharp.cache(false);
  sharp.concurrency(threadsPerDecode === 0 ? availableParallelism() : threadsPerDecode);
}

const COLOR_TYPES: Record<number, ColorType> = { 1: "L8", 2: "La8", 3: "Rgb8", 4: "Rgba8" };

interface Header {
  readonly width: number;
  readonly height: number;
  readonly channels: number;
}

function decodeFailed(error: unknown): MediaError {
  const text = error instanceof Error ? error.message : String(error);
  return new MediaError("IMAGE_DECODE_FAILED", `Failed to decode image: ${text.split("\n")[0] ?? text}`);
}

/** Reads dimensions and channel count from the header, without pixels. */
async function readHeader(bytes: Uint8Array, applyOrientation: boolean): Promise<Header> {
  let meta: Metadata;
  try {
    meta = await sharp(bytes, { limitInputPixels: false, failOn: "none" }).metadata();
  } catch (error) {
    throw decodeFailed(error);
  }
  const { width, height } = meta;
  if (width === undefined || height === undefined || width <= 0 || height <= 0) {
    throw new MediaError("IMAGE_DECODE_FAILED", "Failed to decode image: no dimensions in header");
  }
  // CMYK sources decode to RGB, as the reference's decoder converts them.
  const channels = meta.space === "cmyk" ? (meta.hasAlpha ? 4 : 3) : (meta.channels ?? 0);
  const rotated = applyOrientation && (meta.orientation ?? 1) >= 5;
  return { width: rotated ? height : width, height: rotated ? width : height, channels };
}

/** The reference's limit checks, in its order and with its messages. */
export function checkImageLimits(width: number, height: number, channels: number, limits: ImageDecoderLimits): void {
  if (
    (limits.maxImageWidth !== null && width > limits.maxImageWidth) ||
    (limits.maxImageHeight !== null && height > limits.maxImageHeight)
  ) {
    throw new MediaError(
      "IMAGE_DIMENSIONS_EXCEED_LIMITS",
      `Image dimensions exceed configured limits: ${width}x${height}`,
      BigInt(Math.max(limits.maxImageWidth ?? 0, limits.maxImageHeight ?? 0)),
      BigInt(Math.max(width, height)),
    );
  }
  const alloc = BigInt(width) * BigInt(height) * BigInt(channels);
  if (alloc > BigInt(limits.maxAlloc)) {
    throw new MediaError(
      "IMAGE_ALLOCATION_EXCEEDS_LIMIT",
      `Image allocation ${alloc} bytes exceeds configured limit ${limits.maxAlloc} bytes`,
      BigInt(limits.maxAlloc),
      alloc,
    );
  }
}

/** Repacks RGBA (grey replicated into R, G, B) as grey+alpha. */
function rgbaToLa(rgba: Uint8Array): Uint8Array {
  const out = new Uint8Array(rgba.length / 2);
  for (let i = 0, j = 0; j < out.length; i += 4, j += 2) {
    out[j] = rgba[i]!;
    out[j + 1] = rgba[i + 3]!;
  }
  return out;
}

/**
 * Decodes an encoded image to a uint8 [H, W, C] tensor, keeping the source
 * channel count (1, 2, 3 or 4) unless forceRgb is set. Pixels are the stored
 * ones: embedded ICC profiles are ignored, as the reference ignores them.
 * Limits are checked on the header before any pixel is decoded; sharp's
 * limitInputPixels is a second fence (BMP: its decoder checks that the pixel
 * data is in the file before allocating). The canonical content hash is
 * computed here, as the reference computes it on its decode thread.
 */
export async function decodeImage(
  bytes: Uint8Array,
  limits: ImageDecoderLimits,
  options: ImageDecodeOptions = {},
): Promise<DecodedMedia> {
  const format = guessImageFormat(bytes);
  if (format === null) throw new MediaError("IMAGE_FORMAT_UNSUPPORTED", "Unsupported image format: unrecognized data");
  if (!DECODABLE_FORMATS.has(format)) {
    throw new MediaError("IMAGE_FORMAT_UNSUPPORTED", `Unsupported image format: ${format}`);
  }
  const applyOrientation = options.applyExifOrientation === true;
  // BMP has its own decoder (and no EXIF); everything else goes to sharp.
  const bmp = format === "Bmp" ? readBmpHeader(bytes) : null;
  const header = bmp ?? (await readHeader(bytes, applyOrientation));
  options.signal?.throwIfAborted();

  const colorType = COLOR_TYPES[options.forceRgb ? 3 : header.channels];
  if (colorType === undefined) {
    throw new MediaError("IMAGE_CHANNELS_UNSUPPORTED", `Unsupported color type: ${header.channels} channels`);
  }
  const channels = options.forceRgb ? 3 : header.channels;
  checkImageLimits(header.width, header.height, channels, limits);

  const pixels = bmp
    ? { data: await decodeBmpPixels(bytes, bmp, channels === 4 ? 4 : 3, options.signal), width: bmp.width, height: bmp.height }
    : await decodePixels(bytes, format, channels, limits, applyOrientation);
  if (pixels.width !== header.width || pixels.height !== header.height) {
    throw new MediaError("IMAGE_DECODE_FAILED", "Failed to decode image: decoded size differs from its header");
  }
  const shape = [pixels.height, pixels.width, channels];
  return {
    data: pixels.data,
    tensorInfo: { shape, dtype: "UINT8", metadata: { Image: { format, color_type: colorType, layout: "HWC" } } },
    contentHash: inSpanSync("media.hash", { "mmgate.media.tensor_bytes": pixels.data.length }, () => canonicalContentHash(shape, "UINT8", pixels.data)),
  };
}

interface Pixels {
  readonly data: Uint8Array;
  readonly width: number;
  readonly height: number;
}

async function decodePixels(
  bytes: Uint8Array,
  format: ImageFormat,
  channels: number,
  limits: ImageDecoderLimits,
  applyOrientation: boolean,
): Promise<Pixels> {
  // Second fence: libvips refuses more input pixels than the budget allows.
  const maxPixels = Math.max(1, Math.floor(limits.maxAlloc / Math.max(1, channels)));
  // ignoreIcc: the stored pixels, whatever profile is embedded. By default
  // sharp transforms through the embedded profile to sRGB (or grey through a
  // grey profile to sRGB and back), while the reference's decoder returns
  // the stored values; raw output never carries the profile itself. CMYK
  // still becomes RGB, through libvips' built-in CMYK profile.
  let pipeline = sharp(bytes, {
    limitInputPixels: maxPixels,
    autoOrient: applyOrientation,
    pages: 1,
    page: 0,
    ignoreIcc: true,
  });
  // sharp writes sRGB by default (grey is replicated into R, G, B), so only
  // grey output needs an explicit colourspace; an explicit sRGB conversion
  // would cost a pass for nothing.
  if (channels === 1) pipeline = pipeline.toColourspace("b-w");
  else if (channels === 3) pipeline = pipeline.removeAlpha();
  else pipeline = pipeline.ensureAlpha();

  let result: { data: Buffer; info: OutputInfo };
  try {
    result = await pipeline.raw({ depth: "uchar" }).toBuffer({ resolveWithObject: true });
  } catch (error) {
    if (error instanceof Error && /pixel limit/i.test(error.message)) {
      throw new MediaError(
        "IMAGE_ALLOCATION_EXCEEDS_LIMIT",
        `Image allocation exceeds configured limit ${limits.maxAlloc} bytes`,
        BigInt(limits.maxAlloc),
      );
    }
    throw decodeFailed(error);
  }
  const { data, info } = result;
  const produced = channels === 2 ? 4 : channels;
  if (info.channels !== produced || data.length !== info.width * info.height * produced) {
    throw new MediaError("IMAGE_DECODE_FAILED", `Failed to decode ${format} image: unexpected ${info.channels}-channel output`);
  }
  const view = new Uint8Array(data.buffer, data.byteOffset, data.length);
  return { data: channels === 2 ? rgbaToLa(view) : view, width: info.width, height: info.height };
}
