/**
 * The relay: its identity, its pools, the catalog and its revisions, the
 * readiness projection and the load windows. Transport-free: the gRPC
 * handlers (service.ts) and the ingest endpoint (ingest.ts) drive it.
 */
import { randomBytes } from "node:crypto";
import { samePoolId, type PoolId } from "../../kv/index.js";
import { WorkSlicer } from "../../util/index.js";
import type { PoolDescriptor, WorkerRoleName } from "../wire/index.js";
import { RelayError } from "../wire/index.js";
import { ChangeFeed } from "./change-feed.js";
import type { RelayConfig } from "./config.js";
import { RelayPool } from "./pool.js";

export interface RelayIdentityValue {
  readonly drtInstanceId: bigint;
  readonly relayIncarnation: bigint;
}

export type ReadinessState = "UNKNOWN" | "UNAVAILABLE" | "READY";

/** One (namespace, model) of the serving topology. */
export interface TopologyEntryValue {
  readonly namespace: string;
  readonly canonicalModelId: string;
  readonly state: ReadinessState;
  readonly presentRoles: readonly WorkerRoleName[];
  readonly missingRoles: readonly WorkerRoleName[];
  readonly members: readonly { readonly pool: RelayPool; readonly roles: readonly WorkerRoleName[] }[];
}

export interface LoadEntryValue {
  readonly descriptor: PoolDescriptor;
  readonly kvUsedBlocks: bigint;
  readonly totalKvBlocks: bigint;
  readonly kvObservedRanks: number;
  readonly kvExpectedRanks: number;
}

export interface LoadWindow {
  readonly windowSequence: bigint;
  readonly observedMs: bigint;
  readonly windowMs: bigint;
  readonly pools: readonly LoadEntryValue[];
}

export interface RelayHooks {
  onTerminalFailure?(pool: RelayPool, error: unknown): void;
  onDelta?(pool: RelayPool): void;
}

const U64_MAX = (1n << 64n) - 1n;
/** How long one wait for a load window lasts before it looks again (the timer makes one every loadWindowMs). */
const MAX_WAIT_MS = 60_000;

export class Relay {
  readonly identity: RelayIdentityValue;
  readonly config: RelayConfig;
  readonly catalog = new ChangeFeed();
  /**
   * Applies events in slices, one message at a time across every pool and
   * source (ingest streams, NATS): see ingest.ts. Its slices never overlap,
   * so one turn of the event loop holds at most one slice of event work.
   */
  readonly slicer: WorkSlicer;
  /** Readiness changes (pools gaining or losing live workers, generations). */
  readonly readiness = new ChangeFeed();
  private readonly pools = new Map<string, RelayPool>();
  /** Pools a subscriber has asked a hub of. */
  private readonly requested = new Set<string>();
  private revisionValue = 1n;
  private sweepTimer: ReturnType<typeof setInterval> | undefined;
  private lastReadiness = "";
  private loadSequence = 0n;
  private lastWindow: LoadWindow | undefined;
  private readonly recentWindows: LoadWindow[] = [];
  private readonly loadWindows = new ChangeFeed();
  private loadTimer: ReturnType<typeof setInterval> | undefined;

  constructor(config: RelayConfig, hooks: RelayHooks = {}) {
    this.config = config;
    this.identity = Object.freeze({
      drtInstanceId: config.drtInstanceId ?? randomBytes(8).readBigUInt64LE(0),
      relayIncarnation: randomBytes(8).readBigUInt64LE(0),
    });
    this.slicer = new WorkSlicer({ sliceMs: config.ingestSliceMs, sliceSteps: config.ingestSliceBlocks });
    for (const poolConfig of config.pools) {
      const pool = new RelayPool(poolConfig, {
        dcId: config.dcId,
        maxBlocksPerEvent: config.maxBlocksPerEvent,
        publicationThreshold: config.publicationThreshold,
        publicationDelayMs: config.publicationDelayMs,
        hubLimits: {
          maxSubscribers: config.maxSubscribersPerPool,
          maxQueuedFrames: config.publicationQueueCapacity,
          maxQueuedBytes: config.publicationQueueBytes,
          // A subscriber that has not read for the progress timeout is as stuck as a bootstrap that cannot hand over a frame.
          subscriberIdleMs: config.snapshotProgressTimeoutMs,
        },
        now: () => performance.now(),
        onChange: (_pool, what) => {
          if (what === "generation") {
            this.revisionValue += 1n;
            this.catalog.bump();
            this.readiness.bump();
          }
        },
        onTerminalFailure: (p, error) => hooks.onTerminalFailure?.(p, error),
        onDelta: (p) => hooks.onDelta?.(p),
      });
      this.pools.set(pool.name, pool);
    }
  }

