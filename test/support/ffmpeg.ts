/**
 * Small video clips made with ffmpeg at test time, with known pixels in
 * every frame, for the video decoder's tests. CI installs ffmpeg (the Debian
 * package, scripts/ensure-tools.mjs); a developer machine without it skips,
 * but CI never does.
 */
import { spawn, spawnSync } from "node:child_process";
import { readFile } from "node:fs/promises";
import { join } from "node:path";

/** Whether ffmpeg and ffprobe are on PATH. */
export function ffmpegInstalled(): boolean {
  return ["ffmpeg", "ffprobe"].every((tool) => spawnSync(tool, ["-version"], { stdio: "ignore" }).status === 0);
}

/** For a `before` hook: skips the suite without ffmpeg on a developer machine; with `CI` set it is an error. */
export function requireFfmpeg(context: Mocha.Context): void {
  if (ffmpegInstalled()) return;
  if (process.env["CI"]) throw new Error("ffmpeg is not installed (CI installs the Debian package ffmpeg: scripts/ensure-tools.mjs)");
  console.warn("    ffmpeg is not on PATH: skipping the video tests (apt-get install ffmpeg to run them)");
  context.skip();
}

/** The RGB value of pixel (x, y) of frame f in every test clip: distinct per frame, varying across the frame. */
export function clipPixel(f: number, x: number, y: number): [number, number, number] {
  return [(f * 8) & 0xff, (x * 16 + f) & 0xff, (y * 30) & 0xff];
}

/** Frame f of a clip as rgb24 bytes. */
export function clipFrame(f: number, width: number, height: number): Uint8Array {
  const out = new Uint8Array(width * height * 3);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) out.set(clipPixel(f, x, y), (y * width + x) * 3);
  }
  return out;
}

export interface ClipSpec {
  readonly frames: number;
  readonly width: number;
  readonly height: number;
  readonly fps: number;
  /**
   * "mkv": FFV1 in Matroska; "mp4": H.264 RGB at qp 0 in MP4 (index at the
   * end, so the decoder must be able to seek); both lossless, so decoded
   * pixels equal clipFrame exactly.
   */
  readonly container: "mkv" | "mp4";
}

/** Encodes a clip of clipFrame frames into `dir` and returns its bytes. */
export async function makeClip(dir: string, name: string, spec: ClipSpec): Promise<Buffer> {
  const file = join(dir, name);
  const codec = spec.container === "mkv" ? ["-c:v", "ffv1"] : ["-c:v", "libx264rgb", "-qp", "0", "-preset", "ultrafast"];
  const child = spawn(
    "ffmpeg",
    [
      "-v", "error", "-y",
      "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", `${spec.width}x${spec.height}`, "-r", String(spec.fps), "-i", "pipe:0",
      ...codec,
      file,
    ],
    { stdio: ["pipe", "ignore", "pipe"] },
  );
  let stderr = "";
  child.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
  const done = new Promise<number | null>((resolve, reject) => {
    child.once("error", reject);
    child.once("close", resolve);
  });
  for (let f = 0; f < spec.frames; f++) child.stdin.write(clipFrame(f, spec.width, spec.height));
  child.stdin.end();
  const code = await done;
  if (code !== 0) throw new Error(`ffmpeg could not make ${name}: ${stderr}`);
  return readFile(file);
}

/**
 * A copy of a Matroska clip whose header claims `durationMs` instead of its
 * real duration (the 8-byte float of the Segment's Duration element).
 */
export function withClaimedDuration(mkv: Uint8Array, durationMs: number): Buffer {
  const out = Buffer.from(mkv);
  const at = out.indexOf(Buffer.from([0x44, 0x89, 0x88]));
  if (at < 0) throw new Error("no 8-byte Duration element in the clip");
  out.writeDoubleBE(durationMs, at + 3);
  return out;
}
