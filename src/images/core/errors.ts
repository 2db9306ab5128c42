import type { JsonValue } from "../contract/types.js";

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
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

/** Default recovery hints per code; later code may append more. */
const DEFAULT_SUGGESTIONS: Record<ErrorCode, readonly string[]> = {
  invalid_request: ["Fix the fields listed in details.issues and send the request again."],
  unsupported_capability: [
    "Call GetCapabilities for the provider and adjust the request, or set policies.compatibility to normalize.",
  ],
  configuration: ["Check the images section of the mmgate configuration (providers, fan-out limits)."],
  authentication: ["Check the provider API key environment variable named in images.providers[].api_key_env."],
  permission_denied: ["Use credentials that are allowed to call this provider."],
  safety_rejected: ["Revise the prompt or inputs; the same request will be refused again."],
  rate_limited: ["Wait for details.retry_after_ms before retrying, or lower the request rate."],
  overloaded: [
    "Retry after details.retry_after_ms, or raise images.admission / images.circuit_breaker limits.",
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
};

export interface ImageErrorInit {
  retryable?: boolean;
  provider?: string;
  upstreamRequestId?: string;
  details?: Record<string, JsonValue>;
  suggestions?: readonly string[];
}

/**
 * The public, redaction-safe error of the image API. Instances are treated
 * as values: the `with*` methods return changed copies.
 */
export class ImageError extends Error {
  readonly code: ErrorCode;
  readonly retryable: boolean;
  readonly provider: string | undefined;
  readonly upstreamRequestId: string | undefined;
  readonly details: Readonly<Record<string, JsonValue>>;
  readonly suggestions: readonly string[];

  constructor(code: ErrorCode, message: string, init: ImageErrorInit = {}) {
    super(message);
    this.name = "ImageError";
    this.code = code;
    this.retryable = init.retryable ?? false;
    this.provider = init.provider;
    this.upstreamRequestId = init.upstreamRequestId;
    this.details = { ...init.details };
    this.suggestions = init.suggestions ?? DEFAULT_SUGGESTIONS[code];
  }

  private copy(change: ImageErrorInit): ImageError {
    const init: ImageErrorInit = {
      retryable: this.retryable,
      details: { ...this.details },
      suggestions: this.suggestions,
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

export function isImageError(value: unknown): value is ImageError {
  return value instanceof ImageError;
}

/** Turns anything thrown into an ImageError without leaking its text. */
export function toImageError(value: unknown, fallbackMessage = "unexpected failure"): ImageError {
  if (value instanceof ImageError) return value;
  if (value instanceof Error && value.name === "AbortError") {
    return new ImageError("cancelled", "the operation was cancelled");
  }
  return new ImageError("internal", fallbackMessage);
}

/** Error codes that count as failures for the circuit breaker. */
export function isBreakerFailure(code: ErrorCode): boolean {
  return code === "rate_limited" || code === "overloaded" || code === "timeout" || code === "upstream" || code === "protocol";
}
