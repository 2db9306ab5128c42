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
import { etcdDiscoverySchema } from "../../discovery/index.js";

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

/** The default of an etcd dial timeout (ms), as the encode hop's discovery has it. */
export const DEFAULT_DISCOVERY_DIAL_TIMEOUT_MS = 5000;

/** One segment of an etcd registration key: non-empty, no `/`. */
const discoverySegment = z.string().regex(/^[^/]+$/, "must be non-empty and contain no /");
const dialTimeoutMs = z.number().int().min(1).max(600_000);

/**
 * Where a pool's workers register (etcd, as an Encode worker registers:
 * `/mmgate/<namespace>/<component>/<endpoint>/<instance id>`, a lease kept
 * alive, a `{id, address, metadata}` value carrying its card). Readiness
 * takes a pool's liveness from these registrations when discovery is
 * configured, and from event recency (`workerLivenessMs`) when it is not.
 */
export const poolDiscoverySchema = z.strictObject({
  /**
   * "auto": etcd when an etcd cluster is named (here or in relay.discovery),
   * else events; "etcd": registrations (an etcd cluster must be named);
   * "events": event recency, even when relay.discovery is set.
   */
  source: z.enum(["auto", "etcd", "events"]).default("auto"),
  /** Every key defaults: endpoints and dialTimeoutMs to relay.discovery.etcd's, the key segments to the pool's endpoint. */
  etcd: z
    .strictObject({
      endpoints: etcdDiscoverySchema.shape.endpoints.optional(),
      namespace: discoverySegment.optional(),
      component: discoverySegment.optional(),
      endpoint: discoverySegment.optional(),
      dialTimeoutMs: dialTimeoutMs.optional(),
    })
    .optional(),
});

/** The etcd cluster the pools' workers register in, unless a pool names its own. */
export const relayDiscoverySchema = z.strictObject({
  etcd: z.strictObject({
    endpoints: etcdDiscoverySchema.shape.endpoints,
    dialTimeoutMs: dialTimeoutMs.default(DEFAULT_DISCOVERY_DIAL_TIMEOUT_MS),
  }),
});

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
  /**
   * Load reporting: the workers' KV capacity in blocks and the worker ranks
   * expected to report (kv_expected_ranks); 0 is unknown for both and is
   * sent as 0 (C.4), never replaced by what was seen.
   */
  totalKvBlocks: u64Schema.default(0n),
  expectedRanks: z.number().int().min(0).max(0xffff_ffff).default(0),
  /** Also take this pool's events from NATS: router events as the reference's JSON on `subject`. */
  nats: natsSourceConfigSchema.optional(),
  /** Where the pool's workers register, for readiness (see poolDiscoverySchema). */
  discovery: poolDiscoverySchema.prefault({}),
});

export type RelayPoolConfig = z.output<typeof relayPoolConfigSchema>;

