/**
 * The relay module's configuration: the transport and stream limits with the
 * reference's defaults and environment names (kv-relay-contract C.5), and the
 * pools this relay publishes, each fed by the ingest endpoint (and NATS when
 * configured). Every u64 (dc id, incarnation, seed) may be written as a JSON
 * number up to 2^53, or as a decimal or 0x-hex string for the full range.
 */
import { z } from "zod";
import { DEFAULT_CKF_CONFIG, DEFAULT_EXPECTED_UNIQUE_BLOCKS, DEFAULT_PUBLICATION_THRESHOLD, MAX_RELAY_BUCKET_COUNT } from "../../kv/index.js";
import { KV_QUERY_HASH_FORMATS } from "../../kv/index.js";
import { DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_QUEUED_FRAMES, MAX_FRAME_BYTES, MAX_QUEUED_FRAMES_LIMIT, MAX_TIMER_VALUE_MS, minQueuedBytes } from "../hub/index.js";
import { natsSourceConfigSchema } from "../nats/index.js";
import { DEFAULT_SLICE_BUDGET } from "../../util/index.js";
import { WORKER_ROLES } from "../wire/index.js";

const U64_MAX = (1n << 64n) - 1n;

/** A u64 from a safe JSON integer, or a decimal or 0x-hex string. */
export const u64Schema = z.union([z.number().int().min(0).max(Number.MAX_SAFE_INTEGER), z.string().regex(/^(0|[1-9][0-9]{0,19}|0x[0-9a-fA-F]{1,16})$/, "a decimal or 0x-hex u64")]).transform((value, ctx) => {
  const n = BigInt(value);
  if (n > U64_MAX) {
    ctx.addIssue({ code: "custom", message: `${value} exceeds 2^64-1` });
    return z.NEVER;
  }
  return n;
});

/** A 16-byte digest identity as 32 hex digits. */
const digestHex = z.string().regex(/^[0-9a-fA-F]{32}$/, "a 16-byte digest as 32 hex digits");

/** Timers: nonzero and at most one year (C.5). */
const timerMs = z.number().int().min(1).max(MAX_TIMER_VALUE_MS);
/** Stream limits. */
const streamLimit = z.number().int().min(1).max(1_000_000).default(64);

/** The most expected blocks whose bucket count is within the relay's 2^24: floor((5n + 15) / 16) <= 2^24. */
export const MAX_EXPECTED_BLOCKS = Math.floor((16 * MAX_RELAY_BUCKET_COUNT) / 5);

/**
 * The default of `maxBlocksPerEvent`: a Stored event of 32,768 blocks with
 * full-width hashes is about 0.8 MB of protobuf, within one ingest message
 * (`maxIngestMessageBytes`), and 524,288 tokens at a block size of 16. A 1
 * MiB JSON event (the NATS and `kv publish` line limit) holds about 14,000
 * blocks, so only the gRPC path reaches it.
 */
export const DEFAULT_MAX_BLOCKS_PER_EVENT = 32_768;

/**
 * The default of `maxIngestMessageBytes`: decoding a message is one turn of
 * the event loop that slicing cannot split (about 50 ms for 1 MiB here).
 */
export const DEFAULT_MAX_INGEST_MESSAGE_BYTES = 1024 * 1024;

/** Pool streams per connection and per client address, by default (the total is 64). */
export const DEFAULT_MAX_POOL_STREAMS_PER_CONNECTION = 16;
export const DEFAULT_MAX_POOL_STREAMS_PER_PEER = 32;

/** The smallest max_message_bytes: one largest CBI1 frame plus 64 KiB of envelope. */
export const MIN_MAX_MESSAGE_BYTES = MAX_FRAME_BYTES + 65_536;

const identityText = z
  .string()
  .min(1)
  .refine((s) => !/^\s|\s$/u.test(s), "must not start or end with whitespace");

export const modelRegistrationSchema = z.strictObject({
  /** The canonical model (or adapter) id clients and routers resolve to. */
  model: identityText,
  /** Other names the model answers to. */
  aliases: z.array(identityText).default([]),
  /** For a LoRA adapter: the base model it runs on; `model` is then the adapter's canonical name. */
  loraBase: identityText.optional(),
});

export type ModelRegistrationConfig = z.output<typeof modelRegistrationSchema>;

/** The pool name: what ingest, NATS and the CLI call it. */
const poolName = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/, "1-63 letters, digits, '.', '_' or '-', starting with a letter or digit");

