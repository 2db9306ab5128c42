import { once } from "node:events";
import { open, readFile, rm } from "node:fs/promises";
import { Command, InvalidArgumentError, Option } from "commander";
import { Code, createClient } from "@connectrpc/connect";
import { MediaService, type TensorInfo } from "../../gen/mmgate/media/v1/media_pb.js";
import { clientTransport, CliError, connectionContext, type ConnectionOptions, EXIT, ioError, reportError, snakeCodeName, tokenOption, withConnectionOptions, withExitCodes } from "../rpc/index.js";
import { decoderLimits, fetchPolicy, mediaConfigSchema, videoDecoderConfig } from "./config.js";
import { metadataJson } from "./descriptor.js";
import { MediaError } from "./errors.js";
import { fetchMedia } from "./fetcher.js";
import { canonicalContentHash, formatContentHashKey, videoContentHash } from "./hash.js";
import { decodeImage } from "./image-decoder.js";
import type { DecodedMediaMetadata, MediaTensorInfo, VideoMetadata } from "./tensor.js";
import { validateVideoMetadata, videoDimensionsFromParts } from "./video.js";
import { decodeVideo, isVideoPayload, validateVideoSampling, type VideoSampling } from "./video-decoder.js";

/** The facts both subcommands print. */
interface Facts {
  readonly shape?: readonly bigint[];
  readonly dtype?: string;
  readonly metadata?: DecodedMediaMetadata | null;
  readonly sizeBytes?: bigint;
  readonly contentHash: bigint | null;
  readonly handle?: bigint;
  readonly descriptorJson?: string;
}

/** JSON with u64 values as decimal strings; metadata exactly as the reference serializes it. */
function factsJson(f: Facts): string {
  const METADATA = "\u0000metadata\u0000";
  const out: Record<string, unknown> = {};
  if (f.shape) out["shape"] = f.shape.map(String);
  if (f.dtype) out["dtype"] = f.dtype;
  if (f.metadata !== undefined) out["metadata"] = METADATA;
  if (f.sizeBytes !== undefined) out["size_bytes"] = String(f.sizeBytes);
  out["content_hash"] = f.contentHash === null ? null : String(f.contentHash);
  out["content_hash_key"] = f.contentHash === null ? null : formatContentHashKey(f.contentHash);
  if (f.handle !== undefined && f.handle !== 0n) out["handle"] = String(f.handle);
  if (f.descriptorJson) out["descriptor_json"] = f.descriptorJson;
  return JSON.stringify(out).replace(JSON.stringify(METADATA), metadataJson(f.metadata ?? null));
}

function factsText(f: Facts): string {
  const rows: [string, string][] = [];
  if (f.shape) rows.push(["shape", `[${f.shape.join(", ")}]`]);
  if (f.dtype) rows.push(["dtype", f.dtype]);
  if (f.metadata !== undefined) rows.push(["metadata", metadataJson(f.metadata)]);
  if (f.sizeBytes !== undefined) rows.push(["size_bytes", String(f.sizeBytes)]);
  rows.push(["content_hash", f.contentHash === null ? "(none: empty payload)" : String(f.contentHash)]);
  if (f.contentHash !== null) rows.push(["content_hash_key", formatContentHashKey(f.contentHash)]);
  if (f.handle !== undefined && f.handle !== 0n) rows.push(["handle", String(f.handle)]);
  if (f.descriptorJson) rows.push(["descriptor", f.descriptorJson]);
  return rows.map(([k, v]) => `${k.padEnd(17)}${v}`).join("\n");
}

function print(f: Facts, json: boolean): void {
  process.stdout.write(`${json ? factsJson(f) : factsText(f)}\n`);
}

/**
 * Reports a media command's failure: a media error under the gRPC code the
 * service would answer it with (its own code first in the message), a file
 * that cannot be read as `io`, a failed call as the call's code.
 */
function fail(command: string, error: unknown, connection?: ConnectionOptions): void {
  let reported = error;
  if (error instanceof MediaError) reported = new CliError(snakeCodeName(error.status), `${error.code}: ${error.message}`, { cause: error });
  else if (error instanceof Error && typeof (error as NodeJS.ErrnoException).code === "string" && (error as NodeJS.ErrnoException).syscall !== undefined) {
    reported = ioError(error.message, error);
  }
  process.exitCode = reportError(process.stderr, `media ${command}`, reported, connection ? connectionContext(connection) : {});
}

