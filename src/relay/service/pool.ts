/**
 * One pool of the relay: the DC filter state its workers' events build, the
 * producer generation that publishes it, and (while anyone subscribes) the
 * publication hub that mirrors it to subscribers.
 *
 * Events are applied as they arrive; a batch is published when the
 * publication threshold is reached, or when the coalescing delay passes with
 * events pending. A threshold reached publishes at the end of the current
 * event-loop turn, not at once: events that arrive together (a message of
 * thousands, a burst of NATS messages) become one delta instead of hundreds
 * in a row that no subscriber's queue could take before its stream gets a
 * turn to send them. The hub starts lazily, with a barrier snapshot, on the
 * first subscriber, and is retired after a while without subscribers; while
 * there is no hub the state does not materialize batches at all.
 *
 * A delta the hub cannot fan out (too large for one frame) turns into a
 * fresh barrier snapshot for the same generation. A terminal failure (the
 * hub's mirror rejected a delta, delivery became uncertain, the sequence ran
 * out) fences the generation: the pool moves to layout generation + 1 with a
 * new hub, and every subscriber of the old one ends with PRODUCER_CHANGED.
 */
import { createHash, randomBytes } from "node:crypto";
import {
  type BarrierCopy,
  canonicalModelId,
  CkfError,
  createKvQuerySemantics,
  createRegistrationWithTarget,
  DcCkfPublisher,
  DcCkfState,
  digestIdentity,
  modelAlias,
  poolId,
  producerIdentity,
  type CanonicalModelRegistration,
  type ApplyOutcome,
  type DcCkfDelta,
  type DcCkfPublicationBatch,
  type PauseCheck,
  type ProducerIdentity,
  type RouterEvent,
} from "../../kv/index.js";
import { publishDelta } from "../frames.js";
import { HubError, PublicationHub, type HubLimits } from "../hub/index.js";
import type { PoolDescriptor } from "../wire/index.js";
import type { ModelRegistrationConfig, RelayPoolConfig } from "./config.js";

/** What the relay hands each pool. */
export interface RelayPoolContext {
  readonly dcId: bigint;
  readonly publicationThreshold: number;
  readonly publicationDelayMs: number;
  /** Blocks (block hashes) an event may carry; a longer one is EventTooLarge. Default: no limit. */
  readonly maxBlocksPerEvent?: number;
  readonly hubLimits: Partial<HubLimits>;
  /** Monotonic ms. */
  readonly now: () => number;
  /** The pool's generation changed (catalog) or its hub opened or closed. */
  readonly onChange: (pool: RelayPool, what: "generation" | "hub") => void;
  /** A delta was published to the current generation. */
  readonly onDelta?: (pool: RelayPool) => void;
  /** A generation was fenced after a terminal publication failure. */
  readonly onTerminalFailure: (pool: RelayPool, error: unknown) => void;
}

export interface RelayPoolStats {
  readonly name: string;
  readonly sequence: bigint;
  readonly layoutGeneration: bigint;
  readonly eventsApplied: number;
  readonly eventsRejected: number;
  readonly deltasPublished: number;
  readonly snapshotRecoveries: number;
  readonly generationChanges: number;
  readonly hub: "none" | "ready" | "recovering";
  readonly subscribers: number;
  /** Distinct canonical blocks owned by some worker rank. */
  readonly uniqueBlocks: number;
  /** (worker, rank) members holding blocks. */
  readonly ranks: number;
  readonly occupiedSlots: number;
  readonly buckets: number;
}

function digestOf(text: string): Uint8Array {
  return createHash("sha256").update(text, "utf8").digest().subarray(0, 16);
}

function registrationOf(model: ModelRegistrationConfig): CanonicalModelRegistration {
  const id = canonicalModelId(model.model);
  const target = model.loraBase === undefined ? { kind: "base" as const, baseModel: id } : { kind: "lora" as const, baseModel: canonicalModelId(model.loraBase), adapter: id };
  return createRegistrationWithTarget(id, target, model.aliases.map(modelAlias));
}

/** Never pauses: `apply` runs the stepped application in one go. */
const NEVER: PauseCheck = () => false;

