/**
 * The dirty window between two publications (B.4 drain_publication): each
 * bucket written since the last drain, in first-dirtied order, with its value
 * from before that first write. Draining compares that value with the
 * bucket's current one, so a bucket whose writes cancelled out ("net
 * reverted") publishes nothing.
 *
 * Membership is a bitset over all buckets and the originals live in typed
 * arrays, so recording a write allocates nothing.
 */
import type { DcCkfImageColumns } from "./identity.js";
import type { CkfWriteObserver } from "./lane.js";

/** What one drain found. */
export interface DrainedWindow {
  /** Buckets whose value changed, in first-dirtied order, with their current words (none when not asked for). */
  readonly columns: DcCkfImageColumns | undefined;
  /** Buckets whose value changed (the columns' length when they were asked for). */
  readonly changed: number;
  /** Buckets that were written but ended where they started. */
  readonly netReverted: number;
}

export class DirtyWindow implements CkfWriteObserver {
  private readonly member: Uint32Array;
  /** The lane as two u32s per bucket (its word's low and high halves): a bucket is kept and compared in two steps, not four. */
  private readonly halves: Uint32Array;
  private order: Int32Array;
  /** Two u32s per entry of `order`: the bucket's halves before its first write. */
  private originals: Uint32Array;
  private count = 0;

  /** `slots`: a lane's slots, four u16s per bucket, starting on a 4-byte boundary (a lane's own buffer does). */
  constructor(slots: Uint16Array) {
    this.member = new Uint32Array(Math.ceil(slots.length / 4 / 32));
    this.halves = new Uint32Array(slots.buffer, slots.byteOffset, slots.length / 2);
    this.order = new Int32Array(64);
    this.originals = new Uint32Array(64 * 2);
  }

  beforeWrite(bucket: number): void {
    const word = bucket >>> 5;
    const bit = 1 << (bucket & 31);
    const bits = this.member[word]!;
    if ((bits & bit) !== 0) return;
    this.member[word] = bits | bit;
    if (this.count === this.order.length) this.grow();
    const at = this.count++;
    this.order[at] = bucket;
    const from = bucket << 1;
    const to = at << 1;
    const h = this.halves;
    const o = this.originals;
    o[to] = h[from]!;
    o[to + 1] = h[from + 1]!;
  }

  /** The membership word of `bucket`, read for its memory only (see CkfLane.peek). */
  peek(bucket: number): number {
    return this.member[bucket >>> 5]!;
  }

  /** Buckets in the window. */
  get size(): number {
    return this.count;
  }

  /** A point to roll the window back to (see `rollbackTo`). */
  mark(): number {
    return this.count;
  }

  /**
   * Forgets the buckets first dirtied after `mark`. A failed insert reports
   * its writes before undoing them; without this its buckets would sit in the
   * window unchanged and count as net reverted although nothing was published
   * or reverted.
   */
  rollbackTo(mark: number): void {
    for (let at = mark; at < this.count; at++) {
      this.unmark(this.order[at]!);
    }
    this.count = Math.min(this.count, mark);
  }

  /**
   * The changed buckets' images as columns, and an empty window. Each value
   * is copied as the bucket's two u32 halves (the same bytes as its u64
   * word), so draining makes no BigInt and no object per image. With
   * `images` false the window is emptied and counted without building them
   * (no consumer would read them).
   */
  drain(withImages = true): DrainedWindow {
    const count = this.count;
    // One ArrayBuffer for both columns (an allocation costs microseconds whatever its size, a view much less):
    // the buckets' u32s, then the values' u64s from the next multiple of 8 bytes.
    const valuesAt = (count * 4 + 7) & ~7;
    const memory = withImages ? new ArrayBuffer(valuesAt + count * 8) : undefined;
    const buckets = memory === undefined ? undefined : new Uint32Array(memory, 0, count);
    const values = memory === undefined ? undefined : new Uint32Array(memory, valuesAt, count * 2);
    let changed = 0;
    const h = this.halves;
    const o = this.originals;
    const order = this.order;
    let netReverted = 0;
    for (let at = 0; at < count; at++) {
      const bucket = order[at]!;
      this.unmark(bucket);
      const i = bucket << 1;
      const j = at << 1;
      const low = h[i]!;
      const high = h[i + 1]!;
      if (low === o[j] && high === o[j + 1]) {
        netReverted++;
        continue;
      }
      if (buckets !== undefined && values !== undefined) {
        buckets[changed] = bucket;
        const k = changed << 1;
        values[k] = low;
        values[k + 1] = high;
      }
      changed++;
    }
    this.count = 0;
    if (memory === undefined || buckets === undefined) return { columns: undefined, changed, netReverted };
    // A little-endian host (the lanes refuse any other): a bucket's two u32 halves, low first, are the bytes of its u64 word.
    const columns = { buckets: buckets.subarray(0, changed), values: new BigUint64Array(memory, valuesAt, changed) };
    return { columns, changed, netReverted };
  }

  /** Bytes held by the window's arrays. */
  get byteLength(): number {
    return this.member.byteLength + this.order.byteLength + this.originals.byteLength;
  }

  private unmark(bucket: number): void {
    const word = bucket >>> 5;
    this.member[word] = this.member[word]! & ~(1 << (bucket & 31));
  }

  private grow(): void {
    const order = new Int32Array(this.order.length * 2);
    order.set(this.order);
    const originals = new Uint32Array(this.originals.length * 2);
    originals.set(this.originals);
    this.order = order;
    this.originals = originals;
  }
}
