/**
 * The image API's per-caller quotas: each call (Generate, GenerateStream,
 * an edit, the OpenAI-shaped routes, which make those calls) costs its
 * caller one request and n images, from the limits auth gave the caller
 * (`Caller.limits`, from the keys file or a certificate rule) or, for a
 * call no key names, `images.quotas.anonymous`. A call over either is
 * refused with `quota_exceeded` (RESOURCE_EXHAUSTED, `retry-after`) before
 * any provider work, and counted by caller label and limit.
 */
import type { Caller, CallerLabel, CallerLimits } from "../../server/index.js";
import { ImageError } from "../core/errors.js";
import { ratesOf, retryAfterSeconds, unlimited, type QuotaDecision, type QuotaLimit, type QuotaRates } from "./bucket.js";
import type { QuotaStore } from "./store.js";

/** The bucket of the calls no key or certificate names: no caller can have this name (it is reserved). */
export const ANONYMOUS_CALLER = "anonymous";

export interface ImageQuotasOptions {
  readonly store: QuotaStore;
  /** Limits of anonymous calls (`images.quotas.anonymous`). */
  readonly anonymous: CallerLimits;
  /** Told of each refusal: the caller's metric label and the bucket that refused. */
  readonly onRefused?: (label: string, limit: QuotaLimit) => void;
}

const UNITS: Readonly<Record<QuotaLimit, string>> = { requests: "requests per second", images: "images per minute" };

/** The limit a bucket stands for, as configured. */
function quotaOf(limits: CallerLimits, limit: QuotaLimit): number {
  return (limit === "requests" ? limits.requestsPerSecond : limits.imagesPerMinute) ?? 0;
}

/** The refusal of a call over its caller's quota; a request larger than a bucket is not retryable. */
export function quotaExceeded(caller: string, limits: CallerLimits, decision: Extract<QuotaDecision, { ok: false }>, images: number): ImageError {
  const { limit } = decision;
  const quota = quotaOf(limits, limit);
  const who = caller === ANONYMOUS_CALLER ? "anonymous callers are" : `caller ${caller} is`;
  const whose = caller === ANONYMOUS_CALLER ? "the anonymous callers'" : `caller ${caller}'s`;
  const details = { limit, caller, quota, ...(limit === "images" ? { requested: images } : {}) };
  if (decision.never) {
    return new ImageError("quota_exceeded", `this request asks for ${images} images, more than ${whose} quota of ${quota} ${UNITS[limit]} allows at once; ask for at most ${quota}`, {
      retryable: false,
      details,
      suggestions: [`Ask for at most ${quota} images per request, or ask the operator for a higher imagesPerMinute.`],
    });
  }
  const seconds = retryAfterSeconds(decision.waitMs);
  const asked = limit === "images" ? ` (this request asks for ${images})` : "";
  return new ImageError("quota_exceeded", `${who} over the quota of ${quota} ${UNITS[limit]}${asked}; retry in ${seconds} s`, {
    retryable: true,
    details: { ...details, retry_after_ms: decision.waitMs },
  });
}

export class ImageQuotas {
  private readonly anonymousRates: QuotaRates;

  constructor(private readonly options: ImageQuotasOptions) {
    this.anonymousRates = ratesOf(options.anonymous);
  }

  /**
   * Charges one request of `images` images to the caller (undefined:
   * anonymous); throws `quota_exceeded` when it is over either limit.
   * A caller without limits costs no lookup.
   */
  async charge(caller: Caller | undefined, label: CallerLabel, images: number): Promise<void> {
    const limits = caller === undefined ? this.options.anonymous : caller.limits;
    const rates = caller === undefined ? this.anonymousRates : ratesOf(limits);
    if (limits === undefined || unlimited(rates)) return;
    const name = caller?.name ?? ANONYMOUS_CALLER;
    const decision = await this.options.store.charge(name, rates, { requests: 1, images });
    if (decision.ok) return;
    this.options.onRefused?.(label(caller?.name), decision.limit);
    throw quotaExceeded(name, limits, decision, images);
  }
}
