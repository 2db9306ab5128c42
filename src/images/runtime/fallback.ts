import type { FallbackPolicy, ImageRequest, ImageResponse, JsonValue, ProviderAttempt } from "../model.js";
import { ImageError, toImageError, type ErrorCode } from "../core/errors.js";
import type { ProviderEventSink } from "../core/provider.js";
import { validationError } from "../core/validation.js";
import type { ExecuteOptions, ImageRuntime, PreparedRequest } from "./runtime.js";
import { inSpan } from "../../telemetry/index.js";

/**
 * Provider fallback (`routing.fallbacks`): the primary route, then each
 * fallback in order, each run through the runtime as its own request
 * (breaker, provider bulkhead, negotiation, output checks) under one
 * shared deadline. A route is left for the next only when the failure
 * says that route could not take the request (`shouldFallback`).
 */

/** Codes that fall back under both policies: the route refused the request without running it. */
const UNAVAILABLE: ReadonlySet<ErrorCode> = new Set([
  "configuration",
  "authentication",
  "unsupported_capability",
  "rate_limited",
  "overloaded",
]);
/** Codes that also fall back under `on_error`: definite failures of the route. */
const ROUTE_ERRORS: ReadonlySet<ErrorCode> = new Set(["upstream", "protocol", "input", "artifact", "internal"]);

/**
 * Whether a failed route may be followed by the next one. Never when the
 * error carries an outcome (`unknown`: the provider may have produced, and
 * billed, images; `completed_unreplayable`), and never for timeouts,
 * cancellation, invalid requests, safety, permission, session or
 * idempotency failures.
 */
export function shouldFallback(error: ImageError, policy: FallbackPolicy): boolean {
  if (error.details["outcome"] !== undefined) return false;
  if (UNAVAILABLE.has(error.code)) return true;
  return policy === "on_error" && ROUTE_ERRORS.has(error.code);
}

export interface Route {
  readonly provider: string;
  readonly model?: string;
}

/** A validated request with its resolved routes: the primary first. */
export interface RoutedRequest {
  readonly request: ImageRequest;
  /** The primary route, prepared (validation, provider, deadline). */
  readonly primary: PreparedRequest;
  readonly routes: readonly Route[];
  /** Whether the request named fallbacks: then attempts are reported. */
  readonly withFallbacks: boolean;
}

const routeKey = (route: Route) => JSON.stringify([route.provider, route.model ?? null]);

/**
 * Validates the request (runtime.prepare) and resolves every route before
 * anything runs: an unregistered fallback is `configuration` naming its
 * field, like an unregistered routing.provider, and a fallback that resolves
 * to the primary route (an implicit default provider) is `invalid_request`.
 */
export function prepareRoutes(runtime: ImageRuntime, request: ImageRequest): RoutedRequest {
  const fallbacks = request.routing.fallbacks ?? [];
  // Providers are told only their own route.
  const routed: ImageRequest = { ...request, routing: { ...request.routing } };
  delete routed.routing.fallbacks;
  delete routed.routing.fallbackPolicy;
  // Validation sees the full routing (the fallback rules); the routed copy runs.
  const primary: PreparedRequest = { ...runtime.prepare(request), request: routed };
  const primaryRoute: Route = { provider: primary.entry.name, ...(request.routing.model !== undefined ? { model: request.routing.model } : {}) };
  const routes: Route[] = [primaryRoute];
  const seen = new Set([routeKey(primaryRoute)]);
  fallbacks.forEach((fallback, i) => {
    try {
      runtime.registry.resolve(fallback.provider);
    } catch (error) {
      const failure = toImageError(error);
      throw failure.withDetail("field", `routing.fallbacks[${i}].provider`);
    }
    const route: Route = { provider: fallback.provider, ...(fallback.model !== undefined ? { model: fallback.model } : {}) };
    if (seen.has(routeKey(route))) {
      throw validationError([
        { field: `routing.fallbacks[${i}]`, code: "duplicate", message: "resolves to the primary route or an earlier fallback" },
      ]);
    }
    seen.add(routeKey(route));
    routes.push(route);
  });
  return { request: routed, primary, routes, withFallbacks: fallbacks.length > 0 };
}

function attemptJson(attempt: ProviderAttempt): JsonValue {
  const out: Record<string, JsonValue> = { provider: attempt.provider, outcome: attempt.outcome, duration_ms: attempt.durationMs };
  if (attempt.model !== undefined) out["model"] = attempt.model;
  if (attempt.errorCode !== undefined) out["error_code"] = attempt.errorCode;
  return out;
}

function attemptAttributes(provider: string, index: number): Record<string, string | number | boolean> {
  return { "mmgate.images.provider": provider, "mmgate.images.attempt": index + 1, "mmgate.images.fallback": index > 0 };
}

/**
 * Runs the routes in order. With a streaming sink, a route that forwarded
 * any event is final: the caller has seen its progress, so another
 * provider's output would not belong to the same stream.
 */
export async function runRoutes(
  runtime: ImageRuntime,
  routed: RoutedRequest,
  policy: FallbackPolicy,
  options: ExecuteOptions,
): Promise<ImageResponse> {
  if (!routed.withFallbacks) return inSpan("images.attempt", attemptAttributes(routed.primary.entry.name, 0), () => runtime.run(routed.primary, options));
  const attempts: ProviderAttempt[] = [];
  const deadline = routed.primary.deadline;
  for (let i = 0; i < routed.routes.length; i += 1) {
    const route = routed.routes[i]!;
    let streamed = false;
    const sink = options.events;
    const events: ProviderEventSink | undefined = sink
      ? (event) => {
          streamed = true;
          return sink(event);
        }
      : undefined;
    const prepared: PreparedRequest =
      i === 0
        ? routed.primary
        : {
            request: { ...routed.request, routing: { provider: route.provider, ...(route.model !== undefined ? { model: route.model } : {}) } },
            entry: runtime.registry.resolve(route.provider),
            deadline,
          };
    const started = performance.now();
    try {
      // A span per provider call (tracing on): which route, which attempt, whether it is a fallback.
      const response = await inSpan("images.attempt", attemptAttributes(prepared.entry.name, i), () => runtime.run(prepared, { ...options, ...(events ? { events } : {}) }));
      attempts.push({ ...route, outcome: "succeeded", durationMs: Math.round(performance.now() - started) });
      if (i > 0) {
        response.normalizations = [
          ...response.normalizations,
          { field: "routing.provider", requested: routed.routes[0]!.provider, effective: route.provider, reason: "provider_fallback" },
        ];
        response.warnings = [...new Set([...response.warnings, "provider_fallback_used"])].sort();
      }
      response.attempts = attempts;
      return response;
    } catch (error) {
      const failure = toImageError(error);
      attempts.push({ ...route, outcome: "failed", errorCode: failure.code, durationMs: Math.round(performance.now() - started) });
      const last = i === routed.routes.length - 1;
      if (last || streamed || options.signal.aborted || !shouldFallback(failure, policy)) {
        throw failure.withDetail("attempts", attempts.map(attemptJson));
      }
    }
  }
  throw new ImageError("internal", "no route was tried");
}
