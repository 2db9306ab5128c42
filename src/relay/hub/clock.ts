/** The hub's time source, a parameter so that tests move time by hand. */
export interface HubClock {
  /** Monotonic milliseconds. */
  now(): number;
  setInterval(fn: () => void, ms: number): unknown;
  clearInterval(handle: unknown): void;
}

/** Real time; the sweep timer is unref'd so an idle hub never holds the process open. */
export const SYSTEM_HUB_CLOCK: HubClock = Object.freeze({
  now: () => performance.now(),
  setInterval: (fn: () => void, ms: number): unknown => {
    const timer = setInterval(fn, ms);
    timer.unref();
    return timer;
  },
  clearInterval: (handle: unknown): void => clearInterval(handle as ReturnType<typeof setInterval>),
});
