/** Why a permit wait ended without a permit. */
export type AcquireFailure = "closed" | "aborted" | "deadline";

export class AcquireError extends Error {
  constructor(readonly reason: AcquireFailure) {
    super(`permit wait ended: ${reason}`);
    this.name = "AcquireError";
  }
}

export interface Permit {
  /** Returns the permit; calling it twice is harmless. */
  release(): void;
}

interface Waiter {
  grant(permit: Permit): void;
  fail(reason: AcquireFailure): void;
}

function abortReason(signal: AbortSignal, deadline: number | undefined): AcquireFailure {
  const timedOut = (signal.reason as { name?: unknown } | undefined)?.name === "TimeoutError";
  return timedOut || (deadline !== undefined && Date.now() >= deadline) ? "deadline" : "aborted";
}

/**
 * A counting semaphore with FIFO waiters whose waits race closing,
 * cancellation and an absolute deadline.
 */
export class Semaphore {
  private available: number;
  private readonly waiters: Waiter[] = [];
  private closed = false;

  constructor(readonly size: number) {
    this.available = size;
  }

  get inUse(): number {
    return this.size - this.available;
  }

  get waiting(): number {
    return this.waiters.length;
  }

  /**
   * Waits for a permit until `signal` fires or `deadline` (epoch ms) passes.
   * A wait the signal ends at or after the deadline, or through a timeout
   * (AbortSignal.timeout), fails as "deadline": callers often fold their
   * deadline into the signal too, and which timer fires first is a race.
   */
  acquire(signal?: AbortSignal, deadline?: number): Promise<Permit> {
    if (this.closed) return Promise.reject(new AcquireError("closed"));
    if (signal?.aborted) return Promise.reject(new AcquireError(abortReason(signal, deadline)));
    if (this.available > 0 && this.waiters.length === 0) {
      this.available -= 1;
      return Promise.resolve(this.permit());
    }
    if (deadline !== undefined && deadline <= Date.now()) return Promise.reject(new AcquireError("deadline"));
    return new Promise<Permit>((resolve, reject) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const cleanup = (): void => {
        if (timer !== undefined) clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        const at = this.waiters.indexOf(waiter);
        if (at >= 0) this.waiters.splice(at, 1);
      };
      const waiter: Waiter = {
        grant: (permit) => {
          cleanup();
          resolve(permit);
        },
        fail: (reason) => {
          cleanup();
          reject(new AcquireError(reason));
        },
      };
      const onAbort = (): void => waiter.fail(abortReason(signal!, deadline));
      signal?.addEventListener("abort", onAbort, { once: true });
      if (deadline !== undefined) timer = setTimeout(() => waiter.fail("deadline"), Math.max(0, deadline - Date.now()));
      this.waiters.push(waiter);
    });
  }

  /** Fails every waiter and every later acquire; held permits stay valid. */
  close(): void {
    this.closed = true;
    for (const waiter of [...this.waiters]) waiter.fail("closed");
  }

  private permit(): Permit {
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        const next = this.waiters.shift();
        if (next && !this.closed) next.grant(this.permit());
        else {
          if (next) next.fail("closed");
          this.available += 1;
        }
      },
    };
  }
}
