/**
 * The video decoder: MP4 / MOV and Matroska / WebM to a uint8 [T, H, W, 3]
 * tensor of sampled frames with VideoMetadata, using ffprobe and ffmpeg from
 * the host. The sampling rules (requested count, target indices) are pure
 * functions here; the tools only probe and decode.
 */
import { availableParallelism } from "node:os";
import { MediaError } from "./errors.js";
import { firstStderrLine, parseRational, runTool, stageInput, type StagedInput, type ToolRun } from "./ffmpeg.js";
import { contentHashForTensor } from "./hash.js";
import { inSpanSync } from "../telemetry/index.js";
import { guessImageFormat } from "./image-format.js";
import { MAX_VIDEO_FRAMES, type DecodedMedia, type MediaTensorInfo, type VideoMetadata } from "./tensor.js";

/** The reference's default allocation limit for a decoded video, 512 MiB. */
export const DEFAULT_VIDEO_MAX_ALLOC = 512 * 1024 * 1024;

/** Server-side video decoder settings (the `media.video` config section). */
export interface VideoDecoderConfig {
  /** ffmpeg executable: a path, or a name looked up on PATH. */
  readonly ffmpegPath: string;
  /** ffprobe executable, likewise. */
  readonly ffprobePath: string;
  /** Largest decoded tensor, frames × W × H × 3 bytes, checked before decoding. */
  readonly maxAlloc: number;
  /** Decoder threads per video; 0 means min(available cores, 8). */
  readonly decodeThreads: number;
  /** Where the encoded input is staged; null for the OS temp dir. */
  readonly tempDir: string | null;
}

/** How to sample frames; the caller chooses per request. */
export interface VideoSampling {
  /** Frames per second of video to sample; excludes numFrames. */
  readonly fps?: number | undefined;
  /** Frames to sample, spread evenly; excludes fps and maxFrames. */
  readonly numFrames?: number | undefined;
  /** Upper bound on the sampled frames; excludes numFrames. */
  readonly maxFrames?: number | undefined;
  /** Any decode error fails, and every target frame must be decoded. Off: bad packets are skipped. */
  readonly strict?: boolean | undefined;
}

export interface VideoDecodeOptions extends VideoSampling {
  /** Compute the canonical video content hash (default true). */
  readonly hash?: boolean;
  readonly signal?: AbortSignal | undefined;
}

export type VideoContainer = "Mp4" | "Matroska";

/** The ffmpeg demuxer each sniffed container is forced to, so nothing else probes the bytes. */
const DEMUXER: Record<VideoContainer, string> = { Mp4: "mov", Matroska: "matroska" };

/** ISO-BMFF brands of still images (HEIF, AVIF): not videos. */
const IMAGE_BRANDS = new Set(["heic", "heix", "heim", "heis", "hevc", "hevx", "mif1", "msf1", "avif", "avis", "avio"]);

/** Sniffs a video container from its magic bytes: `ftyp` at offset 4 (MP4 / MOV) or the EBML header (Matroska / WebM). */
export function guessVideoContainer(bytes: Uint8Array): VideoContainer | null {
  if (bytes.length >= 12 && bytes[4] === 0x66 && bytes[5] === 0x74 && bytes[6] === 0x79 && bytes[7] === 0x70) {
    const brand = String.fromCharCode(bytes[8]!, bytes[9]!, bytes[10]!, bytes[11]!);
    return IMAGE_BRANDS.has(brand) ? null : "Mp4";
  }
  if (bytes.length >= 4 && bytes[0] === 0x1a && bytes[1] === 0x45 && bytes[2] === 0xdf && bytes[3] === 0xa3) return "Matroska";
  return null;
}

/** Whether encoded bytes go to the video decoder (a video container that is not an image format). */
export function isVideoPayload(bytes: Uint8Array): boolean {
  return guessImageFormat(bytes) === null && guessVideoContainer(bytes) !== null;
}

function optionsInvalid(message: string): MediaError {
  return new MediaError("VIDEO_OPTIONS_INVALID", message);
}

