import { Counter, Gauge, type Registry } from "prom-client";
import type { TensorStore } from "./tensor-store.js";

/** Tensor store metrics; gauges are read from the store at scrape time. */
export class MediaMetrics {
  readonly evictions: Counter<"reason">;

  constructor(registry: Registry, store: TensorStore) {
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
  }
}
