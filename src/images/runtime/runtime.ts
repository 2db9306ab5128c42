import { cloneRequest, type ImageRequest, type ImageResponse, type ProviderCapabilities } from "../contract/types.js";
import { validateCapabilities } from "../core/capabilities.js";
import { ImageError, toImageError } from "../core/errors.js";
import type { ProviderEventSink } from "../core/provider.js";
import { validateRequest, type RequestLimits } from "../core/validation.js";
import { AdmissionGate, type AdmissionLimits } from "./admission.js";
import type { ProviderRegistry, RegisteredProvider } from "./registry.js";

export interface ImageRuntimeOptions {
  readonly limits: RequestLimits;
  /** Applied when a request has no timeout_ms. */
  readonly defaultTimeoutMs: number;
  /** How long an interrupted provider gets to wind down. */
  readonly cancellationGraceMs: number;
  readonly globalAdmission: AdmissionLimits;
  /** Called once per request that reached a provider's breaker. */
  readonly onOutcome?: (outcome: RuntimeOutcome) => void;
}

export interface RuntimeOutcome {
  readonly provider: string;
  readonly generated: number;
  readonly failed: number;
  readonly error?: ImageError;
}

export interface ExecuteOptions {
  readonly requestId: string;
  /** Caller cancellation (client gone, gRPC deadline). */
  readonly signal: AbortSignal;
  readonly events?: ProviderEventSink;
}

const GRACE_EXPIRED = Symbol("grace-expired");
/** gRPC's DEADLINE_EXCEEDED, as carried by connect's abort reasons. */
const GRPC_DEADLINE_EXCEEDED = 4;

function isDeadline(reason: unknown, deadline: number): boolean {
  if (Date.now() >= deadline) return true;
  const shaped = reason as { name?: unknown; code?: unknown } | undefined;
  return shaped?.name === "TimeoutError" || shaped?.code === GRPC_DEADLINE_EXCEEDED;
}

function outputSetError(message: string): ImageError {
  return new ImageError("protocol", message);
}

/** The output set must be exactly 0..n, ascending, with failures only under best effort. */
export function checkOutputSet(request: ImageRequest, response: ImageResponse): void {
  const n = request.parameters.n;
  if (response.failures.length > 0 && request.parameters.failurePolicy !== "best_effort") {
    throw outputSetError("provider returned partial failures under fail-fast policy");
  }
  if (response.data.length + response.failures.length !== n) throw outputSetError("provider returned the wrong number of outputs");
  const indices = [...response.data.map((image) => image.index), ...response.failures.map((failure) => failure.index)];
  const sorted = [...indices].sort((a, b) => a - b);
  if (!sorted.every((index, position) => index === position)) throw outputSetError("provider returned an invalid output set");
  for (const list of [response.data, response.failures]) {
    for (let i = 1; i < list.length; i += 1) {
      if (list[i]!.index <= list[i - 1]!.index) throw outputSetError("provider outputs are not in ascending order");
    }
  }
}

/**
 * Runs image requests: intrinsic validation against the configured limits,
 * the global bulkhead, the provider's breaker and bulkhead, the deadline,
 * and the final checks of what the provider returned.
 */
export class ImageRuntime {
  private readonly globalGate: AdmissionGate;
  private readonly shutdownController = new AbortController();

  constructor(
    readonly registry: ProviderRegistry,
    private readonly options: ImageRuntimeOptions,
  ) {
    this.globalGate = new AdmissionGate("global", options.globalAdmission);
  }

  get globalQueueDepth(): number {
    return this.globalGate.queueDepth;
  }

  get limits(): RequestLimits {
    return this.options.limits;
  }

  async capabilities(provider?: string, model?: string): Promise<ProviderCapabilities> {
    const entry = this.registry.resolve(provider);
    const capabilities = await entry.provider.capabilities(model);
    this.checkIdentity(entry, capabilities);
    return capabilities;
  }

  private checkIdentity(entry: RegisteredProvider, capabilities: ProviderCapabilities): void {
    if (capabilities.provider !== entry.name) {
      throw new ImageError("protocol", "provider capabilities name a different provider", {
        provider: entry.name,
        details: { expected: entry.name, actual: capabilities.provider },
      });
    }
    validateCapabilities(capabilities);
  }

  /** Resolves the request's provider and the deadline it runs under. */
  prepare(request: ImageRequest): { entry: RegisteredProvider; deadline: number } {
    if (this.shutdownController.signal.aborted) throw new ImageError("cancelled", "runtime is shutting down");
    validateRequest(request, this.options.limits);
    const entry = this.registry.resolve(request.routing.provider);
    const deadline = Date.now() + (request.timeoutMs ?? this.options.defaultTimeoutMs);
    return { entry, deadline };
  }

