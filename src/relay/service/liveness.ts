/**
 * Where readiness takes a pool's liveness from.
 *
 * - discovery: the pool's workers register in etcd as Encode workers do
 *   (src/discovery: a key under `/mmgate/<namespace>/<component>/<endpoint>/`
 *   held by a lease the worker keeps alive, a `{id, address, metadata}`
 *   value whose metadata is the worker's card). A registered worker whose
 *   card fits the pool is live, whether or not it sends events: an idle,
 *   healthy pool is live. Until the resolver has read the prefix once, the
 *   pool has no authoritative view (its entries are UNKNOWN). When etcd is
 *   lost the last membership stays (as the resolver keeps it).
 * - events: no discovery configured; a worker that sent an event within
 *   `workerLivenessMs` is live, and the view is authoritative once any event
 *   reached the pool since start (the topology takes an entry's event-fed
 *   pools as known once any of them is).
 */
import type { Logger } from "pino";
import type { Registry } from "prom-client";
import { EtcdResolver, type Member } from "../../discovery/index.js";
import type { WorkerRoleName } from "../wire/index.js";
import type { PoolDiscovery } from "./config.js";

export type LivenessSource = "discovery" | "events";

/** A pool's liveness as readiness reads it. */
export interface PoolLivenessView {
  readonly source: LivenessSource;
  /** Whether the view is a fact (discovery: the prefix was read; events: an event arrived) rather than not knowing yet. */
  readonly authoritative: boolean;
  /** Live workers: registered (discovery) or with a recent event (events). */
  readonly liveWorkers: number;
  /**
   * The pool's roles its live workers provide: from each registration's
   * worker_type (a card without one provides every role of the pool); with
   * events, every role of the pool while a worker is live.
   */
  readonly liveRoles: readonly WorkerRoleName[];
}

/** The card key a worker's registration names its role by, as an Encode worker's card does (`worker_type`). */
export const WORKER_TYPE_KEY = "worker_type";

/**
 * Why a registered member is not a live worker of a pool with `roles`;
 * undefined when it is. A card without a worker_type is a legacy card and
 * counts for any pool; one with a worker_type counts when it names one of
 * the pool's roles (prefill, decode, encode, aggregated, legacy; any case).
 */
export function notAPoolWorker(member: Member, roles: readonly WorkerRoleName[]): string | undefined {
  const type = member.metadata[WORKER_TYPE_KEY];
  if (type === undefined || type === "") return undefined;
  return roles.some((role) => role === type.toUpperCase()) ? undefined : `worker_type ${type} is none of the pool's roles (${roles.join(", ")})`;
}

export interface DiscoveryLivenessOptions {
  readonly pool: string;
  readonly roles: readonly WorkerRoleName[];
  readonly discovery: PoolDiscovery;
  /** The live set or its authority changed. */
  readonly onChange: () => void;
}

/** A pool's liveness from its workers' etcd registrations. */
export class DiscoveryLiveness {
  readonly pool: string;
  readonly discovery: PoolDiscovery;
  private readonly roles: readonly WorkerRoleName[];
  private readonly onChange: () => void;
  /** The accepted members of the last membership; undefined until the prefix was read. */
  private live: readonly Member[] | undefined;
  private ignoredCount = 0;

  constructor(options: DiscoveryLivenessOptions) {
    this.pool = options.pool;
    this.discovery = options.discovery;
    this.roles = options.roles;
    this.onChange = options.onChange;
  }

  view(): PoolLivenessView {
    const live = this.live ?? [];
    const roles = new Set<WorkerRoleName>();
    for (const member of live) {
      const type = member.metadata[WORKER_TYPE_KEY];
      if (type === undefined || type === "") for (const role of this.roles) roles.add(role);
      else roles.add(type.toUpperCase() as WorkerRoleName);
    }
    return { source: "discovery", authoritative: this.live !== undefined, liveWorkers: live.length, liveRoles: this.roles.filter((r) => roles.has(r)) };
  }

  /** Registrations under the prefix whose card does not fit the pool (last membership). */
  get ignored(): number {
    return this.ignoredCount;
  }

  /** `/mmgate/<namespace>/<component>/<endpoint>/`. */
  get prefix(): string {
    const { namespace, component, endpoint } = this.discovery;
    return `/mmgate/${namespace}/${component}/${endpoint}/`;
  }

  /**
   * Watches the registrations until `signal` fires. Rejects when etcd
   * cannot be read at the start (the host's supervisor runs it again with
   * backoff); the view is not authoritative until a run has read the prefix,
   * nor after a run ended.
   */
  async run(signal: AbortSignal, deps: { readonly logger?: Logger; readonly registry?: Registry } = {}): Promise<void> {
    if (signal.aborted) return;
    const { endpoints, namespace, component, endpoint, dialTimeoutMs } = this.discovery;
    const resolver = await EtcdResolver.create({
      endpoints,
      namespace,
      component,
      endpoint,
      dialTimeoutMs,
      ...(deps.logger === undefined ? {} : { logger: deps.logger }),
      ...(deps.registry === undefined ? {} : { registry: deps.registry }),
    });
    try {
      for await (const membership of resolver.watch(signal)) this.apply(membership.members, deps.logger);
    } finally {
      await resolver.close();
      this.live = undefined;
      this.onChange();
    }
  }

  private apply(members: readonly Member[], logger: Logger | undefined): void {
    const live: Member[] = [];
    let ignored = 0;
    for (const member of members) {
      const why = notAPoolWorker(member, this.roles);
      if (why === undefined) live.push(member);
      else {
        ignored += 1;
        logger?.debug({ pool: this.pool, member: member.id, why }, "registration under the pool's prefix ignored");
      }
    }
    const before = this.live === undefined ? undefined : signature(this.live);
    this.live = Object.freeze(live);
    this.ignoredCount = ignored;
    if (before !== signature(live)) this.onChange();
  }
}

/** What readiness reads of a live set: ids and worker types. */
function signature(members: readonly Member[]): string {
  return members.map((m) => `${m.id}\0${m.metadata[WORKER_TYPE_KEY] ?? ""}`).join("\n");
}