/** Refuses option combinations the reference refuses, and values that cannot be counts or rates. */
export function validateVideoSampling(s: VideoSampling): void {
  if (s.fps !== undefined && s.numFrames !== undefined) throw optionsInvalid("fps and num_frames cannot both be set");
  if (s.maxFrames !== undefined && s.numFrames !== undefined) throw optionsInvalid("max_frames and num_frames cannot both be set");
  if (s.fps !== undefined && !(Number.isFinite(s.fps) && s.fps > 0)) throw optionsInvalid(`fps must be a positive number, got ${s.fps}`);
  for (const [name, value] of [["num_frames", s.numFrames], ["max_frames", s.maxFrames]] as const) {
    if (value !== undefined && !(Number.isSafeInteger(value) && value >= 0)) {
      throw optionsInvalid(`${name} must be a whole number >= 0, got ${value}`);
    }
  }
}

/** What ffprobe tells about the chosen stream, in the reference's terms. */
export interface VideoProbe {
  /** Index of the stream in the container (for `-map 0:<index>`). */
  readonly streamIndex: number;
  readonly width: number;
  readonly height: number;
  /** avg_frame_rate, or r_frame_rate when that is 0. */
  readonly fps: number;
  /** Seconds: stream duration × time_base, else the container duration, else 0. */
  readonly duration: number;
  /** The stream's frame count, else floor(duration × fps). */
  readonly totalFrames: number;
}

function decodeFailed(message: string): MediaError {
  return new MediaError("VIDEO_DECODE_FAILED", message);
}

type Json = Record<string, unknown>;

const num = (value: unknown): number => (typeof value === "number" ? value : typeof value === "string" && value.trim() !== "" ? Number(value) : NaN);

/**
 * Picks the stream ffmpeg's av_find_best_stream would (approximated from
 * what ffprobe shows): video, not a cover picture; then not marked for the
 * impaired, then default-marked, then the highest bit rate, then the first.
 */
function bestVideoStream(streams: readonly Json[]): Json | undefined {
  let best: Json | undefined;
  let bestScore: number[] = [];
  for (const s of streams) {
    if (s["codec_type"] !== "video") continue;
    const d = (s["disposition"] ?? {}) as Json;
    if (d["attached_pic"] === 1) continue;
    const score = [
      (d["visual_impaired"] === 1 || d["hearing_impaired"] === 1 ? 0 : 1) + (d["default"] === 1 ? 1 : 0),
      Number.isFinite(num(s["bit_rate"])) ? num(s["bit_rate"]) : 0,
    ];
    const better = best === undefined || score[0]! > bestScore[0]! || (score[0] === bestScore[0] && score[1]! > bestScore[1]!);
    if (better) {
      best = s;
      bestScore = score;
    }
  }
  return best;
}

/** Reads ffprobe's JSON (`-show_entries stream=…:format=duration -of json`) with the reference's rules. */
export function probeFromFfprobeJson(text: string): VideoProbe {
  let parsed: Json;
  try {
    parsed = JSON.parse(text) as Json;
  } catch {
    throw decodeFailed("Failed to decode video: unreadable ffprobe output");
  }
  const streams = Array.isArray(parsed["streams"]) ? (parsed["streams"] as Json[]) : [];
  const stream = bestVideoStream(streams);
  if (stream === undefined) throw decodeFailed("Failed to decode video: no video stream");
  const streamIndex = num(stream["index"]);
  const width = num(stream["width"]);
  const height = num(stream["height"]);
  if (!Number.isSafeInteger(streamIndex) || !(Number.isSafeInteger(width) && width > 0 && Number.isSafeInteger(height) && height > 0)) {
    throw decodeFailed("Failed to decode video: unknown frame size");
  }

  const avg = parseRational(stream["avg_frame_rate"]);
  const fps = avg !== 0 && Number.isFinite(avg) ? avg : parseRational(stream["r_frame_rate"]);
  if (!(Number.isFinite(fps) && fps > 0)) throw decodeFailed(`Invalid video frame rate: ${fps}`);

  const durationTs = num(stream["duration_ts"]);
  const timeBase = parseRational(stream["time_base"]);
  const container = num(((parsed["format"] ?? {}) as Json)["duration"]);
  let duration = 0;
  if (Number.isFinite(durationTs) && durationTs > 0 && timeBase > 0) duration = durationTs * timeBase;
  else if (Number.isFinite(container) && container > 0) duration = container;

  const nbFrames = num(stream["nb_frames"]);
  const totalFrames = Number.isFinite(nbFrames) && nbFrames > 0 ? nbFrames : Math.floor(duration * fps);
  if (!(totalFrames > 0)) throw decodeFailed("Video has no frames");
  if (!Number.isSafeInteger(totalFrames)) throw decodeFailed(`Video frame count ${totalFrames} is out of range`);
  return { streamIndex, width, height, fps, duration, totalFrames };
}

