import type { IncomingMessage, ServerResponse } from "node:http";
import type { Http2ServerRequest, Http2ServerResponse } from "node:http2";
import type { DescService } from "@bufbuild/protobuf";
import type { ConnectError, ConnectRouter, Interceptor, ServiceImpl } from "@connectrpc/connect";
import type { Logger } from "pino";
import type { Registry } from "prom-client";
import type { z } from "zod";
import type { ServingStatus } from "./health.js";
import type { TaskOptions } from "./supervisor.js";

/**
 * One service implementation bound to its generated descriptor. The host
 * registers it on the router, in reflection and in health.
 */
export interface ServiceBinding<S extends DescService = DescService> {
  readonly service: S;
  readonly implementation: Partial<ServiceImpl<S>>;
  /**
   * A receive limit of the service's own, below the host's
   * maxReceiveMessageBytes: a message over it is refused
   * (RESOURCE_EXHAUSTED) before it is decoded. Its calls all go through
   * connect's handler, which applies it.
   */
  readonly readMaxBytes?: number;
}

/** Per-service settings of a binding. */
export interface ServiceOptions {
  readonly readMaxBytes?: number;
}

/** Binds an implementation to its descriptor with the implementation typed. */
export function bindService<S extends DescService>(
  service: S,
  implementation: Partial<ServiceImpl<S>>,
  options: ServiceOptions = {},
): ServiceBinding {
  return { service, implementation, ...(options.readMaxBytes !== undefined ? { readMaxBytes: options.readMaxBytes } : {}) } as unknown as ServiceBinding;
}

/**
 * A module's own view of grpc.health.v1. Its readiness feeds the server's
 * `""` entry and `/readyz` (SERVING only while every module is ready); its
 * services follow its readiness unless it sets them itself.
 */
export interface ModuleHealth {
  /** Whether this module can take traffic (a hop whose target is pending cannot). */
  setReady(ready: boolean, reason?: string): void;
  readonly ready: boolean;
  /**
   * Sets one of this module's own entries: one of its services (which then
   * stops following readiness) or a sub-entry such as
   * `mmgate.images.v1.ImageService/openai`.
   */
  set(name: string, status: ServingStatus): void;
  get(name: string): ServingStatus | undefined;
}

/** Long-running work a module hands to the host (watch loops, retry loops, actors). */
export interface TaskSupervisor {
  /**
   * Runs `task` until it returns; when it throws, logs the error and runs it
   * again after a bounded, jittered backoff. Its signal fires when the
   * server drains (after the module's `drain` hook) or the module closes.
   */
  run(name: string, task: (signal: AbortSignal) => Promise<void>, options?: TaskOptions): void;
}

/** What the host hands a module when it builds it. */
export interface ModuleContext<C, D = Record<never, never>> {
  /** This module's section of the configuration, validated by its schema. */
  readonly config: C;
  /** What the modules this one `requires` export, keyed as in `requires`. */
  readonly deps: D;
  readonly logger: Logger;
  readonly metrics: Registry;
  readonly health: ModuleHealth;
  readonly tasks: TaskSupervisor;
  /**
   * Fires when the server begins to drain. Server-streaming handlers end
   * their streams cleanly (status OK) when it fires; unary calls ignore it.
   */
  readonly drainSignal: AbortSignal;
  /** The address clients use to reach this server, e.g. "127.0.0.1:50051". */
  readonly advertisedAddress: string;
  /**
   * The services this process serves, for calls in memory (no TCP) with the
   * listener's interceptors, limits and auth: hand it to `src/rpc`'s
   * `inProcessTransport`. Live once the module's `start` hook runs.
   */
  readonly localRoutes: LocalRoutes;
}

/** What an in-process transport needs to reach this process's own services. */
export interface LocalRoutes {
  /** Registers every served service on a router; throws UNAVAILABLE before the routes are live. */
  readonly routes: (router: ConnectRouter) => void;
  /** The listener's interceptors (status record, drain, error mapping, auth). */
  readonly interceptors: () => Interceptor[];
  readonly readMaxBytes: number;
  readonly writeMaxBytes: number;
}

/** A request an `HttpRoute` serves: HTTP/1.1 or HTTP/2, as Node hands it over. */
export type HttpRouteRequest = IncomingMessage | Http2ServerRequest;
export type HttpRouteResponse = ServerResponse | Http2ServerResponse;

/** What the host hands an `HttpRoute` with each request. */
export interface HttpRouteContext {
  /** Fires when the client goes away before the response ended, or when the server's grace is over. */
  readonly signal: AbortSignal;
  /** Largest request body the route may read (`limits.maxReceiveMessageBytes`). */
  readonly readMaxBytes: number;
  readonly logger: Logger;
  /** For a prefix route, what follows the prefix in the path, as sent (not percent-decoded); undefined for an exact route. */
  readonly pathRest?: string | undefined;
}

