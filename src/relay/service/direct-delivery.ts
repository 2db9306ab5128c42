/**
 * A pool stream's deltas written in the hub's own turn: when the hub queues
 * a delta for the subscriber, its FilterUpdate (serialized once for every
 * subscriber, server/pre-encoded.ts) goes straight onto the call's HTTP/2
 * stream, as a bare HTTP/2 server would write it, instead of through the
 * handler's async generator and the transport's message pipeline, which
 * cost several promises and a serialization per frame and subscriber.
 *
 * Everything else about the stream stays: each delta is checked to continue
 * the last; frames are taken from the hub's bounded queue only while less
 * than HANDOVER_BACKLOG_BYTES wait in the transport, so a client that does
 * not read fills its queue and ends SUBSCRIBER_LAGGED (the hub's idle sweep
 * ends one whose transport takes nothing for the progress timeout); a
 * heartbeat goes out after an interval without a frame, through the
 * handler (nothing is written directly while it is on its way, so it never
 * overtakes or trails a delta out of order). The handler waits on `next()`
 * for what it must do itself: stop, end, fail, or send a heartbeat.
 *
 * Only for calls whose transport takes protobuf binary FilterUpdates over
 * HTTP/2, once the snapshot is out (the response headers are sent).
 */
import { sameProducerIdentity, type ProducerIdentity } from "../../kv/index.js";
import type { DirectMessages, PacedWrites } from "../../server/index.js";
import type { HubSubscriber, PublicationFrame } from "../hub/index.js";
import { RelayError } from "../wire/index.js";

/**
 * The next frame goes to the transport while less than this is waiting to
 * be written (one paced piece): frames queued in the hub then go out
 * together, one DATA frame and socket write for several small deltas,
 * instead of one each, while a client that does not read still holds at
 * most this much (or one larger frame) outside its bounded hub queue.
 */
export const HANDOVER_BACKLOG_BYTES = 64 * 1024;

/** What the handler must do: return, end with the subscription's end, throw `failure`, or send a heartbeat. */
export type DirectWake = "stop" | "ended" | "failed" | "heartbeat";

/** Which of two pending wakes wins (a heartbeat yields to anything that ends the stream). */
const PRIORITY: Readonly<Record<DirectWake, number>> = { heartbeat: 0, ended: 1, failed: 2, stop: 3 };

export interface DirectDeliveryOptions {
  readonly out: DirectMessages;
  readonly subscriber: HubSubscriber;
  readonly expected: ProducerIdentity;
  /** The length-prefixed FilterUpdate of a delta frame (made once per frame, shared). */
  readonly envelopeOf: (frame: PublicationFrame) => Buffer;
  /** The sequence the snapshot left the subscriber at. */
  readonly sequence: bigint;
  readonly heartbeatIntervalMs: number;
  readonly signal: AbortSignal;
}

/**
 * A stream's direct writes as one class for every stream: the hub's loop
 * over its subscribers reads `backlog` and calls `write` per frame, and the
 * objects `directMessagesOf` makes each have a shape of their own (a getter
 * closure each), which makes those reads megamorphic lookups.
 */
export class StreamMessages implements DirectMessages {
  private readonly send: (envelope: Buffer) => boolean;

  /** `paced` must be the pacer of the stream `direct` writes to (pacedWritesOf and directMessagesOf of one call). */
  constructor(
    private readonly paced: PacedWrites,
    direct: DirectMessages,
  ) {
    this.send = direct.write.bind(direct);
  }

  get backlog(): number {
    return this.paced.backlog;
  }

  whenBelow(bytes: number): Promise<void> {
    return this.paced.whenBelow(bytes);
  }

  write(envelope: Buffer): boolean {
    return this.send(envelope);
  }
}

export class DirectDelivery {
  private readonly out: DirectMessages;
  private readonly subscriber: HubSubscriber;
  private readonly envelopeOf: (frame: PublicationFrame) => Buffer;
  private current: bigint;
  private checked: ProducerIdentity | undefined;
  /** The transport holds HANDOVER_BACKLOG_BYTES or more: frames wait in the hub queue. */
  private blocked = false;
  /** A heartbeat is on its way through the handler: nothing is written meanwhile. */
  private paused = false;
  private heartbeatDue = false;
  private lastSent = performance.now();
  private closed = false;
  private pending: DirectWake | undefined;
  private waiter: ((wake: DirectWake) => void) | undefined;
  private timer: ReturnType<typeof setTimeout>;
  /** Why the stream must end, when a frame failed its checks. */
  failure: RelayError | undefined;
  private readonly onAbort = (): void => this.wake("stop");

  constructor(private readonly options: DirectDeliveryOptions) {
    this.out = options.out;
    this.subscriber = options.subscriber;
    this.envelopeOf = options.envelopeOf;
    this.current = options.sequence;
    this.timer = setTimeout(this.onTimer, options.heartbeatIntervalMs);
    if (options.signal.aborted) this.wake("stop");
    else options.signal.addEventListener("abort", this.onAbort, { once: true });
    void options.subscriber.whenEnded().then(() => this.wake("ended"));
    options.subscriber.onQueued = this.drain;
    this.drain();
  }

