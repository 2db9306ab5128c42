import { z } from "zod";
import { MAX_TIMER_MS } from "../util/index.js";
import { ERROR_CODES } from "./core/errors.js";
import { DEFAULT_REQUEST_LIMITS, MAX_OUTPUTS_CEILING, isValidSize } from "./core/validation.js";
import { callerLimitsSchema } from "../server/index.js";
import { checkNatsCredentials, natsCredentialFields, natsReconnectWaitSchema, natsServersSchema } from "../nats/index.js";

const MiB = 1024 * 1024;
const positive = () => z.number().int().min(1);
/** A duration in ms that Node timers can hold. */
const durationMs = () => positive().max(MAX_TIMER_MS);
/** A count, or "unlimited". */
const limit = z.union([z.number().int().min(0), z.literal("unlimited")]);
const size = z.string().refine((s) => s !== "auto" && isValidSize(s), "expected WxH, e.g. 512x512");
const providerName = z.string().regex(/^[a-z][a-z0-9-]{0,63}$/, "lowercase letters, digits and -, starting with a letter");

const requestLimitsSchema = z
  .strictObject({
    maxPromptBytes: positive().max(16 * MiB).default(DEFAULT_REQUEST_LIMITS.maxPromptBytes),
    maxNegativePromptBytes: positive().max(16 * MiB).default(DEFAULT_REQUEST_LIMITS.maxNegativePromptBytes),
    /** The one limit on parameters.n, used by the service and every fan-out decorator. */
    maxOutputs: positive().max(MAX_OUTPUTS_CEILING).default(DEFAULT_REQUEST_LIMITS.maxOutputs),
    maxInputs: positive().max(1024).default(DEFAULT_REQUEST_LIMITS.maxInputs),
    maxInlineEncodedBytes: positive().max(1024 * MiB).default(DEFAULT_REQUEST_LIMITS.maxInlineEncodedBytes),
    maxEdge: positive().max(65_535).default(DEFAULT_REQUEST_LIMITS.maxEdge),
    maxTimeoutMs: durationMs().default(DEFAULT_REQUEST_LIMITS.maxTimeoutMs),
    maxIdentifierBytes: positive().max(4096).default(DEFAULT_REQUEST_LIMITS.maxIdentifierBytes),
  })
  .prefault({});

const fanoutSchema = z
  .strictObject({
    /** Logical maximum advertised by decorated providers; at most limits.maxOutputs. */
    maxOutputs: positive().max(MAX_OUTPUTS_CEILING).default(16),
    /**
     * Provider-wide simultaneous upstream calls (single-output calls take a
     * permit too); "auto" means maxOutputs, bounded because maxOutputs is.
     */
    maxParallelOutputs: z.union([positive().max(MAX_OUTPUTS_CEILING), z.literal("auto")]).default("auto"),
    /** Longest wait for a fan-out permit (the request deadline applies too). */
    permitTimeoutMs: durationMs().default(120_000),
    /** How long fail-fast waits for cancelled siblings. */
    siblingGraceMs: z.number().int().min(0).max(60_000).default(1000),
  })
  .prefault({});

const admissionLimitsSchema = (concurrent: number | "unlimited", queued: number | "unlimited") =>
  z
    .strictObject({
      maxConcurrent: limit.refine((v) => v !== 0, "must be above 0 (or \"unlimited\")").default(concurrent),
      maxQueued: limit.default(queued),
    })
    .prefault({});

const circuitBreakerSchema = z
  .strictObject({
    enabled: z.boolean().default(true),
    failureThreshold: positive().default(5),
    openDurationMs: positive().default(180_000),
    halfOpenMaxCalls: positive().default(1),
    successThreshold: positive().default(1),
  })
  .prefault({});

/**
 * The shared store of idempotency keys (runtime/idempotency-nats.ts): a
 * NATS JetStream key-value bucket every replica uses.
 */
