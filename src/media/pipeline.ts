import { inSpan } from "../telemetry/index.js";
import { Semaphore } from "../util/index.js";
import { decoderLimits, fetchPolicy, videoDecoderConfig, type MediaConfig } from "./config.js";
import { MediaAdmission, type MediaStage, type MediaStageLoad } from "./admission.js";
import { DecodedMediaCache, decodedCacheKey, type DecodedCacheEvent } from "./decoded-cache.js";
import { buildDescriptor, descriptorToJson } from "./descriptor.js";
import { MediaError } from "./errors.js";
import { fetchMedia, type Resolver } from "./fetcher.js";
import { decodeImage } from "./image-decoder.js";
import { isDataUrl } from "./url-policy.js";
import { decodeVideo, isVideoPayload, validateVideoSampling, type VideoSampling } from "./video-decoder.js";
import type { DecodedMedia } from "./tensor.js";
import type { TensorStore } from "./tensor-store.js";

/** Where encoded media comes from: a URL (fetched under the URL policy) or bytes. */
export type MediaSource = { readonly url: string; readonly data?: undefined } | { readonly data: Uint8Array; readonly url?: undefined };

export interface DecodeOptions {
  readonly forceRgb?: boolean;
  readonly applyExifOrientation?: boolean;
  /** Frame sampling when the bytes are a video (MP4, MOV, MKV, WebM); all frames by default. */
  readonly video?: VideoSampling;
  /** Compute the video content hash (default true); images are always hashed. */
  readonly hashVideo?: boolean;
}

/** A decoded tensor kept in the store, and the transfer descriptor that names it. */
export interface StoredMedia {
  readonly handle: bigint;
  /** The reference's descriptor JSON (NIXL metadata, handle, size, tensor info, hash). */
  readonly descriptorJson: string;
}

/**
 * The media capability as other modules use it (the encode worker, say):
 * fetch and decode under the configured limits, concurrency and bounded
 * queues (a call beyond a full queue fails at once with OVERLOADED), and
 * keep results in the tensor store. MediaService is a thin layer over it.
 */
export interface MediaPipeline {
  /**
   * Fetches (URL policy, size limit) or takes the bytes, then decodes under
   * the decoder limits. An http(s) URL goes through the decoded cache when
   * it is on (decodedCache.maxBytes > 0): the result may be shared with
   * other callers and must not be mutated.
   */
  decode(source: MediaSource, options: DecodeOptions, signal: AbortSignal): Promise<DecodedMedia>;
  /** Keeps a decoded tensor in the store and describes it. */
  store(decoded: DecodedMedia): StoredMedia;
  readonly tensors: TensorStore;
  /** Decoded images of http(s) URLs (see decoded-cache.ts); `enabled` is false when decodedCache.maxBytes is 0. */
  readonly decodedCache: DecodedMediaCache;
  /** "b64:…" metadata of this process's transfer agent. */
  readonly nixlMetadata: string;
  /** Running and waiting operations of each stage, live. */
  readonly load: Readonly<Record<MediaStage, MediaStageLoad>>;
}

export interface MediaPipelineOptions {
  readonly config: MediaConfig;
  readonly tensors: TensorStore;
  readonly nixlMetadata: string;
  /** Name resolution for URL fetches (tests substitute one). */
  readonly resolver?: Resolver;
  /**
   * The decode slots, when they are shared with other work (or held by a
   * test); by default a Semaphore of decoder.maxConcurrentDecodes. The queue
   * in front of them is bounded by decoder.maxQueuedDecodes either way.
   */
  readonly decodeSlots?: Semaphore;
  /** The fetch slots, likewise (default: fetch.maxConcurrentFetches, queue fetch.maxQueuedFetches). */
  readonly fetchSlots?: Semaphore;
  /** Called for every call refused because a stage's queue is full. */
  readonly onRejected?: (stage: MediaStage) => void;
  /** Called for every decoded-cache hit, miss and eviction. */
  readonly onDecodedCache?: (event: DecodedCacheEvent) => void;
}

