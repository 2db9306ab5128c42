import { expect } from "chai";
import { xxh3 } from "@node-rs/xxhash";
import { existsSync } from "node:fs";
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import type * as grpc from "@grpc/grpc-js";
import { ErrorDetailSchema, MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import { mediaCommand } from "../../src/media/cli.js";
import { mediaConfigSchema, videoDecoderConfig } from "../../src/media/config.js";
import { MediaError } from "../../src/media/errors.js";
import { mediaErrorToConnect } from "../../src/media/module.js";
import { mediaModule } from "../../src/media/index.js";
import { videoMetadataJson } from "../../src/media/serde-json.js";
import type { VideoMetadata } from "../../src/media/tensor.js";
import {
  FrameCollector,
  decodeVideo,
  guessVideoContainer,
  isVideoPayload,
  planFrames,
  probeFromFfprobeJson,
  requestedFrameCount,
  roundHalfEven,
  selectExpression,
  targetFrameIndices,
  type VideoDecoderConfig,
  type VideoSampling,
} from "../../src/media/video-decoder.js";
import { clipFrame, makeClip, requireFfmpeg, withClaimedDuration } from "../support/ffmpeg.js";
import { captureOutput, expectRejection, grpcUnary, runMmgate, startServer, type InProcessServer } from "../support/index.js";
import { encodeRaw, pattern } from "./fixtures.js";

const rejects = (work: Promise<unknown> | (() => unknown)) => expectRejection<MediaError>(work, { type: MediaError });

/** The canonical video hash written out from the rule, independently of src/media/hash.ts. */
function ruleHash(shape: number[], metadata: VideoMetadata, bytes: Uint8Array): bigint {
  const u64 = (n: number) => {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(n));
    return b;
  };
  const lp = (b: Uint8Array) => Buffer.concat([u64(b.length), b]);
  const json = Buffer.from(videoMetadataJson(metadata));
  return xxh3.xxh64(
    Buffer.concat([lp(Buffer.from("video")), u64(shape.length), ...shape.map(u64), Buffer.of(0), lp(json), lp(bytes)]),
    0n,
  );
}

/** Frames `indices` of a clip, stacked. */
function expectedFrames(indices: readonly number[], width: number, height: number): Buffer {
  return Buffer.concat(indices.map((f) => clipFrame(f, width, height)));
}

