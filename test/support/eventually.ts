/**
 * Retries an assertion until it passes: for conditions that become true
 * through work the test does not control (a log line, a counter, a closed
 * connection). The timeout is generous because it only bounds a failure;
 * it is never a claim about how fast anything is.
 */
import { setTimeout as sleep } from "node:timers/promises";

export interface EventuallyOptions {
  /** How long to keep trying before failing with the last error (5 s by default). */
  readonly timeoutMs?: number;
  /** Pause between attempts (10 ms by default). */
  readonly intervalMs?: number;
}

/** Calls `fn` until it returns (or resolves) without throwing, and returns its result. */
export async function eventually<T>(fn: () => T | Promise<T>, options: EventuallyOptions = {}): Promise<T> {
  const { timeoutMs = 5000, intervalMs = 10 } = options;
  const end = performance.now() + timeoutMs;
  for (;;) {
    try {
      return await fn();
    } catch (err) {
      if (performance.now() >= end) {
        if (err instanceof Error) err.message = `still failing after ${timeoutMs} ms: ${err.message}`;
        throw err;
      }
    }
    await sleep(intervalMs);
  }
}
