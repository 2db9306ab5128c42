/**
 * The hub's mirror of one producer lane (B.7): the words at `sequence`,
 * shared with subscribers as immutable snapshots. Deltas are applied
 * copy-on-write: the lane is copied only while a subscriber still holds a
 * snapshot of it, otherwise written in place, so a hub without bootstrapping
 * subscribers holds exactly one lane whatever the delta rate. A large lane
 * (a 2^24-bucket one is 128 MiB, half a second to copy) is copied in steps
 * across turns (LaneFill), the deltas meanwhile written to the new lane
 * ahead of the copy.
 */
import { sameLease, sameProducerIdentity, type DcCkfDelta, type DcCkfSnapshot, type LaneLease, type ProducerIdentity } from "../../kv/index.js";
import { HubError } from "./errors.js";

/**
 * One lane at one sequence. `buckets` must not be written by anyone: it is
 * immutable for as long as its pin is held (the hub copies before writing a
 * pinned lane); after release the hub may reuse it.
 */
export interface HubSnapshot {
  readonly identity: ProducerIdentity;
  readonly lease: LaneLease;
  readonly sequence: bigint;
  readonly buckets: BigUint64Array;
}

/** A held snapshot: the lane is not written while it is held. release() is idempotent. */
export interface SnapshotPin {
  readonly snapshot: HubSnapshot;
  release(): void;
}

/** A lane and how many pins hold it; only the current lane's count matters to the mirror. */
interface Lane {
  readonly words: BigUint64Array;
  pins: number;
}

/** Lanes up to this many buckets (8 MiB) are copied in one go. */
const SYNC_COPY_BUCKETS = 1 << 20;
/** Buckets a fill step copies (2 MiB), and how long one turn keeps taking steps. */
const FILL_STEP_BUCKETS = 1 << 18;
const FILL_TURN_MS = 5;

/**
 * A new lane filled from a pinned one (which never changes) in steps, while
 * deltas write the new lane: a bucket written ahead of the copy is marked,
 * and the copy leaves it alone.
 */
class LaneFill {
  private readonly written: Uint32Array;
  private cursor = 0;

  constructor(
    private readonly from: BigUint64Array,
    private readonly to: BigUint64Array,
  ) {
    this.written = new Uint32Array(Math.ceil(from.length / 32));
  }

  /** A delta wrote `bucket` of the new lane. */
  noteWrite(bucket: number): void {
    if (bucket >= this.cursor) this.written[bucket >>> 5] = this.written[bucket >>> 5]! | (1 << (bucket & 31));
  }

  /** Copies up to `maxBuckets` more buckets (a multiple of 32); true once every bucket is copied. */
  step(maxBuckets: number): boolean {
    const total = this.from.length;
    const end = Math.min(total, this.cursor + maxBuckets);
    let at = this.cursor;
    while (at < end) {
      let runEnd = at;
      while (runEnd < end && this.written[runEnd >>> 5] === 0) runEnd = Math.min(end, ((runEnd >>> 5) + 1) << 5);
      if (runEnd > at) {
        this.to.set(this.from.subarray(at, runEnd), at);
        at = runEnd;
        continue;
      }
      const bits = this.written[at >>> 5]!;
      const groupEnd = Math.min(end, ((at >>> 5) + 1) << 5);
      for (let bucket = at; bucket < groupEnd; bucket++) if ((bits & (1 << (bucket & 31))) === 0) this.to[bucket] = this.from[bucket]!;
      at = groupEnd;
    }
    this.cursor = end;
    return end === total;
  }
}

export class HubMirror {
  readonly identity: ProducerIdentity;
  readonly lease: LaneLease;
  private lane: Lane;
  private sequenceValue: bigint;
  /** Pins handed out and not released, on any lane. */
  private heldPins = 0;
  private copies = 0;
  /** The current lane's fill from the lane it replaced, while it runs. */
  private fill: LaneFill | undefined;
  private fillTimer: ReturnType<typeof setImmediate> | undefined;
  private fillWaiters: (() => void)[] = [];

  /**
   * Installs `snapshot`, copying its words so that the producer's array and
   * the mirror never alias (the mirror writes its lane in place). With
   * `adopt` the caller hands the words over instead (a barrier snapshot is
   * already a copy no one else holds): no second copy of a lane that may be
   * 128 MiB.
   */
  constructor(snapshot: DcCkfSnapshot, adopt = false) {
    const expected = snapshot.identity.format.bucketCount;
    if (snapshot.buckets.length !== expected) {
      throw new HubError("SnapshotBucketCount", `the snapshot has ${snapshot.buckets.length} buckets, its format declares ${expected}`, {
        details: { length: snapshot.buckets.length },
      });
    }
    this.identity = snapshot.identity;
    this.lease = snapshot.lease;
    this.sequenceValue = snapshot.sequence;
    this.lane = { words: adopt ? snapshot.buckets : snapshot.buckets.slice(), pins: 0 };
  }

  get sequence(): bigint {
    return this.sequenceValue;
  }

  /** Pins handed out and not yet released (old lanes included). */
  get pinned(): number {
    return this.heldPins;
  }

  /** How many times a delta had to copy a held lane (for stats and tests). */
  get laneCopies(): number {
    return this.copies;
  }

  /** Whether the current lane is complete (no fill under way): a pin now costs nothing. */
  get settled(): boolean {
    return this.fill === undefined;
  }

  /** Resolves once the current lane is complete. */
  whenSettled(): Promise<void> {
    if (this.fill === undefined) return Promise.resolve();
    return new Promise((resolve) => this.fillWaiters.push(resolve));
  }

