import { create } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Logger } from "pino";
import {
  DecodeResponseSchema,
  HashTensorResponseSchema,
  ReadTensorResponseSchema,
  ReleaseTensorResponseSchema,
  type DecodeRequest,
  type DecodeResponse,
  type HashTensorRequest,
  type HashTensorResponse,
  type MediaService,
  type ReadTensorRequest,
  type ReadTensorResponse,
  type ReleaseTensorRequest,
  type ReleaseTensorResponse,
  type VideoOptions,
} from "../../gen/mmgate/media/v1/media_pb.js";
import type { MediaConfig } from "./config.js";
import { MediaError } from "./errors.js";
import { canonicalContentHash, formatContentHashKey, videoContentHash } from "./hash.js";
import type { MediaPipeline, MediaSource } from "./pipeline.js";
import type { MediaTensorInfo } from "./tensor.js";
import type { VideoSampling } from "./video-decoder.js";
import { validateVideoMetadata, videoDimensionsFromParts } from "./video.js";
import { dtypeFromProto, shapeFromProto, tensorInfoToProto, videoMetadataFromProto } from "./proto-convert.js";

export interface MediaServiceDeps {
  readonly config: MediaConfig;
  readonly pipeline: MediaPipeline;
  readonly logger?: Logger;
}

/** Overflow-checked element count of a shape. */
function elementCount(shape: readonly number[]): bigint {
  return shape.reduce((n, d) => n * BigInt(d), 1n);
}

/** A uint64 count as a number; beyond 2^53 it saturates (no video has that many frames). */
function count(value: bigint | undefined): number | undefined {
  return value === undefined ? undefined : Number(value > BigInt(Number.MAX_SAFE_INTEGER) ? BigInt(Number.MAX_SAFE_INTEGER) : value);
}

function videoSampling(video: VideoOptions | undefined): VideoSampling {
  if (video === undefined) return {};
  return { fps: video.fps, numFrames: count(video.numFrames), maxFrames: count(video.maxFrames), strict: video.strict };
}

function hashResponse(hash: bigint | null): HashTensorResponse {
  return create(HashTensorResponseSchema, hash === null ? {} : { contentHash: hash, contentHashKey: formatContentHashKey(hash) });
}

export function createMediaService(deps: MediaServiceDeps): ServiceImpl<typeof MediaService> {
  const { config, pipeline } = deps;
  const store = pipeline.tensors;

  async function decode(req: DecodeRequest, ctx: HandlerContext): Promise<DecodeResponse> {
    const options = req.options;
    const source: MediaSource | undefined =
      req.source.case === "url" ? { url: req.source.value } : req.source.case === "data" ? { data: req.source.value } : undefined;
    if (source === undefined) throw new MediaError("URL_INVALID", "a source (url or data) is required");
    const decoded = await pipeline.decode(
      source,
      { forceRgb: options?.forceRgb ?? false, applyExifOrientation: options?.applyExifOrientation ?? false, video: videoSampling(req.video) },
      ctx.signal,
    );
    const size = decoded.data.length;
    if (options?.returnPixels && size > config.maxInlinePixelBytes) {
      throw new MediaError(
        "INLINE_PIXELS_TOO_LARGE",
        `Decoded tensor of ${size} bytes exceeds the inline limit of ${config.maxInlinePixelBytes} bytes; read it with ReadTensor`,
        BigInt(config.maxInlinePixelBytes),
        BigInt(size),
      );
    }
    ctx.signal.throwIfAborted();
    const stored = options?.skipStore ? { handle: 0n, descriptorJson: "" } : pipeline.store(decoded);
    const hash = decoded.contentHash;
    return create(DecodeResponseSchema, {
      tensorInfo: tensorInfoToProto(decoded.tensorInfo),
      ...(hash === null ? {} : { contentHash: hash, contentHashKey: formatContentHashKey(hash) }),
      descriptorJson: stored.descriptorJson,
      handle: stored.handle,
      sizeBytes: BigInt(size),
      pixels: options?.returnPixels ? decoded.data : new Uint8Array(0),
    });
  }

  function hashTensor(req: HashTensorRequest): HashTensorResponse {
    const shape = shapeFromProto(req.shape);
    const dtype = dtypeFromProto(req.dtype);
    const bytes = req.data;
    if (req.videoMetadata !== undefined) {
      const metadata = videoMetadataFromProto(req.videoMetadata);
      validateVideoMetadata(metadata);
      if (bytes.length === 0) return hashResponse(null);
      const info: MediaTensorInfo = { shape, dtype, metadata: { Video: metadata } };
      videoDimensionsFromParts(info, bytes);
      return hashResponse(videoContentHash(info, bytes));
    }
    if (bytes.length === 0) return hashResponse(null);
    const expected = elementCount(shape);
    if (expected !== BigInt(bytes.length)) {
      throw new MediaError(
        "TENSOR_INVALID",
        `tensor payload has ${bytes.length} bytes, shape [${shape.join(", ")}] needs ${expected}`,
        expected,
        BigInt(bytes.length),
      );
    }
    return hashResponse(canonicalContentHash(shape, dtype, bytes));
  }

  async function* readTensor(req: ReadTensorRequest, ctx: HandlerContext): AsyncGenerator<ReadTensorResponse> {
    const tensor = store.get(req.handle);
    if (tensor === undefined) {
      throw new MediaError("TENSOR_NOT_FOUND", `tensor ${req.handle} not found (released or expired)`);
    }
    // Holding the view keeps the bytes alive even if the entry is released mid-stream.
    const data = tensor.data;
    const total = BigInt(data.length);
    const end = req.length === 0n ? total : req.offset + req.length;
    if (req.offset > total || end > total) {
      throw new MediaError("READ_RANGE_INVALID", `range ${req.offset}+${req.length} is outside the tensor's ${total} bytes`, total, end);
    }
    // The stream is finite and served from memory, so it runs to its end even
    // while the server drains: stopping early would hand the receiver a
    // partial tensor under status OK. The host's grace still bounds it.
    const chunk = config.readChunkBytes;
    for (let at = Number(req.offset); at < Number(end); at += chunk) {
      if (ctx.signal.aborted) return;
      const stop = Math.min(at + chunk, Number(end));
      yield create(ReadTensorResponseSchema, { offset: BigInt(at), data: data.subarray(at, stop), totalSize: total });
    }
  }

  function releaseTensor(req: ReleaseTensorRequest): ReleaseTensorResponse {
    return create(ReleaseTensorResponseSchema, { released: store.release(req.handle) });
  }

  // Errors thrown here reach the client through the module's error mapper.
  return { decode, hashTensor, readTensor, releaseTensor };
}
