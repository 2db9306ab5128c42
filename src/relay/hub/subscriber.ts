/**
 * One subscriber of a pool's publication hub: a snapshot to bootstrap from,
 * taken once, then every delta frame in order through a queue bounded in
 * frames and bytes. There is no drop-and-continue: a frame that does not
 * fit ends the subscription as lagged, and the consumer resubscribes from a
 * fresh snapshot. Every end frees the queue and the snapshot at once.
 */
import { BoundedQueue } from "../../util/index.js";
import { HubError } from "./errors.js";
import type { PublicationFrame } from "./frame.js";
import type { HubSnapshot, SnapshotPin } from "./snapshot.js";

/**
 * Why a subscription ended. All but "closed" and "aborted" (the consumer's
 * own stop) mean: resubscribe and bootstrap from a fresh snapshot.
 * - lagged: a frame did not fit the queue (SUBSCRIBER_LAGGED).
 * - retired: the hub was retired (Unavailable).
 * - recovery: the hub is re-snapshotting (a delta too large for one frame, or a replaced snapshot).
 * - idle: the consumer did not read for the hub's subscriberIdleMs.
 * - failed: the hub failed terminally; its generation is fenced.
 * - aborted: the subscription's AbortSignal fired.
 * - closed: the consumer called close().
 */
export type SubscriberEndReason = "lagged" | "retired" | "recovery" | "idle" | "failed" | "aborted" | "closed";

export const SUBSCRIBER_END_REASONS: readonly SubscriberEndReason[] = ["lagged", "retired", "recovery", "idle", "failed", "aborted", "closed"];

/** What a read yields: the next frame, or the end and its reason (every later read yields the same end). */
export type SubscriberRead =
  | { readonly kind: "frame"; readonly frame: PublicationFrame }
  | { readonly kind: "ended"; readonly reason: SubscriberEndReason };

/** What the hub gives a subscriber; not part of the public face. */
export interface SubscriberInit {
  readonly id: number;
  readonly pin: SnapshotPin;
  readonly maxQueuedFrames: number;
  readonly maxQueuedBytes: number;
  readonly now: () => number;
  /** Asks the hub to remove this subscriber (the consumer stopped). */
  readonly detach: (subscriber: HubSubscriber, reason: "aborted" | "closed") => void;
  readonly signal: AbortSignal | undefined;
}

export class HubSubscriber {
  readonly id: number;
  readonly maxQueuedFrames: number;
  readonly maxQueuedBytes: number;
  private readonly queue: BoundedQueue<PublicationFrame>;
  private pin: SnapshotPin | undefined;
  private snapshotTaken = false;
  private reason: SubscriberEndReason | undefined;
  /** A read is waiting for a frame: the consumer is keeping up, whatever the clock says. */
  private reading = false;
  private lastActive: number;
  private readonly now: () => number;
  private readonly detach: SubscriberInit["detach"];
  private readonly signal: AbortSignal | undefined;
  private readonly onAbort: (() => void) | undefined;
  /** Resolves whenEnded()'s promise; made on its first call. */
  private endWaiters: ((reason: SubscriberEndReason) => void)[] | undefined;

  constructor(init: SubscriberInit) {
    this.id = init.id;
    this.pin = init.pin;
    this.maxQueuedFrames = init.maxQueuedFrames;
    this.maxQueuedBytes = init.maxQueuedBytes;
    this.queue = new BoundedQueue<PublicationFrame>({ maxItems: init.maxQueuedFrames, maxBytes: init.maxQueuedBytes, sizeOf: (frame) => frame.queuedBytes });
    this.now = init.now;
    this.lastActive = init.now();
    this.detach = init.detach;
    this.signal = init.signal;
    if (init.signal !== undefined) {
      this.onAbort = () => this.detach(this, "aborted");
      init.signal.addEventListener("abort", this.onAbort, { once: true });
    }
  }

  /** Why the subscription ended; undefined while it is live. */
  get endReason(): SubscriberEndReason | undefined {
    return this.reason;
  }

  get queuedFrames(): number {
    return this.queue.length;
  }

  get queuedBytes(): number {
    return this.queue.bytes;
  }

