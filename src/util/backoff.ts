/**
 * The one bounded exponential backoff with jitter: between a relay consumer's
 * failed stream and its next subscription (contract C.3), a router's relay
 * streams, and a supervised task's restarts; and the interruptible wait that
 * spends it.
 *
 * Failure n (0-based, counted since the last success) waits a uniformly
 * random time in [max(min, top / 2), top], where top = min(max, min * 2^(n+1)):
 * never less than `minMs`, never more than `maxMs`, and spread so that the
 * consumers of one relay (or processes restarting at once) do not come back
 * in lockstep, at the cap too.
 */
import { MAX_TIMER_MS } from "./abort.js";

export interface BackoffOptions {
  /** The first wait (ms, default 100). */
  readonly minMs: number;
  /** The longest wait (ms, default 10,000). */
  readonly maxMs: number;
}

export const DEFAULT_BACKOFF: BackoffOptions = Object.freeze({ minMs: 100, maxMs: 10_000 });

/** Defaults filled in; RangeError unless 0 <= minMs <= maxMs <= the longest Node timer. */
export function backoffOptions(init: Partial<BackoffOptions> = {}): BackoffOptions {
  const minMs = init.minMs ?? DEFAULT_BACKOFF.minMs;
  const maxMs = init.maxMs ?? Math.max(DEFAULT_BACKOFF.maxMs, minMs);
  if (!Number.isFinite(minMs) || minMs < 0) throw new RangeError(`backoff minMs ${minMs} must be a finite number >= 0`);
  if (!Number.isFinite(maxMs) || maxMs < minMs || maxMs > MAX_TIMER_MS) {
    throw new RangeError(`backoff maxMs ${maxMs} must be in ${minMs}..${MAX_TIMER_MS}`);
  }
  return Object.freeze({ minMs, maxMs });
}

/** The wait after failure `attempt` (0-based); `random` returns [0, 1). */
export function backoffDelay(attempt: number, options: BackoffOptions, random: () => number = Math.random): number {
  const { minMs, maxMs } = options;
  // 2^attempt past 2^40 only ever hits the cap; keep the arithmetic finite.
  const top = Math.min(maxMs, minMs * 2 ** (Math.min(Math.max(0, attempt), 40) + 1));
  const bottom = Math.max(minMs, top / 2);
  return Math.round(bottom + random() * (top - bottom));
}

export type WaitEnd = "elapsed" | "woken" | "aborted";

/** A wait that ends after `ms`, when `wake()` is called, or when `signal` fires, whichever is first; it never rejects. */
export interface Wait {
  readonly done: Promise<WaitEnd>;
  wake(): void;
}

export function interruptibleWait(ms: number, signal: AbortSignal): Wait {
  let finish: (end: WaitEnd) => void = () => undefined;
  const done = new Promise<WaitEnd>((resolve) => {
    if (signal.aborted) {
      resolve("aborted");
      return;
    }
    const onAbort = () => finish("aborted");
    const timer = setTimeout(() => finish("elapsed"), Math.min(Math.max(0, ms), MAX_TIMER_MS));
    signal.addEventListener("abort", onAbort, { once: true });
    finish = (end) => {
      clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
      finish = () => undefined;
      resolve(end);
    };
  });
  return { done, wake: () => finish("woken") };
}
