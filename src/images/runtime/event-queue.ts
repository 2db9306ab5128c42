/**
 * A bounded single-consumer queue: `push` waits while the buffer is full, so
 * a slow reader slows the producer instead of growing memory.
 */
export class EventQueue<T> implements AsyncIterable<T> {
  private readonly items: T[] = [];
  private closed = false;
  private wakeReader: (() => void) | undefined;
  private readonly writers: (() => void)[] = [];

  constructor(private readonly capacity: number) {}

  async push(item: T): Promise<void> {
    while (!this.closed && this.items.length >= this.capacity) {
      await new Promise<void>((resolve) => this.writers.push(resolve));
    }
    if (this.closed) return;
    this.items.push(item);
    this.wakeReader?.();
  }

  /** Ends iteration once the buffer is drained; later pushes are dropped. */
  close(): void {
    this.closed = true;
    this.wakeReader?.();
    for (const writer of this.writers.splice(0)) writer();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    try {
      while (true) {
        const item = this.items.shift();
        if (item !== undefined) {
          this.writers.shift()?.();
          yield item;
          continue;
        }
        if (this.closed) return;
        await new Promise<void>((resolve) => {
          this.wakeReader = resolve;
        });
        this.wakeReader = undefined;
      }
    } finally {
      // The consumer went away: release any blocked producer.
      this.close();
    }
  }
}
