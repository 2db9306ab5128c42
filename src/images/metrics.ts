import { Counter, Gauge, Histogram, type Registry } from "prom-client";
import type { QuotaLimit } from "./quota/bucket.js";
import type { IdempotencyAnswer } from "./runtime/idempotency.js";
import type { ImageRuntime, RuntimeOutcome } from "./runtime/runtime.js";

const STATES = ["closed", "open", "half_open"] as const;
const IDEMPOTENCY_RESULTS: readonly IdempotencyAnswer[] = ["executed", "replayed", "joined", "conflict"];

/** What the metrics read of the idempotency store at scrape time. */
export interface IdempotencyStoreState {
  /** True while a shared store is unreachable and keys are process-local (or refused). */
  readonly degraded: boolean;
}

/** What the metrics read of the quota store at scrape time. */
export interface QuotaStoreState {
  /** True while a shared store is unreachable and buckets are per replica. */
  readonly degraded: boolean;
}

/** Image metrics: gauges read at scrape time, counters fed by the runtime. */
export class ImageMetrics {
  private readonly requests: Counter<"provider" | "code">;
  private readonly outputs: Counter<"provider" | "result">;
  private readonly providerSeconds: Histogram<"provider" | "outcome">;
  private readonly idempotency: Counter<"result">;
  private readonly leaseTakeovers: Counter;
  private readonly quotaRejections: Counter<"caller" | "limit">;

