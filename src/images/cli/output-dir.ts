/**
 * The `--out` directory of `images generate`: checked before anything is
 * paid for, the images and previews written under stable names, earlier
 * runs' files removed, and a temporary directory when `--out` fails.
 */
import { constants } from "node:fs";
import { access, mkdir, mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as pb from "../../../gen/mmgate/images/v1/images_pb.js";
import { type CliError, ioError, usageError } from "../../rpc/index.js";
import { describe } from "./io.js";

export const EXTENSIONS: Record<number, string> = {
  [pb.OutputFormat.PNG]: "png",
  [pb.OutputFormat.JPEG]: "jpg",
  [pb.OutputFormat.WEBP]: "webp",
};

/**
 * Creates `--out` (like `mkdir -p`) and checks that it is a writable directory,
 * before anything is paid for.
 */
export async function prepareOutDir(dir: string): Promise<void> {
  // Any --out that cannot take the images is a usage error: found before anything is paid for.
  const existing = await stat(dir).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENOENT") return undefined;
    if (error.code === "ENOTDIR") throw usageError(`--out ${dir}: a parent of it is a file, not a directory`);
    throw usageError(`--out ${dir}: ${describe(error)}`);
  });
  if (existing && !existing.isDirectory()) throw usageError(`--out ${dir}: exists and is not a directory`);
  if (!existing) {
    try {
      await mkdir(dir, { recursive: true });
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ENOTDIR" || code === "EEXIST") throw usageError(`--out ${dir}: a parent of it is a file, not a directory`);
      throw usageError(`--out ${dir}: cannot create the directory: ${describe(error)}`);
    }
  }
  try {
    await access(dir, constants.W_OK | constants.X_OK);
  } catch (error) {
    throw usageError(`--out ${dir}: the directory is not writable: ${describe(error)}`);
  }
}

/** Output files are zero-padded to the width of the largest requested index (n = 12 → image-00 … image-11). */
export function indexWidth(n: number): number {
  return String(Math.max(0, n - 1)).length;
}

function imageName(index: number, ext: string, width: number): string {
  return `image-${String(index).padStart(width, "0")}.${ext}`;
}

export function partialName(index: number, partialIndex: number, ext: string, width: number): string {
  return `partial-${String(index).padStart(width, "0")}-${partialIndex}.${ext}`;
}

/** What the CLI names its files; any such file this run did not write is stale. */
const OUTPUT_NAME = /^(?:image-\d+|partial-\d+-\d+)\.(?:png|jpg|webp|bin)$/;

/** Previews carry no format field: tell it from the magic bytes. */
export function sniffExtension(bytes: Uint8Array): string {
  if (bytes[0] === 0x89 && bytes[1] === 0x50 && bytes[2] === 0x4e && bytes[3] === 0x47) return "png";
  if (bytes[0] === 0xff && bytes[1] === 0xd8 && bytes[2] === 0xff) return "jpg";
  if (bytes.length >= 12 && Buffer.from(bytes.subarray(0, 4)).toString("latin1") === "RIFF" && Buffer.from(bytes.subarray(8, 12)).toString("latin1") === "WEBP") return "webp";
  return "bin";
}

/** Removes earlier runs' `image-*` / `partial-*` files in `dir` that this run did not write; returns their names. */
async function removeStale(dir: string, written: ReadonlySet<string>): Promise<string[]> {
  const stale: string[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    if (entry.isFile() && OUTPUT_NAME.test(entry.name) && !written.has(entry.name)) stale.push(entry.name);
  }
  for (const name of stale) await rm(join(dir, name), { force: true });
  return stale.sort();
}

export interface SaveContext {
  readonly out: string;
  readonly width: number;
  /** Preview files this run wrote into `out`. */
  readonly partials: Set<string>;
}

export type Encoded = { readonly image: pb.GeneratedImage; readonly bytes: Uint8Array; readonly name: string };

async function writeAll(dir: string, images: readonly Encoded[]): Promise<void> {
  for (const { bytes, name } of images) {
    const path = join(dir, name);
    try {
      await writeFile(path, bytes);
    } catch (error) {
      throw new Error(`could not write ${path}: ${describe(error)}`, { cause: error });
    }
  }
}

/** What a finished generate call left behind. */
export interface Saved {
  /** Where the images are: --out, or a temporary directory when writing there failed. */
  readonly dir: string;
  readonly images: readonly Encoded[];
  /** Earlier runs' files removed from --out. */
  readonly removed: readonly string[];
  /** Why the images are not in --out, if they are not. */
  readonly writeError?: CliError;
  /** Why earlier files could not be removed, if they could not. */
  readonly cleanupError?: string;
}

/**
 * Writes each image as <out>/image-<index>.<ext>. If the images cannot be
 * written there, they are kept in a fresh temporary directory instead
 * (named on stderr, exit 1): paid images are never dropped.
 */
export async function saveImages(response: pb.ImageResponse, ctx: SaveContext): Promise<Saved> {
  const images: Encoded[] = [];
  for (const image of response.data) {
    if (image.payload.case !== "image") continue;
    images.push({ image, bytes: image.payload.value, name: imageName(image.index, EXTENSIONS[image.format] ?? "bin", ctx.width) });
  }
  try {
    await writeAll(ctx.out, images);
  } catch (error) {
    const dir = await mkdtemp(join(tmpdir(), "mmgate-images-"));
    await writeAll(dir, images);
    return { dir, images, removed: [], writeError: ioError(describe(error), error) };
  }
  try {
    return { dir: ctx.out, images, removed: await removeStale(ctx.out, new Set([...images.map((i) => i.name), ...ctx.partials])) };
  } catch (error) {
    return { dir: ctx.out, images, removed: [], cleanupError: `could not remove earlier files in ${ctx.out}: ${describe(error)}` };
  }
}
