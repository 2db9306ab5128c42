import { MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import { defineModule, bindService } from "../server/index.js";
import type { Semaphore } from "../util/index.js";
import { MEDIA_ENV, mediaConfigSchema, peakMemoryBytes } from "./config.js";
import { agentMetadataBytes, encodeNixlMetadata, newTransferAgent } from "./descriptor.js";
import { mediaErrorToConnect } from "./errors.js";
import { configureSharp } from "./image-decoder.js";
import { MediaMetrics } from "./metrics.js";
import { createMediaPipeline, type MediaPipeline } from "./pipeline.js";
import { createMediaService } from "./service.js";
import { TensorStore } from "./tensor-store.js";

/** Options of a media module built by `createMediaModule`. */
export interface MediaModuleOptions {
  /**
   * Decode slots shared with other work, or held by a test; by default each
   * instance has its own of decoder.maxConcurrentDecodes. The queue in front
   * of them is bounded by decoder.maxQueuedDecodes either way.
   */
  readonly decodeSlots?: Semaphore;
  /** Fetch slots, likewise (default fetch.maxConcurrentFetches). */
  readonly fetchSlots?: Semaphore;
}

/**
 * The `media` module: MediaService over a bounded tensor store. Other
 * modules that `require` it get its pipeline (fetch, decode, store).
 */
export function createMediaModule(options: MediaModuleOptions = {}) {
  return defineModule({
    name: "media",
    description: "Decoded media: image and video tensors, the canonical XXH3 content hash, transfer descriptors",
    configSchema: mediaConfigSchema,
    // DYN_MM_ALLOW_INTERNAL, DYN_MULTIMODAL_LOADER_CACHE_GB (docs/media.md).
    env: MEDIA_ENV,
    mapError: mediaErrorToConnect,
    create(ctx) {
      const config = ctx.config;
      configureSharp(config.decoder.threadsPerDecode);
      const tensors = new TensorStore({
        maxBytes: config.store.maxBytes,
        ttlMs: config.store.ttlMs,
        // Called only after construction, once `metrics` exists.
        onEvict: (_tensor, reason) => metrics.evictions.inc({ reason }),
      });
      // Read at scrape time only, after construction, once `pipeline` exists.
      const metrics = new MediaMetrics(ctx.metrics, tensors, () => pipeline.load, () => pipeline.decodedCache);
      const agent = newTransferAgent(ctx.advertisedAddress);
      const pipeline: MediaPipeline = createMediaPipeline({
        config,
        tensors,
        nixlMetadata: encodeNixlMetadata(agentMetadataBytes(agent)),
        ...(options.decodeSlots ? { decodeSlots: options.decodeSlots } : {}),
        ...(options.fetchSlots ? { fetchSlots: options.fetchSlots } : {}),
        onRejected: (stage) => metrics.admissionRejected.inc({ stage }),
        onDecodedCache: (event) => metrics.decodedCache[event].inc(),
      });
      ctx.logger.info(
        {
          agent: agent.name,
          storeBytes: config.store.maxBytes,
          decodedCacheBytes: config.decodedCache.maxBytes,
          // Store budget + decoded cache budget + decoder.maxAlloc × decoder.maxConcurrentDecodes.
          peakMemoryBytes: peakMemoryBytes(config),
          maxConcurrentDecodes: config.decoder.maxConcurrentDecodes,
          maxQueuedDecodes: config.decoder.maxQueuedDecodes,
          maxConcurrentFetches: config.fetch.maxConcurrentFetches,
          maxQueuedFetches: config.fetch.maxQueuedFetches,
        },
        "media tensor store ready",
      );
      return {
        services: [bindService(MediaService, createMediaService({ config, pipeline, logger: ctx.logger }))],
        exports: pipeline,
        close() {
          tensors.clear();
          pipeline.decodedCache.clear();
        },
      };
    },
  });
}

/** The `media` module as the server runs it. */
export const mediaModule = createMediaModule();

export { MEDIA_ENV, mediaConfigSchema, peakMemoryBytes, type MediaConfig } from "./config.js";
export { DecodedMediaCache, decodedCacheKey, type DecodedCacheEvent, type DecodedMediaCacheOptions } from "./decoded-cache.js";
export { MediaError, OVERLOADED_RETRY_AFTER_SECONDS, type MediaErrorCode } from "./errors.js";
export { MediaAdmission, MEDIA_STAGES, type MediaStage, type MediaStageLoad } from "./admission.js";
export {
  createMediaPipeline,
  type DecodeOptions,
  type MediaPipeline,
  type MediaPipelineOptions,
  type MediaSource,
  type StoredMedia,
} from "./pipeline.js";
export type {
  ColorType,
  DataType,
  DecodedMedia,
  DecodedMediaMetadata,
  ImageFormat,
  ImageMetadata,
  MediaTensorInfo,
  VideoMetadata,
} from "./tensor.js";
export {
  canonicalContentHash,
  contentHashForTensor,
  formatContentHashKey,
  parseContentHashKey,
  videoContentHash,
} from "./hash.js";
export { videoMetadataJson, formatF64 } from "./serde-json.js";
export { videoDimensionsFromParts, type VideoDimensions } from "./video.js";
export {
  decodeVideo,
  DEFAULT_VIDEO_MAX_ALLOC,
  guessVideoContainer,
  isVideoPayload,
  targetFrameIndices,
  requestedFrameCount,
  validateVideoSampling,
  type VideoContainer,
  type VideoDecodeOptions,
  type VideoDecoderConfig,
  type VideoSampling,
} from "./video-decoder.js";
export { configureSharp, decodeImage, DEFAULT_MAX_ALLOC, type ImageDecoderLimits, type ImageDecodeOptions } from "./image-decoder.js";
export {
  agentMetadataBytes,
  buildDescriptor,
  decodeNixlMetadata,
  descriptorToJson,
  encodeNixlMetadata,
  newTransferAgent,
  parseDescriptorJson,
  type MediaDataDescriptor,
  type NixlDescriptor,
  type TransferAgent,
} from "./descriptor.js";
export { TensorStore, type StoredTensor, type TensorStoreOptions } from "./tensor-store.js";
export { fetchMedia, decodeDataUrl, REDIRECT_STATUSES, type FetchPolicy, type MixedAddressPolicy, type Resolver } from "./fetcher.js";
export {
  BLOCKED_HOSTS,
  BLOCKED_IP_NETWORKS,
  checkUrlAllowed,
  isBlockedIp,
  DEFAULT_URL_POLICY,
  type UrlPolicy,
} from "./url-policy.js";
export { mediaCommand } from "./cli.js";