/** What `applyUntil` and `continueApply` answer while the event is paused. */
export const APPLY_PAUSED: unique symbol = Symbol("RelayPool: the event is paused");

/**
 * Lanes up to this many buckets (8 MiB, a few milliseconds) are copied for a
 * barrier in one go; larger ones in steps across turns (installBarrier).
 */
const SYNC_BARRIER_BUCKETS = 1 << 20;
/** Buckets a barrier copy step takes (2 MiB), and how long one turn keeps taking steps. */
const BARRIER_STEP_BUCKETS = 1 << 18;
const BARRIER_TURN_MS = 5;

/** A barrier snapshot being copied in steps, and the deltas published since its sequence. */
interface PendingBarrier {
  readonly hub: PublicationHub;
  readonly sequence: bigint;
  readonly copy: BarrierCopy;
  readonly deltas: DcCkfDelta[];
  readonly waiters: { resolve: () => void; reject: (error: unknown) => void }[];
  timer: ReturnType<typeof setImmediate> | undefined;
}

/** A fresh producer incarnation: a random u64. */
function randomIncarnation(): bigint {
  return randomBytes(8).readBigUInt64LE(0);
}

export class RelayPool {
  readonly name: string;
  readonly config: RelayPoolConfig;
  private readonly ctx: RelayPoolContext;
  private readonly state: DcCkfState;
  private descriptorValue: PoolDescriptor;
  private publisher: DcCkfPublisher;
  private hubValue: PublicationHub | undefined;
  private hubIdleSince: number | undefined;
  private flushTimer: ReturnType<typeof setTimeout> | undefined;
  private flushSoon: ReturnType<typeof setImmediate> | undefined;
  private readonly delayMs: number;
  private readonly threshold: number;
  /** Events applied since the last publication. */
  private pending = 0;
  /** Last event time per worker, for readiness. */
  private readonly workerSeen = new Map<bigint, number>();
  /** The event applyUntil paused, until continueApply finishes it. */
  private paused: RouterEvent | undefined;
  private applied = 0;
  private rejected = 0;
  private deltas = 0;
  private recoveries = 0;
  private generations = 0;
  private closed = false;
  /** Set by the delivery sink when the hub asks for a fresh snapshot. */
  private recoveryDue = false;
  /** The barrier snapshot under way for the hub, if any (installBarrier). */
  private barrier: PendingBarrier | undefined;
  /** Holds on timer-driven publications (see hold()). */
  private holds = 0;
  /**
   * A publication came due while it could not go out (an event mid-way in
   * steps, or a hold); it goes out when the event is done or the last hold
   * is released.
   */
  private publicationDue = false;

  constructor(config: RelayPoolConfig, ctx: RelayPoolContext) {
    this.name = config.name;
    this.config = config;
    this.ctx = ctx;
    this.threshold = config.publicationThreshold ?? ctx.publicationThreshold;
    this.delayMs = config.publicationDelayMs ?? ctx.publicationDelayMs;
    // The pool decides when to publish (threshold, delay, turn), so the state never drains on its own.
    this.state = new DcCkfState(
      { expectedBlocksPerDc: config.expectedBlocks, seed: config.seed, publishEveryNEvents: Number.MAX_SAFE_INTEGER },
      { materialize: false, ...(ctx.maxBlocksPerEvent === undefined ? {} : { maxBlocksPerEvent: ctx.maxBlocksPerEvent }) },
    );
    const dcId = config.dcId ?? ctx.dcId;
    const semantics = createKvQuerySemantics(config.blockSize, config.hashFormat);
    const { namespace, component, endpoint } = config.endpoint;
    const cacheSemantics = config.cacheSemanticsDigest
      ? digestIdentity(Buffer.from(config.cacheSemanticsDigest, "hex"), "Explicit")
      : digestIdentity(digestOf(`mmgate/cache-semantics/v1\0${config.blockSize}\0${config.hashFormat}`), "DefaultDerived");
    const routingScope = config.routingScopeDigest
      ? digestIdentity(Buffer.from(config.routingScopeDigest, "hex"), "Explicit")
      : digestIdentity(digestOf(`mmgate/routing-scope/v1\0${namespace}\0${component}\0${endpoint}\0${config.name}`), "DefaultDerived");
    const producer = producerIdentity({
      poolId: poolId({ cacheSemantics, routingScope, dcId }),
      producerIncarnation: config.producerIncarnation ?? randomIncarnation(),
      layoutGeneration: config.layoutGeneration,
      format: this.state.format(),
    });
    this.descriptorValue = Object.freeze({
      producer,
      servingEndpoint: Object.freeze({ namespace, component, endpoint }),
      registrations: Object.freeze(config.models.map(registrationOf)),
      querySemantics: semantics,
      poolRoles: Object.freeze([...config.roles]),
    });
    this.publisher = this.newPublisher(producer);
  }

