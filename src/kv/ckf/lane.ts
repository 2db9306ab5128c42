/**
 * One packed CKF lane (B.2, B.3): bucketCount buckets of four 16-bit slots.
 *
 * The slots are a Uint16Array whose buffer *is* the wire image: slot i of
 * bucket b is bits 16i..16i+15 of the little-endian u64 word b, so snapshots
 * are a BigUint64Array view of the same memory, never a conversion. Slot 0
 * means empty (fingerprints are never 0).
 */
import { CkfAddressing, slotsHoldKey } from "./addressing.js";
import { CKF_LANE_COUNT, MAX_KICKS } from "./config.js";
import { CkfError, describeValue } from "./errors.js";
import { laneSeed, SplitMix64 } from "./splitmix.js";
import { assertLittleEndianHost } from "./u64.js";
import { Xxh3Of8 } from "./xxh3-8.js";

/**
 * Told about every bucket just before one of its slots is written, so a dirty
 * window can keep the bucket's value from before its first write. A failed
 * insert rolls its writes back after having reported them; see CkfLane.insert.
 */
export interface CkfWriteObserver {
  beforeWrite(bucket: number): void;
}

export interface CkfLaneOptions {
  readonly seed: bigint;
  /** A power of two in 2..2^24. */
  readonly bucketCount: number;
  /** Evictions per insert before giving up, 0..4096; 0 tries the two home buckets only. */
  readonly maxKicks: number;
  /** Which lane's RNG stream to use, 0..CKF_LANE_COUNT-1 (the DC state uses lane 0). Default 0. */
  readonly lane?: number;
}

export class CkfLane {
  readonly seed: bigint;
  readonly bucketCount: number;
  readonly maxKicks: number;
  readonly addressing: CkfAddressing;
  /** bucketCount * 4 slots; the same memory as `words()`. */
  readonly slots: Uint16Array;
  /** Notified before each bucket write; undefined when nobody tracks dirty buckets. */
  observer: CkfWriteObserver | undefined = undefined;
  /** Slot writes made by the last successful insert or remove (1 without evictions). */
  lastWrites = 0;
  /** Set by `address`: the key's fingerprint and bucketA. */
  keyFingerprint = 0;
  keyBucket = 0;
  private occupied = 0;
  private readonly rng: SplitMix64;
  /** The addressing's key hash, run here so that insert reads delta(fp) only when bucketA is full. */
  private readonly mixer: Xxh3Of8;
  private readonly mask: number;
  /** The shared delta table (addressing.deltas): a random read into 256 KiB that most inserts skip. */
  private readonly deltas: Uint32Array;
  /** The eviction walk's undo log: slot index and previous value, per kick. */
  private readonly undoSlot: Int32Array;
  private readonly undoValue: Uint16Array;

  constructor(options: CkfLaneOptions) {
    assertLittleEndianHost();
    const { seed, bucketCount, maxKicks, lane = 0 } = options;
    if (!Number.isInteger(maxKicks) || maxKicks < 0 || maxKicks > MAX_KICKS) {
      throw new CkfError("InvalidMaxKicks", `maxKicks ${describeValue(maxKicks)} is outside 0..${MAX_KICKS}`);
    }
    // Checked here rather than left to BigInt(lane), which throws a bare
    // RangeError for a fraction and happily derives a seed from -1 or 1e9.
    if (!Number.isInteger(lane) || lane < 0 || lane >= CKF_LANE_COUNT) {
      throw new CkfError("InvalidIdentity", `lane ${describeValue(lane)} is not an integer in 0..${CKF_LANE_COUNT - 1}`);
    }
    this.addressing = new CkfAddressing(seed, bucketCount);
    this.seed = seed;
    this.bucketCount = bucketCount;
    this.maxKicks = maxKicks;
    this.slots = new Uint16Array(bucketCount * 4);
    this.rng = new SplitMix64(laneSeed(seed, lane));
    this.mixer = new Xxh3Of8(seed);
    this.mask = bucketCount - 1;
    this.deltas = this.addressing.deltas;
    this.undoSlot = new Int32Array(maxKicks);
    this.undoValue = new Uint16Array(maxKicks);
  }

  /**
   * Inserts one copy of the key's fingerprint (B.3): the lowest empty slot of
   * bucketA, then of bucketB; otherwise a random eviction walk of up to
   * maxKicks kicks. Returns false (CapacityExhausted) when the walk fails, after
   * undoing every write in reverse order: the slots are then byte-for-byte
   * what they were. With `relocate` false only the home buckets are tried.
   */
  insert(hi: number, lo: number, relocate = true): boolean {
    this.address(hi, lo);
    return this.insertAt(this.keyFingerprint, this.keyBucket, relocate);
  }

  /**
   * The key's fingerprint and bucketA (B.2, as CkfAddressing.probe computes
   * them) into `keyFingerprint` / `keyBucket`: for a caller that addresses
   * several keys before inserting them (see `peek`). bucketB is left to
   * insertAt, which reads the delta table only when bucketA is full. The
   * halves may be u32s or int32s of the same bits.
   */
  address(hi: number, lo: number): void {
    const mixer = this.mixer;
    mixer.hash(hi, lo);
    const mixedLo = mixer.lo;
    this.keyFingerprint = (mixedLo & 0xffff) || 1;
    this.keyBucket = ((mixedLo >>> 16) | (mixer.hi << 16)) & this.mask;
  }

