import { MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import { defineModule, bindService } from "../server/index.js";
import { mediaConfigSchema } from "./config.js";
import { agentMetadataBytes, encodeNixlMetadata, newTransferAgent } from "./descriptor.js";
import { mediaErrorToConnect } from "./errors.js";
import { configureSharp } from "./image-decoder.js";
import { MediaMetrics } from "./metrics.js";
import { createMediaPipeline, type MediaPipeline } from "./pipeline.js";
import { createMediaService } from "./service.js";
import { TensorStore } from "./tensor-store.js";

/**
 * The `media` module: MediaService over a bounded tensor store. Other
 * modules that `require` it get its pipeline (fetch, decode, store).
 */
export const mediaModule = defineModule({
  name: "media",
  description: "Decoded media: image tensors, the canonical XXH3 content hash, transfer descriptors",
  configSchema: mediaConfigSchema,
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
    const metrics = new MediaMetrics(ctx.metrics, tensors);
    const agent = newTransferAgent(ctx.advertisedAddress);
    const pipeline: MediaPipeline = createMediaPipeline({ config, tensors, nixlMetadata: encodeNixlMetadata(agentMetadataBytes(agent)) });
    ctx.logger.info({ agent: agent.name, storeBytes: config.store.maxBytes }, "media tensor store ready");
    return {
      services: [bindService(MediaService, createMediaService({ config, pipeline, logger: ctx.logger }))],
      exports: pipeline,
      close() {
        tensors.clear();
      },
    };
  },
});

export { mediaConfigSchema, type MediaConfig } from "./config.js";
export { MediaError, type MediaErrorCode } from "./errors.js";
export { createMediaPipeline, type DecodeOptions, type MediaPipeline, type MediaSource, type StoredMedia } from "./pipeline.js";
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
export { fetchMedia, decodeDataUrl, type FetchPolicy, type Resolver } from "./fetcher.js";
export {
  BLOCKED_HOSTS,
  BLOCKED_IP_NETWORKS,
  checkUrlAllowed,
  isBlockedIp,
  DEFAULT_URL_POLICY,
  type UrlPolicy,
} from "./url-policy.js";
export { mediaCommand } from "./cli.js";