/** A read that ended short or out of order: the server's answer cannot be trusted. */
function dataLoss(message: string): CliError {
  return new CliError(snakeCodeName(Code.DataLoss), message);
}

function metadataFromProto(info: TensorInfo | undefined): DecodedMediaMetadata | null {
  const m = info?.metadata;
  if (m?.case === "image") {
    return { Image: { format: (m.value.format || null) as never, color_type: m.value.colorType as never, layout: "HWC" } };
  }
  if (m?.case === "video") {
    const v = m.value;
    return {
      Video: {
        source_fps: v.sourceFps,
        source_duration: v.sourceDuration,
        sampled_timestamps: v.sampledTimestamps,
        ...(v.sourceTotalFrames !== undefined ? { source_total_frames: Number(v.sourceTotalFrames) } : {}),
        ...(v.framesIndices !== undefined ? { frames_indices: v.framesIndices.values.map(Number) } : {}),
      },
    };
  }
  return null;
}

const isUrl = (s: string): boolean => /^(https?|data):/i.test(s);

interface DecodeOpts extends ConnectionOptions {
  local?: boolean;
  json?: boolean;
  forceRgb?: boolean;
  exif?: boolean;
  store?: boolean;
  fps?: number;
  numFrames?: number;
  maxFrames?: number;
  strict?: boolean;
}

function sampling(opts: DecodeOpts): VideoSampling {
  const s: VideoSampling = { fps: opts.fps, numFrames: opts.numFrames, maxFrames: opts.maxFrames, strict: opts.strict === true };
  validateVideoSampling(s);
  return s;
}

async function decodeLocally(source: string, opts: DecodeOpts): Promise<Facts> {
  const config = mediaConfigSchema.parse({});
  const bytes = isUrl(source) ? await fetchMedia(source, fetchPolicy(config)) : new Uint8Array(await readFile(source));
  const d = isVideoPayload(bytes)
    ? await decodeVideo(bytes, videoDecoderConfig(config), sampling(opts))
    : await decodeImage(bytes, decoderLimits(config), { forceRgb: opts.forceRgb === true, applyExifOrientation: opts.exif === true });
  return {
    shape: d.tensorInfo.shape.map((n) => BigInt(n)),
    dtype: d.tensorInfo.dtype,
    metadata: d.tensorInfo.metadata,
    sizeBytes: BigInt(d.data.length),
    contentHash: d.contentHash,
  };
}

async function decodeRemotely(source: string, opts: DecodeOpts): Promise<Facts> {
  const client = createClient(MediaService, clientTransport(opts));
  const res = await client.decode({
    source: isUrl(source) ? { case: "url", value: source } : { case: "data", value: new Uint8Array(await readFile(source)) },
    options: { forceRgb: opts.forceRgb === true, applyExifOrientation: opts.exif === true, skipStore: opts.store !== true },
    video: {
      ...sampling(opts),
      numFrames: opts.numFrames === undefined ? undefined : BigInt(opts.numFrames),
      maxFrames: opts.maxFrames === undefined ? undefined : BigInt(opts.maxFrames),
    },
  });
  return {
    shape: res.tensorInfo?.shape ?? [],
    dtype: "UINT8",
    metadata: metadataFromProto(res.tensorInfo),
    sizeBytes: res.sizeBytes,
    contentHash: res.contentHash ?? null,
    handle: res.handle,
    descriptorJson: res.descriptorJson,
  };
}

function parseRate(value: string): number {
  const rate = Number(value);
  if (!(value.trim() !== "" && Number.isFinite(rate) && rate > 0)) throw new InvalidArgumentError("expected a positive number");
  return rate;
}

function parseCount(value: string): number {
  if (!/^\d+$/.test(value.trim()) || !Number.isSafeInteger(Number(value))) throw new InvalidArgumentError("expected a whole number");
  return Number(value);
}

function parseShape(value: string): number[] {
  const dims = value.split(",").map((s) => s.trim());
  if (dims.some((d) => !/^\d+$/.test(d))) throw new InvalidArgumentError("expected comma-separated dimensions, e.g. 1,2,3");
  return dims.map(Number);
}

function parseHex(value: string): Uint8Array {
  const clean = value.replace(/^0x/i, "").replace(/\s+/g, "");
  if (clean.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(clean)) throw new InvalidArgumentError("expected an even number of hex digits");
  return new Uint8Array(Buffer.from(clean, "hex"));
}

