/**
 * A version counter that streams wait on: every change bumps it and wakes
 * every waiter; a waiter that was not waiting at the moment of a change sees
 * it from the version it last read, so no change between two waits is lost.
 */
export class ChangeFeed {
  private versionValue = 0n;
  private waiters: Array<() => void> = [];

  get version(): bigint {
    return this.versionValue;
  }

  /** Records a change and wakes every waiter. */
  bump(): void {
    this.versionValue += 1n;
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }

  /**
   * Resolves true once the version is past `seen` (at once if it already is),
   * false when `ms` pass first or the signal fires.
   */
  waitPast(seen: bigint, ms: number, signal: AbortSignal): Promise<boolean> {
    if (this.versionValue !== seen) return Promise.resolve(true);
    if (signal.aborted) return Promise.resolve(false);
    return new Promise((resolve) => {
      const done = (changed: boolean): void => {
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        const at = this.waiters.indexOf(wake);
        if (at >= 0) this.waiters.splice(at, 1);
        resolve(changed);
      };
      const wake = (): void => done(true);
      const onAbort = (): void => done(false);
      const timer = setTimeout(() => done(false), ms);
      signal.addEventListener("abort", onAbort, { once: true });
      this.waiters.push(wake);
    });
  }
}
