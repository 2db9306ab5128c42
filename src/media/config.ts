import ipaddr from "ipaddr.js";
import { z } from "zod";
import { DEFAULT_MAX_ALLOC, type ImageDecoderLimits } from "./image-decoder.js";
import type { FetchPolicy } from "./fetcher.js";
import { DEFAULT_VIDEO_MAX_ALLOC, type VideoDecoderConfig } from "./video-decoder.js";

const KiB = 1024;
const MiB = 1024 * KiB;
const GiB = 1024 * MiB;

const cidr = z.string().refine((s) => ipaddr.isValidCIDR(s), "expected a CIDR network such as 127.0.0.1/32");

/**
 * The reference's environment names, beside MMGATE_MEDIA__*: each sets an
 * input-only key that the schema folds into the keys in force (so
 * print-config shows the effective values, not the switch).
 */
export const MEDIA_ENV: Readonly<Record<string, string>> = Object.freeze({
  DYN_MM_ALLOW_INTERNAL: "fetch.allowInternal",
  DYN_MULTIMODAL_LOADER_CACHE_GB: "decodedCache.gib",
});

/**
 * The reference's DYN_MM_ALLOW_INTERNAL rule: only "1" (read from the
 * environment as the number 1) turns the three allow flags on; any other
 * value, "true" and "0" included, has no effect.
 */
const allowInternalSwitch = z.union([z.boolean(), z.number(), z.string()]).optional();

/** A float number of GiB, as a number or a decimal string ("8.0" stays a string when read from the environment). */
const gibAmount = z.preprocess(
  (value) => (typeof value === "string" && /^\s*\+?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$/.test(value) ? Number(value) : value),
  z.number().min(0).max(1024),
);

