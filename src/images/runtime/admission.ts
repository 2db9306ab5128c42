import { ImageError } from "../core/errors.js";
import { AcquireError, Semaphore, type Permit } from "../../util/index.js";

export interface AdmissionLimits {
  /** Simultaneous operations; undefined means unlimited. */
  readonly maxConcurrent?: number;
  /** Operations allowed to wait; undefined means unlimited, 0 means none. */
  readonly maxQueued?: number;
}

const UNLIMITED_PERMIT: Permit = { release: () => undefined };

/**
 * A bulkhead: at most `maxConcurrent` operations run, at most `maxQueued`
 * wait, and everything beyond is refused at once with `overloaded`.
 */
export class AdmissionGate {
  private readonly permits: Semaphore | undefined;
  private queued = 0;
  private closed = false;

  constructor(
    /** `global` or `provider:<name>`, reported as details.limit. */
    readonly label: string,
    private readonly limits: AdmissionLimits,
  ) {
    if (limits.maxConcurrent !== undefined && !(Number.isInteger(limits.maxConcurrent) && limits.maxConcurrent > 0)) {
      throw new ImageError("configuration", `admission limit ${label} needs maxConcurrent above 0`);
    }
    this.permits = limits.maxConcurrent === undefined ? undefined : new Semaphore(limits.maxConcurrent);
  }

  /** Operations waiting for a permit. */
  get queueDepth(): number {
    return this.queued;
  }

  get active(): number {
    return this.permits?.inUse ?? 0;
  }

  async acquire(signal: AbortSignal, deadline: number): Promise<Permit> {
    if (this.closed) throw new ImageError("cancelled", "runtime is shutting down");
    if (!this.permits) return UNLIMITED_PERMIT;
    const free = this.permits.inUse < this.permits.size && this.permits.waiting === 0;
    if (!free) {
      if (this.limits.maxQueued !== undefined && this.queued >= this.limits.maxQueued) {
        throw new ImageError("overloaded", "the admission queue is full", {
          retryable: true,
          details: { limit: this.label },
        });
      }
    }
    this.queued += free ? 0 : 1;
    try {
      return await this.permits.acquire(signal, deadline);
    } catch (error) {
      if (!(error instanceof AcquireError)) throw error;
      if (error.reason === "deadline") {
        throw new ImageError("timeout", "the request timed out waiting for admission", {
          retryable: true,
          details: { limit: this.label },
        });
      }
      if (error.reason === "closed") throw new ImageError("cancelled", "runtime is shutting down");
      throw new ImageError("cancelled", "the request was cancelled while waiting for admission");
    } finally {
      this.queued -= free ? 0 : 1;
    }
  }

  close(): void {
    this.closed = true;
    this.permits?.close();
  }
}
