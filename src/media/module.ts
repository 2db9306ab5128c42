/**
 * The `media` module: its definition, its error mapper, and what its
 * `create` builds (the tensor store, the pipeline, MediaService).
 */
import { create } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import { ErrorDetailSchema, MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import { defineModule, bindService } from "../server/index.js";
import type { Semaphore } from "../util/index.js";
import { MEDIA_ENV, mediaConfigSchema, peakMemoryBytes } from "./config.js";
import { agentMetadataBytes, encodeNixlMetadata, newTransferAgent } from "./descriptor.js";
import { MediaError, OVERLOADED_RETRY_AFTER_SECONDS } from "./errors.js";
import { configureSharp } from "./image-decoder.js";
import { MediaMetrics } from "./metrics.js";
import { createMediaPipeline, type MediaPipeline } from "./pipeline.js";
import { createMediaService } from "./service.js";
import { TensorStore } from "./tensor-store.js";

/**
 * The media module's error mapper: a MediaError keeps its status and its
 * typed detail (OVERLOADED also gets `retry-after` metadata); anything else
 * is left to the host (logged, INTERNAL).
 */
export function mediaErrorToConnect(error: unknown): ConnectError | undefined {
  if (error instanceof MediaError) {
    // The values often come from request arithmetic (offset + length, the
    // product of a shape) and may pass 2^64 - 1: saturate, so the detail
    // always encodes.
    const detail = create(ErrorDetailSchema, {
      code: error.code,
      limit: saturateU64(error.limit ?? 0n),
      actual: saturateU64(error.actual ?? 0n),
    });
    const metadata = new Headers();
    if (error.code === "OVERLOADED") metadata.set("retry-after", String(OVERLOADED_RETRY_AFTER_SECONDS));
    return new ConnectError(error.message, error.status, metadata, [{ desc: ErrorDetailSchema, value: detail }]);
  }
  return undefined;
}

const U64_MAX = 2n ** 64n - 1n;

/** A bigint clamped into uint64's range. */
function saturateU64(value: bigint): bigint {
  return value < 0n ? 0n : value > U64_MAX ? U64_MAX : value;
}

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
