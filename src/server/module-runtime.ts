import type { Logger } from "pino";
import type { Registry } from "prom-client";
import type { MmgateConfig } from "./config/index.js";
import type { HealthRegistry } from "./health.js";
import { Readiness } from "./health.js";
import type {
  ErrorMapper,
  HostStatusDecorator,
  HttpRoute,
  LocalRoutes,
  ModuleHealth,
  ModuleInstance,
  ServiceBinding,
  ServiceModule,
} from "./module.js";
import type { PlannedModule } from "./module-plan.js";
import { Supervisor } from "./supervisor.js";

export interface ModuleRuntimeOptions {
  readonly config: MmgateConfig;
  readonly logger: Logger;
  readonly registry: Registry;
  readonly health: HealthRegistry;
  /** Handed to every module as `ctx.drainSignal`. */
  readonly drainingSignal: AbortSignal;
}

/** What modules are built with besides their own config, known once the port is bound. */
export interface ModuleSurroundings {
  readonly advertisedAddress: string;
  readonly localRoutes: LocalRoutes;
}

interface BuiltModule {
  readonly module: ServiceModule;
  readonly served: boolean;
  readonly supervisor: Supervisor;
  readonly health: ModuleHealth & { follow(services: readonly string[]): void };
  instance: ModuleInstance;
}

/**
 * The configured modules through their life: planned in dependency order,
 * built (`create`), started once the routes are live, their readiness
 * folded into health, their tasks supervised, drained alongside the
 * listener and closed in reverse order.
 */
export class ModuleRuntime {
  private readonly readiness: Readiness;
  private readonly built: BuiltModule[] = [];
  private readonly mappers = new Map<string, ErrorMapper>();
  private readonly decorators = new Map<string, HostStatusDecorator>();

  constructor(
    /** The modules in dependency order (`planModules`). */
    readonly plan: readonly PlannedModule[],
    private readonly options: ModuleRuntimeOptions,
  ) {
    this.readiness = new Readiness(options.health, (module, ready, reason) =>
      options.logger.info({ module, ready, reason }, ready ? "module ready" : "module not ready"),
    );
  }

  /**
   * Creates every module in dependency order, each with its requirements'
   * exports; returns the service bindings of the served ones. A service
   * bound twice is an error. On failure, what was built stays known, so
   * that `stopTasks` and `close` still reach it.
   */
  async build(surroundings: ModuleSurroundings): Promise<ServiceBinding[]> {
    const { config, logger, registry, drainingSignal } = this.options;
    const exportsByName = new Map<string, unknown>();
    for (const { module, served } of this.plan) {
      const moduleLogger = logger.child({ module: module.name });
      const supervisor = new Supervisor(module.name, moduleLogger, registry);
      const moduleHealth = this.readiness.forModule(module.name);
      const deps: Record<string, unknown> = {};
      for (const [key, dep] of Object.entries(module.requires ?? {})) deps[key] = exportsByName.get(dep.name);
      // The instance is stored before anything can throw, so that a failing
      // create() of a later module still stops this one's tasks.
      const entry: BuiltModule = { module, served, supervisor, health: moduleHealth, instance: { services: [] } };
      this.built.push(entry);
      entry.instance = await module.create({
        config: config.sections[module.name],
        deps,
        logger: moduleLogger,
        metrics: registry,
        health: moduleHealth,
        tasks: supervisor,
        drainSignal: drainingSignal,
        advertisedAddress: surroundings.advertisedAddress,
        localRoutes: surroundings.localRoutes,
      });
      exportsByName.set(module.name, entry.instance.exports);
    }
    const bindings = this.served().flatMap((b) => [...b.instance.services]);
    const seen = new Set<string>();
    for (const b of bindings) {
      if (seen.has(b.service.typeName)) throw new Error(`service ${b.service.typeName} is registered twice`);
      seen.add(b.service.typeName);
    }
    for (const b of this.built) {
      const mapError = b.module.mapError;
      if (mapError) for (const s of b.instance.services) this.mappers.set(s.service.typeName, mapError);
      const decorate = b.module.decorateHostStatus;
      if (decorate) for (const s of b.instance.services) this.decorators.set(s.service.typeName, decorate);
    }
    return bindings;
  }

  /** A served module's services follow its readiness (unless it sets them itself). */
  followReadiness(): void {
    for (const b of this.served()) b.health.follow(b.instance.services.map((s) => s.service.typeName));
  }

  /** The error mapper of the module whose service `typeName` is. */
  mapperFor(typeName: string): ErrorMapper | undefined {
    return this.mappers.get(typeName);
  }

  /** The host-status decorator of the module whose service `typeName` is. */
  decoratorFor(typeName: string): HostStatusDecorator | undefined {
    return this.decorators.get(typeName);
  }

  /** The plain HTTP routes of the served modules. */
  httpRoutes(): HttpRoute[] {
    return this.served().flatMap((b) => [...(b.instance.httpRoutes ?? [])]);
  }

  /** Runs every module's `start`, in dependency order: the routes are live, modules may register, watch and call each other. */
  async start(): Promise<void> {
    for (const b of this.built) await b.instance.start?.();
  }

  /** The routes are live and every module started: "" may turn SERVING. */
  markStarted(): void {
    this.readiness.markStarted();
  }

  /** Modules not ready, with their reasons. */
  pending(): ReadonlyMap<string, string> {
    return this.readiness.pending();
  }

  /** The plan for the start-up log: served modules by name, the others marked as dependencies. */
  describe(): string[] {
    return this.plan.map((p) => (p.served ? p.module.name : `${p.module.name} (dependency, not served)`));
  }

  /** Every module's `drain` at once; `graceOverSignal` fires when the grace is over. A failure is logged. */
  async drain(graceOverSignal: AbortSignal): Promise<void> {
    await Promise.all(
      this.built.map(async ({ module, instance }) => {
        try {
          await instance.drain?.(graceOverSignal);
        } catch (err) {
          this.options.logger.error({ err, module: module.name }, "module failed to drain");
        }
      }),
    );
  }

  /** Fires every supervised task's signal and waits up to `timeoutMs` for them to return. */
  async stopTasks(timeoutMs: number): Promise<void> {
    await Promise.all(this.built.map((b) => b.supervisor.stop(timeoutMs)));
  }

  /** Every module's `close`, in reverse order; a failure is logged and the others still run. */
  async close(): Promise<void> {
    for (const { module, instance } of [...this.built].reverse()) {
      try {
        await instance.close?.();
      } catch (err) {
        this.options.logger.error({ err, module: module.name }, "module failed to close");
      }
    }
  }

  private served(): BuiltModule[] {
    return this.built.filter((b) => b.served);
  }
}