export const relayPoolConfigSchema = z.strictObject({
  name: poolName,
  /** The pool's datacenter; default the relay's dcId. */
  dcId: u64Schema.optional(),
  /**
   * Sizes the filter: bucket count = the next power of two of ceil(5n/16); the
   * relay's 2^24 buckets (a 128 MiB lane, 32 snapshot chunks) take up to 53,687,091.
   */
  expectedBlocks: z.number().int().min(1).max(MAX_EXPECTED_BLOCKS).default(DEFAULT_EXPECTED_UNIQUE_BLOCKS),
  /** The filter's addressing seed. */
  seed: u64Schema.default(DEFAULT_CKF_CONFIG.seed),
  /** Tokens per KV block, as the workers hash them. */
  blockSize: z.number().int().min(1).max(0xffff_ffff).default(16),
  hashFormat: z.enum(KV_QUERY_HASH_FORMATS).default("DYNAMO_STANDARD_V1"),
  /** The models the pool serves; a router resolves a request's model through these. */
  models: z.array(modelRegistrationSchema).min(1).default([{ model: "mmgate-demo", aliases: [] }]),
  /** Where the pool's workers serve. */
  endpoint: z
    .strictObject({ namespace: identityText.default("mmgate"), component: identityText.default("backend"), endpoint: identityText.default("generate") })
    .prefault({}),
  roles: z.array(z.enum(WORKER_ROLES)).min(1).default(["AGGREGATED"]),
  /** Explicit indexer-domain digests; absent, each is derived from the pool's settings (source DEFAULT_DERIVED). */
  cacheSemanticsDigest: digestHex.optional(),
  routingScopeDigest: digestHex.optional(),
  /** The producer incarnation; default a random one per start, as a restarted producer is a new one. */
  producerIncarnation: u64Schema.optional(),
  /** The first layout generation (never 0); a generation change adds one. */
  layoutGeneration: u64Schema.default(1n).refine((n) => n > 0n, "layoutGeneration must not be 0"),
  /** Events per publication; default the relay's. */
  publicationThreshold: z.number().int().min(1).max(1_000_000).optional(),
  /** Longest wait (ms) before pending events are published; default the relay's. */
  publicationDelayMs: timerMs.optional(),
  /**
   * A reached threshold publishes at the end of the event-loop turn, so that
   * events arriving together are one delta (default). Off: at once, one delta
   * per threshold even within a burst, as a benchmark that matches deliveries
   * to events needs; a burst larger than threshold x queue capacity then lags
   * every subscriber.
   */
  coalesceWithinTurn: z.boolean().default(true),
  /** Load reporting: the workers' KV capacity in blocks (0: unknown) and their rank count (0: what has been seen). */
  totalKvBlocks: u64Schema.default(0n),
  expectedRanks: z.number().int().min(0).max(0xffff_ffff).default(0),
  /** Also take this pool's events from NATS: router events as the reference's JSON on `subject`. */
  nats: natsSourceConfigSchema.optional(),
});

export type RelayPoolConfig = z.output<typeof relayPoolConfigSchema>;

