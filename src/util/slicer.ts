/**
 * Long synchronous work cut into slices, so that the event loop keeps
 * turning while it runs: health checks, subscriber streams and timers get a
 * turn between slices instead of waiting seconds for the work to end.
 *
 * The work counts what it does with `due(steps)`, which says when the slice
 * is spent: `sliceSteps` steps, or `sliceMs` milliseconds since the slice
 * began, whichever comes first. The caller then awaits `yieldTurn()`, which
 * resolves on a later turn of the event loop (setImmediate: pending I/O
 * callbacks and timers run first), and goes on in a fresh slice. A slice is
 * also over when its turn ends without a yield (the next piece of work that
 * counts steps starts a fresh one), so tasks that follow one another in one
 * turn share its budget rather than each taking a whole one.
 *
 * `exclusive(task)` runs tasks one at a time in submission order, each to
 * its end across its yields: work that must not interleave with other work
 * of its kind (the relay applies one ingest message, or one NATS message, at
 * a time) queues there, and the slices of one slicer never overlap.
 *
 * `finish(steps)` drives stepped work (a generator that yields where it may
 * pause) to its end, yielding the loop at each pause; without a pause it
 * answers at once, without a promise.
 */

/** How long a slice may run. */
export interface SliceBudget {
  /** Wall-clock milliseconds a slice may take before the work yields. */
  readonly sliceMs: number;
  /** Steps (blocks, events: whatever the work counts) a slice may take before it yields, however fast they are. */
  readonly sliceSteps: number;
}

export const DEFAULT_SLICE_BUDGET: SliceBudget = Object.freeze({ sliceMs: 5, sliceSteps: 4096 });

/**
 * The clock is read once every this many steps counted one at a time (and
 * at every other call): a step of the ingest path is a block, a fraction of
 * a microsecond, and reading the clock at each was a twentieth of the work.
 * A slice overruns sliceMs by at most this many steps' time.
 */
export const SLICE_CLOCK_STEPS = 8;

/** What a slicer has done since it was built. */
export interface SlicerStats {
  /** Times work yielded the event loop because its slice was spent. */
  readonly yields: number;
  /** Tasks that ran through `exclusive`. */
  readonly tasks: number;
  /** Tasks waiting for their turn now (the one running not counted). */
  readonly waiting: number;
  /**
   * The longest slice so far, in ms: from the first step counted in a turn
   * to the yield (or the end of the task) that ended it. What the work
   * itself held the loop for, apart from whatever else shared the turn.
   */
  readonly longestSliceMs: number;
}

const noop = (): void => undefined;

export class WorkSlicer {
  readonly budget: SliceBudget;
  private tail: Promise<void> = Promise.resolve();
  private open = false;
  private started = 0;
  private steps = 0;
  /** The step count from which a one-step call reads the clock again (SLICE_CLOCK_STEPS). */
  private nextClock = 0;
  private yields = 0;
  private tasks = 0;
  private longest = 0;
  private queued = 0;
  /** Counts slices, so that a closer scheduled for one never closes a later one. */
  private slice = 0;

  constructor(budget: Partial<SliceBudget> = {}) {
    const sliceMs = budget.sliceMs ?? DEFAULT_SLICE_BUDGET.sliceMs;
    const sliceSteps = budget.sliceSteps ?? DEFAULT_SLICE_BUDGET.sliceSteps;
    if (!(sliceMs > 0)) throw new RangeError(`sliceMs ${sliceMs} is not a positive number`);
    if (!(sliceSteps >= 1)) throw new RangeError(`sliceSteps ${sliceSteps} is not at least 1`);
    this.budget = Object.freeze({ sliceMs, sliceSteps });
  }

  /**
   * Counts `steps` steps done in the current slice (opening one when none is
   * open); true when the slice is spent and the caller should await
   * `yieldTurn()` before going on. A bound function: pass it as it is.
   */
  readonly due = (steps = 1): boolean => {
    if (!this.open) {
      this.open = true;
      this.started = performance.now();
      this.steps = 0;
      this.nextClock = 0;
      // The slice ends with this turn of the loop at the latest: at the check phase after it, or, when it
      // began in a check phase (a resumed task), at the next timers phase, before any new I/O is read.
      const slice = ++this.slice;
      const close = () => {
        if (this.slice === slice) this.open = false;
      };
      setImmediate(close);
      setTimeout(close, 0);
    }
    this.steps += steps;
    if (this.steps >= this.budget.sliceSteps) return true;
    if (steps === 1 && this.steps < this.nextClock) return false;
    this.nextClock = this.steps + SLICE_CLOCK_STEPS;
    return performance.now() - this.started >= this.budget.sliceMs;
  };

  /** Whether a slice is open: work counted steps in this turn of the loop. */
  get busy(): boolean {
    return this.open;
  }

  /** Ends the slice: resolves on a later turn of the event loop, after pending I/O callbacks and timers. */
  yieldTurn(): Promise<void> {
    this.yields += 1;
    this.endSlice();
    return new Promise<void>((resolve) => setImmediate(resolve));
  }

  /**
   * Runs stepped work to its end: each time the generator yields (it paused
   * because `due` said so), the loop gets a turn before the next step. The
   * value comes at once when the work never paused, as a promise otherwise.
   */
  finish<T>(steps: Generator<void, T, void>): T | Promise<T> {
    const first = steps.next();
    if (first.done === true) return first.value;
    return this.resume(steps);
  }

  /**
   * Runs `task` after every task submitted before it has settled: one at a
   * time, in submission order, each across all of its yields. A task that
   * rejects rejects its own promise only; the next one runs regardless.
   */
  exclusive<T>(task: () => T | Promise<T>): Promise<T> {
    this.queued += 1;
    const run = this.tail.then(async () => {
      this.queued -= 1;
      this.tasks += 1;
      try {
        return await task();
      } finally {
        this.endSlice();
      }
    });
    this.tail = run.then(noop, noop);
    return run;
  }

  stats(): SlicerStats {
    return { yields: this.yields, tasks: this.tasks, waiting: this.queued, longestSliceMs: this.longest };
  }

  /** Starts `longestSliceMs` over (a benchmark measuring one load after another). */
  resetLongestSlice(): void {
    this.longest = 0;
  }

  /** Notes how long the open slice has run (it may go on when a task ends without a yield; the longest counts). */
  private endSlice(): void {
    if (this.open) this.longest = Math.max(this.longest, performance.now() - this.started);
  }

  private async resume<T>(steps: Generator<void, T, void>): Promise<T> {
    for (;;) {
      await this.yieldTurn();
      const step = steps.next();
      if (step.done === true) return step.value;
    }
  }
}