describe("video sampling rules", () => {
  it("targets are np.unique(np.linspace(0, total - 1, n).round()), half to even", () => {
    // Expected values computed with numpy 2.4.
    const table: [number, number, number[]][] = [
      [1, 1, [0]],
      [10, 1, [0]],
      [3, 2, [0, 2]],
      [6, 3, [0, 2, 5]], // 2.5 -> 2
      [4, 3, [0, 2, 3]], // 1.5 -> 2
      [11, 5, [0, 2, 5, 8, 10]], // 2.5 -> 2, 7.5 -> 8
      [8, 7, [0, 1, 2, 4, 5, 6, 7]], // 3.5 -> 4
      [100, 7, [0, 16, 33, 50, 66, 82, 99]], // 16.5 -> 16, 49.5 -> 50, 82.5 -> 82
      [30, 8, [0, 4, 8, 12, 17, 21, 25, 29]],
      [10, 4, [0, 3, 6, 9]],
      [5, 5, [0, 1, 2, 3, 4]],
    ];
    for (const [total, n, expected] of table) expect(targetFrameIndices(total, n), `${total}, ${n}`).to.deep.equal(expected);
    // Duplicates (only possible when n > total, which the count rule refuses) collapse.
    expect(targetFrameIndices(2, 5)).to.deep.equal([0, 1]);
    expect([0.5, 1.5, 2.5, 3.5, 2.4999, 2.5001].map(roundHalfEven)).to.deep.equal([0, 2, 2, 4, 2, 3]);
  });

  it("the requested count follows fps, num_frames, max_frames, then at least 1 and at most total", () => {
    const probe = { duration: 10, totalFrames: 300 };
    const table: [VideoSampling, number][] = [
      [{}, 300],
      [{ numFrames: 8 }, 8],
      [{ numFrames: 0 }, 1],
      [{ fps: 2 }, 20],
      [{ fps: 2, maxFrames: 5 }, 5],
      [{ fps: 0.05 }, 1], // floor(0.5) = 0, then at least 1
      [{ fps: 30 }, 300],
      [{ maxFrames: 16 }, 16],
      [{ maxFrames: 1000 }, 300],
      [{ maxFrames: 0 }, 1],
      [{ numFrames: 300 }, 300],
    ];
    for (const [sampling, expected] of table) expect(requestedFrameCount(probe, sampling), JSON.stringify(sampling)).to.equal(expected);
  });

  it("refuses every invalid request with a typed error", async () => {
    const probe = { duration: 10, totalFrames: 300 };
    const cases: [VideoSampling, typeof probe, string, RegExp][] = [
      [{ fps: 1, numFrames: 2 }, probe, "VIDEO_OPTIONS_INVALID", /fps and num_frames cannot both be set/],
      [{ maxFrames: 1, numFrames: 2 }, probe, "VIDEO_OPTIONS_INVALID", /max_frames and num_frames cannot both be set/],
      [{ fps: 0 }, probe, "VIDEO_OPTIONS_INVALID", /fps must be a positive number/],
      [{ fps: Number.NaN }, probe, "VIDEO_OPTIONS_INVALID", /fps must be a positive number/],
      [{ numFrames: 1.5 }, probe, "VIDEO_OPTIONS_INVALID", /num_frames must be a whole number/],
      [{ numFrames: 301 }, probe, "VIDEO_FRAME_REQUEST_INVALID", /Requested 301 frames but the video has only 300/],
      [{ fps: 31 }, probe, "VIDEO_FRAME_REQUEST_INVALID", /Requested 310 frames/],
      [{ fps: 1 }, { duration: 0, totalFrames: 300 }, "VIDEO_FRAME_REQUEST_INVALID", /needs the video's duration/],
    ];
    for (const [sampling, p, code, message] of cases) {
      const error = await rejects(() => requestedFrameCount(p, sampling));
      expect(error.code, JSON.stringify(sampling)).to.equal(code);
      expect(error.message).to.match(message);
      expect(error.status).to.equal(Code.InvalidArgument);
    }
    const over = await rejects(() => requestedFrameCount(probe, { numFrames: 400 }));
    expect([over.limit, over.actual]).to.deep.equal([300n, 400n]);
  });

  it("reads ffprobe's facts with the reference's fallbacks", () => {
    const json = (stream: Record<string, unknown>, format: Record<string, unknown> = {}, extra: Record<string, unknown>[] = []) =>
      JSON.stringify({ streams: [...extra, { index: extra.length, codec_type: "video", width: 16, height: 8, ...stream }], format });
    // Stream duration x time_base and the stream's frame count.
    expect(
      probeFromFfprobeJson(json({ avg_frame_rate: "30000/1001", r_frame_rate: "30/1", time_base: "1/90000", duration_ts: 900900, nb_frames: "300" })),
    ).to.deep.equal({ streamIndex: 0, width: 16, height: 8, fps: 30000 / 1001, duration: 900900 * (1 / 90000), totalFrames: 300 });
    // avg_frame_rate 0/0 falls back to r_frame_rate; the container duration; floor(duration x fps).
    const mkv = probeFromFfprobeJson(json({ avg_frame_rate: "0/0", r_frame_rate: "25/1", time_base: "1/1000" }, { duration: "2.030000" }));
    expect(mkv).to.include({ fps: 25, duration: 2.03, totalFrames: 50 });
    // No duration anywhere but a frame count: duration 0.
    expect(probeFromFfprobeJson(json({ avg_frame_rate: "5/1", nb_frames: "7" }))).to.include({ duration: 0, totalFrames: 7 });
    // A cover picture is not the video; a default-marked stream wins over an earlier one.
    const withCover = probeFromFfprobeJson(
      json({ avg_frame_rate: "5/1", nb_frames: "7" }, {}, [{ index: 0, codec_type: "video", width: 600, height: 600, disposition: { attached_pic: 1 } }]),
    );
    expect(withCover.streamIndex).to.equal(1);
    const two = JSON.stringify({
      streams: [
        { index: 0, codec_type: "video", width: 4, height: 4, avg_frame_rate: "5/1", nb_frames: "3", disposition: { default: 0 } },
        { index: 1, codec_type: "video", width: 8, height: 8, avg_frame_rate: "5/1", nb_frames: "3", disposition: { default: 1 } },
      ],
    });
    expect(probeFromFfprobeJson(two).streamIndex).to.equal(1);
  });

  it("refuses streams without frames, rate or video", async () => {
    const base = { index: 0, codec_type: "video", width: 16, height: 8 };
    const cases: [unknown, RegExp][] = [
      [{ streams: [{ ...base, avg_frame_rate: "5/1" }], format: {} }, /Video has no frames/],
      [{ streams: [{ ...base, avg_frame_rate: "5/1", nb_frames: "0" }], format: { duration: "0.1" } }, /Video has no frames/],
      [{ streams: [{ ...base, avg_frame_rate: "0/0", r_frame_rate: "0/0", nb_frames: "3" }] }, /Invalid video frame rate/],
      [{ streams: [{ index: 0, codec_type: "audio" }] }, /no video stream/],
      [{ streams: [{ ...base, width: 0, avg_frame_rate: "5/1", nb_frames: "3" }] }, /unknown frame size/],
    ];
    for (const [value, message] of cases) {
      const error = await rejects(() => probeFromFfprobeJson(JSON.stringify(value)));
      expect(error.code).to.equal("VIDEO_DECODE_FAILED");
      expect(error.message).to.match(message);
    }
  });

  it("selects target frames in ffmpeg with runs, or a span filtered while streaming", () => {
    expect(selectExpression([0, 3, 4, 5, 9])).to.equal("eq(n\\,0)+between(n\\,3\\,5)+eq(n\\,9)");
    expect(planFrames([0, 1, 2, 3])).to.deep.equal({ mode: "exact", filter: null });
    expect(planFrames([2, 3, 4])).to.deep.equal({ mode: "exact", filter: "select=between(n\\,2\\,4)" });
    expect(planFrames([1, 3, 6], 10)).to.deep.equal({ mode: "span", filter: "select=between(n\\,1\\,6)" });

    // Span mode: output frames 1..6, three of them kept; chunks straddle frames.
    const frame = 6;
    const tensor = new Uint8Array(3 * frame);
    const collector = new FrameCollector(tensor, frame, [1, 3, 6], { mode: "span", filter: "" });
    const stream = Uint8Array.from({ length: 6 * frame }, (_, i) => Math.floor(i / frame) + 1);
    for (let at = 0; at < stream.length; at += 5) collector.push(stream.subarray(at, at + 5));
    expect(collector.collected).to.equal(3);
    expect(collector.partial).to.equal(false);
    expect(Array.from(tensor)).to.deep.equal([...Array<number>(6).fill(1), ...Array<number>(6).fill(3), ...Array<number>(6).fill(6)]);
    expect(() => collector.push(Uint8Array.of(7))).to.throw(/more frames than requested/);

    const exact = new FrameCollector(new Uint8Array(2 * frame), frame, [0, 5], { mode: "exact", filter: null });
    exact.push(new Uint8Array(frame + 2));
    expect([exact.collected, exact.partial]).to.deep.equal([1, true]);
  });

  it("sniffs MP4 and Matroska but not still images", async () => {
    const ftyp = (brand: string) => Buffer.concat([Buffer.from([0, 0, 0, 0x18]), Buffer.from(`ftyp${brand}`), Buffer.alloc(12)]);
    expect(guessVideoContainer(ftyp("isom"))).to.equal("Mp4");
    expect(guessVideoContainer(ftyp("qt  "))).to.equal("Mp4");
    expect(guessVideoContainer(Buffer.from([0x1a, 0x45, 0xdf, 0xa3, 0x01]))).to.equal("Matroska");
    for (const brand of ["avif", "heic", "mif1"]) expect(guessVideoContainer(ftyp(brand)), brand).to.equal(null);
    expect(isVideoPayload(ftyp("avif"))).to.equal(false);
    expect(isVideoPayload(await encodeRaw(pattern(12), 2, 2, 3, "png"))).to.equal(false);
    expect(isVideoPayload(ftyp("mp42"))).to.equal(true);
  });
});

describe("video decoder (ffmpeg)", function () {
  this.timeout(30_000);
  const W = 16;
  const H = 8;
  let dir: string;
  let config: VideoDecoderConfig;
  let mkv: Buffer; // 10 frames at 5 fps, FFV1
  let mp4: Buffer; // the same in H.264 RGB, index at the end
  let long: Buffer; // 30 frames at 10 fps, FFV1

  before(async function () {
    requireFfmpeg(this);
    dir = await mkdtemp(join(tmpdir(), "mmgate-video-test-"));
    // The decoder stages inputs here, so the tests can see that nothing is left.
    const staging = join(dir, "staging");
    await mkdir(staging);
    config = { ...videoDecoderConfig(mediaConfigSchema.parse({})), tempDir: staging };
    [mkv, mp4, long] = await Promise.all([
      makeClip(dir, "clip.mkv", { frames: 10, width: W, height: H, fps: 5, container: "mkv" }),
      makeClip(dir, "clip.mp4", { frames: 10, width: W, height: H, fps: 5, container: "mp4" }),
      makeClip(dir, "long.mkv", { frames: 30, width: W, height: H, fps: 10, container: "mkv" }),
    ]);
  });

  after(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("decodes sampled frames exactly, with the reference's metadata and the canonical video hash", async () => {
    const decoded = await decodeVideo(mkv, config, { numFrames: 4 });
    const metadata: VideoMetadata = {
      source_fps: 5,
      source_duration: 2,
      sampled_timestamps: [0, 0.6, 1.2, 1.8],
      source_total_frames: 10,
      frames_indices: [0, 3, 6, 9],
    };
    expect(decoded.tensorInfo).to.deep.equal({ shape: [4, H, W, 3], dtype: "UINT8", metadata: { Video: metadata } });
    expect(Buffer.from(decoded.data).equals(expectedFrames([0, 3, 6, 9], W, H))).to.equal(true);
    expect(decoded.contentHash).to.equal(ruleHash([4, H, W, 3], metadata, decoded.data));
    expect(videoMetadataJson(metadata)).to.equal(
      '{"source_fps":5.0,"source_duration":2.0,"sampled_timestamps":[0.0,0.6,1.2,1.8],"source_total_frames":10,"frames_indices":[0,3,6,9]}',
    );
    // Nothing is left where the input was staged.
    expect(await readdir(config.tempDir!)).to.deep.equal([]);
  });

  it("samples by the spec's rules from an MP4 whose index is at its end", async () => {
    // [options, frames_indices]; source: 10 frames, 5 fps, 2 s.
    // (The rules themselves are table-tested above; these check that ffmpeg delivers the frames they pick.)
    const table: [VideoSampling, number[]][] = [
      [{}, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]], // every frame: no select filter
      [{ fps: 2 }, [0, 3, 6, 9]], // floor(2 x 2) = 4
      [{ fps: 2, maxFrames: 3 }, [0, 4, 9]], // 4.5 -> 4
    ];
    const results = await Promise.all(table.map(([sampling]) => decodeVideo(mp4, config, sampling)));
    for (const [i, [sampling, indices]] of table.entries()) {
      const decoded = results[i]!;
      const label = JSON.stringify(sampling);
      expect(decoded.tensorInfo.shape, label).to.deep.equal([indices.length, H, W, 3]);
      const video = (decoded.tensorInfo.metadata as { Video: VideoMetadata }).Video;
      expect(video.frames_indices, label).to.deep.equal(indices);
      expect(video.sampled_timestamps, label).to.deep.equal(indices.map((i) => i / 5));
      expect(Buffer.from(decoded.data).equals(expectedFrames(indices, W, H)), label).to.equal(true);
    }
  });

  it("takes the spec's targets from a longer clip (half-to-even rounding on real frames)", async () => {
    // total 30, n 8: linspace(0, 29, 8) -> [0, 4, 8, 12, 17, 21, 25, 29].
    const decoded = await decodeVideo(long, config, { numFrames: 8, strict: true, hash: false });
    expect(decoded.contentHash).to.equal(null);
    const indices = [0, 4, 8, 12, 17, 21, 25, 29];
    expect((decoded.tensorInfo.metadata as { Video: VideoMetadata }).Video.frames_indices).to.deep.equal(indices);
    expect(Buffer.from(decoded.data).equals(expectedFrames(indices, W, H))).to.equal(true);
  });

  it("a truncated file fails in strict mode and yields the frames before the damage otherwise", async () => {
    const truncated = long.subarray(0, Math.floor(long.length * 0.5));
    // Cut right after the header: not a single frame, an error even when not strict.
    const headerOnly = long.subarray(0, long.indexOf(Buffer.from([0x1f, 0x43, 0xb6, 0x75])) + 8);
    const [strict, partial, none] = await Promise.all([
      rejects(decodeVideo(truncated, config, { numFrames: 8, strict: true })),
      decodeVideo(truncated, config, { numFrames: 8 }),
      rejects(decodeVideo(headerOnly, config, {})),
    ]);
    expect(strict.code).to.equal("VIDEO_DECODE_FAILED");
    expect(strict.message).to.match(/decoded \d of 8 requested frames/);

    const video = (partial.tensorInfo.metadata as { Video: VideoMetadata }).Video;
    const m = partial.tensorInfo.shape[0]!;
    expect(m).to.be.within(1, 7);
    expect(video.frames_indices).to.deep.equal([0, 4, 8, 12, 17, 21, 25, 29].slice(0, m));
    expect(video.source_total_frames).to.equal(30);
    expect(Buffer.from(partial.data).equals(expectedFrames(video.frames_indices!, W, H))).to.equal(true);

    expect(none.code).to.equal("VIDEO_DECODE_FAILED");
    expect(none.message).to.match(/no frame could be decoded/);
  });

  it("refuses a video over the allocation limit from its header, before decoding", async () => {
    // The header claims 10^6 s: 5,000,000 frames of 384 bytes. The ffmpeg
    // path points nowhere, so reaching the decode would fail differently.
    const claimed = withClaimedDuration(mkv, 1e9);
    const noDecode = { ...config, ffmpegPath: join(dir, "no-such-ffmpeg") };
    const [error, small, missing] = await Promise.all([
      rejects(decodeVideo(claimed, noDecode, {})),
      rejects(decodeVideo(mkv, { ...noDecode, maxAlloc: 1000 }, { numFrames: 4 })),
      rejects(decodeVideo(claimed, noDecode, { numFrames: 2 })),
    ]);
    expect(error.code).to.equal("VIDEO_ALLOCATION_EXCEEDS_LIMIT");
    expect(error.message).to.equal("Video allocation 1920000000 bytes exceeds configured limit 536870912 bytes");
    expect([error.limit, error.actual]).to.deep.equal([536870912n, 1920000000n]);
    // The configured limit applies: 4 frames of 384 bytes do not fit in 1,000.
    expect(small.message).to.equal("Video allocation 1536 bytes exceeds configured limit 1000 bytes");
    // With the frames asked for fitting, the same clip reaches the (missing) decoder.
    expect(missing.code).to.equal("VIDEO_DECODER_UNAVAILABLE");
  });

  it("refuses bad requests and bad files with typed errors", async () => {
    const both = await rejects(decodeVideo(mkv, config, { fps: 1, numFrames: 2 }));
    expect(both.code).to.equal("VIDEO_OPTIONS_INVALID");
    const [tooMany, garbage, noIndex] = await Promise.all([
      rejects(decodeVideo(mkv, config, { numFrames: 11 })),
      rejects(decodeVideo(Buffer.concat([mkv.subarray(0, 4), Buffer.alloc(200, 0x55)]), config, {})),
      // The MP4's index is at its end: without it there is nothing to read.
      rejects(decodeVideo(mp4.subarray(0, mp4.length - 200), config, {})),
    ]);
    expect(tooMany.code).to.equal("VIDEO_FRAME_REQUEST_INVALID");
    expect(tooMany.message).to.equal("Requested 11 frames but the video has only 10");
    expect(garbage.code).to.equal("VIDEO_DECODE_FAILED");
    expect(garbage.message).to.match(/^Failed to decode video: /);
    expect(garbage.message).to.not.match(/@ 0x/);
    expect(noIndex.code).to.equal("VIDEO_DECODE_FAILED");
  });

  it("without ffprobe or ffmpeg, video decoding is FAILED_PRECONDITION with the reason", async () => {
    const error = await rejects(decodeVideo(mkv, { ...config, ffprobePath: "/nonexistent/ffprobe" }, {}));
    expect(error.code).to.equal("VIDEO_DECODER_UNAVAILABLE");
    expect(error.message).to.equal(
      "Video decoding is unavailable: ffprobe not found at '/nonexistent/ffprobe'; install the Debian package ffmpeg or set media.video.ffprobePath",
    );
    const status = mediaErrorToConnect(error)!;
    expect(status.code).to.equal(Code.FailedPrecondition);
    expect(status.findDetails(ErrorDetailSchema)[0]?.code).to.equal("VIDEO_DECODER_UNAVAILABLE");
    // A staging directory that does not exist is the server's problem too.
    const staging = await rejects(decodeVideo(mkv, { ...config, tempDir: join(dir, "missing") }, {}));
    expect(staging.code).to.equal("VIDEO_DECODER_UNAVAILABLE");
    expect(staging.message).to.equal("Video decoding is unavailable: cannot stage the input (ENOENT); check media.video.tempDir");
  });

  it("cancellation kills ffmpeg and rejects with the caller's reason", async () => {
    // A stand-in ffmpeg that records its pid and hangs.
    const pidFile = join(dir, "ffmpeg.pid");
    const fake = join(dir, "hanging-ffmpeg");
    await writeFile(fake, `#!/bin/sh\necho $$ > '${pidFile}'\nexec sleep 30\n`);
    await chmod(fake, 0o755);
    const controller = new AbortController();
    const decoding = decodeVideo(mkv, { ...config, ffmpegPath: fake }, { signal: controller.signal });
    const started = Date.now();
    while (!existsSync(pidFile) || (await readFile(pidFile, "utf8")).trim() === "") {
      if (Date.now() - started > 10_000) throw new Error("the stand-in ffmpeg never started");
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    const pid = Number((await readFile(pidFile, "utf8")).trim());
    const reason = new Error("caller went away");
    controller.abort(reason);
    const error = await expectRejection(decoding);
    expect(error).to.equal(reason);
    expect(() => process.kill(pid, 0)).to.throw(/ESRCH/);
    expect(await readdir(config.tempDir!)).to.deep.equal([]);
  });
});

describe("video through MediaService and the CLI", function () {
  this.timeout(30_000);
  const W = 16;
  const H = 8;
  let dir: string;
  let server: InProcessServer;
  let clip: Buffer;
  let file: string;

  before(async function () {
    requireFfmpeg(this);
    dir = await mkdtemp(join(tmpdir(), "mmgate-video-rpc-"));
    clip = await makeClip(dir, "clip.mp4", { frames: 10, width: W, height: H, fps: 5, container: "mp4" });
    file = join(dir, "clip.mp4");
    server = await startServer({ modules: [mediaModule] });
  });

  after(async () => {
    await server?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("Decode takes video bytes and sampling options (connect)", async () => {
    const client = createClient(MediaService, server.transport);
    const res = await client.decode({ source: { case: "data", value: clip }, options: { returnPixels: true }, video: { numFrames: 3n } });
    expect(res.tensorInfo?.shape).to.deep.equal([3n, BigInt(H), BigInt(W), 3n]);
    expect(res.tensorInfo?.metadata.case).to.equal("video");
    const video = res.tensorInfo?.metadata.value as { sourceFps: number; sourceDuration: number; sampledTimestamps: number[]; sourceTotalFrames?: bigint; framesIndices?: { values: bigint[] } };
    expect(video.sourceFps).to.equal(5);
    expect(video.sourceDuration).to.equal(2);
    expect(video.sampledTimestamps).to.deep.equal([0, 0.8, 1.8]);
    expect(video.sourceTotalFrames).to.equal(10n);
    expect(video.framesIndices?.values).to.deep.equal([0n, 4n, 9n]);
    expect(Buffer.from(res.pixels).equals(expectedFrames([0, 4, 9], W, H))).to.equal(true);
    const metadata: VideoMetadata = { source_fps: 5, source_duration: 2, sampled_timestamps: [0, 0.8, 1.8], source_total_frames: 10, frames_indices: [0, 4, 9] };
    expect(res.contentHash).to.equal(ruleHash([3, H, W, 3], metadata, res.pixels));
    expect(JSON.parse(res.descriptorJson)).to.have.nested.property("metadata.Video.frames_indices").that.deep.equals([0, 4, 9]);

    const both = await expectRejection(client.decode({ source: { case: "data", value: clip }, video: { fps: 1, numFrames: 2n } }), { type: ConnectError });
    expect(both.code).to.equal(Code.InvalidArgument);
    expect(both.findDetails(ErrorDetailSchema)[0]?.code).to.equal("VIDEO_OPTIONS_INVALID");
  });

  it("Decode takes video bytes and sampling options (@grpc/grpc-js)", async () => {
    const grpcClient = server.grpcClient("mmgate/media/v1/media.proto", "mmgate.media.v1.MediaService");
    const res = await grpcUnary<Record<string, unknown>>(grpcClient, "Decode", {
      data: clip,
      options: { returnPixels: true, skipStore: true },
      video: { fps: 2, maxFrames: "3", strict: true },
    });
    const info = res["tensorInfo"] as { shape: string[]; metadata: string; video: { framesIndices: { values: string[] }; sourceTotalFrames: string } };
    expect(info.shape).to.deep.equal(["3", String(H), String(W), "3"]);
    expect(info.metadata).to.equal("video");
    expect(info.video.framesIndices.values).to.deep.equal(["0", "4", "9"]);
    expect(info.video.sourceTotalFrames).to.equal("10");
    expect(Buffer.from(res["pixels"] as Buffer).equals(expectedFrames([0, 4, 9], W, H))).to.equal(true);
    const error = await expectRejection<grpc.ServiceError>(grpcUnary(grpcClient, "Decode", { data: clip, video: { numFrames: "11" } }), { code: 3 });
    expect(error.details).to.equal("Requested 11 frames but the video has only 10");
  });

  it("mmgate media decode clip.mp4 --num-frames 8 prints the same facts locally and through the server", async () => {
    const run = async (args: string[]) =>
      (await captureOutput(() => mediaCommand().exitOverride().parseAsync(args, { from: "user" }))).stdout;
    const local = JSON.parse(await run(["decode", file, "--num-frames", "8", "--local", "--json"])) as Record<string, unknown>;
    const remote = JSON.parse(await run(["decode", file, "--num-frames", "8", "--addr", server.addr, "--json"])) as Record<string, unknown>;
    expect(local).to.deep.equal(remote);
    expect(local["shape"]).to.deep.equal(["8", String(H), String(W), "3"]);
    expect(local["metadata"]).to.have.nested.property("Video.frames_indices").that.deep.equals([0, 1, 3, 4, 5, 6, 8, 9]);
    const conflict = await runMmgate(["media", "decode", file, "--num-frames", "2", "--fps", "1", "--local"]);
    expect(conflict.code).to.not.equal(0);
    expect(conflict.stderr).to.match(/cannot be used with/);
  });
});