/**
 * Frames to sample: floor(duration × fps) with fps, else num_frames, else
 * all; then at most max_frames, at least 1, and never more than the video has.
 */
export function requestedFrameCount(probe: Pick<VideoProbe, "duration" | "totalFrames">, s: VideoSampling): number {
  validateVideoSampling(s);
  let n: number;
  if (s.fps !== undefined) {
    if (!(probe.duration > 0)) {
      throw new MediaError("VIDEO_FRAME_REQUEST_INVALID", "Sampling by fps needs the video's duration, which is unknown");
    }
    n = Math.floor(probe.duration * s.fps);
  } else {
    n = s.numFrames ?? probe.totalFrames;
  }
  if (s.maxFrames !== undefined) n = Math.min(n, s.maxFrames);
  n = Math.max(n, 1);
  if (n > probe.totalFrames) {
    throw new MediaError(
      "VIDEO_FRAME_REQUEST_INVALID",
      `Requested ${n} frames but the video has only ${probe.totalFrames}`,
      BigInt(probe.totalFrames),
      BigInt(n),
    );
  }
  return n;
}

/** Rounds half to even, as numpy's round does. */
export function roundHalfEven(x: number): number {
  const floor = Math.floor(x);
  const frac = x - floor;
  if (frac > 0.5) return floor + 1;
  if (frac < 0.5) return floor;
  return floor % 2 === 0 ? floor : floor + 1;
}

/**
 * `np.unique(np.linspace(0, total - 1, n).round())` as integers: i × step
 * with step = (total − 1) / (n − 1) computed once, the last value exactly
 * total − 1, rounded half to even, duplicates dropped. [0] when n is 1.
 */
export function targetFrameIndices(total: number, n: number): number[] {
  if (!(Number.isSafeInteger(n) && n >= 1)) throw new RangeError(`frame count must be >= 1, got ${n}`);
  if (n === 1) return [0];
  const stop = total - 1;
  const div = n - 1;
  const step = stop / div;
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const y = i === div ? stop : step === 0 ? (i / div) * stop : i * step;
    const r = roundHalfEven(y);
    if (out.length === 0 || out[out.length - 1]! < r) out.push(r);
  }
  return out;
}

/** Longest `select` expression passed on the command line (Linux caps one argument at 128 KiB). */
export const MAX_SELECT_EXPRESSION = 64 * 1024;

/**
 * The ffmpeg `select` expression that passes exactly the target frames
 * (runs of consecutive indices as one `between`), or null when it would be
 * longer than `maxLength`.
 */
export function selectExpression(targets: readonly number[], maxLength = MAX_SELECT_EXPRESSION): string | null {
  const terms: string[] = [];
  let length = 0;
  for (let i = 0; i < targets.length; ) {
    let j = i;
    while (j + 1 < targets.length && targets[j + 1] === targets[j]! + 1) j++;
    const term = i === j ? `eq(n\\,${targets[i]})` : `between(n\\,${targets[i]}\\,${targets[j]})`;
    length += term.length + 1;
    if (length > maxLength) return null;
    terms.push(term);
    i = j + 1;
  }
  return terms.join("+");
}

/**
 * Where each output frame of ffmpeg goes. "exact": ffmpeg passes only the
 * targets, so output frame k is target k. "span": ffmpeg passes every frame
 * from the first target to the last, and frames that are not targets are
 * dropped here while streaming.
 */
export type FramePlan = { readonly mode: "exact"; readonly filter: string | null } | { readonly mode: "span"; readonly filter: string };

export function planFrames(targets: readonly number[], maxLength = MAX_SELECT_EXPRESSION): FramePlan {
  const first = targets[0]!;
  const last = targets[targets.length - 1]!;
  // Every frame from 0: no selection at all.
  if (first === 0 && last === targets.length - 1) return { mode: "exact", filter: null };
  const expr = selectExpression(targets, maxLength);
  if (expr !== null) return { mode: "exact", filter: `select=${expr}` };
  return { mode: "span", filter: `select=between(n\\,${first}\\,${last})` };
}

