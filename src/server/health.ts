import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";
import { BoundedQueue, linkSignals } from "../util/index.js";
import type { ModuleHealth } from "./module.js";
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
 * change listeners for grpc.health.v1 Watch. Each entry has the status its
 * owner reports and, on top, an operator's override
 * (AdminService.SetServingStatus): the effective status is NOT_SERVING
 * while either says so. While the server drains every entry reports
 * NOT_SERVING, whatever was set for it.
 */
export class HealthRegistry {
  private readonly statuses = new Map<string, ServingStatus>();
  private readonly outOfRotation = new Set<string>();
  private readonly listeners = new Map<string, Set<Listener>>();
  private draining = false;

  constructor() {
    this.statuses.set("", ServingStatus.SERVING);
  }

  /** Registers an entry or changes the status its owner reports. */
  set(service: string, status: ServingStatus): void {
    this.change(service, () => this.statuses.set(service, status));
  }

  /** An operator takes an entry out of rotation (false) or puts it back (true). */
  setOperatorServing(service: string, serving: boolean): void {
    this.change(service, () => (serving ? this.outOfRotation.delete(service) : this.outOfRotation.add(service)));
  }

  has(service: string): boolean {
    return this.statuses.has(service);
  }

  /** The effective status, or undefined for an unknown service. */
  get(service: string): ServingStatus | undefined {
    const set = this.statuses.get(service);
    if (set === undefined) return undefined;
    return this.draining || this.outOfRotation.has(service) ? ServingStatus.NOT_SERVING : set;
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

  private change(service: string, apply: () => void): void {
    const before = this.get(service);
    apply();
    this.notify(service, before);
  }

  private notify(service: string, before: ServingStatus | undefined): void {
    const after = this.get(service);
    if (after === before || after === undefined) return;
    for (const listener of this.listeners.get(service) ?? []) listener(after);
  }
}

/**
 * Readiness of every module, folded into the server's `""` entry: SERVING
 * once the host has started and while every module is ready. Each module
 * gets a `ModuleHealth` whose services follow its readiness until it sets
 * them itself.
 */
export class Readiness {
  private readonly notReady = new Map<string, string>();
  private started = false;

  constructor(
    private readonly registry: HealthRegistry,
    private readonly onChange: (module: string, ready: boolean, reason: string | undefined) => void = () => undefined,
  ) {
    this.registry.set("", ServingStatus.NOT_SERVING);
  }

  /** The routes are live and every module started: "" may turn SERVING. */
  markStarted(): void {
    this.started = true;
    this.publish();
  }

  /** Modules not ready, with their reasons. */
  pending(): ReadonlyMap<string, string> {
    return this.notReady;
  }

  forModule(module: string): ModuleHealth & { follow(services: readonly string[]): void } {
    const own = new Set<string>();
    const following = new Set<string>();
    let ready = true;
    const status = () => (ready ? ServingStatus.SERVING : ServingStatus.NOT_SERVING);
    return {
      get ready() {
        return ready;
      },
      setReady: (value, reason) => {
        if (value === ready && (value || this.notReady.get(module) === (reason ?? "not ready"))) return;
        ready = value;
        if (value) this.notReady.delete(module);
        else this.notReady.set(module, reason ?? "not ready");
        for (const name of following) this.registry.set(name, status());
        this.onChange(module, value, reason);
        this.publish();
      },
      set: (name, value) => {
        own.add(name);
        following.delete(name);
        this.registry.set(name, value);
      },
      get: (name) => this.registry.get(name),
      follow: (services) => {
        for (const name of services) {
          if (own.has(name)) continue;
          following.add(name);
          this.registry.set(name, status());
        }
      },
    };
  }

  private publish(): void {
    const serving = this.started && this.notReady.size === 0;
    this.registry.set("", serving ? ServingStatus.SERVING : ServingStatus.NOT_SERVING);
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
      // Only the latest status matters: a slow reader skips what it missed.
      const latest = new BoundedQueue<ServingStatus>({ maxItems: 1 });
      latest.replace(registry.get(req.service) ?? ServingStatus.SERVICE_UNKNOWN);
      const unsubscribe = registry.subscribe(req.service, (s) => latest.replace(s));
      // The stream ends on client cancellation, or on drain once the
      // NOT_SERVING that drain published has been written; at its deadline
      // it ends DEADLINE_EXCEEDED (a quiet return would end it OK).
      const link = linkSignals([ctx.signal, drainSignal]);
      const stop = link.signal;
      try {
        for (;;) {
          const next = await latest.next(stop).catch(() => undefined);
          if (next === undefined || next.done === true) {
            const reason: unknown = ctx.signal.reason;
            if (reason instanceof ConnectError && reason.code === Code.DeadlineExceeded) throw reason;
            return;
          }
          yield { status: next.value };
          if (drainSignal.aborted && next.value === ServingStatus.NOT_SERVING) return;
        }
      } finally {
        link.dispose();
        unsubscribe();
        latest.close();
      }
    },
  };
}

export { Health };
