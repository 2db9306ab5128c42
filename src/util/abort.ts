/**
 * Yields from `source` until it ends or `signal` fires, whichever is first;
 * a wait for the next item does not hold the stop back. Used by handlers of
 * client-driven streams so that they end cleanly when the server drains.
 */
export async function* untilAborted<T>(source: AsyncIterable<T>, signal: AbortSignal): AsyncGenerator<T> {
  const iterator = source[Symbol.asyncIterator]();
  let onAbort: (() => void) | undefined;
  const aborted = new Promise<undefined>((resolve) => {
    onAbort = () => resolve(undefined);
    if (signal.aborted) resolve(undefined);
    else signal.addEventListener("abort", onAbort, { once: true });
  });
  try {
    for (;;) {
      const next = await Promise.race([iterator.next(), aborted]);
      if (next === undefined || next.done) return;
      yield next.value;
    }
  } finally {
    if (onAbort) signal.removeEventListener("abort", onAbort);
    void iterator.return?.()?.catch(() => undefined);
  }
}

/** Settles with `work`, or rejects with the signal's reason as soon as it fires. */
export function raceAbort<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason as Error);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason as Error);
    signal.addEventListener("abort", onAbort, { once: true });
    work.then(
      (value) => {
        signal.removeEventListener("abort", onAbort);
        resolve(value);
      },
      (error: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(error as Error);
      },
    );
  });
}

/**
 * Resolves after `ms`, or rejects with the signal's reason as soon as it
 * fires (the timer is cleared then). `ms` is clamped to what a Node timer
 * can hold.
 */
export function delay(ms: number, signal?: AbortSignal): Promise<void> {
  if (signal?.aborted) return Promise.reject(signal.reason as Error);
  return new Promise<void>((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason as Error);
    };
    const timer = setTimeout(
      () => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      },
      Math.min(Math.max(0, ms), MAX_TIMER_MS),
    );
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** The longest delay a Node timer holds (longer ones fire at once). */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Waits until `work` settles (either way) or `ms` pass, whichever is first;
 * true when it settled in time. Never rejects, and clears its timer, so a
 * grace period leaves nothing behind.
 */
export async function settleWithin(work: PromiseLike<unknown>, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const expired = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), Math.min(Math.max(0, ms), MAX_TIMER_MS));
  });
  try {
    return await Promise.race([
      Promise.resolve(work).then(
        () => true,
        () => true,
      ),
      expired,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** `value` as an Error: itself when it is one, else an Error with its text (a library that rejects with a string). */
export function errorOf(value: unknown): Error {
  return value instanceof Error ? value : new Error(String(value));
}

/** Resolves when `signal` fires (at once if it has), and drops its listener when `settled` settles. */
export function whenAborted(signal: AbortSignal, settled: Promise<unknown>): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const onAbort = () => resolve();
    signal.addEventListener("abort", onAbort, { once: true });
    void settled.finally(() => signal.removeEventListener("abort", onAbort));
  });
}

/** A signal that fires with the first of several, and the way to let go of them. */
export interface LinkedSignal {
  readonly signal: AbortSignal;
  /** Removes the listeners on the source signals and clears the timer; the signal stays as it is. */
  dispose(): void;
}

/**
 * Like `AbortSignal.any` (plus an optional timeout, whose reason is the
 * TimeoutError `AbortSignal.timeout` gives), for a call-scoped signal tied
 * to one that lives as long as the server (its drain or shutdown signal):
 * `AbortSignal.any` keeps memory on the long-lived signal for every call on
 * Node 20, and `AbortSignal.timeout` holds its timer until it fires. Call
 * `dispose` when the call ends.
 */
export function linkSignals(signals: readonly AbortSignal[], options: { timeoutMs?: number } = {}): LinkedSignal {
  const controller = new AbortController();
  const cleanups: (() => void)[] = [];
  const dispose = (): void => {
    for (const cleanup of cleanups.splice(0)) cleanup();
  };
  const abort = (reason: unknown): void => {
    dispose();
    controller.abort(reason);
  };
  for (const source of signals) {
    if (source.aborted) {
      abort(source.reason);
      return { signal: controller.signal, dispose };
    }
    const onAbort = (): void => abort(source.reason);
    source.addEventListener("abort", onAbort, { once: true });
    cleanups.push(() => source.removeEventListener("abort", onAbort));
  }
  if (options.timeoutMs !== undefined) {
    const timer = setTimeout(
      () => abort(new DOMException("The operation was aborted due to timeout", "TimeoutError")),
      Math.min(Math.max(0, options.timeoutMs), MAX_TIMER_MS),
    );
    timer.unref();
    cleanups.push(() => clearTimeout(timer));
  }
  return { signal: controller.signal, dispose };
}

/**
 * A call's stream that is cancelled when its reader stops early. Leaving a
 * `for await` over a connect client's stream (break, return, a throw) stops
 * reading but does not cancel the call: the HTTP/2 stream stays open, the
 * server goes on writing into it until flow control stops it, and the
 * session keeps it until the call's own end. Here `open` gets a signal that
 * also fires once the reader is done, however it left; a call that ended by
 * itself is unaffected.
 */
export async function* cancelledOnExit<T>(signal: AbortSignal | undefined, open: (signal: AbortSignal) => AsyncIterable<T>): AsyncGenerator<T, void, undefined> {
  const done = new AbortController();
  const link = linkSignals(signal === undefined ? [done.signal] : [signal, done.signal]);
  try {
    yield* open(link.signal);
  } finally {
    done.abort();
    link.dispose();
  }
}