/**
 * Copies ffmpeg's rgb24 stream into the preallocated tensor frame by frame,
 * without buffering: each chunk lands at its place at once.
 */
export class FrameCollector {
  /** Frames completed and kept (always the first `collected` targets). */
  collected = 0;
  private outputFrame = 0;
  private offset = 0;
  /** Slot of the output frame in progress; null until its first byte arrives. */
  private slot: number | null = null;

  constructor(
    private readonly tensor: Uint8Array,
    private readonly frameBytes: number,
    private readonly targets: readonly number[],
    private readonly plan: FramePlan,
  ) {}

  /** Slot in the tensor of output frame k, or -1 to drop it. */
  private slotOf(k: number): number {
    if (this.plan.mode === "exact") {
      if (k >= this.targets.length) throw decodeFailed("Failed to decode video: ffmpeg produced more frames than requested");
      return k;
    }
    const ordinal = this.targets[0]! + k;
    const next = this.collected;
    if (next < this.targets.length && this.targets[next] === ordinal) return next;
    if (ordinal > this.targets[this.targets.length - 1]!) {
      throw decodeFailed("Failed to decode video: ffmpeg produced more frames than requested");
    }
    return -1;
  }

  /** Whether output stopped in the middle of a frame. */
  get partial(): boolean {
    return this.offset > 0;
  }

  push(chunk: Uint8Array): void {
    let at = 0;
    while (at < chunk.length) {
      // Resolved at a frame's first byte, so a stream that ends after its last frame never asks for one more.
      this.slot ??= this.slotOf(this.outputFrame);
      const take = Math.min(this.frameBytes - this.offset, chunk.length - at);
      if (this.slot >= 0) this.tensor.set(chunk.subarray(at, at + take), this.slot * this.frameBytes + this.offset);
      at += take;
      this.offset += take;
      if (this.offset === this.frameBytes) {
        if (this.slot >= 0) this.collected++;
        this.outputFrame++;
        this.offset = 0;
        this.slot = null;
      }
    }
  }
}

/** Threads of one decode: the configured number, or min(available cores, 8) as the reference. */
export function videoDecodeThreads(configured: number): number {
  return configured > 0 ? configured : Math.min(availableParallelism(), 8);
}

async function probe(config: VideoDecoderConfig, input: StagedInput, demuxer: string, signal: AbortSignal | undefined): Promise<VideoProbe> {
  const MAX_PROBE_OUTPUT = 1024 * 1024;
  const out: Buffer[] = [];
  let outBytes = 0;
  const run = await runTool(
    config.ffprobePath,
    [
      "-v", "error", "-hide_banner",
      "-protocol_whitelist", "file",
      "-f", demuxer,
      "-show_entries",
      "stream=index,codec_type,width,height,avg_frame_rate,r_frame_rate,time_base,duration_ts,nb_frames,bit_rate" +
        ":stream_disposition=default,attached_pic,visual_impaired,hearing_impaired:format=duration",
      "-of", "json",
      input.path,
    ],
    {
      tool: "ffprobe",
      input,
      signal,
      onStdout(chunk) {
        outBytes += chunk.length;
        if (outBytes > MAX_PROBE_OUTPUT) throw decodeFailed("Failed to decode video: ffprobe output is too large");
        out.push(Buffer.from(chunk));
      },
    },
  );
  if (run.code !== 0) throw decodeFailed(`Failed to decode video: ${firstStderrLine(run.stderr) || exitText(run)}`);
  return probeFromFfprobeJson(Buffer.concat(out).toString("utf8"));
}

function exitText(run: ToolRun): string {
  return run.signal !== null ? `ffmpeg ended on ${run.signal}` : `ffmpeg exited with code ${run.code}`;
}

/**
 * Decodes an MP4 / MOV or Matroska / WebM video to a uint8 [T, H, W, 3]
 * tensor of the sampled frames at native size, with VideoMetadata and (by
 * default) the canonical video content hash. The allocation limit is
 * checked on the probed header before any frame is decoded; ffmpeg's output
 * streams straight into the preallocated tensor.
 */