const idempotencyNatsSchema = z
  .strictObject({
    /** NATS servers, `HOST:PORT` or `nats://HOST:PORT`; the client picks one and fails over to the others. */
    servers: natsServersSchema,
    /** Connection name the server shows in its monitoring. */
    name: z.string().min(1).default("mmgate-images-idempotency"),
    ...natsCredentialFields,
    /** The key-value bucket (created when missing, with the settings below; an existing one is used as it is). */
    bucket: z.string().regex(/^[-\w]{1,64}$/, "letters, digits, _ and -").default("mmgate_idempotency"),
    /** Copies of the bucket in a clustered server (1..5), when it is created. */
    replicas: z.int().min(1).max(5).default(1),
    /** Where the server keeps the bucket: `file` survives a server restart, `memory` does not. */
    storage: z.enum(["file", "memory"]).default("file"),
    /** The bucket's size limit, when it is created: past it a response is not stored (`completed_unreplayable`). */
    maxBucketBytes: z.int().min(MiB).max(Number.MAX_SAFE_INTEGER).default(1024 * MiB),
    /** Largest value written; a response above it is stored in chunks of at most this (and the server's max_payload). */
    maxValueBytes: z.int().min(16 * 1024).max(64 * MiB).default(MiB),
    /** Largest response stored for replay (image bytes and metadata); a heavier one is `completed_unreplayable`. */
    maxResponseBytes: positive().max(4096 * MiB).default(64 * MiB),
    /** How long the first connection's handshake may take. */
    connectTimeoutMs: durationMs().default(2000),
    /** How long one key-value operation may take before the store counts as unreachable. */
    requestTimeoutMs: durationMs().default(2000),
    /** Pause between attempts to reconnect to a lost server (and first wait between attempts to reach the bucket). */
    reconnectWaitMs: natsReconnectWaitSchema,
    /** How often the replica running a key refreshes its claim. */
    heartbeatMs: durationMs().default(2000),
    /**
     * A running claim not refreshed for this long (as a waiting replica sees
     * it) is taken over: its owner is presumed dead and the key answers an
     * unknown outcome. At least 3 heartbeats.
     */
    leaseMs: durationMs().default(15_000),
    /**
     * While the bucket is unreachable: `local` keeps keys per replica (a retry
     * that reaches another replica runs again), `refuse` answers keyed
     * requests `overloaded` (retryable) until it is back.
     */
    whenUnavailable: z.enum(["local", "refuse"]).default("local"),
  })
  .prefault({})
  .superRefine((c, ctx) => {
    checkNatsCredentials(c, ctx);
    if (c.leaseMs < 3 * c.heartbeatMs) ctx.addIssue({ code: "custom", path: ["leaseMs"], message: "must be at least 3 × heartbeatMs" });
  });

/** Idempotency keys (runtime/idempotency.ts): bounded, with TTLs, in this process or shared over NATS. */
const idempotencySchema = z
  .strictObject({
    enabled: z.boolean().default(true),
    /**
     * `memory`: keys live in this process. `nats`: in a JetStream key-value
     * bucket (`nats`) shared by every replica, this process's memory taking
     * over while it is unreachable.
     */
    store: z.enum(["memory", "nats"]).default("memory"),
    /** Keys remembered at once in this process (pending, completed and unknown-outcome entries). */
    maxEntries: positive().max(10_000_000).default(10_000),
    /** Bytes of completed responses kept for replay in this process (images included). */
    maxCompletedBytes: positive().max(64 * 1024 * MiB).default(256 * MiB),
    /** How long a completed response is replayed. */
    completedTtlMs: durationMs().default(86_400_000),
    /** How long an unknown-outcome failure is replayed instead of running again. */
    unknownTtlMs: durationMs().default(86_400_000),
    /** The shared store, with `store: nats`. */
    nats: idempotencyNatsSchema,
  })
  .prefault({});

/**
 * Per-caller quotas (../quota/): token buckets per caller name, from the
 * caller's `limits` (auth.keysFile, auth.certificates) and, for callers
 * without a name, `anonymous`. Absent limits are unlimited.
 */
const quotasSchema = z
  .strictObject({
    /** Limits of the calls no key or certificate names (every call when auth is off), all in one bucket. */
    anonymous: callerLimitsSchema.prefault({}),
    /**
     * `memory`: buckets per process. `nats`: in a JetStream key-value bucket
     * on the servers of `idempotency.nats`, shared by every replica (this
     * process's memory while it is unreachable). `auto`: `nats` when
     * `idempotency` is enabled with `store: nats`, else `memory`.
     */
    store: z.enum(["auto", "memory", "nats"]).default("auto"),
    /** Callers whose buckets this process keeps at once; past it, idle (refilled) buckets go first. */
    maxCallers: positive().max(10_000_000).default(10_000),
    nats: z
      .strictObject({
        /** The key-value bucket of the quotas (created when missing, in memory; an existing one is used as it is). */
        bucket: z.string().regex(/^[-\w]{1,64}$/, "letters, digits, _ and -").default("mmgate_quotas"),
      })
      .prefault({}),
  })
  .prefault({});

