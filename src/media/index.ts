export { createMediaModule, mediaModule, type MediaModuleOptions } from "./module.js";
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
