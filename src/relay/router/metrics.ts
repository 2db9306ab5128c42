/**
 * The router's per-pool metrics, labelled by relay (its address as
 * configured) and pool (the pool key, "dc<id>:<semantics>:<scope>"). The
 * gauges are read from the consumers when scraped, so a pool that leaves a
 * catalog leaves the gauges with it; the resubscription counter counts
 * events, so it keeps counting across a consumer's restart.
 */
import { Counter, Gauge, type Registry } from "prom-client";
import type { RelayConsumerEvent } from "../consumer/index.js";
import type { ServingStateName } from "./relay-state.js";
import type { RouterPoolView } from "./router.js";

/** The gauge's values: ServingReadinessState's numbers. */
const SERVING_STATE_VALUE: Readonly<Record<ServingStateName, number>> = { UNKNOWN: 0, UNAVAILABLE: 1, READY: 2 };

/** What the scrape-time gauges read. */
export interface RouterGaugeSource {
  readonly relays: readonly string[];
  pools(): RouterPoolView[];
  connected(relay: string): boolean;
  /** A pool's best serving readiness over its models, by its relay's readiness stream. */
  servingState(view: RouterPoolView): ServingStateName;
  /** Whether the relay's readiness or load stream is open. */
  streamConnected(relay: string, stream: "readiness" | "load"): boolean;
  /** The clock of the views' lastFrameAt (ms). */
  now(): number;
}

type PoolLabels = "relay" | "pool";

export class RouterMetrics {
  private readonly resubscribes: Counter<PoolLabels>;

  constructor(registry: Registry, source: RouterGaugeSource) {
    const poolGauge = (name: string, help: string, value: (view: RouterPoolView, now: number) => number | undefined): void => {
      new Gauge<PoolLabels>({
        name,
        help,
        labelNames: ["relay", "pool"],
        registers: [registry],
        collect() {
          this.reset();
          const now = source.now();
          for (const view of source.pools()) {
            const v = value(view, now);
            if (v !== undefined) this.set({ relay: view.relay, pool: view.key }, v);
          }
        },
      });
    };
    poolGauge("mmgate_router_pool_ready", "1 while the pool's mirror is ready for overlap queries, else 0", (view) => (view.state === "ready" ? 1 : 0));
    poolGauge("mmgate_router_pool_installed_sequence", "The sequence of the pool's mirror (while it holds an installed snapshot)", (view) =>
      view.installedSequence === undefined ? undefined : Number(view.installedSequence),
    );
    poolGauge(
      "mmgate_router_pool_lag_seconds",
      "Local receive time of the pool's last frame minus that frame's send_ts_us (the producer's clock): transit delay, clock skew included",
      (view) => (view.lastFrameAt === undefined || view.lastSendTsUs === undefined ? undefined : (view.lastFrameAt - Number(view.lastSendTsUs) / 1000) / 1000),
    );
    poolGauge("mmgate_router_pool_last_frame_age_seconds", "Seconds since the pool's last frame arrived (local clock); heartbeats keep it below the relay's heartbeat interval", (view, now) =>
      view.lastFrameAt === undefined ? undefined : Math.max(0, now - view.lastFrameAt) / 1000,
    );
    poolGauge(
      "mmgate_router_pool_serving_state",
      "The pool's serving readiness as its relay reports it, best over the models it serves: 0 UNKNOWN, 1 UNAVAILABLE (left out of overlap answers), 2 READY",
      (view) => SERVING_STATE_VALUE[source.servingState(view)],
    );
    new Gauge<"relay" | "stream">({
      name: "mmgate_router_relay_stream_connected",
      help: "1 while the relay's readiness or load stream is open, else 0",
      labelNames: ["relay", "stream"],
      registers: [registry],
      collect() {
        for (const relay of source.relays) for (const stream of ["readiness", "load"] as const) this.set({ relay, stream }, source.streamConnected(relay, stream) ? 1 : 0);
      },
    });
    new Gauge<"relay">({
      name: "mmgate_router_relay_connected",
      help: "1 while the relay's catalog stream is open, else 0",
      labelNames: ["relay"],
      registers: [registry],
      collect() {
        for (const relay of source.relays) this.set({ relay }, source.connected(relay) ? 1 : 0);
      },
    });
    this.resubscribes = new Counter<PoolLabels>({
      name: "mmgate_router_pool_resubscribes_total",
      help: "Subscriptions to a pool after its first (each follows a failed stream and rebuilds the mirror from a snapshot)",
      labelNames: ["relay", "pool"],
      registers: [registry],
    });
  }

  /** Follows one consumer event of `relay`. */
  onEvent(relay: string, event: RelayConsumerEvent): void {
    switch (event.type) {
      case "catalog":
        // Every catalogued pool has a series from the start.
        for (const pool of [...event.added, ...event.replaced]) this.resubscribes.inc({ relay, pool }, 0);
        return;
      case "subscribing":
        if (event.resubscribes > 0) this.resubscribes.inc({ relay, pool: event.pool });
        return;
      case "withdrawn":
        this.resubscribes.remove({ relay, pool: event.pool });
        return;
      default:
        return;
    }
  }
}