  get descriptor(): PoolDescriptor {
    return this.descriptorValue;
  }

  get producer(): ProducerIdentity {
    return this.descriptorValue.producer;
  }

  /** The hub, when one is open. */
  get hub(): PublicationHub | undefined {
    return this.hubValue;
  }

  /** Deltas published since the pool started, over every generation. */
  get deltasPublished(): number {
    return this.deltas;
  }

  /** The publication sequence of the current generation. */
  get sequence(): bigint {
    return this.publisher.lastSequence;
  }

  /**
   * Applies one event. Returns the CkfError that rejected it (or part of it:
   * the rest of the event still applies), undefined when it applied or was
   * ignored by the residency gate. The stepped application below, run
   * without a pause.
   */
  apply(event: RouterEvent): CkfError | undefined {
    const done = this.applyUntil(event, NEVER);
    return done === APPLY_PAUSED ? undefined : done;
  }

  /**
   * Applies one event in steps (DcCkfState.applyEventInSteps): the generator
   * yields whenever `pause` says so, between blocks, and its value is what
   * `apply` returns. Until it is done nothing else may apply events to this
   * pool; a publication that comes due meanwhile (the coalescing delay, a
   * threshold, a flush) waits for the end of the event, so deltas always end
   * at event boundaries. Only a barrier snapshot (a hub opening) may see the
   * event partly applied, a consistent lane that the following deltas
   * complete. It is applyUntil and continueApply in a generator.
   */
  *applyInSteps(event: RouterEvent, pause: PauseCheck): Generator<void, CkfError | undefined, void> {
    let done = this.applyUntil(event, pause);
    try {
      while (done === APPLY_PAUSED) {
        yield;
        done = this.continueApply(pause);
      }
    } finally {
      if (done === APPLY_PAUSED) {
        this.paused = undefined;
        this.state.abandonEvent();
      }
    }
    return done;
  }

  /**
   * The stepped application without a generator (DcCkfState.applyEventUntil),
   * for a caller that applies many events and rarely pauses: applies `event`
   * until it is done, or until `pause` says so between blocks. Returns what
   * `apply` returns once the event is done, APPLY_PAUSED when it paused; then
   * `continueApply(pause)` goes on, in a later turn, until it is done. The
   * rules of applyInSteps hold.
   */
  applyUntil(event: RouterEvent, pause: PauseCheck): CkfError | undefined | typeof APPLY_PAUSED {
    if (this.closed) return new CkfError("InvalidEvent", `pool ${this.name} is closed`);
    const outcome = this.state.applyEventUntil(event, pause);
    if (outcome !== undefined) return this.eventDone(event, outcome);
    this.paused = event;
    return APPLY_PAUSED;
  }

  /** Goes on with the event applyUntil paused; the same answers. */
  continueApply(pause: PauseCheck): CkfError | undefined | typeof APPLY_PAUSED {
    const outcome = this.state.continueEvent(pause);
    if (outcome === undefined) return APPLY_PAUSED;
    const event = this.paused!;
    this.paused = undefined;
    return this.eventDone(event, outcome);
  }

