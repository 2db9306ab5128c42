import { Semaphore } from "../util/index.js";
import { decoderLimits, fetchPolicy, type MediaConfig } from "./config.js";
import { MediaAdmission, type MediaStage, type MediaStageLoad } from "./admission.js";
import { buildDescriptor, descriptorToJson } from "./descriptor.js";
import { MediaError } from "./errors.js";
import { fetchMedia, type Resolver } from "./fetcher.js";
import { decodeImage } from "./image-decoder.js";
import type { DecodedMedia } from "./tensor.js";
import type { TensorStore } from "./tensor-store.js";

/** Where encoded media comes from: a URL (fetched under the URL policy) or bytes. */
export type MediaSource = { readonly url: string; readonly data?: undefined } | { readonly data: Uint8Array; readonly url?: undefined };

export interface DecodeOptions {
  readonly forceRgb?: boolean;
  readonly applyExifOrientation?: boolean;
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
  /** Fetches (URL policy, size limit) or takes the bytes, then decodes under the decoder limits. */
  decode(source: MediaSource, options: DecodeOptions, signal: AbortSignal): Promise<DecodedMedia>;
  /** Keeps a decoded tensor in the store and describes it. */
  store(decoded: DecodedMedia): StoredMedia;
  readonly tensors: TensorStore;
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
}

export function createMediaPipeline(options: MediaPipelineOptions): MediaPipeline {
  const { config, tensors, nixlMetadata } = options;
  const limits = decoderLimits(config);
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

  return {
    tensors,
    nixlMetadata,
    load: { decode: decodes, fetch: fetches },
    async decode(source, decodeOptions, signal) {
      const bytes = await encodedBytes(source, signal);
      return decodes.run(signal, () =>
        decodeImage(bytes, limits, {
          forceRgb: decodeOptions.forceRgb ?? false,
          applyExifOrientation: decodeOptions.applyExifOrientation ?? false,
          signal,
        }),
      );
    },
    store(decoded) {
      const handle = tensors.put(decoded.data, decoded.tensorInfo, decoded.contentHash);
      const descriptor = buildDescriptor(nixlMetadata, handle, decoded.data.length, decoded.tensorInfo, decoded.contentHash);
      return { handle, descriptorJson: descriptorToJson(descriptor) };
    },
  };
}
