/**
 * Token buckets as pure functions of a bucket's level and the time, so that
 * the memory store and the shared one decide alike and tests drive the
 * clock. A caller has up to two buckets: requests (refilled at
 * requestsPerSecond, holding one second's worth and at least one request)
 * and images (refilled at imagesPerMinute, holding one minute's worth; a
 * request costs its n). A call is charged to both or to neither.
 */
import type { CallerLimits } from "../../server/index.js";

/** How a bucket fills: at most `capacity` tokens (the burst), `perMs` tokens a millisecond. */
export interface BucketRate {
  readonly capacity: number;
  readonly perMs: number;
}

/** A bucket's tokens when it was last charged (`at`, ms since the epoch, by the clock of whoever charged it). */
export interface BucketLevel {
  readonly tokens: number;
  readonly at: number;
}

/** Which bucket refused: requests per second, or images per minute. */
export type QuotaLimit = "requests" | "images";

export const QUOTA_LIMITS: readonly QuotaLimit[] = ["requests", "images"];

/** The buckets a caller's limits give it; an absent one is unlimited. */
export type QuotaRates = Partial<Record<QuotaLimit, BucketRate>>;

/** A caller's buckets as last charged; a bucket never charged (or forgotten) is full. */
export type QuotaState = Partial<Record<QuotaLimit, BucketLevel>>;

/** What one call takes from each bucket. */
export type QuotaCost = Readonly<Record<QuotaLimit, number>>;

/**
 * A charge's outcome. Refused: the bucket that refused, and how long until
 * both buckets could take the call (`waitMs`), or `never` when the call
 * costs more than a bucket holds (n above imagesPerMinute).
 */
export type QuotaDecision =
  | { readonly ok: true; readonly state: QuotaState }
  | { readonly ok: false; readonly limit: QuotaLimit; readonly waitMs: number; readonly never: false }
  | { readonly ok: false; readonly limit: QuotaLimit; readonly never: true };

/**
 * Slack for floating point: a rate such as 1/60 per second refills a token
 * as 0.9999999999 of one, which must count as one, and a wait of
 * 60000.0000001 ms as 60 s.
 */
const EPSILON = 1e-9;

/** requestsPerSecond as a bucket: one second's worth, at least one request. */
export function requestsRate(perSecond: number): BucketRate {
  return { capacity: Math.max(1, perSecond), perMs: perSecond / 1000 };
}

/** imagesPerMinute as a bucket: one minute's worth. */
export function imagesRate(perMinute: number): BucketRate {
  return { capacity: perMinute, perMs: perMinute / 60_000 };
}

/** The buckets of a caller's limits; empty when it has none. */
export function ratesOf(limits: CallerLimits | undefined): QuotaRates {
  const rates: { requests?: BucketRate; images?: BucketRate } = {};
  if (limits?.requestsPerSecond !== undefined) rates.requests = requestsRate(limits.requestsPerSecond);
  if (limits?.imagesPerMinute !== undefined) rates.images = imagesRate(limits.imagesPerMinute);
  return rates;
}

export function unlimited(rates: QuotaRates): boolean {
  return rates.requests === undefined && rates.images === undefined;
}

/**
 * The tokens of a bucket at `now`: its level refilled for the time since,
 * at most its capacity (so a lowered limit applies at once). A level
 * written later than `now` (another replica's clock runs ahead) counts as
 * written now.
 */
export function tokensAt(level: BucketLevel | undefined, rate: BucketRate, now: number): number {
  if (level === undefined) return rate.capacity;
  const elapsed = Math.max(0, now - level.at);
  return Math.min(rate.capacity, Math.max(0, level.tokens) + elapsed * rate.perMs);
}

/** Whether a bucket is full at `now`: forgetting it changes nothing. */
export function isFull(level: BucketLevel | undefined, rate: BucketRate, now: number): boolean {
  return tokensAt(level, rate, now) + EPSILON >= rate.capacity;
}

type Take = { readonly ok: true; readonly level: BucketLevel } | { readonly ok: false; readonly waitMs: number; readonly never: boolean };

/** Takes `cost` tokens from one bucket, or says how long until it holds them (never, when it cannot). */
export function take(level: BucketLevel | undefined, rate: BucketRate, cost: number, now: number): Take {
  if (cost > rate.capacity + EPSILON) return { ok: false, waitMs: Infinity, never: true };
  const tokens = tokensAt(level, rate, now);
  if (tokens + EPSILON >= cost) return { ok: true, level: { tokens: Math.max(0, tokens - cost), at: now } };
  return { ok: false, waitMs: Math.max(1, Math.ceil((cost - tokens) / rate.perMs - EPSILON)), never: false };
}

/**
 * Charges a call to every bucket of `rates`, all or nothing. Refused, it
 * names the bucket that holds the call up longest (one that never can
 * first) and the wait until all of them could take it.
 */
export function charge(state: QuotaState | undefined, rates: QuotaRates, cost: QuotaCost, now: number): QuotaDecision {
  const next: { requests?: BucketLevel; images?: BucketLevel } = {};
  let refusal: { limit: QuotaLimit; waitMs: number; never: boolean } | undefined;
  for (const limit of QUOTA_LIMITS) {
    const rate = rates[limit];
    if (rate === undefined) continue;
    const taken = take(state?.[limit], rate, cost[limit], now);
    if (taken.ok) {
      next[limit] = taken.level;
    } else if (refusal === undefined || (taken.never && !refusal.never) || (taken.never === refusal.never && taken.waitMs > refusal.waitMs)) {
      refusal = { limit, waitMs: taken.waitMs, never: taken.never };
    }
  }
  if (refusal === undefined) return { ok: true, state: next };
  return refusal.never ? { ok: false, limit: refusal.limit, never: true } : { ok: false, limit: refusal.limit, waitMs: refusal.waitMs, never: false };
}

/** A wait as the retry-after header says it: whole seconds, rounded up, at least 1. */
export function retryAfterSeconds(waitMs: number): number {
  return Math.max(1, Math.ceil(waitMs / 1000 - EPSILON));
}