  async execute(request: ImageRequest, options: ExecuteOptions): Promise<ImageResponse> {
    const started = performance.now();
    const { entry, deadline } = this.prepare(request);
    // One signal for caller cancellation, the deadline and shutdown.
    const operation = AbortSignal.any([
      options.signal,
      this.shutdownController.signal,
      AbortSignal.timeout(Math.max(0, deadline - Date.now())),
    ]);
    const globalPermit = await this.globalGate.acquire(operation, deadline);
    try {
      let breakerPermit;
      try {
        breakerPermit = entry.breaker.acquire();
      } catch (error) {
        this.options.onOutcome?.({ provider: entry.name, generated: 0, failed: request.parameters.n, error: toImageError(error) });
        throw error;
      }
      let outcome: ImageError | undefined;
      let dispatched = false;
      try {
        const queueStarted = performance.now();
        const providerPermit = await entry.gate.acquire(operation, deadline);
        const queueMs = Math.round(performance.now() - queueStarted);
        try {
          const capabilities = await entry.provider.capabilities(request.routing.model);
          this.checkIdentity(entry, capabilities);
          const routed = cloneRequest(request);
          routed.routing = { provider: entry.name, ...(request.routing.model !== undefined ? { model: request.routing.model } : {}) };
          const providerStarted = performance.now();
          dispatched = true;
          const response = await this.runProvider(entry, routed, operation, deadline, options);
          if (capabilities.model !== undefined && response.model !== capabilities.model) {
            throw new ImageError("protocol", "provider answered with a different model", {
              provider: entry.name,
              details: { expected: capabilities.model, actual: response.model },
            });
          }
          checkOutputSet({ ...routed, parameters: response.effective }, response);
          response.id = options.requestId;
          response.provider = entry.name;
          if (request.policies.revisedPrompt === "omit") delete response.revisedPrompt;
          if (request.responseFormat === "metadata") for (const image of response.data) delete image.data;
          response.timings = {
            ...response.timings,
            queueMs,
            providerMs: Math.round(performance.now() - providerStarted),
            totalMs: Math.round(performance.now() - started),
          };
          this.options.onOutcome?.({ provider: entry.name, generated: response.data.length, failed: response.failures.length });
          return response;
        } finally {
          providerPermit.release();
        }
      } catch (error) {
        outcome = toImageError(error);
        if (outcome.provider === undefined && outcome.code !== "invalid_request") outcome = outcome.withProvider(entry.name);
        this.options.onOutcome?.({ provider: entry.name, generated: 0, failed: request.parameters.n, error: outcome });
        throw outcome;
      } finally {
        const callerGone = outcome !== undefined && (outcome.code === "cancelled" || outcome.code === "timeout") && options.signal.aborted;
        // A wait for our own fan-out capacity that ended before any call went out.
        const neverSent = outcome !== undefined && outcome.details["stage"] === "capacity_wait" && outcome.details["outcome"] === undefined;
        if (callerGone || neverSent || (outcome !== undefined && !dispatched)) {
          // A caller that went away, or our own full queue, says nothing about the provider.
          breakerPermit.abandon();
        } else {
          breakerPermit.record(outcome?.code);
        }
      }
    } finally {
      globalPermit.release();
    }
  }

  /**
   * Calls the provider under the operation signal. An interrupted provider
   * gets the cancellation grace to finish; whatever it did is then unknown.
   */
  private async runProvider(
    entry: RegisteredProvider,
    request: ImageRequest,
    operation: AbortSignal,
    deadline: number,
    options: ExecuteOptions,
  ): Promise<ImageResponse> {
    const execution = entry.provider.execute(request, {
      requestId: options.requestId,
      deadline,
      signal: operation,
      ...(options.events ? { events: options.events } : {}),
    });
    let timer: ReturnType<typeof setTimeout> | undefined;
    let onAbort: (() => void) | undefined;
    const grace = new Promise<typeof GRACE_EXPIRED>((resolve) => {
      onAbort = () => {
        timer = setTimeout(() => resolve(GRACE_EXPIRED), this.options.cancellationGraceMs);
      };
      if (operation.aborted) onAbort();
      else operation.addEventListener("abort", onAbort, { once: true });
    });
    try {
      const result = await Promise.race([execution, grace]);
      if (result === GRACE_EXPIRED) throw this.interruption(operation, deadline);
      return result;
    } catch (error) {
      const failure = toImageError(error);
      if (failure.details["outcome"] !== undefined || failure.details["stage"] === "capacity_wait") throw failure;
      if (operation.aborted || failure.code === "timeout" || failure.code === "cancelled") {
        throw this.interruption(operation, deadline, failure);
      }
      throw failure;
    } finally {
      clearTimeout(timer);
      if (onAbort) operation.removeEventListener("abort", onAbort);
      execution.catch(() => undefined);
    }
  }

  private interruption(operation: AbortSignal, deadline: number, cause?: ImageError): ImageError {
    let base: ImageError;
    if (operation.aborted && this.shutdownController.signal.aborted) base = new ImageError("cancelled", "runtime is shutting down");
    else if (operation.aborted && isDeadline(operation.reason, deadline)) base = new ImageError("timeout", "the request deadline passed");
    else if (operation.aborted) base = new ImageError("cancelled", "the request was cancelled");
    else base = cause ?? new ImageError("internal", "the provider was interrupted");
    return base
      .withRetryable(false)
      .withDetail("outcome", "unknown")
      .withSuggestion("The provider may have produced images; do not blindly retry the same request.");
  }

  /** Stops admitting, cancels work in flight, and shuts every provider down. */
  async shutdown(): Promise<void> {
    if (this.shutdownController.signal.aborted) return;
    this.shutdownController.abort();
    this.globalGate.close();
    for (const entry of this.registry.list()) entry.gate.close();
    await Promise.allSettled(this.registry.list().map((entry) => entry.provider.shutdown()));
  }
}
