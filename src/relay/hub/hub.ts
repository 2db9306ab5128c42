/**
 * The publication hub of one pool (one producer generation): the mirror of
 * its lane, and the fan-out of delta frames to subscribers (C.4 "Hub fan-out
 * and slow subscribers", "Hub loop"). Single-threaded by construction: every
 * method runs to completion, so a subscriber's snapshot and the first frame
 * it is queued always join up (snapshot at N, first delta N -> N+1).
 *
 * The hub does not talk to the producer. When a snapshot is needed (first
 * install, recovery) the owner calls publishSnapshot with a barrier snapshot;
 * publishDelta tells it when recovery is required.
 */
import { imageCount, relayLease, sameLease, sameProducerIdentity, type DcCkfDelta, type DcCkfSnapshot, type LaneLease, type ProducerIdentity } from "../../kv/index.js";
import { SYSTEM_HUB_CLOCK, type HubClock } from "./clock.js";
import { HubError } from "./errors.js";
import { FRAME_ENVELOPE_HEADROOM_BYTES, hubLimits, queueLimits, type HubLimits } from "./limits.js";
import type { PublicationFrame } from "./frame.js";
import { HubMirror } from "./snapshot.js";
import { HubSubscriber, SUBSCRIBER_END_REASONS, type SubscriberEndReason } from "./subscriber.js";

/**
 * - awaiting_snapshot: created, no snapshot yet; subscribe fails NotReady.
 * - ready: mirroring and fanning out.
 * - recovering: a delta could not be fanned out; subscribers were closed and
 *   the hub waits for a fresh snapshot (subscribe fails NotReady meanwhile).
 * - retired, failed: final.
 */
export type HubState = "awaiting_snapshot" | "ready" | "recovering" | "retired" | "failed";

/** Why a delta turned into snapshot recovery. */
export type RecoveryCause = "delta_images" | "frame_bytes";

export type PublishDeltaResult =
  /** Applied to the mirror and offered to every subscriber. */
  | { readonly kind: "published"; readonly sequence: bigint; readonly delivered: number; readonly lagged: number }
  /** Too large for one frame: every subscriber was closed as "recovery"; publish a fresh barrier snapshot. */
  | { readonly kind: "recovery_required"; readonly cause: RecoveryCause; readonly closed: number }
  /** No snapshot installed (not yet, or recovering): dropped, since the next snapshot carries it. */
  | { readonly kind: "awaiting_snapshot" };

export interface SubscribeOptions {
  /** At most the hub's maxQueuedFrames (its default). */
  readonly maxQueuedFrames?: number;
  /** At most the hub's maxQueuedBytes (its default), at least one largest frame plus headroom. */
  readonly maxQueuedBytes?: number;
  /** Stops the subscription: it is removed and its queue and snapshot freed. */
  readonly signal?: AbortSignal;
}

export interface HubStats {
  readonly state: HubState;
  /** The mirror's sequence; undefined without a snapshot. */
  readonly sequence: bigint | undefined;
  readonly subscribers: number;
  /** Frames queued across all subscribers. */
  readonly queuedFrames: number;
  /** Bytes (payload + headroom) queued across all subscribers. */
  readonly queuedBytes: number;
  /** Subscribers still holding their bootstrap snapshot. */
  readonly pinnedSnapshots: number;
  /** Deltas applied and fanned out. */
  readonly deltasPublished: number;
  /** Deltas that turned into snapshot recovery. */
  readonly recoveries: number;
  /** How many times a delta copied a held lane (current mirror only). */
  readonly laneCopies: number;
  /** Subscriptions ended, by reason, since the hub was created. */
  readonly ended: Readonly<Record<SubscriberEndReason, number>>;
}

export interface PublicationHubOptions {
  /** The producer generation this hub publishes; every snapshot and delta must carry it. */
  readonly identity: ProducerIdentity;
  /** The hub's publication lease; default relayLease(identity) (B.6). */
  readonly lease?: LaneLease;
  readonly limits?: Partial<HubLimits>;
  readonly clock?: HubClock;
}

export class PublicationHub {
  readonly identity: ProducerIdentity;
  readonly lease: LaneLease;
  readonly limits: HubLimits;
  private readonly clock: HubClock;
  private stateValue: HubState = "awaiting_snapshot";
  private mirror: HubMirror | undefined;
  private readonly subscribers = new Map<number, HubSubscriber>();
  private nextId = 1;
  private sweepTimer: unknown;
  private deltasPublished = 0;
  private recoveries = 0;
  private readonly ended: Record<SubscriberEndReason, number>;