function parseVideoMetadata(value: string): VideoMetadata {
  let raw: unknown;
  try {
    raw = JSON.parse(value);
  } catch {
    throw new InvalidArgumentError("expected JSON");
  }
  const r = raw as Record<string, unknown>;
  const nums = (v: unknown) => Array.isArray(v) && v.every((x) => typeof x === "number");
  if (typeof r["source_fps"] !== "number" || typeof r["source_duration"] !== "number" || !nums(r["sampled_timestamps"])) {
    throw new InvalidArgumentError("expected {source_fps, source_duration, sampled_timestamps[, source_total_frames, frames_indices]}");
  }
  if (r["source_total_frames"] !== undefined && typeof r["source_total_frames"] !== "number") {
    throw new InvalidArgumentError("source_total_frames must be a number");
  }
  if (r["frames_indices"] !== undefined && !nums(r["frames_indices"])) throw new InvalidArgumentError("frames_indices must be numbers");
  return {
    source_fps: r["source_fps"],
    source_duration: r["source_duration"],
    sampled_timestamps: r["sampled_timestamps"] as number[],
    ...(r["source_total_frames"] !== undefined ? { source_total_frames: r["source_total_frames"] as number } : {}),
    ...(r["frames_indices"] !== undefined ? { frames_indices: r["frames_indices"] as number[] } : {}),
  };
}

interface HashOpts {
  shape: number[];
  hex?: Uint8Array;
  file?: string;
  videoMetadata?: VideoMetadata;
  json?: boolean;
}

/** The canonical hash computed in this process, as HashTensor computes it. */
async function hashFacts(opts: HashOpts): Promise<Facts> {
  const bytes = opts.hex ?? (opts.file ? new Uint8Array(await readFile(opts.file)) : new Uint8Array(0));
  const shape = opts.shape;
  if (opts.videoMetadata) {
    validateVideoMetadata(opts.videoMetadata);
    const info: MediaTensorInfo = { shape, dtype: "UINT8", metadata: { Video: opts.videoMetadata } };
    if (bytes.length === 0) return { shape: shape.map((n) => BigInt(n)), dtype: "UINT8", contentHash: null };
    videoDimensionsFromParts(info, bytes);
    return { shape: shape.map((n) => BigInt(n)), dtype: "UINT8", metadata: info.metadata, contentHash: videoContentHash(info, bytes) };
  }
  const expected = shape.reduce((n, d) => n * BigInt(d), 1n);
  if (bytes.length > 0 && expected !== BigInt(bytes.length)) {
    throw new MediaError("TENSOR_INVALID", `tensor payload has ${bytes.length} bytes, shape [${shape.join(", ")}] needs ${expected}`);
  }
  return { shape: shape.map((n) => BigInt(n)), dtype: "UINT8", contentHash: canonicalContentHash(shape, "UINT8", bytes) };
}

const U64_MAX = (1n << 64n) - 1n;

/** A tensor handle: a decimal u64, parsed without going through a double. */
export function parseHandle(value: string): bigint {
  const v = value.trim();
  if (!/^\d+$/.test(v) || BigInt(v) > U64_MAX) throw new InvalidArgumentError("expected a decimal u64 handle");
  return BigInt(v);
}

interface ReadOpts extends ConnectionOptions {
  out?: string;
}

/** Streams ReadTensor into FILE (removed again if the read fails) or stdout; returns the bytes written. */
async function readTensor(handle: bigint, opts: ReadOpts): Promise<bigint> {
  const client = createClient(MediaService, clientTransport(opts));
  const file = opts.out === undefined ? undefined : await open(opts.out, "w");
  let written = 0n;
  let total: bigint | undefined;
  try {
    for await (const chunk of client.readTensor({ handle })) {
      if (chunk.offset !== written) throw dataLoss(`the server sent bytes at ${chunk.offset}, expected ${written}`);
      total = chunk.totalSize;
      if (file) {
        await file.write(chunk.data);
      } else if (!process.stdout.write(chunk.data)) {
        await once(process.stdout, "drain");
      }
      written += BigInt(chunk.data.length);
    }
    // An empty tensor answers with no chunks at all.
    if (total !== undefined && written !== total) throw dataLoss(`the stream ended after ${written} of ${total} bytes`);
    await file?.close();
    return written;
  } catch (error) {
    if (file && opts.out !== undefined) {
      await file.close().catch(() => undefined);
      await rm(opts.out, { force: true });
    }
    throw error;
  }
}

