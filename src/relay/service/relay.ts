/**
 * The relay: its identity, its pools, the catalog and its revisions, the
 * readiness projection and the load windows. Transport-free: the gRPC
 * handlers (service.ts) and the ingest endpoint (ingest.ts) drive it.
 */
import { randomBytes } from "node:crypto";
import { samePoolId, type PoolId } from "../../kv/index.js";
import { WorkSlicer } from "../../util/index.js";
import type { PoolDescriptor } from "../wire/index.js";
import { RelayError } from "../wire/index.js";
import { ChangeFeed } from "./change-feed.js";
import { poolDiscovery, type RelayConfig } from "./config.js";
import { DiscoveryLiveness, type PoolLivenessView } from "./liveness.js";
import { RelayPool } from "./pool.js";
import { buildTopology, emittableTopology, type TopologyEntryValue } from "./topology.js";
import type { TopologyEntry as WireTopologyEntry } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";

export type { ReadinessState, TopologyEntryValue } from "./topology.js";

export interface RelayIdentityValue {
  readonly drtInstanceId: bigint;
  readonly relayIncarnation: bigint;
}

/**
 * One revision of the catalog: the descriptors published then. A pool
 * whose generation failed terminally is left out of one revision (withdrawn)
 * before the next one lists its new generation.
 */
export interface CatalogRevision {
  readonly revision: bigint;
  readonly pools: readonly PoolDescriptor[];
}

/** Catalog revisions kept for streams that have not sent them yet; one further behind skips to the oldest kept (revisions may skip). */
const CATALOG_HISTORY = 64;

export interface LoadEntryValue {
  readonly descriptor: PoolDescriptor;
  readonly kvUsedBlocks: bigint;
  readonly totalKvBlocks: bigint;
  readonly kvObservedRanks: number;
  /** The configured rank count; 0 when unknown (never the observed count). */
  readonly kvExpectedRanks: number;
  /** Live workers as readiness counts them (registered, or with an event within workerLivenessMs); undefined while unknown. */
  readonly liveWorkers: number | undefined;
}

/** One (namespace, canonical model) of the catalog in a load window. */
export interface ModelLoadValue {
  readonly namespace: string;
  readonly canonicalModelId: string;
  /** The window's pools that register the model. */
  readonly servingPools: number;
}

export interface LoadWindow {
  readonly windowSequence: bigint;
  readonly observedMs: bigint;
  readonly windowMs: bigint;
  readonly pools: readonly LoadEntryValue[];
  readonly models: readonly ModelLoadValue[];
}

export interface RelayHooks {
  onTerminalFailure?(pool: RelayPool, error: unknown): void;
  onDelta?(pool: RelayPool): void;
  /** A topology entry failed the contract's topology rules and was left out of a readiness update. */
  onInvalidTopology?(entry: TopologyEntryValue, error: unknown): void;
  /** A load window could not be made: the load streams open then end PUBLICATION_UNAVAILABLE. */
  onLoadFailure?(error: unknown): void;
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
  private readonly catalogRevisions: CatalogRevision[] = [];
  /** Pools taken out of the catalog after a terminal failure, until their next generation is published. */
  private readonly withdrawn = new Set<string>();
  /** Pools whose liveness comes from their workers' registrations. */
  private readonly discovery = new Map<string, DiscoveryLiveness>();
  private sweepTimer: ReturnType<typeof setInterval> | undefined;
  private lastReadiness = "";
  private loadSequence = 0n;
  private lastWindow: LoadWindow | undefined;
  private readonly recentWindows: LoadWindow[] = [];
  private readonly loadWindows = new ChangeFeed();
  private loadTimer: ReturnType<typeof setInterval> | undefined;
  /** Set by close(): every load stream ends PUBLICATION_UNAVAILABLE. */
  private loadClosed = false;
  /** The last window sequence before a window failed: streams that had not gone past it end PUBLICATION_UNAVAILABLE. */
  private loadFailedThrough: bigint | undefined;
  private readonly hooks: RelayHooks;