/**
 * A plain HTTP endpoint a module serves on the gRPC port, next to the RPCs
 * (an OpenAI-shaped API, say). The host matches method and path (an exact
 * path before any prefix route, the longest prefix first), logs each
 * request as `http request finished` with the route's name, counts it in
 * `mmgate_http_requests_total`, answers 405 for another method of a matched
 * path, 503 while draining and 500 when the handler throws before
 * answering; the handler does the rest.
 */
export interface HttpRoute {
  readonly method: "GET" | "POST";
  /**
   * Exact path, e.g. "/v1/images/generations"; or a prefix route ending in
   * "/*", e.g. "/v1/models/*", which serves every longer path under it
   * (not the prefix itself) and hands the remainder over as `ctx.pathRest`.
   * A `*` anywhere else is refused. The query string is ignored.
   */
  readonly path: string;
  /** Name in logs and metrics, e.g. "openai.images.generations". */
  readonly name: string;
  handle(req: HttpRouteRequest, res: HttpRouteResponse, ctx: HttpRouteContext): Promise<void>;
}

/** A built module: its services, what it exports to others, and its lifecycle hooks. */
export interface ModuleInstance<E = unknown> {
  readonly services: readonly ServiceBinding[];
  /** Plain HTTP endpoints served on the gRPC port (only when the module is served). */
  readonly httpRoutes?: readonly HttpRoute[];
  /** Handed to modules that `require` this one, as `ctx.deps.<key>`. */
  readonly exports?: E;
  /** After every module is built and the routes are live: register, open watches. */
  start?(): Promise<void> | void;
  /**
   * Once the server begins to drain, awaited (with the listener's own drain)
   * up to the grace: revoke leases, end subscribers with their proper status.
   * `signal` fires when the grace is over.
   */
  drain?(signal: AbortSignal): Promise<void> | void;
  /** Last, after the listener and every task stopped: release timers, sockets, files. */
  close?(): Promise<void> | void;
}

/**
 * Turns an error a handler of this module threw into the status a client
 * sees; `undefined` leaves it to the host, which logs it and answers
 * INTERNAL. Handlers throw their own typed errors and never build a
 * ConnectError themselves.
 */
export type ErrorMapper = (error: unknown) => ConnectError | undefined;

/**
 * Why the host built a status itself for a call to one of a module's
 * services: "unmapped", an error no mapper claimed (INTERNAL); "draining",
 * a call refused because the server drains (UNAVAILABLE).
 */
export type HostStatusOrigin = "unmapped" | "draining";

/**
 * Adds what a module's contract wants on a status the host builds itself for
 * one of its services (a reason trailer, say). It keeps the status's code;
 * the host still logs an unmapped error as it does for every module.
 */
export type HostStatusDecorator = (status: ConnectError, origin: HostStatusOrigin) => ConnectError;

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type AnyModule = ServiceModule<any, any, any>;
/** The modules a module needs, by the key it reads them under. */
export type ModuleRequirements = Readonly<Record<string, AnyModule>>;
/** `ctx.deps` for a set of requirements: each key holds that module's exports. */
export type DepsOf<R extends ModuleRequirements> = { readonly [K in keyof R]: R[K] extends ServiceModule<unknown, infer E> ? E : never };

/**
 * A capability as the host sees it: a name (its key in the config and in the
 * `modules` list), a config schema for its section, the modules it needs,
 * and a factory.
 */
export interface ServiceModule<C = unknown, E = unknown, R extends ModuleRequirements = ModuleRequirements> {
  readonly name: string;
  readonly description: string;
  readonly configSchema: z.ZodType<C>;
  /** Modules this one is built after and gets the exports of. */
  readonly requires?: R;
  /**
   * Environment variables read as config keys of this module, beyond the
   * `MMGATE_<SECTION>__<KEY>` rule: name → path inside the module's section
   * (`{ DYN_RELAY_LISTEN: "listen" }` sets `relay.listen`). Values parse as
   * every variable's do: JSON when they parse as JSON, else the string.
   */
  readonly env?: Readonly<Record<string, string>>;
  readonly mapError?: ErrorMapper;
  /** Decorates the statuses the host builds itself for this module's services (unmapped errors, drain refusals). */
  readonly decorateHostStatus?: HostStatusDecorator;
  create(ctx: ModuleContext<C, DepsOf<R>>): Promise<ModuleInstance<E>> | ModuleInstance<E>;
}

/** Declares a module with its config, exports and dependencies inferred. */
export function defineModule<S extends z.ZodType, E = undefined, R extends ModuleRequirements = Record<never, never>>(module: {
  readonly name: string;
  readonly description: string;
  readonly configSchema: S;
  readonly requires?: R;
  readonly env?: Readonly<Record<string, string>>;
  readonly mapError?: ErrorMapper;
  readonly decorateHostStatus?: HostStatusDecorator;
  create(ctx: ModuleContext<z.output<S>, DepsOf<R>>): Promise<ModuleInstance<E>> | ModuleInstance<E>;
}): ServiceModule<z.output<S>, E, R> {
  return module as ServiceModule<z.output<S>, E, R>;
}