  /**
   * A bucket's first slot, read for its memory only: a caller that reads the
   * buckets of a batch of keys before inserting them has their cache misses
   * overlap, where one insert after another waits for each in turn.
   */
  peek(bucket: number): number {
    return this.slots[bucket << 2]!;
  }

  /** insert for a key `address` gave (fp, bucketA). */
  insertAt(fingerprint: number, bucketA: number, relocate: boolean): boolean {
    let fp = fingerprint;
    const a = bucketA;
    if (this.place(a, fp)) {
      this.lastWrites = 1;
      this.occupied++;
      return true;
    }
    const deltas = this.deltas;
    const b = a ^ deltas[fp]!;
    if (this.place(b, fp)) {
      this.lastWrites = 1;
      this.occupied++;
      return true;
    }
    const kicks = relocate ? this.maxKicks : 0;
    if (kicks === 0) return false;
    const slots = this.slots;
    const rng = this.rng;
    let bucket = (rng.next32() & 1) === 0 ? a : b;
    for (let kick = 0; kick < kicks; kick++) {
      const index = (bucket << 2) | (rng.next32() & 3);
      this.observer?.beforeWrite(bucket);
      const displaced = slots[index]!;
      this.undoSlot[kick] = index;
      this.undoValue[kick] = displaced;
      slots[index] = fp;
      fp = displaced;
      bucket ^= deltas[fp]!;
      if (this.place(bucket, fp)) {
        this.lastWrites = kick + 2;
        this.occupied++;
        return true;
      }
    }
    for (let kick = kicks - 1; kick >= 0; kick--) slots[this.undoSlot[kick]!] = this.undoValue[kick]!;
    return false;
  }

  /**
   * Removes one copy of the key's fingerprint: the first matching slot of
   * bucketA, else of bucketB. Throws IndexerInvariantViolation when neither
   * holds it; callers remove only what they know they inserted.
   */
  remove(hi: number, lo: number): void {
    const addressing = this.addressing;
    addressing.probe(hi, lo);
    const fp = addressing.fingerprint;
    if (this.clear(addressing.bucketA, fp) || this.clear(addressing.bucketB, fp)) {
      this.lastWrites = 1;
      this.occupied--;
      return;
    }
    throw new CkfError(
      "IndexerInvariantViolation",
      `fingerprint ${fp} is in neither bucket ${addressing.bucketA} nor ${addressing.bucketB}`,
    );
  }

  /** Whether either candidate bucket holds the key's fingerprint (false positives possible, no false negatives). */
  contains(hi: number, lo: number): boolean {
    return slotsHoldKey(this.addressing, this.slots, hi, lo);
  }

  /** The lane as little-endian u64 bucket words: a view of the slots' memory, not a copy. */
  words(): BigUint64Array {
    return new BigUint64Array(this.slots.buffer, this.slots.byteOffset, this.bucketCount);
  }

  /** Bucket `bucket` as its u64 wire word. */
  word(bucket: number): bigint {
    const s = this.slots;
    const i = bucket << 2;
    return (BigInt(((s[i + 3]! << 16) | s[i + 2]!) >>> 0) << 32n) | BigInt(((s[i + 1]! << 16) | s[i]!) >>> 0);
  }

  /** Replaces the whole lane with `words` (a snapshot), for mirrors and diagnostics. */
  loadWords(words: BigUint64Array): void {
    if (words.length !== this.bucketCount) {
      throw new CkfError("InvalidIdentity", `a snapshot of ${words.length} buckets does not fit a lane of ${this.bucketCount}`);
    }
    this.words().set(words);
    let occupied = 0;
    for (const slot of this.slots) if (slot !== 0) occupied++;
    this.occupied = occupied;
  }

  /** Non-empty slots. */
  occupiedSlots(): number {
    return this.occupied;
  }

  /** Buckets with at least one non-empty slot (a scan of the lane). */
  occupiedBuckets(): number {
    const s = this.slots;
    let n = 0;
    for (let i = 0; i < s.length; i += 4) if ((s[i]! | s[i + 1]! | s[i + 2]! | s[i + 3]!) !== 0) n++;
    return n;
  }

  /** Bytes of slot memory (8 per bucket). */
  get byteLength(): number {
    return this.slots.byteLength;
  }

  /** Writes fp to the lowest empty slot of `bucket`, if there is one. */
  private place(bucket: number, fp: number): boolean {
    const s = this.slots;
    let i = bucket << 2;
    if (s[i] !== 0) {
      i++;
      if (s[i] !== 0) {
        i++;
        if (s[i] !== 0) {
          i++;
          if (s[i] !== 0) return false;
        }
      }
    }
    this.observer?.beforeWrite(bucket);
    s[i] = fp;
    return true;
  }

  /** Empties the first slot of `bucket` holding fp, if there is one. */
  private clear(bucket: number, fp: number): boolean {
    const s = this.slots;
    const base = bucket << 2;
    for (let i = base; i < base + 4; i++) {
      if (s[i] === fp) {
        this.observer?.beforeWrite(bucket);
        s[i] = 0;
        return true;
      }
    }
    return false;
  }
}