  /** Starts the hub idle sweep and the readiness watch. */
  start(): void {
    const every = Math.min(1_000, this.config.hubIdleEvictMs);
    this.sweepTimer ??= setInterval(() => this.sweep(), every);
    this.sweepTimer.unref();
    this.loadTimer ??= setInterval(() => this.nextLoadWindow(), this.config.loadWindowMs);
    this.loadTimer.unref();
  }

  close(): void {
    if (this.sweepTimer !== undefined) clearInterval(this.sweepTimer);
    this.sweepTimer = undefined;
    if (this.loadTimer !== undefined) clearInterval(this.loadTimer);
    this.loadTimer = undefined;
    for (const pool of this.pools.values()) pool.close();
  }

  /** The catalog revision; it moves on every change and may skip values. */
  get revision(): bigint {
    return this.revisionValue;
  }

  pool(name: string): RelayPool | undefined {
    return this.pools.get(name);
  }

  allPools(): readonly RelayPool[] {
    return [...this.pools.values()];
  }

  /** The pool publishing for `id`, whatever its generation. */
  poolById(id: PoolId): RelayPool | undefined {
    for (const pool of this.pools.values()) if (samePoolId(pool.producer.poolId, id)) return pool;
    return undefined;
  }

  /** Records that a subscriber asked for this pool's hub. */
  markRequested(pool: RelayPool): void {
    this.requested.add(pool.name);
  }

  initializedHubs(): number {
    let n = 0;
    for (const pool of this.pools.values()) if (pool.hub !== undefined) n += 1;
    return n;
  }

  hubCounts(): { requested: number; initialized: number; ready: number; idle: number } {
    let initialized = 0;
    let ready = 0;
    let idle = 0;
    for (const pool of this.pools.values()) {
      const hub = pool.hub;
      if (hub === undefined) continue;
      initialized += 1;
      if (hub.state === "ready") ready += 1;
      if (hub.evictable) idle += 1;
    }
    return { requested: this.requested.size, initialized, ready, idle };
  }

  /**
   * The serving topology as this relay knows it: one entry per (namespace,
   * canonical model) over its pools. A pool counts as serving while some
   * worker sent it an event within workerLivenessMs. UNKNOWN while no pool of
   * the entry has received any event since start (nothing authoritative yet);
   * READY when a serving pool covers every role the entry's pools declare;
   * UNAVAILABLE otherwise.
   */
  topology(): readonly TopologyEntryValue[] {
    const groups = new Map<string, { namespace: string; model: string; pools: RelayPool[] }>();
    for (const pool of this.pools.values()) {
      const namespace = pool.descriptor.servingEndpoint.namespace;
      for (const registration of pool.descriptor.registrations) {
        const key = `${namespace}\0${registration.model}`;
        let group = groups.get(key);
        if (group === undefined) groups.set(key, (group = { namespace, model: registration.model, pools: [] }));
        group.pools.push(pool);
      }
    }
    const entries: TopologyEntryValue[] = [];
    for (const group of [...groups.values()].sort((a, b) => (a.namespace === b.namespace ? cmp(a.model, b.model) : cmp(a.namespace, b.namespace)))) {
      const declared = new Set<WorkerRoleName>();
      const present = new Set<WorkerRoleName>();
      let known = false;
      for (const pool of group.pools) {
        for (const role of pool.descriptor.poolRoles) declared.add(role);
        if (pool.hasEventSource) known = true;
        if (pool.liveWorkers(this.config.workerLivenessMs) > 0) for (const role of pool.descriptor.poolRoles) present.add(role);
      }
      const missing = [...declared].filter((role) => !present.has(role));
      const state: ReadinessState = !known ? "UNKNOWN" : present.size > 0 && missing.length === 0 ? "READY" : "UNAVAILABLE";
      entries.push(
        Object.freeze({
          namespace: group.namespace,
          canonicalModelId: group.model,
          state,
          presentRoles: Object.freeze([...present]),
          missingRoles: Object.freeze(missing),
          members: Object.freeze(group.pools.map((pool) => Object.freeze({ pool, roles: pool.descriptor.poolRoles }))),
        }),
      );
    }
    return entries;
  }

