export interface BoundedQueueOptions<T> {
  /** Most items queued at once (a positive integer). */
  maxItems: number;
  /** Most bytes queued at once, as counted by `sizeOf`; default Infinity. */
  maxBytes?: number;
  /** The byte size of an item (a non-negative finite number); default 0. */
  sizeOf?: (item: T) => number;
}

/** A producer waiting in push(), in a FIFO list that supports removal on abort. */
interface Producer<T> {
  item: T;
  size: number;
  resolve(accepted: boolean): void;
  reject(reason: unknown): void;
  signal: AbortSignal | undefined;
  onAbort: (() => void) | undefined;
  prev: Producer<T> | undefined;
  next: Producer<T> | undefined;
}

interface Consumer<T> {
  resolve(result: IteratorResult<T>): void;
  reject(reason: unknown): void;
  signal: AbortSignal | undefined;
  onAbort: (() => void) | undefined;
}

const INITIAL_SLOTS = 16;
/** When the queue empties, a ring grown past this many slots is given back. */
const RETAINED_SLOTS = 1024;

/**
 * A bounded queue with one consumer, bounded by item count and by bytes.
 *
 * - An item larger than `maxBytes` is accepted only into an empty queue, so
 *   that one oversize item cannot wedge the queue forever; while it is
 *   queued, nothing else is admitted.
 * - Producers waiting in push() are admitted strictly in FIFO order as room
 *   appears; tryPush() does not overtake them (it reports full while any
 *   producer waits).
 * - close() ends it gracefully: the reader drains what is queued, then the
 *   iteration ends; fail(error) is the same but the reader's next() then
 *   rejects with `error`. The first of them wins. Producers still waiting
 *   are released with false.
 * - Signals are listened to only while an operation waits.
 */
export class BoundedQueue<T> implements AsyncIterable<T> {
  private readonly maxItems: number;
  private readonly maxBytes: number;
  private readonly sizeOf: (item: T) => number;

  // The ring: `count` items from `head`, with their sizes as counted on entry.
  private slots: (T | undefined)[];
  private sizes: number[];
  private head = 0;
  private count = 0;
  private byteCount = 0;

  private first: Producer<T> | undefined;
  private last: Producer<T> | undefined;
  private consumer: Consumer<T> | undefined;

  private ended = false;
  private failure: { error: unknown } | undefined;

  constructor(options: BoundedQueueOptions<T>) {
    const { maxItems, maxBytes = Number.POSITIVE_INFINITY, sizeOf = () => 0 } = options;
    if (!Number.isSafeInteger(maxItems) || maxItems < 1) throw new RangeError(`maxItems ${maxItems} is not a positive integer`);
    if (!(maxBytes >= 0)) throw new RangeError(`maxBytes ${maxBytes} is not a non-negative number`);
    this.maxItems = maxItems;
    this.maxBytes = maxBytes;
    this.sizeOf = sizeOf;
    const slots = Math.min(maxItems, INITIAL_SLOTS);
    this.slots = new Array<T | undefined>(slots);
    this.sizes = new Array<number>(slots).fill(0);
  }

  /** Items queued (not counting those of producers still waiting). */
  get length(): number {
    return this.count;
  }

  /** Bytes queued, as counted by `sizeOf` when each item entered. */
  get bytes(): number {
    return this.byteCount;
  }

  /** True once close(), fail() or the end of an iteration has been called. */
  get closed(): boolean {
    return this.ended;
  }

  /** Queues `item` if there is room now; false when full (either bound), producers are waiting, or closed. */
  tryPush(item: T): boolean {
    if (this.ended || this.first !== undefined) return false;
    const size = this.measure(item);
    if (!this.fits(size)) return false;
    this.enqueue(item, size);
    this.pump();
    return true;
  }

  /**
   * Queues `item`, waiting for room behind earlier waiting producers.
   * Resolves true once queued, false if the queue is (or becomes) closed
   * first; rejects with `signal.reason` when the signal fires first.
   */
  push(item: T, signal?: AbortSignal): Promise<boolean> {
    if (signal?.aborted) return Promise.reject(signal.reason as Error);
    if (this.ended) return Promise.resolve(false);
    let size: number;
    try {
      size = this.measure(item);
    } catch (error) {
      return Promise.reject(error as Error);
    }
    if (this.first === undefined && this.fits(size)) {
      this.enqueue(item, size);
      this.pump();
      return Promise.resolve(true);
    }
    return new Promise<boolean>((resolve, reject) => {
      const producer: Producer<T> = { item, size, resolve, reject, signal, onAbort: undefined, prev: this.last, next: undefined };
      if (signal !== undefined) {
        producer.onAbort = () => {
          this.unlink(producer);
          reject(signal.reason as Error);
          // The producer behind it may fit where this one did not.
          this.pump();
        };
        signal.addEventListener("abort", producer.onAbort, { once: true });
      }
      if (this.last === undefined) this.first = producer;
      else this.last.next = producer;
      this.last = producer;
    });
  }

  /**
   * Conflating push: discards everything queued and queues `item` alone,
   * whatever its size (for "latest state only" streams). Producers waiting
   * in push() are settled as if their items had been queued and then
   * discarded: their push resolves true. False when closed.
   */
  replace(item: T): boolean {
    if (this.ended) return false;
    const size = this.measure(item);
    this.clearItems();
    for (let p = this.first; p !== undefined; p = this.first) {
      this.unlink(p);
      p.resolve(true);
    }
    this.enqueue(item, size);
    this.pump();
    return true;
  }

  /** No more pushes; the reader drains what is queued, then ends. Waiting producers get false. */
  close(): void {
    this.end(undefined);
  }

  /** Like close(), but once drained the reader's next() rejects with `error`. */
  fail(error: unknown): void {
    this.end({ error });
  }

