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
} from "../../gen/mmgate/media/v1/media_pb.js";
import { decoderLimits, fetchPolicy, type MediaConfig } from "./config.js";
import { buildDescriptor, descriptorToJson } from "./descriptor.js";
import { MediaError, toConnectError } from "./errors.js";
import { fetchMedia, type Resolver } from "./fetcher.js";
import { canonicalContentHash, formatContentHashKey, videoContentHash } from "./hash.js";
import { decodeImage } from "./image-decoder.js";
import { Semaphore } from "../util/index.js";
import type { MediaTensorInfo } from "./tensor.js";
import type { TensorStore } from "./tensor-store.js";
import { validateVideoMetadata, videoDimensionsFromParts } from "./video.js";
import { dtypeFromProto, shapeFromProto, tensorInfoToProto, videoMetadataFromProto } from "./wire.js";

export interface MediaServiceDeps {
  readonly config: MediaConfig;
  readonly store: TensorStore;
  /** "b64:…" metadata of this process's transfer agent. */
  readonly nixlMetadata: string;
  readonly logger?: Logger;
  /** Name resolution for URL fetches (tests substitute one). */
  readonly resolver?: Resolver;
}

/** Overflow-checked element count of a shape. */
function elementCount(shape: readonly number[]): bigint {
  return shape.reduce((n, d) => n * BigInt(d), 1n);
}

function hashResponse(hash: bigint | null): HashTensorResponse {
  return create(HashTensorResponseSchema, hash === null ? {} : { contentHash: hash, contentHashKey: formatContentHashKey(hash) });
}

export function createMediaService(deps: MediaServiceDeps): ServiceImpl<typeof MediaService> {
  const { config, store } = deps;
  const limits = decoderLimits(config);
  const policy = fetchPolicy(config);
  const decodeSlots = new Semaphore(config.decoder.maxConcurrentDecodes);
  const fetchSlots = new Semaphore(config.fetch.maxConcurrentFetches);

  /** Runs `work` holding one of `slots`; a cancelled wait rethrows the caller's abort reason. */
  async function withSlot<T>(slots: Semaphore, signal: AbortSignal, work: () => Promise<T>): Promise<T> {
    let permit;
    try {
      permit = await slots.acquire(signal);
    } catch (error) {
      signal.throwIfAborted();
      throw error;
    }
    try {
      return await work();
    } finally {
      permit.release();
    }
  }

  async function encodedBytes(req: DecodeRequest, signal: AbortSignal): Promise<Uint8Array> {
    switch (req.source.case) {
      case "url": {
        const url = req.source.value;
        return withSlot(fetchSlots, signal, () =>
          fetchMedia(url, policy, { signal, ...(deps.resolver ? { resolver: deps.resolver } : {}) }),
        );
      }
      case "data":
        if (req.source.value.length === 0) throw new MediaError("IMAGE_DECODE_FAILED", "image data is empty");
        return req.source.value;
      default:
        throw new MediaError("URL_INVALID", "a source (url or data) is required");
    }
  }

  async function decode(req: DecodeRequest, ctx: HandlerContext): Promise<DecodeResponse> {
    const options = req.options;
    const bytes = await encodedBytes(req, ctx.signal);
    const decoded = await withSlot(decodeSlots, ctx.signal, () =>
      decodeImage(bytes, limits, {
        forceRgb: options?.forceRgb ?? false,
        applyExifOrientation: options?.applyExifOrientation ?? false,
        signal: ctx.signal,
      }),
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
    let handle = 0n;
    let descriptorJson = "";
    if (!options?.skipStore) {
      handle = store.put(decoded.data, decoded.tensorInfo, decoded.contentHash);
      descriptorJson = descriptorToJson(buildDescriptor(deps.nixlMetadata, handle, size, decoded.tensorInfo, decoded.contentHash));
    }
    const hash = decoded.contentHash;
    return create(DecodeResponseSchema, {
      tensorInfo: tensorInfoToProto(decoded.tensorInfo),
      ...(hash === null ? {} : { contentHash: hash, contentHashKey: formatContentHashKey(hash) }),
      descriptorJson,
      handle,
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

  return {
    async decode(req, ctx) {
      try {
        return await decode(req, ctx);
      } catch (error) {
        throw toConnectError(error);
      }
    },
    hashTensor(req) {
      try {
        return hashTensor(req);
      } catch (error) {
        throw toConnectError(error);
      }
    },
    async *readTensor(req, ctx) {
      try {
        yield* readTensor(req, ctx);
      } catch (error) {
        throw toConnectError(error);
      }
    },
    releaseTensor(req) {
      return releaseTensor(req);
    },
  };
}
