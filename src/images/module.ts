/**
 * The `images` module: its definition, its error mapper, and the instance
 * its `create` builds (providers, runtime, metrics, the service, the
 * OpenAI-shaped routes).
 */
import type { ConnectError } from "@connectrpc/connect";
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import { bindService, defineModule, type ModuleContext, type ModuleInstance } from "../server/index.js";
import { buildImageRuntime, type BuildOptions } from "./build.js";
import { imagesConfigSchema, quotaStoreOf, type ImagesConfig } from "./config.js";
import { ImageError } from "./core/errors.js";
import { ImageMetrics } from "./metrics.js";
import { toConnectError } from "./proto-convert.js";
import type { ImageRuntime } from "./runtime/runtime.js";
import { publishProviderHealth } from "./provider-health.js";
import { imageService, type ImageServiceOptions } from "./service.js";
import { MemoryIdempotencyStore, type IdempotencyAnswer } from "./runtime/idempotency.js";
import { NatsIdempotencyStore } from "./runtime/idempotency-nats.js";
import { openAiImageApi } from "./openai-api/index.js";
import { NatsQuotaStore } from "./quota/nats.js";
import { ImageQuotas } from "./quota/quotas.js";
import { MemoryQuotaStore } from "./quota/store.js";

/**
 * The images module's error mapper: an ImageError becomes its status and
 * ErrorDetail; anything else is left to the host (logged, INTERNAL).
 */
export function mapImageError(error: unknown): ConnectError | undefined {
  return error instanceof ImageError ? toConnectError(error) : undefined;
}

/**
 * The service's idempotency store, when images.idempotency.enabled, counted
 * by `metrics`: this process's memory, or the NATS bucket the replicas
 * share (it starts connecting at once; the module closes it).
 */
function idempotencyStore(ctx: ModuleContext<ImagesConfig>, metrics: ImageMetrics): MemoryIdempotencyStore | NatsIdempotencyStore | undefined {
  const { enabled, store, nats, ...limits } = ctx.config.idempotency;
  if (!enabled) return undefined;
  const observe = (answer: IdempotencyAnswer) => metrics.recordIdempotency(answer);
  if (store === "memory") return new MemoryIdempotencyStore(limits, Date.now, observe);
  const shared = new NatsIdempotencyStore({
    limits,
    nats,
    logger: ctx.logger.child({ component: "idempotency" }),
    observe,
    onTakeover: () => metrics.recordLeaseTakeover(),
  });
  shared.start();
  return shared;
}

/**
 * Where callers' quota buckets live (images.quotas.store): this process's
 * memory, or a NATS bucket on the idempotency store's servers that every
 * replica shares (it starts connecting at once; the module closes it).
 */
function quotaStore(ctx: ModuleContext<ImagesConfig>, now: () => number): MemoryQuotaStore | NatsQuotaStore {
  const { quotas, idempotency } = ctx.config;
  if (quotaStoreOf(ctx.config) === "memory") return new MemoryQuotaStore(quotas.maxCallers, now);
  const shared = new NatsQuotaStore({
    nats: idempotency.nats,
    bucket: quotas.nats.bucket,
    maxCallers: quotas.maxCallers,
    logger: ctx.logger.child({ component: "quotas" }),
    now,
  });
  shared.start();
  return shared;
}

/** What an embedder or a test may add when building the module. */
export type ImagesModuleOptions = Omit<BuildOptions, "onOutcome"> & {
  /** The clock of the quotas' token buckets (ms since the epoch); Date.now by default. */
  readonly quotaClock?: () => number;
};

/**
 * Starts the capability: providers, runtime, metrics and the service
 * binding. `options` lets embedders and tests add providers in code.
 */
function createImagesInstance(
  ctx: ModuleContext<ImagesConfig>,
  options: ImagesModuleOptions = {},
): ModuleInstance & { runtime: ImageRuntime } {
  // The gauges read the runtime at scrape time; it exists by then.
  const holder: { runtime?: ImageRuntime; health?: ReturnType<typeof publishProviderHealth>; idempotency?: NatsIdempotencyStore; quotas?: MemoryQuotaStore | NatsQuotaStore } = {};
  const metrics = new ImageMetrics(ctx.metrics, () => holder.runtime, () => holder.idempotency, () => holder.quotas);
  const { quotaClock, ...buildOptions } = options;
  const runtime = buildImageRuntime(ctx.config, {
    ...buildOptions,
    onOutcome: (outcome) => {
      metrics.record(outcome);
      if (!outcome.ok && outcome.error.code === "internal") {
        // Clients get a redacted `internal` error; the log keeps what was thrown.
        ctx.logger.error({ err: outcome.error.cause ?? outcome.error, provider: outcome.provider }, "image request failed unexpectedly");
      }
      // After the runtime has recorded the outcome with the breaker.
      queueMicrotask(() => holder.health?.refresh());
    },
  });
  holder.runtime = runtime;
  const providerHealth = publishProviderHealth(runtime, ctx.health, ImageService.typeName);
  holder.health = providerHealth;
  ctx.tasks.run("provider-health", providerHealth.watch);
  const idempotency = idempotencyStore(ctx, metrics);
  if (idempotency instanceof NatsIdempotencyStore) holder.idempotency = idempotency;
  const buckets = quotaStore(ctx, quotaClock ?? Date.now);
  holder.quotas = buckets;
  const quotas = new ImageQuotas({
    store: buckets,
    anonymous: ctx.config.quotas.anonymous,
    onRefused: (caller, limit) => metrics.recordQuotaRejection(caller, limit),
  });
  const serviceOptions: ImageServiceOptions = { quotas, ...(idempotency ? { idempotency } : {}) };
  // One shutdown for drain and close: requests in flight finish within
  // images.shutdownGraceMs (the host's grace ends it sooner), the rest are
  // answered with timeout, then the providers stop.
  let stopped: Promise<void> | undefined;
  const stop = (signal?: AbortSignal): Promise<void> => {
    const result = runtime.shutdown(signal ? { signal } : {});
    stopped ??= result.then(({ drained, interrupted }) => {
      if (!drained) ctx.logger.warn({ interrupted }, "image requests still running when the shutdown grace ended were aborted");
    });
    return stopped;
  };
  return {
    runtime,
    services: [bindService(ImageService, imageService(runtime, ctx.drainSignal, serviceOptions))],
    // OpenAI's image endpoints, each request one ImageService call in process.
    httpRoutes: openAiImageApi({ localRoutes: ctx.localRoutes, metrics: ctx.metrics, maxInputFiles: ctx.config.limits.maxInputs }),
    drain: (signal) => stop(signal),
    // The shared stores outlive the requests: their outcomes are written before they close.
    close: async () => {
      await stop();
      await holder.idempotency?.close();
      await buckets.close();
    },
  };
}

/** The `images` module, with providers added in code (embedders, tests, benchmarks). */
export function defineImagesModule(options: ImagesModuleOptions = {}) {
  return defineModule({
    name: "images",
    description: "Image generation over registered providers with bounded multi-output fan-out",
    configSchema: imagesConfigSchema,
    mapError: mapImageError,
    create: (ctx) => createImagesInstance(ctx, options),
  });
}

export const imagesModule = defineImagesModule();
