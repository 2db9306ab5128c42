import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  Health,
  HealthCheckResponse_ServingStatus as ServingStatus,
  HealthListResponseSchema,
  HealthCheckResponseSchema,
} from "../../gen/grpc/health/v1/health_pb.js";

export { ServingStatus };

type Listener = (status: ServingStatus) => void;

/**
 * Serving status of the server ("") and of each registered service, with
 * change listeners for grpc.health.v1 Watch. While the server drains every
 * service reports NOT_SERVING, whatever was set for it.
 */
export class HealthRegistry {
  private readonly statuses = new Map<string, ServingStatus>();
  private readonly listeners = new Map<string, Set<Listener>>();
  private draining = false;

  constructor() {
    this.statuses.set("", ServingStatus.SERVING);
  }

  /** Registers a service (SERVING) or changes its status. */
  set(service: string, status: ServingStatus): void {
    const before = this.get(service);
    this.statuses.set(service, status);
    this.notify(service, before);
  }

  has(service: string): boolean {
    return this.statuses.has(service);
  }

  /** The effective status, or undefined for an unknown service. */
  get(service: string): ServingStatus | undefined {
    const set = this.statuses.get(service);
    if (set === undefined) return undefined;
    return this.draining ? ServingStatus.NOT_SERVING : set;
  }

  names(): string[] {
    return [...this.statuses.keys()].sort();
  }

  get isDraining(): boolean {
    return this.draining;
  }

  /** Marks everything NOT_SERVING for good; watchers see it at once. */
  drain(): void {
    if (this.draining) return;
    const before = new Map([...this.statuses.keys()].map((name) => [name, this.get(name)]));
    this.draining = true;
    for (const [name, status] of before) this.notify(name, status);
  }

  /** Calls `listener` on every change of `service`'s effective status. */
  subscribe(service: string, listener: Listener): () => void {
    let set = this.listeners.get(service);
    if (!set) this.listeners.set(service, (set = new Set()));
    set.add(listener);
    return () => {
      set.delete(listener);
      if (set.size === 0) this.listeners.delete(service);
    };
  }

  private notify(service: string, before: ServingStatus | undefined): void {
    const after = this.get(service);
    if (after === before || after === undefined) return;
    for (const listener of this.listeners.get(service) ?? []) listener(after);
  }
}

/** Bounds a Watch stream's backlog: only the latest status matters. */
class LatestStatus {
  private pending: ServingStatus | undefined;
  private wake: (() => void) | undefined;

  push(status: ServingStatus): void {
    this.pending = status;
    this.wake?.();
  }

  async next(signal: AbortSignal): Promise<ServingStatus | undefined> {
    while (this.pending === undefined) {
      if (signal.aborted) return undefined;
      await new Promise<void>((resolve) => {
        const done = () => {
          signal.removeEventListener("abort", done);
          this.wake = undefined;
          resolve();
        };
        this.wake = done;
        signal.addEventListener("abort", done, { once: true });
      });
    }
    const status = this.pending;
    this.pending = undefined;
    return status;
  }
}

/**
 * grpc.health.v1.Health over a registry. Watch sends the current status,
 * then every change; it ends cleanly when the server drains, after the
 * NOT_SERVING it caused has been sent.
 */
export function healthService(registry: HealthRegistry, drainSignal: AbortSignal): Partial<ServiceImpl<typeof Health>> {
  return {
    check(req) {
      const status = registry.get(req.service);
      if (status === undefined) throw new ConnectError(`unknown service "${req.service}"`, Code.NotFound);
      return { status };
    },
    list() {
      const statuses: Record<string, ReturnType<typeof create<typeof HealthCheckResponseSchema>>> = {};
      for (const name of registry.names()) {
        statuses[name] = create(HealthCheckResponseSchema, { status: registry.get(name) ?? ServingStatus.UNKNOWN });
      }
      return create(HealthListResponseSchema, { statuses });
    },
    async *watch(req, ctx) {
      const latest = new LatestStatus();
      latest.push(registry.get(req.service) ?? ServingStatus.SERVICE_UNKNOWN);
      const unsubscribe = registry.subscribe(req.service, (s) => latest.push(s));
      // The stream ends on client cancellation, or on drain once the
      // NOT_SERVING that drain published has been written.
      const stop = AbortSignal.any([ctx.signal, drainSignal]);
      try {
        for (;;) {
          const status = await latest.next(stop);
          if (status === undefined) return;
          yield { status };
          if (drainSignal.aborted && status === ServingStatus.NOT_SERVING) return;
        }
      } finally {
        unsubscribe();
      }
    },
  };
}

export { Health };