export const relayConfigSchema = z
  .strictObject({
    /** This relay's instance id in RelayIdentity; default random per start. */
    drtInstanceId: u64Schema.optional(),
    /** The datacenter id of the pools that do not set their own (DYN_DC_ID). */
    dcId: u64Schema.default(1n),
    pools: z.array(relayPoolConfigSchema).min(1).prefault([{ name: "default" }]),
    /** The etcd cluster the pools' workers register in (each pool under its endpoint); absent: readiness from event recency. */
    discovery: relayDiscoverySchema.optional(),
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
  .refine((c) => new Set(c.pools.map((p) => p.name)).size === c.pools.length, { message: "pool names must be unique", path: ["pools"] })
  .superRefine((c, ctx) => {
    for (const issue of topologyEndpointConflicts(c.pools)) ctx.addIssue({ code: "custom", path: ["pools", issue.index, "endpoint"], message: issue.message });
    c.pools.forEach((pool, index) => {
      const problem = poolDiscoveryProblem(c, pool);
      if (problem !== undefined) ctx.addIssue({ code: "custom", path: ["pools", index, "discovery"], message: problem });
    });
  });

export type RelayConfig = z.output<typeof relayConfigSchema>;

/** A pool's serving endpoint as "namespace.component.endpoint". */
function endpointText(pool: RelayPoolConfig): string {
  const { namespace, component, endpoint } = pool.endpoint;
  return `${namespace}.${component}.${endpoint}`;
}

/**
 * The serving topology keys a pool takes part in: (its namespace, each base
 * model it registers, its own or an adapter's `loraBase`). Adapters are
 * nested under their base model's entry, never keys of their own.
 */
export function topologyKeysOf(pool: RelayPoolConfig): { readonly namespace: string; readonly model: string }[] {
  const models = new Set(pool.models.map((m) => m.loraBase ?? m.model));
  return [...models].map((model) => ({ namespace: pool.endpoint.namespace, model }));
}

/**
 * Pools that would be two members with one endpoint in one topology entry,
 * which the reference's validate_topology_entry rejects
 * (DuplicateTopologyMember): one issue per later pool, naming both.
 */
export function topologyEndpointConflicts(pools: readonly RelayPoolConfig[]): { readonly index: number; readonly message: string }[] {
  const seen = new Map<string, number>();
  const issues: { index: number; message: string }[] = [];
  pools.forEach((pool, index) => {
    const reported = new Set<number>();
    for (const key of topologyKeysOf(pool)) {
      const id = `${endpointText(pool)}\0${key.model}`;
      const first = seen.get(id);
      if (first === undefined) {
        seen.set(id, index);
        continue;
      }
      if (reported.has(first)) continue;
      reported.add(first);
      issues.push({
        index,
        message:
          `pools "${pools[first]!.name}" and "${pool.name}" both serve model ${JSON.stringify(key.model)} at endpoint ${endpointText(pool)}: ` +
          "one (namespace, model) cannot list one endpoint twice (the reference rejects it as DuplicateTopologyMember); give each pool its own endpoint",
      });
    }
  });
  return issues;
}

/** Where a pool's workers register: an etcd cluster and the pool's key prefix segments. */
export interface PoolDiscovery {
  readonly endpoints: readonly string[];
  readonly namespace: string;
  readonly component: string;
  readonly endpoint: string;
  readonly dialTimeoutMs: number;
}

/**
 * The pool's discovery with every default filled in (endpoints and dial
 * timeout from relay.discovery.etcd, key segments from the pool's
 * endpoint), or undefined when its readiness comes from event recency.
 */
export function poolDiscovery(relay: Pick<RelayConfig, "discovery">, pool: RelayPoolConfig): PoolDiscovery | undefined {
  const own = pool.discovery.etcd;
  const shared = relay.discovery?.etcd;
  if (pool.discovery.source === "events") return undefined;
  const endpoints = own?.endpoints ?? shared?.endpoints;
  if (endpoints === undefined) return undefined;
  return Object.freeze({
    endpoints: Object.freeze([...endpoints]),
    namespace: own?.namespace ?? pool.endpoint.namespace,
    component: own?.component ?? pool.endpoint.component,
    endpoint: own?.endpoint ?? pool.endpoint.endpoint,
    dialTimeoutMs: own?.dialTimeoutMs ?? shared?.dialTimeoutMs ?? DEFAULT_DISCOVERY_DIAL_TIMEOUT_MS,
  });
}

function poolDiscoveryProblem(relay: Pick<RelayConfig, "discovery">, pool: RelayPoolConfig): string | undefined {
  const resolved = poolDiscovery(relay, pool);
  if (resolved === undefined) {
    return pool.discovery.source === "etcd" ? "source etcd needs etcd.endpoints here or in relay.discovery.etcd.endpoints" : undefined;
  }
  for (const part of ["namespace", "component", "endpoint"] as const) {
    // Defaults come from the pool's endpoint, which may hold a "/" that no etcd key segment can.
    if (resolved[part].includes("/")) return `etcd.${part}: "${resolved[part]}" (from the pool's endpoint) contains a /; set etcd.${part}`;
  }
  return undefined;
}

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