export const relayConfigSchema = z
  .strictObject({
    /** This relay's instance id in RelayIdentity; default random per start. */
    drtInstanceId: u64Schema.optional(),
    /** The datacenter id of the pools that do not set their own (DYN_DC_ID). */
    dcId: u64Schema.default(1n),
    pools: z.array(relayPoolConfigSchema).min(1).prefault([{ name: "default" }]),
    /** The largest message either way (C.5); at least one largest CBI1 frame plus envelope. */
    maxMessageBytes: z.number().int().min(MIN_MAX_MESSAGE_BYTES).max(0x7fff_ffff).default(8 * 1024 * 1024),
    poolHeartbeatIntervalMs: timerMs.default(10_000),
    catalogHeartbeatIntervalMs: timerMs.default(10_000),
    readinessHeartbeatIntervalMs: timerMs.default(10_000),
    snapshotProgressTimeoutMs: timerMs.default(60_000),
    loadWindowMs: timerMs.default(1_000),
    loadFanoutCapacity: z.number().int().min(1).max(65_536).default(16),
    publicationQueueCapacity: z.number().int().min(1).max(MAX_QUEUED_FRAMES_LIMIT).default(DEFAULT_MAX_QUEUED_FRAMES),
    publicationQueueBytes: z.number().int().min(minQueuedBytes(MAX_FRAME_BYTES)).max(Number.MAX_SAFE_INTEGER).default(DEFAULT_MAX_QUEUED_BYTES),
    /** Snapshot chunks being encoded at once, across all streams. */
    publicationEncodingConcurrency: z.number().int().min(1).max(1024).default(2),
    publicationThreshold: z.number().int().min(1).max(1_000_000).default(DEFAULT_PUBLICATION_THRESHOLD),
    publicationDelayMs: timerMs.default(1),
    /** A hub with no subscribers for this long is retired (its lane freed) until the next subscriber. */
    hubIdleEvictMs: timerMs.default(300_000),
    /** A worker that sent no event for this long no longer counts as live for readiness. */
    workerLivenessMs: timerMs.default(60_000),
    maxCatalogSubscribers: streamLimit,
    maxPoolStreamsTotal: streamLimit,
    maxSubscribersPerPool: streamLimit,
    maxInitializedPoolHubs: streamLimit,
    maxReadinessSubscribers: streamLimit,
    maxLoadSubscribers: streamLimit,
    /**
     * Pool streams (SubscribeKvPool and its decoded sibling) one connection,
     * and one client address, may hold at once: below the total, so that one
     * client (64 streams on one connection that never read, say) cannot take
     * every slot. A stream counts until its HTTP/2 stream is gone.
     */
    maxPoolStreamsPerConnection: z.number().int().min(1).max(1_000_000).default(DEFAULT_MAX_POOL_STREAMS_PER_CONNECTION),
    maxPoolStreamsPerPeer: z.number().int().min(1).max(1_000_000).default(DEFAULT_MAX_POOL_STREAMS_PER_PEER),
    /** Ingest streams open at once, and events per ingest message. */
    maxIngestStreams: z.number().int().min(1).max(100_000).default(256),
    maxEventsPerMessage: z.number().int().min(1).max(1_000_000).default(65_536),
    /**
     * Largest KvEventService.Publish message taken (below the host's
     * limits.maxReceiveMessageBytes): a message is decoded in one turn of
     * the event loop, before ingest can slice it, so this bounds how long
     * one message can hold every other call. A larger message ends the
     * stream with RESOURCE_EXHAUSTED; split the events over messages.
     */
    maxIngestMessageBytes: z.number().int().min(1024).max(1024 * 1024 * 1024).default(DEFAULT_MAX_INGEST_MESSAGE_BYTES),
    /**
     * Blocks a Stored event (block hashes a Removed event) may carry, from
     * ingest or NATS; a longer event is rejected (EventTooLarge) and the
     * stream goes on.
     */
    maxBlocksPerEvent: z.number().int().min(1).max(16_777_216).default(DEFAULT_MAX_BLOCKS_PER_EVENT),
    /**
     * Applying events (ingest messages and NATS messages, one at a time across
     * the relay) yields the event loop after this many milliseconds of work,
     * or this many blocks and events, whichever comes first, and goes on in a
     * later turn.
     */
    ingestSliceMs: z.number().min(0.1).max(1_000).default(DEFAULT_SLICE_BUDGET.sliceMs),
    ingestSliceBlocks: z.number().int().min(1).max(16_777_216).default(DEFAULT_SLICE_BUDGET.sliceSteps),
  })
  .refine((c) => new Set(c.pools.map((p) => p.name)).size === c.pools.length, { message: "pool names must be unique", path: ["pools"] });

export type RelayConfig = z.output<typeof relayConfigSchema>;

/** The reference's environment names (C.5, B.8), beside MMGATE_RELAY__*. */
export const RELAY_ENV: Readonly<Record<string, string>> = Object.freeze({
  DYN_DC_ID: "dcId",
  DYN_RELAY_MAX_MESSAGE_BYTES: "maxMessageBytes",
  DYN_RELAY_POOL_HEARTBEAT_INTERVAL_MS: "poolHeartbeatIntervalMs",
  DYN_RELAY_READINESS_HEARTBEAT_INTERVAL_MS: "readinessHeartbeatIntervalMs",
  DYN_RELAY_SNAPSHOT_PROGRESS_TIMEOUT_MS: "snapshotProgressTimeoutMs",
  DYN_RELAY_LOAD_WINDOW_MS: "loadWindowMs",
  DYN_RELAY_LOAD_FANOUT_CAPACITY: "loadFanoutCapacity",
  DYN_RELAY_PUBLICATION_QUEUE_CAPACITY: "publicationQueueCapacity",
  DYN_RELAY_PUBLICATION_QUEUE_BYTES: "publicationQueueBytes",
  DYN_RELAY_PUBLICATION_ENCODING_CONCURRENCY: "publicationEncodingConcurrency",
  DYN_RELAY_PUBLICATION_THRESHOLD: "publicationThreshold",
  DYN_RELAY_PUBLICATION_DELAY_MS: "publicationDelayMs",
  DYN_RELAY_MAX_CATALOG_SUBSCRIBERS: "maxCatalogSubscribers",
  DYN_RELAY_MAX_POOL_STREAMS_TOTAL: "maxPoolStreamsTotal",
  DYN_RELAY_MAX_SUBSCRIBERS_PER_POOL: "maxSubscribersPerPool",
  DYN_RELAY_MAX_INITIALIZED_POOL_HUBS: "maxInitializedPoolHubs",
  DYN_RELAY_MAX_READINESS_SUBSCRIBERS: "maxReadinessSubscribers",
  DYN_RELAY_MAX_LOAD_SUBSCRIBERS: "maxLoadSubscribers",
});