  constructor(options: PublicationHubOptions) {
    this.identity = options.identity;
    this.lease = options.lease ?? relayLease(options.identity);
    this.limits = hubLimits(options.limits);
    this.clock = options.clock ?? SYSTEM_HUB_CLOCK;
    this.ended = Object.fromEntries(SUBSCRIBER_END_REASONS.map((reason) => [reason, 0])) as Record<SubscriberEndReason, number>;
  }

  get state(): HubState {
    return this.stateValue;
  }

  /**
   * The reference lets a hub be evicted only with no subscribers and no
   * pinned snapshot; the owner decides when (and retires it then).
   */
  get evictable(): boolean {
    return this.subscribers.size === 0 && this.stateValue !== "retired" && this.stateValue !== "failed";
  }

  /**
   * Installs a barrier snapshot: the first one, a recovery one, or a
   * replacement. Its identity and lease must be the hub's (IdentityChanged,
   * LeaseChanged) and its word count its format's (SnapshotBucketCount); on
   * any of these nothing changes. Subscribers of an earlier snapshot cannot
   * continue from this one, so they are closed as "recovery". With
   * `adoptWords` the hub keeps `snapshot.buckets` as its lane instead of a
   * copy: the caller must not read or write them after.
   */
  publishSnapshot(snapshot: DcCkfSnapshot, options: { readonly adoptWords?: boolean } = {}): void {
    this.assertLive();
    if (!sameProducerIdentity(snapshot.identity, this.identity)) throw new HubError("IdentityChanged", "the snapshot belongs to another producer generation");
    if (!sameLease(snapshot.lease, this.lease)) throw new HubError("LeaseChanged", "the snapshot was taken on another lease");
    const mirror = new HubMirror(snapshot, options.adoptWords === true);
    this.closeAll("recovery");
    this.mirror?.dispose();
    this.mirror = mirror;
    this.stateValue = "ready";
  }

  /**
   * Publishes one delta and its encoded frame. The frame must describe the
   * delta (InvalidFrame, nothing changes). A delta over maxDeltaImages, a
   * frame over maxFrameBytes, or no frame at all (the delta did not fit one:
   * the encoder refused it) is not fanned out: subscribers are closed as
   * "recovery" and the hub waits for a fresh snapshot. A delta the mirror
   * rejects (identity, lease, sequence gap, bucket) is a terminal failure:
   * the hub fails, closes everyone as "failed" and rethrows the mirror's
   * error, since the generation can no longer be vouched for. Otherwise the
   * frame goes to every subscriber; one it does not fit ends as "lagged".
   */
  publishDelta(delta: DcCkfDelta, frame: PublicationFrame | undefined): PublishDeltaResult {
    this.assertLive();
    if (frame !== undefined) checkFrame(delta, frame);
    const mirror = this.mirror;
    if (this.stateValue !== "ready" || mirror === undefined) return { kind: "awaiting_snapshot" };
    // No frame: the delta did not fit one (the encoder refused its image count).
    const cause: RecoveryCause | undefined =
      frame === undefined || imageCount(delta) > this.limits.maxDeltaImages
        ? "delta_images"
        : frame.payload.length > this.limits.maxFrameBytes
          ? "frame_bytes"
          : undefined;
    if (cause !== undefined || frame === undefined) {
      const closed = this.closeAll("recovery");
      // The mirror is now behind the producer; dropping it frees the lane until the fresh snapshot.
      mirror.dispose();
      this.mirror = undefined;
      this.stateValue = "recovering";
      this.recoveries += 1;
      return { kind: "recovery_required", cause: cause ?? "delta_images", closed };
    }
    try {
      mirror.applyDelta(delta);
    } catch (error) {
      this.fail();
      throw error;
    }
    this.deltasPublished += 1;
    let delivered = 0;
    let lagged = 0;
    for (const subscriber of [...this.subscribers.values()]) {
      if (subscriber.offer(frame)) delivered += 1;
      else {
        lagged += 1;
        this.remove(subscriber, "lagged");
      }
    }
    return { kind: "published", sequence: mirror.sequence, delivered, lagged };
  }

  /**
   * A new subscriber holding the current snapshot. Fails Retired / Failed
   * on a final hub, NotReady without a snapshot, SubscriberLimit at
   * maxSubscribers, InvalidConfig for queue bounds outside the hub's, and
   * with the signal's reason when it has already fired.
   */
  subscribe(options: SubscribeOptions = {}): HubSubscriber {
    this.assertLive();
    const mirror = this.mirror;
    if (this.stateValue !== "ready" || mirror === undefined) throw new HubError("NotReady", `the hub has no snapshot to bootstrap from (${this.stateValue})`);
    if (this.subscribers.size >= this.limits.maxSubscribers) throw new HubError("SubscriberLimit", `the pool has ${this.limits.maxSubscribers} subscribers already`);
    const bounds = queueLimits(this.limits, options);
    if (options.signal?.aborted) throw options.signal.reason;
    const subscriber = new HubSubscriber({
      id: this.nextId++,
      pin: mirror.pin(),
      ...bounds,
      now: () => this.clock.now(),
      detach: (s, reason) => this.remove(s, reason),
      signal: options.signal,
    });
    this.subscribers.set(subscriber.id, subscriber);
    this.startSweep();
    return subscriber;
  }