export function createMediaPipeline(options: MediaPipelineOptions): MediaPipeline {
  const { config, tensors, nixlMetadata } = options;
  const limits = decoderLimits(config);
  const videoConfig = videoDecoderConfig(config);
  const policy = fetchPolicy(config);
  const decodes = new MediaAdmission(
    "decode",
    options.decodeSlots ?? new Semaphore(config.decoder.maxConcurrentDecodes),
    config.decoder.maxQueuedDecodes,
    options.onRejected,
  );
  const fetches = new MediaAdmission(
    "fetch",
    options.fetchSlots ?? new Semaphore(config.fetch.maxConcurrentFetches),
    config.fetch.maxQueuedFetches,
    options.onRejected,
  );

  async function encodedBytes(source: MediaSource, signal: AbortSignal): Promise<Uint8Array> {
    if (source.url !== undefined) {
      const url = source.url;
      return fetches.run(signal, () => fetchMedia(url, policy, { signal, ...(options.resolver ? { resolver: options.resolver } : {}) }));
    }
    if (source.data.length === 0) throw new MediaError("IMAGE_DECODE_FAILED", "image data is empty");
    return source.data;
  }

  const decodedCache = new DecodedMediaCache({
    maxBytes: config.decodedCache.maxBytes,
    ...(options.onDecodedCache ? { onEvent: options.onDecodedCache } : {}),
  });

  async function fetchAndDecode(
    source: MediaSource,
    imageOptions: { forceRgb: boolean; applyExifOrientation: boolean },
    signal: AbortSignal,
    video: VideoSampling & { hash?: boolean } = {},
  ) {
    // Spans (tracing on): the fetch (its HTTP requests are the fetcher's client spans) and the decode, each with its wait for a slot; the hash is the decoder's.
    const bytes =
      source.url === undefined ? await encodedBytes(source, signal) : await inSpan("media.fetch", { "mmgate.media.data_url": isDataUrl(source.url) }, () => encodedBytes(source, signal));
    // Videos share the decode slots and queue with images.
    return inSpan("media.decode", { "mmgate.media.encoded_bytes": bytes.length }, () =>
      decodes.run(signal, () =>
        isVideoPayload(bytes) ? decodeVideo(bytes, videoConfig, { ...video, signal }) : decodeImage(bytes, limits, { ...imageOptions, signal }),
      ),
    );
  }

  return {
    tensors,
    nixlMetadata,
    decodedCache,
    load: { decode: decodes, fetch: fetches },
    async decode(source, decodeOptions, signal) {
      const imageOptions = { forceRgb: decodeOptions.forceRgb ?? false, applyExifOrientation: decodeOptions.applyExifOrientation ?? false };
      // Bad sampling options fail before anything is fetched.
      const sampling = decodeOptions.video ?? {};
      validateVideoSampling(sampling);
      const video = { ...sampling, hash: decodeOptions.hashVideo ?? true };
      // The cache keys on the image options only: a call that samples a video
      // its own way (or skips its hash) bypasses it.
      const ownSampling = Object.values(sampling).some((v) => v !== undefined && v !== false) || !video.hash;
      // http(s) URLs only: data URLs and bytes carry their own content (nothing
      // to fetch again), and keying by them would cost as much as they hold.
      const url = source.url;
      if (url !== undefined && decodedCache.enabled && !isDataUrl(url) && !ownSampling) {
        // A hit takes no fetch or decode slot. The shared work runs under a
        // signal that fires only when every waiter has left (decoded-cache.ts).
        return decodedCache.get(decodedCacheKey(url, imageOptions), signal, (shared) => fetchAndDecode(source, imageOptions, shared, video));
      }
      return fetchAndDecode(source, imageOptions, signal, video);
    },
    store(decoded) {
      const handle = tensors.put(decoded.data, decoded.tensorInfo, decoded.contentHash);
      const descriptor = buildDescriptor(nixlMetadata, handle, decoded.data.length, decoded.tensorInfo, decoded.contentHash);
      return { handle, descriptorJson: descriptorToJson(descriptor) };
    },
  };
}
