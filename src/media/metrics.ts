import { Counter, Gauge, type Registry } from "prom-client";
import { MEDIA_STAGES, type MediaStage, type MediaStageLoad } from "./admission.js";
import type { TensorStore } from "./tensor-store.js";

/**
 * Tensor store and admission metrics; gauges are read at scrape time, from
 * the store and from `load` (the pipeline's stages).
 */
export class MediaMetrics {
  readonly evictions: Counter<"reason">;
  /** Calls refused because a stage's queue was full. */
  readonly admissionRejected: Counter<"stage">;

  constructor(registry: Registry, store: TensorStore, load: () => Readonly<Record<MediaStage, MediaStageLoad>>) {
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
  }
}