const referenceSchema = z
  .strictObject({
    enabled: z.boolean().default(true),
    name: providerName.default("reference"),
    model: z.string().min(1).default("reference-image-1"),
    /** Outputs the provider makes per call; fan-out covers the rest. */
    nativeCount: positive().max(MAX_OUTPUTS_CEILING).default(1),
    latencyMs: z.number().int().min(0).max(600_000).default(50),
    maxPartialImages: z.number().int().min(0).max(3).default(3),
    defaultSize: size.default("512x512"),
    maxEdge: positive().max(4096).default(2048),
    failure: z
      .strictObject({
        promptContains: z.string().default(""),
        outputIndices: z.array(z.number().int().min(0)).default([]),
        code: z.enum(ERROR_CODES).default("upstream"),
        retryable: z.boolean().default(true),
      })
      .prefault({}),
  })
  .prefault({});

const openaiSchema = z.strictObject({
  name: providerName,
  /** For example https://api.openai.com; the provider posts to <baseUrl>/v1/images/generations. */
  baseUrl: z.url(),
  /** Name of the environment variable holding the API key; the key itself never enters the config. */
  apiKeyEnv: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/).default("OPENAI_API_KEY"),
  model: z.string().min(1).default("gpt-image-1"),
  /** Outputs per upstream call. */
  nativeCount: positive().max(MAX_OUTPUTS_CEILING).default(10),
  sizes: z.array(size).default(["1024x1024", "1536x1024", "1024x1536"]),
  /** Upper bound of one upstream HTTP call. */
  requestTimeoutMs: durationMs().default(600_000),
  /** Largest upstream response body accepted. */
  maxResponseBytes: positive().default(256 * MiB),
});

export const imagesConfigSchema = z
  .strictObject({
    /** Provider used when a request names none; "" means the first enabled one. */
    defaultProvider: z.string().default(""),
    limits: requestLimitsSchema,
    defaultTimeoutMs: durationMs().default(300_000),
    /** Time an interrupted provider gets to wind down. */
    cancellationGraceMs: positive().max(30_000).default(1000),
    /** On shutdown, how long requests in flight may finish before they are aborted. */
    shutdownGraceMs: positive().max(300_000).default(10_000),
    fanout: fanoutSchema,
    admission: z
      .strictObject({
        global: admissionLimitsSchema("unlimited", "unlimited"),
        perProvider: admissionLimitsSchema(64, 256),
      })
      .prefault({}),
    circuitBreaker: circuitBreakerSchema,
    idempotency: idempotencySchema,
    quotas: quotasSchema,
    reference: referenceSchema,
    openai: z.array(openaiSchema).default([]),
  })
  .prefault({})
  .superRefine((config, ctx) => {
    if (config.fanout.maxOutputs > config.limits.maxOutputs) {
      ctx.addIssue({ code: "custom", path: ["fanout", "maxOutputs"], message: "must not exceed limits.maxOutputs" });
    }
    const parallel = config.fanout.maxParallelOutputs;
    if (parallel !== "auto" && parallel > config.fanout.maxOutputs) {
      ctx.addIssue({ code: "custom", path: ["fanout", "maxParallelOutputs"], message: "must not exceed fanout.maxOutputs" });
    }
    if (config.defaultTimeoutMs > config.limits.maxTimeoutMs) {
      ctx.addIssue({ code: "custom", path: ["defaultTimeoutMs"], message: "must not exceed limits.maxTimeoutMs" });
    }
    // Whether defaultProvider names a registered provider is checked when the
    // registry is built, because embedders may add providers in code.
    const names = [...(config.reference.enabled ? [config.reference.name] : []), ...config.openai.map((p) => p.name)];
    if (new Set(names).size !== names.length) ctx.addIssue({ code: "custom", path: ["openai"], message: "provider names must be unique" });
  });

export type ImagesConfig = z.output<typeof imagesConfigSchema>;
export type OpenAiProviderConfig = z.output<typeof openaiSchema>;
export type IdempotencyConfig = z.output<typeof idempotencySchema>;
export type IdempotencyNatsConfig = z.output<typeof idempotencyNatsSchema>;
export type QuotasConfig = z.output<typeof quotasSchema>;

/** Where the quotas' buckets live: `auto` follows the idempotency store. */
export function quotaStoreOf(config: Pick<ImagesConfig, "quotas" | "idempotency">): "memory" | "nats" {
  const { store } = config.quotas;
  if (store !== "auto") return store;
  return config.idempotency.enabled && config.idempotency.store === "nats" ? "nats" : "memory";
}