  topologyCounts(): { ready: number; unavailable: number; unknown: number } {
    const counts = { ready: 0, unavailable: 0, unknown: 0 };
    for (const entry of this.topology()) {
      if (entry.state === "READY") counts.ready += 1;
      else if (entry.state === "UNAVAILABLE") counts.unavailable += 1;
      else counts.unknown += 1;
    }
    return counts;
  }

  /**
   * The next load window: every pool's occupancy (distinct blocks held,
   * the configured KV capacity or 0 when unknown) and rank coverage (ranks
   * seen; expected is the configured count, or what was seen when unset).
   */
  nextLoadWindow(): LoadWindow {
    this.loadSequence = this.loadSequence === U64_MAX ? U64_MAX : this.loadSequence + 1n;
    const pools = [...this.pools.values()].map((pool): LoadEntryValue => {
      const occupancy = pool.occupancy();
      const observed = Math.min(occupancy.ranks, 0xffff_ffff);
      return Object.freeze({
        descriptor: pool.descriptor,
        kvUsedBlocks: BigInt(occupancy.uniqueBlocks),
        totalKvBlocks: pool.config.totalKvBlocks,
        kvObservedRanks: observed,
        kvExpectedRanks: pool.config.expectedRanks === 0 ? observed : pool.config.expectedRanks,
      });
    });
    const window: LoadWindow = Object.freeze({ windowSequence: this.loadSequence, observedMs: BigInt(Date.now()), windowMs: BigInt(this.config.loadWindowMs), pools: Object.freeze(pools) });
    this.lastWindow = window;
    this.recentWindows.push(window);
    if (this.recentWindows.length > this.config.loadFanoutCapacity) this.recentWindows.shift();
    this.loadWindows.bump();
    return window;
  }

  /** The latest load window, made now when there is none yet. */
  currentLoadWindow(): LoadWindow {
    return this.lastWindow ?? this.nextLoadWindow();
  }

  /**
   * The window after `sent`, waiting for it. The relay keeps the last
   * loadFanoutCapacity windows; a subscriber whose next window has already
   * left them has lagged (SUBSCRIBER_LAGGED). Resolves undefined when `signal` fires.
   */
  async loadWindowAfter(sent: bigint, signal: AbortSignal): Promise<LoadWindow | undefined> {
    for (;;) {
      const oldest = this.recentWindows[0];
      if (oldest !== undefined && oldest.windowSequence > sent + 1n) {
        throw new RelayError("SUBSCRIBER_LAGGED", `the load subscriber missed windows ${sent + 1n}..${oldest.windowSequence - 1n}; reopen the stream`);
      }
      const next = this.recentWindows.find((w) => w.windowSequence > sent);
      if (next !== undefined) return next;
      const seen = this.loadWindows.version;
      await this.loadWindows.waitPast(seen, MAX_WAIT_MS, signal);
      if (signal.aborted) return undefined;
    }
  }

  degradedLoadPools(): number {
    return this.lastWindow?.pools.filter((p) => p.kvObservedRanks < p.kvExpectedRanks).length ?? 0;
  }

  /** Idle hubs are retired; a readiness change (a worker went quiet) wakes readiness streams. */
  sweep(): void {
    for (const pool of this.pools.values()) pool.evictIdleHub(this.config.hubIdleEvictMs);
    this.noteReadiness();
  }

  /** Wakes readiness streams when the projection changed. */
  noteReadiness(): void {
    const digest = this.topology()
      .map((e) => `${e.namespace}\0${e.canonicalModelId}\0${e.state}\0${e.presentRoles.join(",")}`)
      .join("\n");
    if (digest !== this.lastReadiness) {
      this.lastReadiness = digest;
      this.readiness.bump();
    }
  }
}

function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