export async function decodeVideo(bytes: Uint8Array, config: VideoDecoderConfig, options: VideoDecodeOptions = {}): Promise<DecodedMedia> {
  validateVideoSampling(options);
  const container = guessVideoContainer(bytes);
  if (container === null) throw decodeFailed("Failed to decode video: unrecognized container (MP4, MOV, MKV and WebM are decoded)");
  const signal = options.signal;
  signal?.throwIfAborted();
  const strict = options.strict === true;

  const input = await stageInput(bytes, config.tempDir);
  try {
    const info = await probe(config, input, DEMUXER[container], signal);
    const n = requestedFrameCount(info, options);
    const targets = targetFrameIndices(info.totalFrames, n);
    const frameBytes = info.width * info.height * 3;
    const alloc = BigInt(targets.length) * BigInt(frameBytes);
    if (alloc > BigInt(config.maxAlloc)) {
      throw new MediaError(
        "VIDEO_ALLOCATION_EXCEEDS_LIMIT",
        `Video allocation ${alloc} bytes exceeds configured limit ${config.maxAlloc} bytes`,
        BigInt(config.maxAlloc),
        alloc,
      );
    }
    if (targets.length > MAX_VIDEO_FRAMES) {
      throw new MediaError(
        "VIDEO_FRAME_REQUEST_INVALID",
        `Requested ${targets.length} frames, more than the limit of ${MAX_VIDEO_FRAMES}`,
        BigInt(MAX_VIDEO_FRAMES),
        BigInt(targets.length),
      );
    }
    signal?.throwIfAborted();

    const storage = Buffer.allocUnsafeSlow(Number(alloc));
    const tensor = new Uint8Array(storage.buffer, storage.byteOffset, storage.length);
    const plan = planFrames(targets);
    const collector = new FrameCollector(tensor, frameBytes, targets, plan);
    const outputFrames = plan.mode === "exact" ? targets.length : targets[targets.length - 1]! - targets[0]! + 1;
    const scale = `scale=${info.width}:${info.height}:flags=bilinear,format=rgb24`;
    const args = [
      "-v", "error", "-nostdin", "-hide_banner", "-nostats",
      ...(strict ? ["-xerror"] : ["-fflags", "+discardcorrupt"]),
      "-threads", String(videoDecodeThreads(config.decodeThreads)),
      "-filter_threads", "1",
      "-protocol_whitelist", "file",
      "-f", DEMUXER[container],
      "-noautorotate",
      "-i", input.path,
      "-map", `0:${info.streamIndex}`,
      "-an", "-sn", "-dn",
      "-filter:v", plan.filter === null ? scale : `${plan.filter},${scale}`,
      "-fps_mode", "passthrough",
      "-frames:v", String(outputFrames),
      "-f", "rawvideo", "-pix_fmt", "rgb24",
      "pipe:1",
    ];
    const run = await runTool(config.ffmpegPath, args, { tool: "ffmpeg", input, signal, onStdout: (chunk) => collector.push(chunk) });
    const m = collector.collected;
    const why = firstStderrLine(run.stderr);
    if (strict) {
      if (run.code !== 0) throw decodeFailed(`Failed to decode video: ${why || exitText(run)}`);
      if (m !== targets.length || collector.partial) {
        throw decodeFailed(`Failed to decode video: decoded ${m} of ${targets.length} requested frames${why ? ` (${why})` : ""}`);
      }
    } else if (m === 0) {
      throw decodeFailed(`Failed to decode video: no frame could be decoded${why ? ` (${why})` : run.code !== 0 ? ` (${exitText(run)})` : ""}`);
    }

    const indices = targets.slice(0, m);
    const data = m === targets.length ? tensor : tensor.slice(0, m * frameBytes);
    const metadata: VideoMetadata = {
      source_fps: info.fps,
      source_duration: info.duration,
      sampled_timestamps: indices.map((i) => i / info.fps),
      source_total_frames: info.totalFrames,
      frames_indices: indices,
    };
    const tensorInfo: MediaTensorInfo = { shape: [m, info.height, info.width, 3], dtype: "UINT8", metadata: { Video: metadata } };
    const contentHash = options.hash === false ? null : inSpanSync("media.hash", { "mmgate.media.tensor_bytes": data.length }, () => contentHashForTensor(tensorInfo, data, true));
    return { data, tensorInfo, contentHash };
  } finally {
    await input.close();
  }
}
