import { Counter, Gauge, type Registry } from "prom-client";
import { registeredMetric } from "../util/index.js";
import { MEDIA_STAGES, type MediaStage, type MediaStageLoad } from "./admission.js";
import type { DecodedCacheEvent } from "./decoded-cache.js";
import type { TensorStore } from "./tensor-store.js";

/** What the decoded-cache gauges read at scrape time. */
export interface DecodedCacheLoad {
  readonly bytes: number;
  readonly count: number;
}

function decodedCacheCounter(registry: Registry, name: string, help: string): Counter {
  return registeredMetric(registry, name, Counter, () => new Counter({ name, help, registers: [registry] }));
}

/**
 * Tensor store, admission and decoded-cache metrics; gauges are read at
 * scrape time, from the store, from `load` (the pipeline's stages) and from
 * `decodedCache`.
 */
export class MediaMetrics {
  readonly evictions: Counter<"reason">;
  /** Calls refused because a stage's queue was full. */
  readonly admissionRejected: Counter<"stage">;
  /** Decoded-cache lookups and evictions, by event. */
  readonly decodedCache: Readonly<Record<DecodedCacheEvent, Counter>>;

  constructor(
    registry: Registry,
    store: TensorStore,
    load: () => Readonly<Record<MediaStage, MediaStageLoad>>,
    decodedCache: () => DecodedCacheLoad = () => ({ bytes: 0, count: 0 }),
  ) {
    new Gauge({
      name: "mmgate_media_tensor_store_bytes",
      help: "Bytes of decoded tensors held in the tensor store",
      registers: [registry],
      collect() {
        this.set(store.bytes);
      },
    });
    new Gauge({
      name: "mmgate_media_tensor_store_tensors",
      help: "Decoded tensors held in the tensor store",
      registers: [registry],
      collect() {
        this.set(store.count);
      },
    });
    this.evictions = new Counter({
      name: "mmgate_media_tensor_store_removals_total",
      help: "Tensors that left the store, by reason (released, expired, evicted)",
      labelNames: ["reason"],
      registers: [registry],
    });
    this.admissionRejected = new Counter({
      name: "mmgate_media_admission_rejected_total",
      help: "Calls refused with OVERLOADED because the stage's queue was full, by stage (decode, fetch)",
      labelNames: ["stage"],
      registers: [registry],
    });
    for (const stage of MEDIA_STAGES) this.admissionRejected.inc({ stage }, 0);
    new Gauge({
      name: "mmgate_media_admission_queued",
      help: "Calls waiting for a slot, by stage (decode, fetch)",
      labelNames: ["stage"],
      registers: [registry],
      collect() {
        const stages = load();
        for (const stage of MEDIA_STAGES) this.set({ stage }, stages[stage].queued);
      },
    });
    new Gauge({
      name: "mmgate_media_admission_in_flight",
      help: "Calls holding a slot, by stage (decode, fetch)",
      labelNames: ["stage"],
      registers: [registry],
      collect() {
        const stages = load();
        for (const stage of MEDIA_STAGES) this.set({ stage }, stages[stage].inFlight);
      },
    });
    this.decodedCache = {
      hit: decodedCacheCounter(
        registry,
        "mmgate_media_decoded_cache_hits_total",
        "Decodes of an http(s) URL served without a fetch and decode of their own (cached, or joined to one in flight)",
      ),
      miss: decodedCacheCounter(registry, "mmgate_media_decoded_cache_misses_total", "Decodes of an http(s) URL that started a fetch and decode"),
      eviction: decodedCacheCounter(
        registry,
        "mmgate_media_decoded_cache_evictions_total",
        "Decoded images dropped from the decoded cache for its byte budget (an image larger than the budget counts once)",
      ),
    };
    new Gauge({
      name: "mmgate_media_decoded_cache_bytes",
      help: "Bytes of decoded images held in the decoded cache",
      registers: [registry],
      collect() {
        this.set(decodedCache().bytes);
      },
    });
    new Gauge({
      name: "mmgate_media_decoded_cache_entries",
      help: "Decoded images held in the decoded cache",
      registers: [registry],
      collect() {
        this.set(decodedCache().count);
      },
    });
  }
}