/** `mmgate media decode|hash|read|release`. */
export function mediaCommand(): Command {
  const media = new Command("media").description("decode images and videos to tensors and compute canonical content hashes");

  withConnectionOptions(
    media
      .command("decode")
      .description("decode an image or video file or URL; by default on the server at --addr, or in this process with --local")
      .argument("<file|url>", "image or video (MP4, MOV, MKV, WebM) file, or an http(s) or data URL"),
  )
    .option("--local", "decode in this process with the default limits and URL policy")
    .option("--json", "print one JSON object (u64 values as decimal strings)")
    .option("--force-rgb", "always three channels")
    .option("--exif", "apply the EXIF orientation")
    .option("--store", "keep the tensor in the server's store and print its handle and descriptor")
    .option("--fps <rate>", "video: sample this many frames per second of video", parseRate)
    .addOption(new Option("--num-frames <n>", "video: sample n frames spread evenly").argParser(parseCount).conflicts(["fps", "maxFrames"]))
    .option("--max-frames <n>", "video: sample at most n frames", parseCount)
    .option("--strict", "video: fail on any decode error instead of skipping bad packets")
    .action(async (source: string, opts: DecodeOpts) => {
      try {
        print(opts.local ? await decodeLocally(source, opts) : await decodeRemotely(source, opts), opts.json === true);
      } catch (error) {
        fail("decode", error, opts.local ? undefined : opts);
      }
    });

  media
    .command("hash")
    .description("compute the canonical XXH3-64 content hash of a uint8 tensor (in this process)")
    .requiredOption("--shape <dims>", "comma-separated dimensions, e.g. 1,2,3", parseShape)
    .addOption(new Option("--hex <bytes>", "tensor bytes as hex").argParser(parseHex).conflicts("file"))
    .option("--file <path>", "tensor bytes from a file")
    .option("--video-metadata <json>", "hash as a video with this VideoMetadata JSON", parseVideoMetadata)
    .option("--json", "print one JSON object (u64 values as decimal strings)")
    .action(async (opts: HashOpts) => {
      try {
        print(await hashFacts(opts), opts.json === true);
      } catch (error) {
        fail("hash", error);
      }
    });

  withConnectionOptions(
    media
      .command("read")
      .description("stream a stored tensor's bytes (ReadTensor) to --out FILE or stdout; exits 0 when all bytes arrived, 1 otherwise")
      .argument("<handle>", "tensor handle (decimal u64, from decode --store)", parseHandle),
  )
    .option("--out <file>", "write the bytes to FILE (removed again if the read fails) instead of stdout")
    .action(async (handle: bigint, opts: ReadOpts) => {
      try {
        const written = await readTensor(handle, opts);
        if (opts.out !== undefined) process.stderr.write(`mmgate media read: wrote ${written} bytes to ${opts.out}\n`);
      } catch (error) {
        fail("read", error, opts);
      }
    });

  const release = withConnectionOptions(
    media
      .command("release")
      .description("drop a stored tensor (ReleaseTensor, mutating: --token); exits 0 when released, 3 when the handle was unknown, 1 when the call failed")
      .argument("<handle>", "tensor handle (decimal u64)", parseHandle),
  )
    .addOption(tokenOption())
    .option("--json", "print one JSON object (u64 values as decimal strings)")
    .action(async (handle: bigint, opts: ConnectionOptions & { token?: string; json?: boolean }) => {
      try {
        const headers = opts.token ? { authorization: `Bearer ${opts.token}` } : undefined;
        const res = await createClient(MediaService, clientTransport(opts)).releaseTensor({ handle }, headers ? { headers } : {});
        process.stdout.write(
          opts.json
            ? `${JSON.stringify({ handle: String(handle), released: res.released })}\n`
            : `${handle} ${res.released ? "released" : "unknown (already released or expired)"}\n`,
        );
        if (!res.released) process.exitCode = EXIT.partial;
      } catch (error) {
        fail("release", error, opts);
      }
    });
  withExitCodes(release, { [EXIT.ok]: "released", [EXIT.partial]: "the handle was unknown (already released or expired)" });

  return media;
}
