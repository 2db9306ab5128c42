/**
 * A copy of a lane as it was at one instant, made in steps while the lane
 * goes on changing (copy-on-write): a bucket about to be written before the
 * copy reached it is saved first, with the value it had, so that the copy
 * ends exactly the lane of that instant. Copying a 2^24-bucket lane (128 MiB)
 * in one call holds the event loop for about half a second; in steps of a
 * few megabytes, each turn holds it for milliseconds.
 *
 * The state installs the copy as a write observer of its lane (beside the
 * dirty window) until the copy is done or cancelled.
 */
import type { CkfWriteObserver } from "./lane.js";

export class BarrierCopy implements CkfWriteObserver {
  /** The copy: complete once `done`. */
  readonly words: BigUint64Array;
  private readonly target: Uint32Array;
  private readonly source: Uint32Array;
  private readonly live: BigUint64Array;
  /** One bit per bucket saved ahead of the cursor. */
  private readonly saved: Uint32Array;
  private cursor = 0;
  private finished = false;

  /**
   * @param slots the lane's slots (four per bucket), read as it changes.
   * @param onDone called once, when the last step completes the copy.
   */
  constructor(
    slots: Uint16Array,
    private readonly onDone: () => void,
  ) {
    const buckets = slots.length >>> 2;
    this.live = new BigUint64Array(slots.buffer, slots.byteOffset, buckets);
    this.source = new Uint32Array(slots.buffer, slots.byteOffset, buckets * 2);
    // A fresh array: its pages are zero until written, so it costs nothing up front.
    this.words = new BigUint64Array(buckets);
    this.target = new Uint32Array(this.words.buffer);
    this.saved = new Uint32Array(Math.ceil(buckets / 32));
  }

  /** Whether every bucket is copied. */
  get done(): boolean {
    return this.finished;
  }

  /** Buckets copied so far, in order (saved ones beyond it aside). */
  get copied(): number {
    return this.cursor;
  }

  /** The lane is about to write `bucket`: save its value first, unless the copy has it already. */
  beforeWrite(bucket: number): void {
    if (bucket < this.cursor || this.finished) return;
    const word = bucket >>> 5;
    const bit = 1 << (bucket & 31);
    const bits = this.saved[word]!;
    if ((bits & bit) !== 0) return;
    this.saved[word] = bits | bit;
    this.target[bucket * 2] = this.source[bucket * 2]!;
    this.target[bucket * 2 + 1] = this.source[bucket * 2 + 1]!;
  }

  /**
   * Copies up to `maxBuckets` more buckets (whole runs of 32, past the
   * saved ones); true once the copy is complete.
   */
  step(maxBuckets: number): boolean {
    if (this.finished) return true;
    const total = this.words.length;
    const end = Math.min(total, this.cursor + Math.max(32, maxBuckets));
    let at = this.cursor;
    while (at < end) {
      // A run of buckets with nothing saved goes in one copy.
      let runEnd = at;
      while (runEnd < end && this.saved[runEnd >>> 5] === 0) runEnd = Math.min(end, ((runEnd >>> 5) + 1) << 5);
      if (runEnd > at) {
        this.words.set(this.live.subarray(at, runEnd), at);
        at = runEnd;
        continue;
      }
      // A group of 32 with saved buckets: those keep their saved value.
      const bits = this.saved[at >>> 5]!;
      const groupEnd = Math.min(end, ((at >>> 5) + 1) << 5);
      for (let bucket = at; bucket < groupEnd; bucket++) {
        if ((bits & (1 << (bucket & 31))) !== 0) continue;
        this.target[bucket * 2] = this.source[bucket * 2]!;
        this.target[bucket * 2 + 1] = this.source[bucket * 2 + 1]!;
      }
      at = groupEnd;
    }
    this.cursor = end;
    if (end === total) {
      this.finished = true;
      this.onDone();
    }
    return this.finished;
  }
}