/** The `media` config section; every field has a default, so `{}` parses. */
export const mediaConfigSchema = z.strictObject({
  decoder: z
    .strictObject({
      /** Widest accepted image in pixels; null for no limit. */
      maxImageWidth: z.number().int().min(1).nullable().default(null),
      /** Tallest accepted image in pixels; null for no limit. */
      maxImageHeight: z.number().int().min(1).nullable().default(null),
      /** Largest decoded tensor, W·H·C bytes (the reference's default, 128 MiB). */
      maxAlloc: z.number().int().min(1).max(16 * GiB).default(DEFAULT_MAX_ALLOC),
      /** Decodes running at once; more wait in the queue below. */
      maxConcurrentDecodes: z.number().int().min(1).max(256).default(4),
      /**
       * Calls allowed to wait for a decode slot; beyond it a call is refused
       * at once (OVERLOADED, RESOURCE_EXHAUSTED with retry-after). 0: no
       * waiting. The default, 16, is four times the default concurrency: a
       * waiter is at most four decode rounds from its turn, and the queue
       * stays small because each waiter holds its encoded input (up to
       * fetch.maxBodyBytes for a URL). A fixed number rather than a multiple,
       * so the effective value is the one print-config shows.
       */
      maxQueuedDecodes: z.number().int().min(0).max(4096).default(16),
      /**
       * libvips threads one decode may use (sharp.concurrency, process-wide);
       * 0 means one per core. sharp's own default on glibc is 1, which makes a
       * single large decode slower.
       */
      threadsPerDecode: z.number().int().min(0).max(64).default(0),
    })
    .prefault({}),
  fetch: z
    .strictObject({
      allowDirectIp: z.boolean().default(false),
      allowDirectPort: z.boolean().default(false),
      /** Turns off the blocked host names and IP networks (the reference's allow_private_ips). */
      allowPrivateIps: z.boolean().default(false),
      /** Networks exempt from the blocked IP networks, e.g. ["127.0.0.1/32"] for a local media server. */
      allowedIpNetworks: z.array(cidr).default([]),
      /** When set, the only hosts that may be fetched (exact match). */
      allowedMediaDomains: z.array(z.string().min(1)).nullable().default(null),
      /** One deadline for the whole fetch, redirects and body included. */
      timeoutMs: z.number().int().min(1).max(600_000).default(30_000),
      /** Largest body (or decoded data URL) accepted. */
      maxBodyBytes: z.number().int().min(1).max(4 * GiB).default(64 * MiB),
      maxRedirects: z.number().int().min(0).max(20).default(3),
      /** URL fetches running at once (each may buffer up to maxBodyBytes); others wait in the queue below. */
      maxConcurrentFetches: z.number().int().min(1).max(1024).default(16),
      /**
       * Calls allowed to wait for a fetch slot; beyond it a call is refused
       * at once (OVERLOADED). 0: no waiting. The default, 64, is four times
       * the default concurrency: a waiting fetch holds no body yet, so the
       * bound is about time spent waiting (at most four fetch rounds), not memory.
       */
      maxQueuedFetches: z.number().int().min(0).max(16_384).default(64),
      userAgent: z.string().min(1).default("mmgate-media-fetcher"),
      /**
       * A name resolving to both allowed and blocked addresses: "refuse" (the
       * hop fails with URL_BLOCKED_IP) or "dropBlocked" (connect to the
       * allowed ones, as the reference's HTTP client does).
       */
      mixedAddresses: z.enum(["refuse", "dropBlocked"]).default("refuse"),
      /** Input only (DYN_MM_ALLOW_INTERNAL): 1 sets allowDirectIp, allowDirectPort and allowPrivateIps. */
      allowInternal: allowInternalSwitch,
    })
    .transform(({ allowInternal, ...fetch }) =>
      allowInternal === 1 || allowInternal === "1" ? { ...fetch, allowDirectIp: true, allowDirectPort: true, allowPrivateIps: true } : fetch,
    )
    .prefault({}),
  /**
   * Decoded images of http(s) URLs, by URL and decode options, in front of
   * fetch and decode (see decoded-cache.ts). Off by default.
   */
  decodedCache: z
    .strictObject({
      /** Byte budget (LRU beyond it); 0 turns the cache off. Wins over `gib` when both are set. */
      maxBytes: z.number().int().min(0).max(1024 * GiB).optional(),
      /** Input only (DYN_MULTIMODAL_LOADER_CACHE_GB): the budget in GiB, a float; bytes = floor(gib × 2^30). */
      gib: gibAmount.optional(),
    })
    .transform(({ maxBytes, gib }) => ({ maxBytes: maxBytes ?? (gib === undefined ? 0 : Math.floor(gib * GiB)) }))
    .prefault({}),
  /** The video decoder (ffprobe and ffmpeg from the host, docs/media.md). */
  video: z
    .strictObject({
      /** ffmpeg executable: a path, or a name looked up on PATH (Debian package ffmpeg). */
      ffmpegPath: z.string().min(1).default("ffmpeg"),
      /** ffprobe executable, likewise. */
      ffprobePath: z.string().min(1).default("ffprobe"),
      /** Largest decoded video, frames × W × H × 3 bytes, checked before decoding (the reference's 512 MiB). */
      maxAlloc: z.number().int().min(1).max(4 * GiB).default(DEFAULT_VIDEO_MAX_ALLOC),
      /** Decoder threads per video; 0 means min(cores, 8), as the reference's default. */
      decodeThreads: z.number().int().min(0).max(64).default(0),
      /** Where encoded videos are staged for ffmpeg (never pixels); null for the OS temp dir. */
      tempDir: z.string().min(1).nullable().default(null),
    })
    .prefault({}),
  store: z
    .strictObject({
      /** Byte budget of decoded tensors awaiting their receiver (LRU beyond it). */
      maxBytes: z.number().int().min(1).max(256 * GiB).default(1 * GiB),
      /** Lifetime of an unreleased tensor. */
      ttlMs: z.number().int().min(1).max(86_400_000).default(120_000),
    })
    .prefault({}),
  /** Largest tensor Decode returns inline when return_pixels is set. */
  maxInlinePixelBytes: z.number().int().min(0).max(1 * GiB).default(4 * MiB),
  /** ReadTensor chunk size. */
  readChunkBytes: z.number().int().min(4 * KiB).max(4 * MiB).default(1 * MiB),
});

export type MediaConfig = z.output<typeof mediaConfigSchema>;

export function decoderLimits(config: MediaConfig): ImageDecoderLimits {
  return {
    maxImageWidth: config.decoder.maxImageWidth,
    maxImageHeight: config.decoder.maxImageHeight,
    maxAlloc: config.decoder.maxAlloc,
  };
}

export function fetchPolicy(config: MediaConfig): FetchPolicy {
  const { maxConcurrentFetches: _slots, maxQueuedFetches: _queued, ...policy } = config.fetch;
  return policy;
}

/**
 * The most memory the media module's own data can take: the tensor store's
 * budget, the decoded cache's budget (an upper bound: a cached tensor that is
 * also stored shares its bytes) and a full-size tensor for every decode in flight (the decoder
 * allocates the tensor before it is stored). Encoded inputs (request bodies,
 * fetched bodies up to fetch.maxBodyBytes) come on top while they are held.
 */
export function peakMemoryBytes(config: MediaConfig): number {
  // A decode slot holds an image (decoder.maxAlloc) or a video (video.maxAlloc).
  const perDecode = Math.max(config.decoder.maxAlloc, config.video.maxAlloc);
  return config.store.maxBytes + config.decodedCache.maxBytes + perDecode * config.decoder.maxConcurrentDecodes;
}

export function videoDecoderConfig(config: MediaConfig): VideoDecoderConfig {
  return { ...config.video };
}
