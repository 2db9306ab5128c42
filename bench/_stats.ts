/** Statistics and round scheduling shared by the benchmarks. */

export function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 === 1 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

/**
 * A distribution-free 95 % confidence interval of the median: the order
 * statistics k and n - k + 1 with k = n/2 - 0.98 sqrt(n) (the normal
 * approximation of the binomial). Undefined below 9 values, where it would
 * be the whole range.
 */
export function medianInterval(values: number[]): [number, number] | undefined {
  const n = values.length;
  if (n < 9) return undefined;
  const s = [...values].sort((a, b) => a - b);
  const k = Math.max(1, Math.floor(n / 2 - 0.98 * Math.sqrt(n)));
  return [s[k - 1]!, s[n - k]!];
}

/** "min–max" */
export const spread = (xs: number[], digits: number) => `${Math.min(...xs).toFixed(digits)}–${Math.max(...xs).toFixed(digits)}`;

/** "median (min–max)" */
export const summary = (xs: number[], digits: number) => `${median(xs).toFixed(digits)} (${spread(xs, digits)})`;

/** Per-round ratios a[i] / b[i]. */
export const ratios = (a: number[], b: number[]) => a.map((t, i) => t / b[i]!);

/**
 * Times each contender once per round, in alternating order (forward on even
 * rounds, reversed on odd ones), after `warmup` untimed rounds. Returns the
 * milliseconds per round, per contender.
 */
export async function interleave(contenders: (() => unknown)[], rounds: number, warmup = 2): Promise<number[][]> {
  const times = contenders.map(() => [] as number[]);
  for (let round = -warmup; round < rounds; round++) {
    const order = contenders.map((_, i) => i);
    if (round % 2 !== 0) order.reverse();
    for (const i of order) {
      const t0 = performance.now();
      await contenders[i]!();
      if (round >= 0) times[i]!.push(performance.now() - t0);
    }
  }
  return times;
}