  constructor(
    registry: Registry,
    runtime: () => ImageRuntime | undefined,
    idempotencyStore: () => IdempotencyStoreState | undefined = () => undefined,
    quotaStore: () => QuotaStoreState | undefined = () => undefined,
  ) {
    new Gauge({
      name: "mmgate_images_circuit_state",
      help: "Circuit breaker state per provider (one-hot over closed, open, half_open)",
      labelNames: ["provider", "state"],
      registers: [registry],
      collect() {
        for (const entry of runtime()?.registry.list() ?? []) {
          const state = entry.breaker.snapshot().state;
          for (const s of STATES) this.set({ provider: entry.name, state: s }, s === state ? 1 : 0);
        }
      },
    });
    // The breakers keep a running count: the counter is advanced by what
    // each breaker refused since the last scrape, so it only ever grows
    // (a provider's new breaker, after a reload, starts from zero).
    const rejectedSeen = new WeakMap<object, number>();
    new Counter({
      name: "mmgate_images_circuit_rejected_calls_total",
      help: "Calls refused by each provider's circuit breaker",
      labelNames: ["provider"],
      registers: [registry],
      collect() {
        for (const entry of runtime()?.registry.list() ?? []) {
          const total = entry.breaker.snapshot().rejectedCalls;
          const delta = total - (rejectedSeen.get(entry.breaker) ?? 0);
          rejectedSeen.set(entry.breaker, total);
          // inc(0) makes the series visible before the first refusal.
          if (delta >= 0) this.inc({ provider: entry.name }, delta);
        }
      },
    });
    new Gauge({
      name: "mmgate_images_queue_depth",
      help: "Requests waiting for admission, globally and per provider",
      labelNames: ["scope", "provider"],
      registers: [registry],
      collect() {
        const rt = runtime();
        if (!rt) return;
        this.set({ scope: "global", provider: "" }, rt.globalQueueDepth);
        for (const entry of rt.registry.list()) this.set({ scope: "provider", provider: entry.name }, entry.gate.queueDepth);
      },
    });
    new Gauge({
      name: "mmgate_images_fanout_active_operations",
      help: "Upstream operations holding a fan-out permit, per provider",
      labelNames: ["provider"],
      registers: [registry],
      collect() {
        for (const entry of runtime()?.registry.list() ?? []) this.set({ provider: entry.name }, entry.provider.activeOperations);
      },
    });
    new Gauge({
      name: "mmgate_images_fanout_abandoned_operations",
      help: "Upstream calls still running after their fail-fast batch gave up on them (their permits were freed)",
      labelNames: ["provider"],
      registers: [registry],
      collect() {
        for (const entry of runtime()?.registry.list() ?? []) this.set({ provider: entry.name }, entry.provider.abandonedOperations);
      },
    });
    this.requests = new Counter({
      name: "mmgate_images_requests_total",
      help: "Image requests by provider and result code (ok or the error code)",
      labelNames: ["provider", "code"],
      registers: [registry],
    });
    this.outputs = new Counter({
      name: "mmgate_images_outputs_total",
      help: "Image outputs by provider and result (generated or failed)",
      labelNames: ["provider", "result"],
      registers: [registry],
    });
    this.providerSeconds = new Histogram({
      name: "mmgate_images_provider_duration_seconds",
      help: "Time a provider took per request, from its request going out to its answer or failure (all its images), by provider and outcome (ok or the error code)",
      labelNames: ["provider", "outcome"],
      // Image generation takes seconds to minutes.
      buckets: [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300],
      registers: [registry],
    });
    this.idempotency = new Counter({
      name: "mmgate_images_idempotency_requests_total",
      help: "Image requests with an idempotency key, by how they were answered: executed, replayed (a stored answer), joined (one still running), conflict (the key was used with another request)",
      labelNames: ["result"],
      registers: [registry],
    });
    for (const result of IDEMPOTENCY_RESULTS) this.idempotency.inc({ result }, 0);
    new Gauge({
      name: "mmgate_images_idempotency_store_degraded",
      help: "1 while the shared idempotency store (images.idempotency.store nats) is unreachable and keys are process-local (or refused); 0 otherwise, always 0 with the memory store",
      registers: [registry],
      collect() {
        this.set(idempotencyStore()?.degraded === true ? 1 : 0);
      },
    });
    this.leaseTakeovers = new Counter({
      name: "mmgate_images_idempotency_lease_takeovers_total",
      help: "Idempotency claims taken over from a replica that stopped refreshing them (the key then answers an unknown outcome)",
      registers: [registry],
    });
    this.quotaRejections = new Counter({
      name: "mmgate_images_quota_rejections_total",
      help: "Image calls refused by their caller's quota (quota_exceeded), by caller (a configured name, anonymous, or other) and limit (requests: per second, images: per minute)",
      labelNames: ["caller", "limit"],
      registers: [registry],
    });
    new Gauge({
      name: "mmgate_images_quota_store_degraded",
      help: "1 while the shared quota store (images.quotas on NATS) is unreachable and callers are charged per replica; 0 otherwise, always 0 with the memory store",
      registers: [registry],
      collect() {
        this.set(quotaStore()?.degraded === true ? 1 : 0);
      },
    });
  }

  /** A call refused by its caller's quota: `caller` is the bounded label auth gives names (a configured name, anonymous, other). */
  recordQuotaRejection(caller: string, limit: QuotaLimit): void {
    this.quotaRejections.inc({ caller, limit });
  }

  /** A claim of the shared idempotency store was taken over from a replica presumed dead. */
  recordLeaseTakeover(): void {
    this.leaseTakeovers.inc();
  }

  /** How an image request with an idempotency key was answered: executed (it ran), replayed (a stored answer), joined (one in flight), conflict (another request under the key). */
  recordIdempotency(result: IdempotencyAnswer): void {
    this.idempotency.inc({ result });
  }

  record(outcome: RuntimeOutcome): void {
    if (outcome.providerMs !== undefined) this.providerSeconds.observe({ provider: outcome.provider, outcome: outcome.ok ? "ok" : outcome.error.code }, outcome.providerMs / 1000);
    this.requests.inc({ provider: outcome.provider, code: outcome.ok ? "ok" : outcome.error.code });
    if (outcome.ok && outcome.generated > 0) this.outputs.inc({ provider: outcome.provider, result: "generated" }, outcome.generated);
    if (outcome.failed > 0) this.outputs.inc({ provider: outcome.provider, result: "failed" }, outcome.failed);
  }
}