  /**
   * The next item, waiting for one; done once closed and drained (rejects
   * with the fail() error instead, on every call, if the queue failed).
   * Rejects with `signal.reason` when the signal fires before an item comes;
   * an item already queued is handed out even if the signal has fired (the
   * signal stops a wait, it does not drop what arrived). One consumer: a
   * second next() while one waits is rejected.
   */
  next(signal?: AbortSignal): Promise<IteratorResult<T>> {
    if (this.consumer !== undefined) return Promise.reject(new Error("BoundedQueue has one consumer: next() is already waiting"));
    if (this.count > 0) {
      const value = this.dequeue();
      this.pump();
      return Promise.resolve({ value, done: false });
    }
    if (this.ended) return this.endResult();
    if (signal?.aborted) return Promise.reject(signal.reason as Error);
    return new Promise<IteratorResult<T>>((resolve, reject) => {
      const consumer: Consumer<T> = { resolve, reject, signal, onAbort: undefined };
      if (signal !== undefined) {
        consumer.onAbort = () => {
          if (this.consumer === consumer) this.consumer = undefined;
          reject(signal.reason as Error);
        };
        signal.addEventListener("abort", consumer.onAbort, { once: true });
      }
      this.consumer = consumer;
    });
  }

  /**
   * Iterates with next(). Ending the iteration early (break, return, throw
   * out of a for await) closes the queue, discards what is still queued and
   * releases waiting producers with false.
   */
  [Symbol.asyncIterator](): AsyncIterator<T> {
    return {
      next: () => this.next(),
      return: (value?: unknown) => {
        this.end(undefined);
        this.clearItems();
        return Promise.resolve({ value, done: true } as IteratorResult<T>);
      },
    };
  }

  private measure(item: T): number {
    const size = this.sizeOf(item);
    if (typeof size !== "number" || !(size >= 0) || size === Number.POSITIVE_INFINITY) {
      throw new RangeError(`sizeOf returned ${String(size)}, not a non-negative finite number`);
    }
    return size;
  }

  private fits(size: number): boolean {
    if (this.count === 0) return true;
    return this.count < this.maxItems && this.byteCount + size <= this.maxBytes;
  }

  private enqueue(item: T, size: number): void {
    if (this.count === this.slots.length) this.grow();
    const at = (this.head + this.count) % this.slots.length;
    this.slots[at] = item;
    this.sizes[at] = size;
    this.count += 1;
    this.byteCount += size;
  }

  private dequeue(): T {
    const item = this.slots[this.head] as T;
    this.slots[this.head] = undefined;
    this.byteCount -= this.sizes[this.head]!;
    this.head = (this.head + 1) % this.slots.length;
    this.count -= 1;
    if (this.count === 0) this.resetRing();
    return item;
  }

  private grow(): void {
    const capacity = Math.min(this.slots.length * 2, this.maxItems);
    const slots = new Array<T | undefined>(capacity);
    const sizes = new Array<number>(capacity).fill(0);
    for (let i = 0; i < this.count; i++) {
      const from = (this.head + i) % this.slots.length;
      slots[i] = this.slots[from];
      sizes[i] = this.sizes[from]!;
    }
    this.slots = slots;
    this.sizes = sizes;
    this.head = 0;
  }

  private clearItems(): void {
    for (let i = 0; i < this.count; i++) this.slots[(this.head + i) % this.slots.length] = undefined;
    this.count = 0;
    this.resetRing();
  }

  /** An empty ring starts again at slot 0, and gives back a large backing array. */
  private resetRing(): void {
    this.head = 0;
    this.byteCount = 0;
    if (this.slots.length > RETAINED_SLOTS) {
      const slots = Math.min(this.maxItems, INITIAL_SLOTS);
      this.slots = new Array<T | undefined>(slots);
      this.sizes = new Array<number>(slots).fill(0);
    }
  }

  private unlink(p: Producer<T>): void {
    if (p.prev === undefined) {
      if (this.first !== p) return; // already removed
      this.first = p.next;
    } else {
      p.prev.next = p.next;
    }
    if (p.next === undefined) this.last = p.prev;
    else p.next.prev = p.prev;
    p.prev = p.next = undefined;
    if (p.onAbort !== undefined) p.signal?.removeEventListener("abort", p.onAbort);
  }

  private end(failure: { error: unknown } | undefined): void {
    if (this.ended) return;
    this.ended = true;
    this.failure = failure;
    for (let p = this.first; p !== undefined; p = this.first) {
      this.unlink(p);
      p.resolve(false);
    }
    this.pump();
  }

  private endResult(): Promise<IteratorResult<T>> {
    if (this.failure !== undefined) return Promise.reject(this.failure.error as Error);
    return Promise.resolve({ value: undefined, done: true });
  }

  /** Admits waiting producers while they fit, and hands items (or the end) to a waiting consumer. */
  private pump(): void {
    for (;;) {
      while (this.first !== undefined && this.fits(this.first.size)) {
        const p = this.first;
        this.unlink(p);
        this.enqueue(p.item, p.size);
        p.resolve(true);
      }
      const consumer = this.consumer;
      if (consumer === undefined) return;
      if (this.count > 0) {
        this.releaseConsumer(consumer);
        consumer.resolve({ value: this.dequeue(), done: false });
        continue; // room appeared
      }
      if (this.ended) {
        this.releaseConsumer(consumer);
        if (this.failure !== undefined) consumer.reject(this.failure.error);
        else consumer.resolve({ value: undefined, done: true });
      }
      return;
    }
  }

  private releaseConsumer(consumer: Consumer<T>): void {
    this.consumer = undefined;
    if (consumer.onAbort !== undefined) consumer.signal?.removeEventListener("abort", consumer.onAbort);
  }
}
