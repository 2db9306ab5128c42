/**
 * A manual clock for code that takes its time source as a parameter: time
 * moves only in `advance`, and the timers set on it fire there, in order.
 */

interface Timer {
  readonly id: number;
  at: number;
  readonly fn: () => void;
  readonly repeatMs: number | undefined;
}

export class FakeClock {
  private time: number;
  private nextId = 1;
  private timers: Timer[] = [];

  constructor(startMs = 0) {
    this.time = startMs;
  }

  /** The current time in ms; bound, so it can be handed over as a `() => number`. */
  readonly now = (): number => this.time;

  /** Runs `fn` once the clock has advanced by `ms`. */
  setTimeout(fn: () => void, ms: number): number {
    return this.add(fn, ms, undefined);
  }

  /** Runs `fn` every `ms` of advanced time. */
  setInterval(fn: () => void, ms: number): number {
    if (!(ms > 0)) throw new RangeError("an interval must be above 0 ms");
    return this.add(fn, ms, ms);
  }

  clearTimeout(id: number | undefined): void {
    this.timers = this.timers.filter((t) => t.id !== id);
  }

  clearInterval(id: number | undefined): void {
    this.clearTimeout(id);
  }

  /** Timers not yet fired (or still repeating). */
  get pending(): number {
    return this.timers.length;
  }

  /**
   * Moves the clock forward by `ms`, firing every timer that comes due on
   * the way at its own time, earliest first (ties in the order they were set).
   */
  advance(ms: number): void {
    if (!(ms >= 0)) throw new RangeError("the clock only moves forward");
    const end = this.time + ms;
    for (;;) {
      const due = this.timers.filter((t) => t.at <= end).sort((a, b) => a.at - b.at || a.id - b.id)[0];
      if (!due) break;
      this.time = due.at;
      if (due.repeatMs === undefined) this.clearTimeout(due.id);
      else due.at += due.repeatMs;
      due.fn();
    }
    this.time = end;
  }

  private add(fn: () => void, ms: number, repeatMs: number | undefined): number {
    const id = this.nextId++;
    this.timers.push({ id, at: this.time + Math.max(0, ms), fn, repeatMs });
    return id;
  }
}
