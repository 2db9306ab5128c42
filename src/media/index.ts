import { defineModule, bindService } from "../server/module.js";
import { MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import { mediaConfigSchema } from "./config.js";
import { configureSharp } from "./image-decoder.js";
import { agentMetadataBytes, encodeNixlMetadata, newTransferAgent } from "./descriptor.js";
import { MediaMetrics } from "./metrics.js";
import { createMediaService } from "./service.js";
import { TensorStore } from "./tensor-store.js";

/** The `media` module: MediaService over a bounded tensor store. */
export const mediaModule = defineModule({
  name: "media",
  description: "Decoded media: image tensors, the canonical XXH3 content hash, transfer descriptors",
  configSchema: mediaConfigSchema,
  create(ctx) {
    const config = ctx.config;
    configureSharp(config.decoder.threadsPerDecode);
    const store = new TensorStore({
      maxBytes: config.store.maxBytes,
      ttlMs: config.store.ttlMs,
      // Called only after construction, once `metrics` exists.
      onEvict: (_tensor, reason) => metrics.evictions.inc({ reason }),
    });
    const metrics = new MediaMetrics(ctx.metrics, store);
    const agent = newTransferAgent(ctx.advertisedAddress);
    const nixlMetadata = encodeNixlMetadata(agentMetadataBytes(agent));
    ctx.logger.info({ agent: agent.name, storeBytes: config.store.maxBytes }, "media tensor store ready");
    const service = createMediaService({ config, store, nixlMetadata, logger: ctx.logger });
    return {
      services: [bindService(MediaService, service)],
      close() {
        store.clear();
      },
    };
  },
});

export { mediaConfigSchema, type MediaConfig } from "./config.js";
export { MediaError, toConnectError, type MediaErrorCode } from "./errors.js";
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
export { configureSharp, decodeImage, checkImageLimits, DEFAULT_MAX_ALLOC, type ImageDecoderLimits, type ImageDecodeOptions } from "./image-decoder.js";
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
