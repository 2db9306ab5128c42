import ipaddr from "ipaddr.js";
import { z } from "zod";
import { DEFAULT_MAX_ALLOC, type ImageDecoderLimits } from "./image-decoder.js";
import type { FetchPolicy } from "./fetcher.js";

const KiB = 1024;
const MiB = 1024 * KiB;
const GiB = 1024 * MiB;

const cidr = z.string().refine((s) => ipaddr.isValidCIDR(s), "expected a CIDR network such as 127.0.0.1/32");

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
 * budget plus a full-size tensor for every decode in flight (the decoder
 * allocates the tensor before it is stored). Encoded inputs (request bodies,
 * fetched bodies up to fetch.maxBodyBytes) come on top while they are held.
 */
export function peakMemoryBytes(config: MediaConfig): number {
  return config.store.maxBytes + config.decoder.maxAlloc * config.decoder.maxConcurrentDecodes;
}
