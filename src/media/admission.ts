import type { Permit, Semaphore } from "../util/index.js";
import { MediaError } from "./errors.js";

/** The pipeline stages that run under a bounded number of slots. */
export type MediaStage = "decode" | "fetch";

export const MEDIA_STAGES: readonly MediaStage[] = ["decode", "fetch"];

/** What a stage is doing right now (read by the metrics at scrape time). */
export interface MediaStageLoad {
  /** Operations holding a slot. */
  readonly inFlight: number;
  /** Operations waiting for a slot. */
  readonly queued: number;
  /** The most operations allowed to wait; beyond it calls are refused. */
  readonly maxQueued: number;
}

/**
 * A bulkhead for one pipeline stage: at most `slots.size` operations run,
 * at most `maxQueued` wait for a slot (0: none), and a call beyond that is
 * refused at once with OVERLOADED (RESOURCE_EXHAUSTED, retry-after) instead
 * of waiting until its deadline. Waiters still end on their caller's
 * cancellation or deadline, which leaves their place in the queue free.
 */
export class MediaAdmission implements MediaStageLoad {
  constructor(
    readonly stage: MediaStage,
    private readonly slots: Semaphore,
    readonly maxQueued: number,
    private readonly onRejected?: (stage: MediaStage) => void,
  ) {
    if (!(Number.isInteger(maxQueued) && maxQueued >= 0)) throw new RangeError(`maxQueued of ${stage} must be a whole number >= 0`);
  }

  get inFlight(): number {
    return this.slots.inUse;
  }

  get queued(): number {
    return this.slots.waiting;
  }

  /** Takes a slot, waits for one in the bounded queue, or throws OVERLOADED. */
  private async acquire(signal: AbortSignal): Promise<Permit> {
    signal.throwIfAborted();
    const free = this.slots.inUse < this.slots.size && this.slots.waiting === 0;
    if (!free && this.slots.waiting >= this.maxQueued) {
      this.onRejected?.(this.stage);
      throw new MediaError(
        "OVERLOADED",
        `media ${this.stage} is overloaded: all ${this.slots.size} slots are busy and ${this.slots.waiting} calls are waiting (the limit); retry later`,
        BigInt(this.maxQueued),
        BigInt(this.slots.waiting + 1),
      );
    }
    try {
      return await this.slots.acquire(signal);
    } catch (error) {
      // A wait the caller ended (cancellation, deadline) ends with their reason.
      signal.throwIfAborted();
      throw error;
    }
  }

  /** Runs `work` holding a slot of this stage. */
  async run<T>(signal: AbortSignal, work: () => Promise<T>): Promise<T> {
    const permit = await this.acquire(signal);
    try {
      return await work();
    } finally {
      permit.release();
    }
  }
}
