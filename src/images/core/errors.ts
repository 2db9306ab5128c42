import type { JsonValue } from "../model.js";

/** The stable error codes of the image API. */
export const ERROR_CODES = [
  "invalid_request",
  "unsupported_capability",
  "configuration",
  "authentication",
  "permission_denied",
  "safety_rejected",
  "rate_limited",
  "overloaded",
  "timeout",
  "cancelled",
  "upstream",
  "protocol",
  "input",
  "artifact",
  "session",
  "idempotency_conflict",
  "internal",
  "quota_exceeded",
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

/** Default recovery hints per code; later code may append more. */
const DEFAULT_SUGGESTIONS: Record<ErrorCode, readonly string[]> = {
  invalid_request: ["Fix the fields listed in details.issues and send the request again."],
  unsupported_capability: [
    "Call GetCapabilities for the provider and adjust the request, or set policies.compatibility to normalize.",
  ],
  configuration: ["Check the images section of the mmgate configuration (images.reference, images.openai, images.fanout)."],
  authentication: ["Check the API key environment variable named in images.openai[].apiKeyEnv."],
  permission_denied: ["Use credentials that are allowed to call this provider."],
  safety_rejected: ["Revise the prompt or inputs; the same request will be refused again."],
  rate_limited: ["Wait for details.retry_after_ms before retrying, or lower the request rate."],
  overloaded: [
    "Retry after details.retry_after_ms, or raise images.admission.global / images.admission.perProvider, or tune images.circuitBreaker.",
  ],
  timeout: ["Raise timeout_ms or reduce parameters.n; check the provider's latency."],
  cancelled: ["The caller or the server cancelled the request; send it again if still needed."],
  upstream: ["The provider failed; retry later or use another provider."],
  protocol: ["The provider broke the contract; report it with the request id."],
  input: ["Check the input images (format, size, count)."],
  artifact: ["The output could not be verified; retry or report it with the request id."],
  session: ["Check session.key or session.thread_id; the session may have expired."],
  idempotency_conflict: ["Use a new idempotency_key for a different request."],
  internal: ["Report the failure with the request id."],
  quota_exceeded: [
    "Wait the retry-after seconds (details.retry_after_ms) before retrying and spread requests out, or ask the operator for higher limits on this key.",
  ],
};

export interface ImageErrorInit {
  retryable?: boolean;
  provider?: string;
  upstreamRequestId?: string;
  details?: Record<string, JsonValue>;
  suggestions?: readonly string[];
  /** What was thrown originally, for logs; never sent to clients. */
  cause?: unknown;
}

/**
 * The details every `safety_rejected` error carries. The category and the
 * recovery hint are defaults a provider may refine; the two flags are fixed:
 * the unchanged request is refused again, and no safety control was relaxed.
 */
export const SAFETY_DETAIL_DEFAULTS: Readonly<Record<string, JsonValue>> = {
  safety_category: "content_policy",
  recovery: "revise_prompt_or_inputs",
};
const SAFETY_DETAIL_FIXED: Readonly<Record<string, JsonValue>> = {
  retry_same_request: false,
  safety_controls_relaxed: false,
};

/** The details as constructed: safety refusals get their four safety details. */
function detailsFor(code: ErrorCode, details: Record<string, JsonValue> | undefined): Record<string, JsonValue> {
  const out: Record<string, JsonValue> = { ...details };
  if (code === "safety_rejected") {
    for (const [key, value] of Object.entries(SAFETY_DETAIL_DEFAULTS)) {
      if (typeof out[key] !== "string" || out[key] === "") out[key] = value;
    }
    Object.assign(out, SAFETY_DETAIL_FIXED);
  }
  return out;
}

/**
 * Whether a retry of the unchanged request may succeed. Never for an unknown
 * outcome (the provider may have produced images) or a safety refusal (it
 * is refused again), whatever the provider said.
 */
function retryableFor(code: ErrorCode, requested: boolean, details: Readonly<Record<string, JsonValue>>): boolean {
  if (code === "safety_rejected" || details["outcome"] === "unknown") return false;
  return requested;
}

/**
 * The public, redaction-safe error of the image API. Instances are values:
 * `details` is frozen and the `with*` methods return changed copies. The
 * invariants of the contract hold for every error, whoever builds it: an
 * unknown outcome or a safety refusal is never retryable, and a safety
 * refusal always carries its safety details.
 */
export class ImageError extends Error {
  readonly code: ErrorCode;
  readonly retryable: boolean;
  readonly provider: string | undefined;
  readonly upstreamRequestId: string | undefined;
  readonly details: Readonly<Record<string, JsonValue>>;
  readonly suggestions: readonly string[];

  constructor(code: ErrorCode, message: string, init: ImageErrorInit = {}) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = "ImageError";
    this.code = code;
    this.provider = init.provider;
    this.upstreamRequestId = init.upstreamRequestId;
    this.details = Object.freeze(detailsFor(code, init.details));
    this.retryable = retryableFor(code, init.retryable ?? false, this.details);
    this.suggestions = init.suggestions ?? DEFAULT_SUGGESTIONS[code];
  }

  private copy(change: ImageErrorInit): ImageError {
    const init: ImageErrorInit = {
      retryable: this.retryable,
      details: { ...this.details },
      suggestions: this.suggestions,
      cause: this.cause,
      ...change,
    };
    if (this.provider !== undefined && init.provider === undefined) init.provider = this.provider;
    if (this.upstreamRequestId !== undefined && init.upstreamRequestId === undefined) {
      init.upstreamRequestId = this.upstreamRequestId;
    }
    const copy = new ImageError(this.code, this.message, init);
    if (this.stack !== undefined) copy.stack = this.stack;
    return copy;
  }

  withDetail(key: string, value: JsonValue): ImageError {
    return this.copy({ details: { ...this.details, [key]: value } });
  }

  withRetryable(retryable: boolean): ImageError {
    return this.copy({ retryable });
  }

  withProvider(provider: string): ImageError {
    return this.copy({ provider });
  }

  withSuggestion(suggestion: string): ImageError {
    if (this.suggestions.includes(suggestion)) return this;
    return this.copy({ suggestions: [...this.suggestions, suggestion] });
  }

  toJSON(): Record<string, JsonValue> {
    const out: Record<string, JsonValue> = { code: this.code, message: this.message, retryable: this.retryable };
    if (this.provider !== undefined) out["provider"] = this.provider;
    if (this.upstreamRequestId !== undefined) out["upstream_request_id"] = this.upstreamRequestId;
    if (Object.keys(this.details).length > 0) out["details"] = { ...this.details };
    if (this.suggestions.length > 0) out["suggestions"] = [...this.suggestions];
    return out;
  }
}

/**
 * Turns anything thrown into an ImageError without leaking its text to
 * clients: an abort is `cancelled`, anything else `internal` (the original
 * stays as the `cause`, for logs).
 */
export function toImageError(value: unknown): ImageError {
  if (value instanceof ImageError) return value;
  if (value instanceof Error && value.name === "AbortError") {
    return new ImageError("cancelled", "the operation was cancelled", { cause: value });
  }
  return new ImageError("internal", "unexpected failure", { cause: value });
}

/** Codes that say the provider is failing: they count against its circuit breaker. */
const PROVIDER_FAULTS: ReadonlySet<ErrorCode> = new Set(["rate_limited", "overloaded", "timeout", "upstream", "protocol"]);

/**
 * How a failed provider call counts for its circuit breaker: a provider
 * fault (`rate_limited`, `overloaded`, `timeout`, `upstream`, `protocol`),
 * or neutral (everything else says nothing about the provider's health).
 */
export function breakerVerdictOf(error: unknown): "failure" | "neutral" {
  return error instanceof ImageError && PROVIDER_FAULTS.has(error.code) ? "failure" : "neutral";
}