  /** True while the bootstrap snapshot is held (the hub copies its lane before writing it). */
  get holdsSnapshot(): boolean {
    return this.pin !== undefined;
  }

  /**
   * The snapshot to bootstrap from; the first delta frame continues from its
   * sequence. Only once: a second call, or a call after the snapshot was
   * released or the subscription ended, throws SnapshotTaken.
   */
  takeSnapshot(): HubSnapshot {
    if (this.snapshotTaken || this.pin === undefined) {
      throw new HubError("SnapshotTaken", "a subscription hands out its snapshot once, until it is released or the subscription ends");
    }
    this.snapshotTaken = true;
    this.lastActive = this.now();
    return this.pin.snapshot;
  }

  /**
   * Done with the snapshot (bootstrap sent): the hub may write its lane in
   * place again. The first read does this too, since reads come after bootstrap.
   */
  releaseSnapshot(): void {
    this.pin?.release();
    this.pin = undefined;
  }

  /**
   * The next frame in order, waiting for one; or the end and why. A frame
   * the hub could not queue is never skipped over: the subscription ends
   * instead. One read at a time (a second concurrent read rejects).
   */
  async next(): Promise<SubscriberRead> {
    if (this.reason !== undefined) return { kind: "ended", reason: this.reason };
    // Refused before touching anything: a second reader would clear the first one's "reading".
    if (this.reading) throw new Error("HubSubscriber has one reader: next() is already waiting");
    this.releaseSnapshot();
    this.lastActive = this.now();
    this.reading = true;
    let result: IteratorResult<PublicationFrame>;
    try {
      result = await this.queue.next();
    } finally {
      this.reading = false;
      this.lastActive = this.now();
    }
    if (result.done) return { kind: "ended", reason: this.reason ?? "closed" };
    return { kind: "frame", frame: result.value };
  }

  /**
   * Resolves with the reason once the subscription ends: for a consumer that
   * is not reading (its transport still busy with an earlier frame) and so
   * would only learn of a lag or an idle eviction from its next read.
   */
  whenEnded(): Promise<SubscriberEndReason> {
    if (this.reason !== undefined) return Promise.resolve(this.reason);
    return new Promise((resolve) => (this.endWaiters ??= []).push(resolve));
  }

  /**
   * The consumer made progress without reading (it handed over a snapshot
   * chunk): the idle clock restarts, so a bootstrap is bounded per chunk.
   */
  noteProgress(): void {
    this.lastActive = this.now();
  }

  /** The consumer stops: the hub removes the subscription and frees its queue. */
  close(): void {
    this.detach(this, "closed");
  }

  /** Hub only: queues `frame` if it fits both bounds; false means the subscriber lagged. */
  offer(frame: PublicationFrame): boolean {
    if (this.reason !== undefined) return false;
    // Checked here rather than left to the queue, which admits an oversize item into an
    // empty queue: the byte limit must hold for every frame, and the hub's limits already
    // guarantee that one largest frame fits an empty queue.
    if (this.queue.length >= this.maxQueuedFrames || this.queue.bytes + frame.queuedBytes > this.maxQueuedBytes) return false;
    return this.queue.tryPush(frame);
  }

  /** Hub only: how long the consumer has neither read nor been waiting to read. */
  idleFor(now: number): number {
    return this.reading ? 0 : now - this.lastActive;
  }

  /**
   * Hub only: ends the subscription with `reason` (the first end wins),
   * discards what is queued and releases the snapshot, so an ended
   * subscriber holds no memory however long its consumer keeps it. A read
   * waiting now yields the end.
   */
  end(reason: SubscriberEndReason): void {
    if (this.reason !== undefined) return;
    this.reason = reason;
    if (this.onAbort !== undefined) this.signal?.removeEventListener("abort", this.onAbort);
    this.releaseSnapshot();
    // Ending an iteration closes the queue and drops its items.
    void this.queue[Symbol.asyncIterator]().return?.();
    const waiters = this.endWaiters;
    this.endWaiters = undefined;
    for (const resolve of waiters ?? []) resolve(reason);
  }
}