  /** The sequence of the last delta written (a heartbeat's base and sequence). */
  get sequence(): bigint {
    return this.current;
  }

  /** The next thing the handler must do. */
  next(): DirectWake | Promise<DirectWake> {
    const pending = this.pending;
    if (pending !== undefined) {
      this.pending = undefined;
      return pending;
    }
    return new Promise((resolve) => (this.waiter = resolve));
  }

  /** The handler is sending a heartbeat: no delta is written until `resume`. */
  pause(): void {
    this.paused = true;
  }

  /** The heartbeat went to the transport: the interval starts over, and queued deltas go out. */
  resume(): void {
    this.paused = false;
    this.heartbeatDue = false;
    this.lastSent = performance.now();
    clearTimeout(this.timer);
    this.timer = setTimeout(this.onTimer, this.options.heartbeatIntervalMs);
    this.drain();
  }

  dispose(): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.timer);
    this.options.signal.removeEventListener("abort", this.onAbort);
    const subscriber = this.options.subscriber;
    if (subscriber.onQueued === this.drain) subscriber.onQueued = undefined;
    subscriber.keepingUp = false;
    this.wake("stop");
  }

  /**
   * Writes every queued delta the transport can take now. The hub calls it
   * as it queues one (in the publisher's turn), the transport as its
   * backlog shrinks. It never throws: a failure ends the stream through the
   * handler.
   */
  private readonly drain = (): void => {
    if (this.closed || this.paused || this.blocked || this.failure !== undefined) return;
    const { out, subscriber } = this;
    // Read once: what this call writes adds to it, and nothing takes from it meanwhile (HTTP/2 takes pieces in later turns).
    let backlog = out.backlog;
    let wrote = false;
    try {
      for (;;) {
        if (backlog >= HANDOVER_BACKLOG_BYTES) {
          this.blocked = true;
          subscriber.keepingUp = false;
          void out.whenBelow(HANDOVER_BACKLOG_BYTES).then(this.unblock);
          break;
        }
        const frame = subscriber.takeFrame();
        if (frame === undefined) {
          // The end reaches the handler through whenEnded.
          if (subscriber.endReason !== undefined) break;
          // Every frame is out and the next can go at once: keeping up.
          subscriber.keepingUp = true;
          if (this.heartbeatDue && !wrote) this.wake("heartbeat");
          break;
        }
        if (frame.identity !== this.checked) {
          if (!sameProducerIdentity(frame.identity, this.options.expected)) {
            this.fail(new RelayError("INVALID_PUBLICATION", "a delta of another producer generation reached the stream"));
            break;
          }
          this.checked = frame.identity;
        }
        const current = this.current;
        // A delta frame goes base -> base + 1 (publicationFrame holds it to that): its base is what to check.
        if (frame.kind !== "delta" || frame.baseSequence !== current) {
          this.fail(new RelayError("INVALID_PUBLICATION", `the publication is not contiguous: at ${current}, got ${frame.kind} ${frame.baseSequence} -> ${frame.sequence}`));
          break;
        }
        const envelope = this.envelopeOf(frame);
        // The stream is gone or ending: the handler learns it from its signal.
        if (!out.write(envelope)) break;
        backlog += envelope.byteLength;
        this.current = frame.sequence;
        wrote = true;
      }
    } catch (error) {
      this.fail(error instanceof RelayError ? error : new RelayError("INTERNAL", `a delta could not be written: ${error instanceof Error ? error.message : String(error)}`, { cause: error }));
    }
    if (wrote) {
      this.lastSent = performance.now();
      if (this.heartbeatDue) {
        // The timer stopped when the heartbeat came due: data went out instead, so the interval starts over.
        this.heartbeatDue = false;
        this.timer = setTimeout(this.onTimer, this.options.heartbeatIntervalMs);
      }
    }
  };

  private readonly unblock = (): void => {
    this.blocked = false;
    this.drain();
  };

  /** A heartbeat is due after a whole interval without a frame; a missed tick is delayed, never bursted. */
  private readonly onTimer = (): void => {
    if (this.closed) return;
    const quiet = performance.now() - this.lastSent;
    const interval = this.options.heartbeatIntervalMs;
    if (quiet < interval) {
      this.timer = setTimeout(this.onTimer, interval - quiet);
      return;
    }
    this.heartbeatDue = true;
    // Blocked, or frames queued: they go first, and the heartbeat only if the drain leaves nothing to send.
    if (!this.blocked && !this.paused) this.drain();
  };

  private fail(error: RelayError): void {
    this.failure ??= error;
    this.wake("failed");
  }

  private wake(wake: DirectWake): void {
    const waiter = this.waiter;
    if (waiter !== undefined) {
      this.waiter = undefined;
      waiter(wake);
      return;
    }
    if (this.pending === undefined || PRIORITY[wake] > PRIORITY[this.pending]) this.pending = wake;
  }
}