  /**
   * Resolves once a subscription costs no copy: the mirror's lane is not
   * being filled from one a bootstrapping subscriber holds (a large lane
   * is copied over several turns). Subscribe after it, or subscribe()
   * finishes the copy in one go.
   */
  whenSettled(): Promise<void> {
    return this.mirror?.whenSettled() ?? Promise.resolve();
  }

  /** Closes every subscriber as "retired" and refuses everything after; idempotent. */
  retire(): void {
    if (this.stateValue === "retired") return;
    this.closeAll("retired");
    this.mirror?.dispose();
    this.mirror = undefined;
    this.stateValue = "retired";
  }

  /** Removes every subscriber that has not read for subscriberIdleMs; returns how many. Runs on the sweep timer too. */
  sweepIdle(): number {
    const now = this.clock.now();
    let evicted = 0;
    for (const subscriber of [...this.subscribers.values()]) {
      if (subscriber.idleFor(now) >= this.limits.subscriberIdleMs) {
        this.remove(subscriber, "idle");
        evicted += 1;
      }
    }
    return evicted;
  }

  stats(): HubStats {
    let queuedFrames = 0;
    let queuedBytes = 0;
    let pinnedSnapshots = 0;
    for (const subscriber of this.subscribers.values()) {
      queuedFrames += subscriber.queuedFrames;
      queuedBytes += subscriber.queuedBytes;
      if (subscriber.holdsSnapshot) pinnedSnapshots += 1;
    }
    return Object.freeze({
      state: this.stateValue,
      sequence: this.mirror?.sequence,
      subscribers: this.subscribers.size,
      queuedFrames,
      queuedBytes,
      pinnedSnapshots,
      deltasPublished: this.deltasPublished,
      recoveries: this.recoveries,
      laneCopies: this.mirror?.laneCopies ?? 0,
      ended: Object.freeze({ ...this.ended }),
    });
  }

  private assertLive(): void {
    if (this.stateValue === "retired") throw new HubError("Retired", "the hub was retired");
    if (this.stateValue === "failed") throw new HubError("Failed", "the hub failed: its generation must be fenced and republished");
  }

  private fail(): void {
    this.closeAll("failed");
    this.mirror?.dispose();
    this.mirror = undefined;
    this.stateValue = "failed";
  }

  private remove(subscriber: HubSubscriber, reason: SubscriberEndReason): void {
    if (this.subscribers.get(subscriber.id) !== subscriber) return;
    this.subscribers.delete(subscriber.id);
    subscriber.end(reason);
    this.ended[reason] += 1;
    if (this.subscribers.size === 0) this.stopSweep();
  }

  private closeAll(reason: SubscriberEndReason): number {
    const all = [...this.subscribers.values()];
    for (const subscriber of all) this.remove(subscriber, reason);
    return all.length;
  }

  /** The idle sweep runs only while there are subscribers, so an unused hub holds no timer. */
  private startSweep(): void {
    if (this.sweepTimer !== undefined) return;
    this.sweepTimer = this.clock.setInterval(() => this.sweepIdle(), this.limits.idleSweepIntervalMs);
  }

  private stopSweep(): void {
    if (this.sweepTimer === undefined) return;
    this.clock.clearInterval(this.sweepTimer);
    this.sweepTimer = undefined;
  }
}

/** The frame must be the delta's own: same generation, same step, delta kind, honest size. */
function checkFrame(delta: DcCkfDelta, frame: PublicationFrame): void {
  if (frame.kind !== "delta") throw new HubError("InvalidFrame", `a delta is published with a delta frame, not a ${frame.kind}`);
  if (!sameProducerIdentity(frame.identity, delta.identity)) throw new HubError("InvalidFrame", "the frame belongs to another producer generation than its delta");
  if (frame.baseSequence !== delta.baseSequence || frame.sequence !== delta.sequence) {
    throw new HubError("InvalidFrame", `the frame goes ${frame.baseSequence} -> ${frame.sequence}, its delta ${delta.baseSequence} -> ${delta.sequence}`);
  }
  if (frame.queuedBytes !== frame.payload.length + FRAME_ENVELOPE_HEADROOM_BYTES) {
    throw new HubError("InvalidFrame", "the frame's queued size is not its payload plus the envelope headroom");
  }
}