  /** An event's end: its worker seen, its count, and the publication it makes due. */
  private eventDone(event: RouterEvent, outcome: ApplyOutcome): CkfError | undefined {
    if (typeof event?.workerId === "bigint") this.workerSeen.set(event.workerId, this.ctx.now());
    if (outcome.firstError !== undefined) this.rejected += 1;
    else this.applied += 1;
    this.pending += 1;
    if (this.publicationDue && this.holds === 0) {
      this.flush();
    } else if (this.pending >= this.threshold && !this.config.coalesceWithinTurn) {
      this.flush();
    } else if (this.pending >= this.threshold) {
      this.flushSoon ??= setImmediate(() => {
        this.flushSoon = undefined;
        this.timedFlush();
      });
    } else {
      // Whatever stays below the threshold goes out after the coalescing delay.
      this.flushTimer ??= setTimeout(() => {
        this.flushTimer = undefined;
        this.timedFlush();
      }, this.delayMs);
    }
    return outcome.firstError;
  }

  /**
   * Holds the publications the turn's end and the coalescing delay would
   * make until the returned function is called (once; holds nest): the
   * relay holds a pool while it applies one message, so that a message's
   * events publish as one delta (or per threshold, without turn coalescing)
   * however many turns its sliced application takes, as they did when a
   * message applied within one turn. A held publication goes out on release.
   */
  hold(): () => void {
    this.holds += 1;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.holds -= 1;
      if (this.holds === 0 && this.publicationDue) this.flush();
    };
  }

  /** A publication the turn's end or the delay made due: now, or when the event in steps and every hold are done. */
  private timedFlush(): void {
    if (this.holds > 0 || this.state.applying) {
      this.publicationDue = true;
      return;
    }
    this.flush();
  }

  /** Publishes whatever is pending now; while an event is applied in steps, when it is done. */
  flush(): void {
    if (this.closed) return;
    if (this.state.applying) {
      this.publicationDue = true;
      return;
    }
    this.publicationDue = false;
    this.pending = 0;
    if (this.flushTimer !== undefined) clearTimeout(this.flushTimer);
    this.flushTimer = undefined;
    const batch = this.state.flush();
    if (batch !== undefined) this.publish(batch);
  }

  /**
   * The hub, started when there is none: the publisher takes the relay's
   * lease and a barrier snapshot installs the hub's mirror. Throws what the
   * barrier throws (SequenceExhausted: the generation is rotated first).
   */
  openHub(): PublicationHub {
    const open = this.hubValue;
    if (open !== undefined && (open.state === "ready" || open.state === "recovering" || open.state === "awaiting_snapshot")) return open;
    const identity = this.producer;
    const hub = new PublicationHub({ identity, limits: this.ctx.hubLimits });
    // The barrier drains the tail first: with no hub before this one there is no lease to publish it on, so
    // it is not materialized (a pool filled before its first subscriber has a tail of its whole lane).
    this.installBarrier(hub);
    this.state.setMaterialization(true);
    this.hubValue = hub;
    this.hubIdleSince = undefined;
    this.ctx.onChange(this, "hub");
    return hub;
  }

  /**
   * The hub once it has its snapshot: at once unless a barrier is being
   * copied (a large lane); rejects with `signal`'s reason when it fires
   * first, and with the hub's end when the hub is retired meanwhile.
   */
  hubReady(signal?: AbortSignal): Promise<PublicationHub> {
    const hub = this.openHub();
    const barrier = this.barrier;
    // No barrier under way: wait for the mirror's lane copy, if one runs (a subscriber would otherwise finish it in one go).
    if (barrier === undefined || barrier.hub !== hub) return hub.whenSettled().then(() => hub);
    if (signal?.aborted) return Promise.reject(signal.reason as Error);
    return new Promise<PublicationHub>((resolve, reject) => {
      const onAbort = () => reject(signal!.reason as Error);
      signal?.addEventListener("abort", onAbort, { once: true });
      barrier.waiters.push({
        resolve: () => {
          signal?.removeEventListener("abort", onAbort);
          resolve(hub);
        },
        reject: (error) => {
          signal?.removeEventListener("abort", onAbort);
          reject(error);
        },
      });
    });
  }

  /**
   * Gives `hub` a barrier snapshot (its first, or a recovery one): the lane
   * copied now for a small lane, in steps across turns for a large one,
   * the deltas published meanwhile held back and handed to the hub after
   * the snapshot. A 2^24-bucket lane (128 MiB) copied in one go would hold
   * the event loop for about half a second.
   */
  private installBarrier(hub: PublicationHub): void {
    if (this.producer.format.bucketCount <= SYNC_BARRIER_BUCKETS) {
      // A barrier snapshot's words are a fresh copy of the lane: the hub takes them as they are.
      hub.publishSnapshot(this.publisher.snapshotAfterBarrier(this.state, hub.lease), { adoptWords: true });
      return;
    }
    this.cancelBarrier(new HubError("NotReady", "a newer barrier snapshot replaced this one"));
    const { sequence, copy } = this.publisher.barrierInSteps(this.state, hub.lease);
    const barrier: PendingBarrier = { hub, sequence, copy, deltas: [], waiters: [], timer: undefined };
    this.barrier = barrier;
    const stepTurn = (): void => {
      barrier.timer = undefined;
      if (this.barrier !== barrier) return;
      const started = performance.now();
      while (!copy.step(BARRIER_STEP_BUCKETS)) {
        if (performance.now() - started >= BARRIER_TURN_MS) {
          barrier.timer = setImmediate(stepTurn);
          return;
        }
      }
      this.finishBarrier(barrier);
    };
    barrier.timer = setImmediate(stepTurn);
  }

  /** The copy is complete: the snapshot goes to the hub, then the deltas published since, in order. */
  private finishBarrier(barrier: PendingBarrier): void {
    this.barrier = undefined;
    const { hub, copy, sequence } = barrier;
    try {
      if (hub.state === "retired" || hub.state === "failed") throw new HubError("NotReady", `the hub was ${hub.state} while its snapshot was copied`);
      hub.publishSnapshot({ identity: hub.identity, lease: hub.lease, sequence, buckets: copy.words }, { adoptWords: true });
      for (const delta of barrier.deltas) {
        const result = publishDelta(hub, delta);
        // Too large for one frame: the hub asks for another barrier, taken after this publication.
        if (result.kind === "recovery_required") this.recoveryDue = true;
      }
    } catch (error) {
      for (const waiter of barrier.waiters) waiter.reject(error);
      if (hub.state === "failed") {
        this.ctx.onTerminalFailure(this, error);
        this.rotateGeneration();
      }
      return;
    }
    for (const waiter of barrier.waiters) waiter.resolve();
    if (this.recoveryDue) {
      this.recoveryDue = false;
      this.installBarrier(hub);
      this.recoveries += 1;
    }
  }

  /** Drops the barrier under way (the hub closed, or another barrier replaces it); its waiters get `error`. */
  private cancelBarrier(error: unknown): void {
    const barrier = this.barrier;
    if (barrier === undefined) return;
    this.barrier = undefined;
    if (barrier.timer !== undefined) clearImmediate(barrier.timer);
    this.state.cancelBarrierCopy();
    for (const waiter of barrier.waiters) waiter.reject(error);
  }

  /**
   * Retires the hub when it has had no subscriber for `idleMs`; returns
   * whether it did. The state stops materializing batches until the next
   * subscriber opens a hub again (with a barrier snapshot).
   */
  evictIdleHub(idleMs: number): boolean {
    const hub = this.hubValue;
    if (hub === undefined) return false;
    if (!hub.evictable) {
      this.hubIdleSince = undefined;
      return false;
    }
    const now = this.ctx.now();
    this.hubIdleSince ??= now;
    if (now - this.hubIdleSince < idleMs) return false;
    this.closeHub();
    return true;
  }

  /**
   * Fences the current generation and starts the next one (layout
   * generation + 1, sequence 0) on the same filter state. Subscribers of the
   * old hub end as retired; their streams report PRODUCER_CHANGED.
   */
  rotateGeneration(): ProducerIdentity {
    const old = this.producer;
    const next = producerIdentity({
      poolId: old.poolId,
      producerIncarnation: old.producerIncarnation,
      layoutGeneration: old.layoutGeneration + 1n,
      format: old.format,
    });
    this.closeHub();
    this.descriptorValue = Object.freeze({ ...this.descriptorValue, producer: next });
    this.publisher = this.newPublisher(next);
    this.generations += 1;
    this.ctx.onChange(this, "generation");
    return next;
  }

  /** Workers with an event within `withinMs`. */
  liveWorkers(withinMs: number): number {
    const cutoff = this.ctx.now() - withinMs;
    let live = 0;
    for (const [worker, seen] of this.workerSeen) {
      if (seen >= cutoff) live += 1;
      else this.workerSeen.delete(worker);
    }
    return live;
  }

  /** Whether any event has reached this pool since it started. */
  get hasEventSource(): boolean {
    return this.applied + this.rejected > 0;
  }

  stats(): RelayPoolStats {
    const state = this.state.stats();
    const hub = this.hubValue;
    return Object.freeze({
      name: this.name,
      sequence: this.publisher.lastSequence,
      layoutGeneration: this.producer.layoutGeneration,
      eventsApplied: this.applied,
      eventsRejected: this.rejected,
      deltasPublished: this.deltas,
      snapshotRecoveries: this.recoveries,
      generationChanges: this.generations,
      hub: hub === undefined ? "none" : hub.state === "ready" ? "ready" : "recovering",
      subscribers: hub?.stats().subscribers ?? 0,
      uniqueBlocks: state.uniqueBlocks,
      ranks: state.members,
      occupiedSlots: state.occupiedSlots,
      buckets: this.producer.format.bucketCount,
    });
  }

  /** Blocks held and ranks holding them (cheap; see stats() for everything). */
  occupancy(): { readonly uniqueBlocks: number; readonly ranks: number } {
    const { uniqueBlocks, members } = this.state.occupancy();
    return { uniqueBlocks, ranks: members };
  }

  /** The filter's words now (a copy), for tests and diagnostics. */
  words(): BigUint64Array {
    return this.state.words().slice();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.flushTimer !== undefined) clearTimeout(this.flushTimer);
    this.flushTimer = undefined;
    if (this.flushSoon !== undefined) clearImmediate(this.flushSoon);
    this.flushSoon = undefined;
    this.cancelBarrier(new HubError("Retired", `pool ${this.name} closed while its hub's snapshot was copied`));
    this.hubValue?.retire();
    this.hubValue = undefined;
  }

  private newPublisher(identity: ProducerIdentity): DcCkfPublisher {
    return new DcCkfPublisher(identity, { lastSequence: 0n, sink: (delta) => this.deliver(delta) });
  }

  private closeHub(): void {
    const hub = this.hubValue;
    if (hub === undefined) return;
    this.cancelBarrier(new HubError("Retired", "the pool's hub closed while its snapshot was copied"));
    this.hubValue = undefined;
    this.hubIdleSince = undefined;
    hub.retire();
    this.state.setMaterialization(false);
    this.ctx.onChange(this, "hub");
  }

  /** The publisher's sink: every delta goes through the hub, if there is one. */
  private deliver(delta: DcCkfDelta): "accepted" | "rejected" {
    const hub = this.hubValue;
    if (hub === undefined) return "accepted";
    // The hub's snapshot is still being copied: the delta continues it, so it waits for it.
    if (this.barrier !== undefined && this.barrier.hub === hub) {
      this.barrier.deltas.push(delta);
      return "accepted";
    }
    // A throw here is the hub's terminal failure; the publisher fences on it.
    const result = publishDelta(hub, delta);
    if (result.kind === "recovery_required") this.recoveryDue = true;
    return "accepted";
  }

  private publish(batch: DcCkfPublicationBatch): void {
    try {
      const result = this.publisher.publish(batch);
      if (result.kind === "published") {
        this.deltas += 1;
        this.ctx.onDelta?.(this);
      }
      if (this.recoveryDue && this.barrier === undefined) {
        this.recoveryDue = false;
        const hub = this.hubValue;
        if (hub !== undefined) {
          this.installBarrier(hub);
          this.recoveries += 1;
        }
      }
    } catch (error) {
      this.recoveryDue = false;
      this.ctx.onTerminalFailure(this, error);
      this.rotateGeneration();
    }
  }
}
