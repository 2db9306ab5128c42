import { setMaxListeners } from "node:events";
import { Code, ConnectError } from "@connectrpc/connect";
import { Gauge } from "prom-client";
import type { Registry } from "prom-client";
import type { MmgateConfig } from "./config/index.js";

/** How long supervised tasks get to return once their signal fired. */
export const TASK_STOP_MS = 5000;

/** How long supervised tasks get when a start-up that failed part way is undone. */
export const ABANDONED_TASK_STOP_MS = 1000;

/**
 * The two moments of a shutdown that running code listens for:
 *
 * - `drainingSignal`: draining began (after `shutdown.delayMs`, while which
 *   health said NOT_SERVING and calls were still taken). New calls are
 *   refused with UNAVAILABLE, HTTP/2 sessions get GOAWAY, HTTP/1.1
 *   connections are closed after their response; modules see it as
 *   `ctx.drainSignal`, health's Watch and reflection end their streams.
 * - `graceOverSignal`: `shutdown.graceMs` is over and calls are still
 *   running: they are cancelled (UNAVAILABLE "server shut down"), on both
 *   request paths and on the plain HTTP routes.
 */
export class ShutdownSignals {
  private readonly draining = new AbortController();
  private readonly graceOver = new AbortController();
  readonly drainingSignal = this.draining.signal;
  readonly graceOverSignal = this.graceOver.signal;

  constructor() {
    // Every open call listens on these two: they legitimately have thousands.
    setMaxListeners(0, this.drainingSignal, this.graceOverSignal);
  }

  get isDraining(): boolean {
    return this.drainingSignal.aborted;
  }

  beginDraining(): void {
    this.draining.abort();
  }

  /** Cancels the calls still running. */
  endGrace(): void {
    this.graceOver.abort(new ConnectError("server shut down", Code.Unavailable));
  }
}

/**
 * A drain as Prometheus sees it. It stays visible while the admin listener
 * lasts (to the end of the shutdown), so that an alert can tell a stuck one
 * by its age.
 */
export class DrainMetrics {
  private readonly draining: Gauge;
  private readonly drainStarted: Gauge;

  constructor(registry: Registry, shutdown: MmgateConfig["shutdown"]) {
    this.draining = new Gauge({
      name: "mmgate_draining",
      help: "1 from SIGTERM (or shutdown) until the process stops: health NOT_SERVING, then GOAWAY and the grace; 0 while serving.",
      registers: [registry],
    });
    this.draining.set(0);
    this.drainStarted = new Gauge({
      name: "mmgate_drain_started_timestamp_seconds",
      help: "When the drain began (Unix seconds); 0 while serving.",
      registers: [registry],
    });
    this.drainStarted.set(0);
    new Gauge({
      name: "mmgate_shutdown_grace_seconds",
      help: "How long a drain may take: shutdown.delayMs plus shutdown.graceMs, in seconds (calls still running then are cancelled).",
      registers: [registry],
    }).set((shutdown.delayMs + shutdown.graceMs) / 1000);
  }

  began(): void {
    this.draining.set(1);
    this.drainStarted.set(Date.now() / 1000);
  }
}
