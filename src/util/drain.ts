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