  constructor(config: RelayConfig, hooks: RelayHooks = {}) {
    this.config = config;
    this.hooks = hooks;
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
        onChange: (changed, what) => {
          if (what === "generation") {
            this.withdrawn.delete(changed.name);
            this.recordCatalog();
            this.readiness.bump();
          }
        },
        onTerminalFailure: (p, error) => {
          // The fenced generation leaves the catalog before the pool rotates to the next one (the pool's next step).
          this.withdrawn.add(p.name);
          this.recordCatalog();
          this.readiness.bump();
          hooks.onTerminalFailure?.(p, error);
        },
        onDelta: (p) => hooks.onDelta?.(p),
      });
      this.pools.set(pool.name, pool);
      const discovery = poolDiscovery(config, poolConfig);
      if (discovery !== undefined) {
        this.discovery.set(pool.name, new DiscoveryLiveness({ pool: pool.name, roles: poolConfig.roles, discovery, onChange: () => this.noteReadiness() }));
      }
    }
    this.catalogRevisions.push(this.catalogNow());
  }

  /** Starts the hub idle sweep and the readiness watch. */
  start(): void {
    const every = Math.min(1_000, this.config.hubIdleEvictMs);
    this.sweepTimer ??= setInterval(() => this.sweep(), every);
    this.sweepTimer.unref();
    this.loadTimer ??= setInterval(() => this.loadTick(), this.config.loadWindowMs);
    this.loadTimer.unref();
  }

  close(): void {
    if (this.sweepTimer !== undefined) clearInterval(this.sweepTimer);
    this.sweepTimer = undefined;
    if (this.loadTimer !== undefined) clearInterval(this.loadTimer);
    this.loadTimer = undefined;
    this.loadClosed = true;
    this.loadWindows.bump();
    for (const pool of this.pools.values()) pool.close();
  }

  /** The catalog revision; it moves on every change and may skip values. */
  get revision(): bigint {
    return this.revisionValue;
  }

  /** The catalog now: every pool but those withdrawn after a terminal failure. */
  private catalogNow(): CatalogRevision {
    const pools = [...this.pools.values()].filter((pool) => !this.withdrawn.has(pool.name)).map((pool) => pool.descriptor);
    return Object.freeze({ revision: this.revisionValue, pools: Object.freeze(pools) });
  }

  /** A catalog change: the next revision, kept for the streams, and the streams woken. */
  private recordCatalog(): void {
    this.revisionValue += 1n;
    this.catalogRevisions.push(this.catalogNow());
    if (this.catalogRevisions.length > CATALOG_HISTORY) this.catalogRevisions.shift();
    this.catalog.bump();
  }

  /** The latest catalog revision. */
  currentCatalog(): CatalogRevision {
    return this.catalogRevisions.at(-1)!;
  }

  /**
   * The revision a stream that sent `sent` sends next: the first kept one
   * after it, so that a withdrawal followed at once by the next generation
   * reaches every stream as two updates; undefined when there is none yet.
   */
  catalogAfter(sent: bigint): CatalogRevision | undefined {
    return this.catalogRevisions.find((revision) => revision.revision > sent);
  }

  /** Pools the catalog lists now. */
  catalogPoolCount(): number {
    return this.pools.size - this.withdrawn.size;
  }

  /** Where readiness takes `pool`'s liveness from, and what it says now. */
  liveness(pool: RelayPool): PoolLivenessView {
    const discovery = this.discovery.get(pool.name);
    if (discovery !== undefined) return discovery.view();
    const live = pool.liveWorkers(this.config.workerLivenessMs);
    return { source: "events", authoritative: pool.hasEventSource, liveWorkers: live, liveRoles: live > 0 ? pool.descriptor.poolRoles : [] };
  }

  /** The registration watches of the pools with discovery (the module runs each as a task). */
  discoveryWatches(): readonly DiscoveryLiveness[] {
    return [...this.discovery.values()];
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
   * The serving topology as this relay knows it (topology.ts): one entry
   * per (namespace, canonical base model) over the pools the catalog lists,
   * adapters nested; liveness from each pool's workers' registrations when
   * discovery is configured, else from event recency.
   */
  topology(): readonly TopologyEntryValue[] {
    const pools = [...this.pools.values()].filter((pool) => !this.withdrawn.has(pool.name));
    return buildTopology(pools.map((pool) => ({ pool, liveness: this.liveness(pool) })));
  }

  /** The topology as the readiness stream sends it: every entry that passes the contract's topology rules (the others go to onInvalidTopology). */
  readinessEntries(): WireTopologyEntry[] {
    return emittableTopology(this.topology(), (entry, error) => this.hooks.onInvalidTopology?.(entry, error));
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
   * the configured KV capacity or 0 when unknown), rank coverage (ranks
   * seen; expected is the configured count, 0 when unknown: C.4 encodes
   * unknown as 0, and the observed count would hide a missing rank) and live
   * workers (readiness's liveness, when it is a fact); every (namespace,
   * model) of the catalog with its pools. Over the pools the catalog lists.
   */
  nextLoadWindow(): LoadWindow {
    this.loadSequence = this.loadSequence === U64_MAX ? U64_MAX : this.loadSequence + 1n;
    const models = new Map<string, { namespace: string; canonicalModelId: string; servingPools: number }>();
    const listed = [...this.pools.values()].filter((pool) => !this.withdrawn.has(pool.name));
    const pools = listed.map((pool): LoadEntryValue => {
      const occupancy = pool.occupancy();
      const namespace = pool.descriptor.servingEndpoint.namespace;
      for (const registration of pool.descriptor.registrations) {
        const key = `${namespace}\0${registration.model}`;
        const model = models.get(key);
        if (model === undefined) models.set(key, { namespace, canonicalModelId: registration.model, servingPools: 1 });
        else model.servingPools += 1;
      }
      const liveness = this.liveness(pool);
      return Object.freeze({
        descriptor: pool.descriptor,
        kvUsedBlocks: BigInt(occupancy.uniqueBlocks),
        totalKvBlocks: pool.config.totalKvBlocks,
        kvObservedRanks: Math.min(occupancy.ranks, 0xffff_ffff),
        kvExpectedRanks: pool.config.expectedRanks,
        liveWorkers: liveness.authoritative ? Math.min(liveness.liveWorkers, 0xffff_ffff) : undefined,
      });
    });
    const modelList = [...models.values()]
      .sort((a, b) => (a.namespace === b.namespace ? cmp(a.canonicalModelId, b.canonicalModelId) : cmp(a.namespace, b.namespace)))
      .map((model) => Object.freeze(model));
    const window: LoadWindow = Object.freeze({
      windowSequence: this.loadSequence,
      observedMs: BigInt(Date.now()),
      windowMs: BigInt(this.config.loadWindowMs),
      pools: Object.freeze(pools),
      models: Object.freeze(modelList),
    });
    this.lastWindow = window;
    this.recentWindows.push(window);
    if (this.recentWindows.length > this.config.loadFanoutCapacity) this.recentWindows.shift();
    this.loadWindows.bump();
    return window;
  }

  /** The latest load window, made now when there is none yet; PUBLICATION_UNAVAILABLE once closed or when it cannot be made. */
  currentLoadWindow(): LoadWindow {
    if (this.loadClosed) throw loadClosedError();
    if (this.lastWindow !== undefined) return this.lastWindow;
    try {
      return this.nextLoadWindow();
    } catch (error) {
      this.failLoad(error);
      throw new RelayError("PUBLICATION_UNAVAILABLE", "the relay could not make a load window; reopen the stream", { cause: error });
    }
  }

  /** The timer's window (every loadWindowMs); a failure ends the open load streams instead of escaping the timer. */
  loadTick(): void {
    try {
      this.nextLoadWindow();
    } catch (error) {
      this.failLoad(error);
    }
  }

  /**
   * A window could not be made: the load publication so far is closed (its
   * streams end PUBLICATION_UNAVAILABLE and reopen) and the next tick starts
   * anew, at a later sequence.
   */
  private failLoad(error: unknown): void {
    this.loadFailedThrough = this.loadSequence;
    this.lastWindow = undefined;
    this.recentWindows.length = 0;
    this.hooks.onLoadFailure?.(error);
    this.loadWindows.bump();
  }

  /**
   * The window after `sent`, waiting for it. The relay keeps the last
   * loadFanoutCapacity windows; a subscriber whose next window has already
   * left them has lagged (SUBSCRIBER_LAGGED). Resolves undefined when `signal` fires;
   * PUBLICATION_UNAVAILABLE once the relay closed, or when a window failed after `sent`.
   */
  async loadWindowAfter(sent: bigint, signal: AbortSignal): Promise<LoadWindow | undefined> {
    for (;;) {
      if (this.loadClosed) throw loadClosedError();
      if (this.loadFailedThrough !== undefined && sent <= this.loadFailedThrough) {
        throw new RelayError("PUBLICATION_UNAVAILABLE", "the relay's load publication failed; reopen the stream");
      }
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
    // What the wire carries of each entry, so that any change of it wakes the streams.
    const digest = JSON.stringify(
      this.topology().map((e) => [
        e.namespace,
        e.canonicalModelId,
        e.state,
        e.presentRoles,
        e.missingRoles,
        e.members.map((m) => m.pool.name),
        e.duplicateRoleEndpoints,
        e.legacyFallbackActive,
        e.adapters,
      ]),
    );
    if (digest !== this.lastReadiness) {
      this.lastReadiness = digest;
      this.readiness.bump();
    }
  }
}

/** C.4: a load stream the relay closed ends PUBLICATION_UNAVAILABLE (reconnect, to another relay). */
function loadClosedError(): RelayError {
  return new RelayError("PUBLICATION_UNAVAILABLE", "the relay closed its load publication; reconnect");
}

function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
