/**
 * The relay's metrics, named as the reference names them (C.6), plus the
 * ingest counters of mmgate's own. Gauges that describe the pools are read
 * when scraped.
 */
import { Counter, Gauge, type Registry } from "prom-client";
import { registeredMetric } from "../../util/index.js";

export type RelayStream = "catalog" | "pool" | "readiness" | "load";
/** The reference's scopes, and mmgate's per-connection and per-peer caps on pool streams. */
export type LimitScope = "total" | "per_pool" | "initialized_hub" | "per_connection" | "per_peer";

/** What the scrape-time gauges read. */
export interface RelayGaugeSource {
  catalogPoolCount(): number;
  hubCounts(): { requested: number; initialized: number; ready: number; idle: number };
  topologyCounts(): { ready: number; unavailable: number; unknown: number };
  degradedLoadPools(): number;
}

export class RelayMetrics {
  readonly subscribers: Gauge<"stream">;
  readonly lagged: Counter<"stream">;
  readonly limitRejected: Counter<"stream" | "scope">;
  readonly poolHeartbeats: Counter;
  readonly loadUpdates: Counter;
  readonly terminalFailures: Counter;
  readonly ingestEvents: Counter<"pool" | "result">;
  readonly deltasPublished: Counter<"pool">;
  readonly bootstrapBytes: Counter<"pool">;
  readonly bootstraps: Counter<"pool" | "result">;

  constructor(registry: Registry, source: RelayGaugeSource) {
    const counter = <L extends string>(name: string, help: string, labelNames: readonly L[] = []): Counter<L> =>
      registeredMetric(registry, name, Counter, () => new Counter({ name, help, labelNames, registers: [registry] })) as Counter<L>;
    const gauge = (name: string, help: string, labelNames: readonly string[], collect: (g: Gauge) => void): void => {
      registeredMetric(registry, name, Gauge, () => new Gauge({ name, help, labelNames, registers: [registry], collect(this: Gauge) { collect(this); } }));
    };
    this.subscribers = registeredMetric(
      registry,
      "kv_dc_relay_subscribers",
      Gauge,
      () => new Gauge({ name: "kv_dc_relay_subscribers", help: "Open relay streams by kind", labelNames: ["stream"], registers: [registry] }),
    ) as Gauge<"stream">;
    for (const stream of ["catalog", "pool", "readiness", "load"] as const) this.subscribers.inc({ stream }, 0);
    this.lagged = counter("kv_dc_relay_subscriber_lagged_total", "Streams ended because the subscriber fell behind", ["stream"]);
    this.limitRejected = counter("kv_dc_relay_subscriber_limit_rejected_total", "Streams refused by an admission limit", ["stream", "scope"]);
    this.poolHeartbeats = counter("kv_dc_relay_pool_heartbeats_total", "Pool stream heartbeats sent");
    this.loadUpdates = counter("kv_dc_relay_load_updates_total", "Load windows produced");
    this.terminalFailures = counter("kv_dc_relay_terminal_publication_failures_total", "Publication generations fenced after a terminal failure");
    this.ingestEvents = counter("mmgate_relay_ingest_events_total", "KV events received by pool and result (applied, rejected)", ["pool", "result"]);
    this.deltasPublished = counter("mmgate_relay_deltas_published_total", "CBI1 deltas published by pool", ["pool"]);
    this.bootstrapBytes = counter("mmgate_relay_bootstrap_bytes_total", "Snapshot bytes (CBI1 chunk payloads) handed to pool streams, by pool", ["pool"]);
    this.bootstraps = counter(
      "mmgate_relay_bootstraps_total",
      "Pool stream snapshots by pool and result: completed (every chunk handed over), ended (the stream ended or failed before)",
      ["pool", "result"],
    );
    gauge("kv_dc_relay_catalog_pool_count", "Pools in the catalog", [], (g) => g.set(source.catalogPoolCount()));
    gauge("kv_dc_relay_requested_publication_hub_count", "Pools whose hub has been asked for by a subscriber", [], (g) => g.set(source.hubCounts().requested));
    gauge("kv_dc_relay_initialized_publication_hub_count", "Publication hubs started", [], (g) => g.set(source.hubCounts().initialized));
    gauge("kv_dc_relay_ready_publication_hub_count", "Publication hubs ready to bootstrap subscribers", [], (g) => g.set(source.hubCounts().ready));
    gauge("kv_dc_relay_idle_publication_hub_count", "Publication hubs without subscribers", [], (g) => g.set(source.hubCounts().idle));
    gauge("kv_dc_relay_serving_topology_count", "Serving topology entries by readiness", ["state"], (g) => {
      const counts = source.topologyCounts();
      g.set({ state: "ready" }, counts.ready);
      g.set({ state: "unavailable" }, counts.unavailable);
      g.set({ state: "unknown" }, counts.unknown);
    });
    gauge("kv_dc_relay_degraded_load_coverage_pool_count", "Pools whose load window saw fewer ranks than expected", [], (g) => g.set(source.degradedLoadPools()));
  }
}
