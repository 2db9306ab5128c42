/**
 * One subscriber of a pool's publication hub: a snapshot to bootstrap from,
 * taken once, then every delta frame in order through a queue bounded in
 * frames and bytes. There is no drop-and-continue: a frame that does not
 * fit ends the subscription as lagged, and the consumer resubscribes from a
 * fresh snapshot. Every end frees the queue and the snapshot at once.
 */
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

/**
 * The frames queued for one subscriber, and its one reader's wait. The
 * subscriber checks both bounds before it pushes (offer), so this is a plain
 * ring: pushing and taking allocate nothing, and a frame already queued is
 * taken without a promise (poll).
 */
class FrameQueue {
  private slots: (PublicationFrame | undefined)[] = new Array<PublicationFrame | undefined>(4);
  private head = 0;
  private count = 0;
  private byteCount = 0;
  private waiter: ((frame: PublicationFrame | undefined) => void) | undefined;

  get length(): number {
    return this.count;
  }

  get bytes(): number {
    return this.byteCount;
  }

  push(frame: PublicationFrame): void {
    const waiter = this.waiter;
    if (waiter !== undefined) {
      // The reader is waiting on an empty queue: the frame goes to it directly.
      this.waiter = undefined;
      waiter(frame);
      return;
    }
    if (this.count === this.slots.length) this.grow();
    this.slots[(this.head + this.count) % this.slots.length] = frame;
    this.count++;
    this.byteCount += frame.queuedBytes;
  }

  /** The oldest frame, taken off the queue; undefined when empty. */
  shift(): PublicationFrame | undefined {
    if (this.count === 0) return undefined;
    const frame = this.slots[this.head]!;
    this.slots[this.head] = undefined;
    this.head = (this.head + 1) % this.slots.length;
    this.count--;
    this.byteCount -= frame.queuedBytes;
    return frame;
  }

  /** The next frame, waiting for one; undefined once `clear` ended the wait. */
  take(): Promise<PublicationFrame | undefined> {
    const frame = this.shift();
    if (frame !== undefined) return Promise.resolve(frame);
    return new Promise((resolve) => (this.waiter = resolve));
  }

  /** Drops every frame and ends a waiting take. */
  clear(): void {
    this.slots = new Array<PublicationFrame | undefined>(4);
    this.head = 0;
    this.count = 0;
    this.byteCount = 0;
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.(undefined);
  }

  private grow(): void {
    const slots = new Array<PublicationFrame | undefined>(this.slots.length * 2);
    for (let i = 0; i < this.count; i++) slots[i] = this.slots[(this.head + i) % this.slots.length];
    this.slots = slots;
    this.head = 0;
  }
}

export class HubSubscriber {
  readonly id: number;
  readonly maxQueuedFrames: number;
  readonly maxQueuedBytes: number;
  private readonly queue = new FrameQueue();
  private pin: SnapshotPin | undefined;
  private snapshotTaken = false;
  private reason: SubscriberEndReason | undefined;
  /** A read is waiting for a frame: the consumer is keeping up, whatever the clock says. */
  private reading = false;
  /**
   * Called, in the hub's turn, after a frame was queued (not when a waiting
   * read took it): a consumer that takes frames with poll() as they come.
   * It must not throw.
   */
  onQueued: (() => void) | undefined = undefined;
  /**
   * Set by such a consumer while it has taken every frame and can take the
   * next at once: as a waiting read, it is keeping up whatever the clock says.
   */
  keepingUp = false;
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
    let frame: PublicationFrame | undefined;
    try {
      frame = await this.queue.take();
    } finally {
      this.reading = false;
      this.lastActive = this.now();
    }
    if (frame === undefined) return { kind: "ended", reason: this.reason ?? "closed" };
    return { kind: "frame", frame };
  }

  /**
   * The next frame if one is queued, or the end; undefined when the reader
   * would have to wait (then call next()). What next() gives, without a
   * promise: a stream that keeps up finds most frames already queued.
   */
  poll(): SubscriberRead | undefined {
    if (this.reason !== undefined) return { kind: "ended", reason: this.reason };
    const frame = this.takeFrame();
    return frame === undefined ? undefined : { kind: "frame", frame };
  }

  /** poll() without a result object: the next queued frame, or undefined when none is queued or the subscription ended (see endReason). */
  takeFrame(): PublicationFrame | undefined {
    if (this.reason !== undefined) return undefined;
    if (this.reading) throw new Error("HubSubscriber has one reader: next() is already waiting");
    const frame = this.queue.shift();
    if (frame === undefined) return undefined;
    this.releaseSnapshot();
    this.lastActive = this.now();
    return frame;
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
    const handed = this.reading;
    this.queue.push(frame);
    if (!handed) this.onQueued?.();
    return true;
  }

  /** Hub only: how long the consumer has neither read nor been waiting to read. */
  idleFor(now: number): number {
    return this.reading || this.keepingUp ? 0 : now - this.lastActive;
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
    this.onQueued = undefined;
    this.keepingUp = false;
    this.queue.clear();
    const waiters = this.endWaiters;
    this.endWaiters = undefined;
    for (const resolve of waiters ?? []) resolve(reason);
  }
}