  /** Stops a fill under way (the mirror is being dropped). */
  dispose(): void {
    if (this.fillTimer !== undefined) clearImmediate(this.fillTimer);
    this.fillTimer = undefined;
    this.fill = undefined;
    this.wakeFillWaiters();
  }

  /** The current lane at the current sequence, held until release(). */
  pin(): SnapshotPin {
    // A subscriber that did not wait for the fill: the rest of it is copied now.
    if (this.fill !== undefined) this.completeFill(Number.POSITIVE_INFINITY);
    const lane = this.lane;
    lane.pins += 1;
    this.heldPins += 1;
    const snapshot: HubSnapshot = Object.freeze({ identity: this.identity, lease: this.lease, sequence: this.sequenceValue, buckets: lane.words });
    let held = true;
    return Object.freeze({
      snapshot,
      release: () => {
        if (!held) return;
        held = false;
        lane.pins -= 1;
        this.heldPins -= 1;
      },
    });
  }

  /**
   * Applies `delta` (B.7): identity, then lease, then sequence continuity,
   * then every image's bucket and value are checked before anything is
   * written, so a throw leaves the mirror exactly as it was. Copies the
   * lane first when a pin still holds it.
   */
  applyDelta(delta: DcCkfDelta): void {
    if (!sameProducerIdentity(delta.identity, this.identity)) {
      throw new HubError("IdentityChanged", "the delta belongs to another producer generation");
    }
    if (!sameLease(delta.lease, this.lease)) throw new HubError("LeaseChanged", "the delta was published on another lease");
    const current = this.sequenceValue;
    if (delta.baseSequence !== current || delta.sequence !== delta.baseSequence + 1n) {
      throw new HubError("SequenceGap", `the mirror is at ${current}; the delta goes ${delta.baseSequence} -> ${delta.sequence}`, {
        details: { current, base: delta.baseSequence, next: delta.sequence },
      });
    }
    const length = this.lane.words.length;
    const columns = delta.columns;
    if (columns === undefined) {
      for (const image of delta.images) {
        if (!Number.isSafeInteger(image.bucket) || image.bucket < 0 || image.bucket >= length) {
          throw new HubError("BucketOutOfRange", `bucket ${String(image.bucket)} is outside a lane of ${length}`, { details: { bucket: image.bucket, length } });
        }
        if (typeof image.value !== "bigint" || BigInt.asUintN(64, image.value) !== image.value) {
          throw new HubError("InvalidImage", `the image of bucket ${image.bucket} is not a u64`, { details: { bucket: image.bucket } });
        }
      }
    } else {
      // Columns hold u32 buckets and u64 values by their types: only the lane's bound is left to check.
      const buckets = columns.buckets;
      if (columns.values.length !== buckets.length) {
        throw new HubError("InvalidImage", `${buckets.length} buckets but ${columns.values.length} values`);
      }
      for (let i = 0; i < buckets.length; i++) {
        const bucket = buckets[i]!;
        if (bucket >= length) throw new HubError("BucketOutOfRange", `bucket ${bucket} is outside a lane of ${length}`, { details: { bucket, length } });
      }
    }
    if (this.lane.pins > 0) {
      // Held by a bootstrapping subscriber: it keeps the old words, the mirror moves on with a copy.
      // (A pinned lane is complete: pin() finishes a fill first.)
      const old = this.lane.words;
      if (old.length <= SYNC_COPY_BUCKETS) {
        this.lane = { words: old.slice(), pins: 0 };
      } else {
        const words = new BigUint64Array(old.length);
        this.lane = { words, pins: 0 };
        this.fill = new LaneFill(old, words);
        this.fillTimer = setImmediate(this.fillTurn);
      }
      this.copies += 1;
    }
    const words = this.lane.words;
    const fill = this.fill;
    if (columns === undefined) {
      for (const image of delta.images) {
        words[image.bucket] = image.value;
        fill?.noteWrite(image.bucket);
      }
    } else {
      // Word for word as u32 halves, the same bytes on either host: no BigInt per image.
      const { buckets, values } = columns;
      const to = new Uint32Array(words.buffer, words.byteOffset, words.length * 2);
      const from = new Uint32Array(values.buffer, values.byteOffset, values.length * 2);
      for (let i = 0; i < buckets.length; i++) {
        const bucket = buckets[i]!;
        to[bucket * 2] = from[i * 2]!;
        to[bucket * 2 + 1] = from[i * 2 + 1]!;
        fill?.noteWrite(bucket);
      }
    }
    this.sequenceValue = delta.sequence;
  }

  /** One turn's steps of the fill. */
  private readonly fillTurn = (): void => {
    this.fillTimer = undefined;
    if (!this.completeFill(FILL_TURN_MS)) this.fillTimer = setImmediate(this.fillTurn);
  };

  /** Fills for up to `ms`; true once the fill is done (or there is none). */
  private completeFill(ms: number): boolean {
    const fill = this.fill;
    if (fill === undefined) return true;
    const started = performance.now();
    while (!fill.step(FILL_STEP_BUCKETS)) {
      if (performance.now() - started >= ms) return false;
    }
    this.fill = undefined;
    if (this.fillTimer !== undefined) clearImmediate(this.fillTimer);
    this.fillTimer = undefined;
    this.wakeFillWaiters();
    return true;
  }

  private wakeFillWaiters(): void {
    const waiters = this.fillWaiters;
    this.fillWaiters = [];
    for (const resolve of waiters) resolve();
  }
}
