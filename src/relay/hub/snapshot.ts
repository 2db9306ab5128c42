/**
 * The hub's mirror of one producer lane (B.7): the words at `sequence`,
 * shared with subscribers as immutable snapshots. Deltas are applied
 * copy-on-write: the lane is copied only while a subscriber still holds a
 * snapshot of it, otherwise written in place, so a hub without bootstrapping
 * subscribers holds exactly one lane whatever the delta rate.
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

export class HubMirror {
  readonly identity: ProducerIdentity;
  readonly lease: LaneLease;
  private lane: Lane;
  private sequenceValue: bigint;
  /** Pins handed out and not released, on any lane. */
  private heldPins = 0;
  private copies = 0;

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

  /** The current lane at the current sequence, held until release(). */
  pin(): SnapshotPin {
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
    for (const image of delta.images) {
      if (!Number.isSafeInteger(image.bucket) || image.bucket < 0 || image.bucket >= length) {
        throw new HubError("BucketOutOfRange", `bucket ${String(image.bucket)} is outside a lane of ${length}`, { details: { bucket: image.bucket, length } });
      }
      if (typeof image.value !== "bigint" || BigInt.asUintN(64, image.value) !== image.value) {
        throw new HubError("InvalidImage", `the image of bucket ${image.bucket} is not a u64`, { details: { bucket: image.bucket } });
      }
    }
    if (this.lane.pins > 0) {
      // Held by a bootstrapping subscriber: it keeps the old words, the mirror moves on with a copy.
      this.lane = { words: this.lane.words.slice(), pins: 0 };
      this.copies += 1;
    }
    const words = this.lane.words;
    for (const image of delta.images) words[image.bucket] = image.value;
    this.sequenceValue = delta.sequence;
  }
}
