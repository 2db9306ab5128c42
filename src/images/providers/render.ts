import { createHash } from "node:crypto";
import sharp, { type Sharp } from "sharp";
import type { Background, OutputFormat } from "../model.js";

/** What a deterministic image is drawn from. */
export interface RenderSpec {
  /** Seed material: prompt, inputs, output index. */
  readonly seed: string;
  readonly width: number;
  readonly height: number;
  /** Cells per edge of the final image. */
  readonly cells: number;
  readonly background: Background;
  readonly format: OutputFormat;
  /** Encoder quality 1..100 for jpeg and webp. */
  readonly quality: number;
}

export interface RenderedImage {
  readonly data: Uint8Array;
  readonly width: number;
  readonly height: number;
  readonly format: OutputFormat;
}

/**
 * The final cell grid as raw RGBA: colours from SHAKE-256 of the seed, and
 * with a transparent background the cells outside a centred disc are clear.
 */
function cellGrid(spec: RenderSpec): Buffer {
  const n = spec.cells;
  const stream = createHash("shake256", { outputLength: n * n * 3 }).update(spec.seed, "utf8").digest();
  const raw = Buffer.alloc(n * n * 4);
  const centre = (n - 1) / 2;
  for (let y = 0; y < n; y += 1) {
    for (let x = 0; x < n; x += 1) {
      const cell = y * n + x;
      raw[cell * 4] = stream[cell * 3]!;
      raw[cell * 4 + 1] = stream[cell * 3 + 1]!;
      raw[cell * 4 + 2] = stream[cell * 3 + 2]!;
      const inside = Math.hypot(x - centre, y - centre) <= n / 2.2;
      raw[cell * 4 + 3] = spec.background === "transparent" && !inside ? 0 : 255;
    }
  }
  return raw;
}

async function encode(pipeline: Sharp, spec: RenderSpec): Promise<RenderedImage> {
  const keepAlpha = spec.background === "transparent" && spec.format !== "jpeg";
  let image = keepAlpha ? pipeline : pipeline.flatten({ background: "#ffffff" });
  if (spec.format === "png") image = image.png({ compressionLevel: 6 });
  else if (spec.format === "jpeg") image = image.jpeg({ quality: spec.quality });
  else image = image.webp({ quality: spec.quality });
  const data = await image.toBuffer();
  return { data: new Uint8Array(data.buffer, data.byteOffset, data.byteLength), width: spec.width, height: spec.height, format: spec.format };
}

const RAW_CELL = (n: number) => ({ raw: { width: n, height: n, channels: 4 as const } });

/** The final image: the cell grid scaled up without smoothing. */
export function renderImage(spec: RenderSpec): Promise<RenderedImage> {
  const pipeline = sharp(cellGrid(spec), RAW_CELL(spec.cells)).resize(spec.width, spec.height, { kernel: "nearest", fit: "fill" });
  return encode(pipeline, spec);
}

/**
 * Preview `step` of `steps`: the same grid averaged down to a coarser one
 * (cells >> (steps - step) per edge), so each preview is finer than the last.
 */
export async function renderPreview(spec: RenderSpec, step: number, steps: number): Promise<RenderedImage> {
  const cells = Math.max(1, spec.cells >> (steps - step));
  const small = await sharp(cellGrid(spec), RAW_CELL(spec.cells))
    .resize(cells, cells, { kernel: "linear", fit: "fill" })
    .raw()
    .toBuffer();
  const pipeline = sharp(small, RAW_CELL(cells)).resize(spec.width, spec.height, { kernel: "nearest", fit: "fill" });
  return encode(pipeline, { ...spec, cells });
}
