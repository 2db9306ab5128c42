import type { DescService } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import type { Logger } from "pino";
import type { Registry } from "prom-client";
import type { z } from "zod";
import type { HealthRegistry } from "./health.js";

/**
 * One service implementation bound to its generated descriptor. The host
 * registers it on the router, in reflection and in health.
 */
export interface ServiceBinding<S extends DescService = DescService> {
  readonly service: S;
  readonly implementation: Partial<ServiceImpl<S>>;
}

/** Binds an implementation to its descriptor with the implementation typed. */
export function bindService<S extends DescService>(
  service: S,
  implementation: Partial<ServiceImpl<S>>,
): ServiceBinding {
  return { service, implementation } as unknown as ServiceBinding;
}

/** What the host hands a module when it starts it. */
export interface ModuleContext<C> {
  /** This module's section of the configuration, validated by its schema. */
  readonly config: C;
  /** Everything validated, for the few modules that read shared settings. */
  readonly root: Readonly<Record<string, unknown>>;
  readonly logger: Logger;
  readonly metrics: Registry;
  readonly health: HealthRegistry;
  /**
   * Fires when the server begins to drain. Server-streaming handlers end
   * their streams cleanly (status OK) when it fires; unary calls ignore it.
   */
  readonly drainSignal: AbortSignal;
  /** The address clients use to reach this server, e.g. "127.0.0.1:50051". */
  readonly advertisedAddress: string;
}

/** A started module: its services and how to stop it. */
export interface ModuleInstance {
  readonly services: readonly ServiceBinding[];
  /** Called once after the listener closed; releases timers, sockets, files. */
  close?(): Promise<void> | void;
}

/**
 * A capability as the host sees it: a name (its key in the config and in
 * the `services` list), a config schema for its section, and a factory.
 */
export interface ServiceModule<S extends z.ZodType = z.ZodType> {
  readonly name: string;
  readonly description: string;
  readonly configSchema: S;
  create(ctx: ModuleContext<z.output<S>>): Promise<ModuleInstance> | ModuleInstance;
}

/** Declares a module with its config type inferred from its schema. */
export function defineModule<S extends z.ZodType>(module: ServiceModule<S>): ServiceModule {
  return module as unknown as ServiceModule;
}
