import type { GenerationParameters, ImageRequest, ImageResponse, ProviderCapabilities } from "../model.js";
import { ImageError, toImageError } from "../core/errors.js";
import type { ProviderEventSink } from "../core/provider.js";
import { validateRequest, type RequestLimits } from "../core/validation.js";
import type { FanoutPlan } from "../fanout/provider.js";
import { linkSignals, raceAbort, settleWithin } from "../../util/index.js";
import { AdmissionGate, type AdmissionLimits } from "./admission.js";
import type { BreakerAdmission } from "./circuit-breaker.js";
import type { ProviderRegistry, RegisteredProvider } from "./registry.js";

export interface ImageRuntimeOptions {
  readonly limits: RequestLimits;
  /** Applied when a request has no timeout_ms. */
  readonly defaultTimeoutMs: number;
  /** How long an interrupted provider gets to wind down. */
  readonly cancellationGraceMs: number;
  readonly globalAdmission: AdmissionLimits;
  /**
   * How long `shutdown` lets requests in flight finish before it aborts
   * them; 10 s when absent.
   */
  readonly shutdownGraceMs?: number;
  /** Called once per request that reached a provider's breaker. */
  readonly onOutcome?: (outcome: RuntimeOutcome) => void;
}

/** How one request that reached a provider's breaker ended. */
export type RuntimeOutcome = (
  | { readonly ok: true; readonly provider: string; readonly generated: number; readonly failed: number }
  | { readonly ok: false; readonly provider: string; readonly failed: number; readonly error: ImageError }
) & {
  /** How long the provider took, from its request going out to its answer or failure; absent when none went out. */
  readonly providerMs?: number;
};

/** A request that passed validation, with its provider and deadline. */
export interface PreparedRequest {
  readonly request: ImageRequest;
  readonly entry: RegisteredProvider;
  /** Absolute deadline in epoch milliseconds. */
  readonly deadline: number;
}

export interface ExecuteOptions {
  readonly requestId: string;
  /** Caller cancellation (client gone, gRPC deadline). */
  readonly signal: AbortSignal;
  readonly events?: ProviderEventSink;
}

/** The shutdown grace when the options name none. */
export const DEFAULT_SHUTDOWN_GRACE_MS = 10_000;

export interface ShutdownOptions {
  /** Ends the grace early: what is still running is aborted when it fires. */
  readonly signal?: AbortSignal;
}

/** How a shutdown went; every caller of `shutdown` gets the same one. */
export interface ShutdownResult {
  /** Every request in flight finished within the grace. */
  readonly drained: boolean;
  /** Requests still running when the grace ended, answered with `timeout`. */
  readonly interrupted: number;
}

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

/** Marks `index` in `seen`; false when it is out of range or seen before. */
function markOnce(seen: Uint8Array, index: number): boolean {
  if (!Number.isInteger(index) || index < 0 || index >= seen.length || seen[index] !== 0) return false;
  seen[index] = 1;
  return true;
}

/**
 * The output set of a response to `parameters` must be exactly 0..n,
 * ascending, with failures only under best effort.
 */
export function checkOutputSet(parameters: Pick<GenerationParameters, "n" | "failurePolicy">, response: ImageResponse): void {
  const n = parameters.n;
  if (response.failures.length > 0 && parameters.failurePolicy !== "best_effort") {
    throw outputSetError("provider returned partial failures under fail-fast policy");
  }
  if (response.data.length + response.failures.length !== n) throw outputSetError("provider returned the wrong number of outputs");
  const seen = new Uint8Array(n);
  for (const image of response.data) if (!markOnce(seen, image.index)) throw outputSetError("provider returned an invalid output set");
  for (const failure of response.failures) if (!markOnce(seen, failure.index)) throw outputSetError("provider returned an invalid output set");
  for (const list of [response.data, response.failures]) {
    for (let i = 1; i < list.length; i += 1) {
      if (list[i]!.index <= list[i - 1]!.index) throw outputSetError("provider outputs are not in ascending order");
    }
  }
}

/**
 * The caller's sink behind a guard: a partial image outside the request
 * (output index not below n, preview index not below partial_images) is
 * dropped, whatever provider sent it.
 */
export function boundedPartials(sink: ProviderEventSink, parameters: Pick<GenerationParameters, "n" | "partialImages">): ProviderEventSink {
  const inRange = (value: number, bound: number) => Number.isInteger(value) && value >= 0 && value < bound;
  return async (event) => {
    if (event.type === "partial_image" && !(inRange(event.index, parameters.n) && inRange(event.partialIndex, parameters.partialImages))) return;
    await sink(event);
  };
}

/** The `overloaded` error of a call the provider's circuit refused. */
function circuitRefusal(provider: string, refusal: Extract<BreakerAdmission, { admitted: false }>): ImageError {
  if (refusal.state === "open") {
    return new ImageError("overloaded", "the provider's circuit is open", {
      retryable: true,
      provider,
      details: { circuit_state: "open", retry_after_ms: refusal.retryAfterMs ?? 0 },
    });
  }
  return new ImageError("overloaded", "the provider's circuit is half open and probing", {
    retryable: true,
    provider,
    details: { circuit_state: "half_open" },
  });
}

/**
 * Runs image requests: intrinsic validation against the configured limits,
 * the global bulkhead, the provider's breaker and bulkhead, the deadline,
 * and the final checks of what the provider returned.
 */
export class ImageRuntime {
  private readonly globalGate: AdmissionGate;
  /** Requests admitted by `run` and not yet settled. */
  private readonly inFlight = new Set<Promise<unknown>>();
  /** Set when shutdown starts: new requests are refused from then on. */
  private closing = false;
  /** Fires when the shutdown grace is over: aborts what is still running. */
  private readonly shutdownController = new AbortController();
  private shutdownResult: Promise<ShutdownResult> | undefined;

  constructor(
    readonly registry: ProviderRegistry,
    private readonly options: ImageRuntimeOptions,
  ) {
    this.globalGate = new AdmissionGate("global", options.globalAdmission);
  }

  /** Requests in flight (between the start of `run` and their answer). */
  get activeRequests(): number {
    return this.inFlight.size;
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
  }

  /**
   * Validates a request once and resolves its provider and deadline; throws
   * before anything else happens when it cannot run.
   */
  prepare(request: ImageRequest): PreparedRequest {
    if (this.closing) throw shuttingDown();
    validateRequest(request, this.options.limits);
    const entry = this.registry.resolve(request.routing.provider);
    const deadline = Date.now() + (request.timeoutMs ?? this.options.defaultTimeoutMs);
    return { request, entry, deadline };
  }

  /** `prepare` and `run` in one step. */
  async execute(request: ImageRequest, options: ExecuteOptions): Promise<ImageResponse> {
    return this.run(this.prepare(request), options);
  }

  /** Runs a prepared request through the gates, the breaker and the provider. */
  run(prepared: PreparedRequest, options: ExecuteOptions): Promise<ImageResponse> {
    // Checked and registered in one step: once shutdown starts, the set is final.
    if (this.closing) return Promise.reject(shuttingDown());
    const work = this.admitAndRun(prepared, options);
    this.inFlight.add(work);
    const forget = (): void => void this.inFlight.delete(work);
    work.then(forget, forget);
    return work;
  }

  private async admitAndRun(prepared: PreparedRequest, options: ExecuteOptions): Promise<ImageResponse> {
    const started = performance.now();
    const { deadline } = prepared;
    // One signal for caller cancellation, the deadline and the end of the shutdown grace.
    const link = linkSignals([options.signal, this.shutdownController.signal], { timeoutMs: deadline - Date.now() });
    try {
      return await this.admitAndRunUnder(link.signal, prepared, options, started);
    } finally {
      link.dispose();
    }
  }

  private async admitAndRunUnder(operation: AbortSignal, prepared: PreparedRequest, options: ExecuteOptions, started: number): Promise<ImageResponse> {
    const { request, entry, deadline } = prepared;
    let globalPermit;
    try {
      globalPermit = await this.globalGate.acquire(operation, deadline);
    } catch (error) {
      throw this.stoppedBeforeDispatch(toImageError(error), operation);
    }
    // queue_ms covers every wait before dispatch: the global gate and the provider's.
    let waitedMs = performance.now() - started;
    try {
      const admission = entry.breaker.admit();
      if (!admission.admitted) {
        const error = circuitRefusal(entry.name, admission);
        this.options.onOutcome?.({ ok: false, provider: entry.name, failed: request.parameters.n, error });
        throw error;
      }
      const breaker = admission.permit;
      // The provider was consulted (capabilities); then its request went out.
      let consulted = false;
      let dispatched = false;
      let providerStarted = 0;
      try {
        const queueStarted = performance.now();
        const providerPermit = await entry.gate.acquire(operation, deadline);
        waitedMs += performance.now() - queueStarted;
        const queueMs = Math.round(waitedMs);
        consulted = true;
        let plan: FanoutPlan;
        let response: ImageResponse;
        let providerMs: number;
        try {
          // The provider sees its own name, also when the request named none.
          const routed =
            request.routing.provider === entry.name ? request : { ...request, routing: { ...request.routing, provider: entry.name } };
          plan = await entry.provider.plan(routed);
          this.checkIdentity(entry, plan.capabilities);
          providerStarted = performance.now();
          dispatched = true;
          response = await this.runProvider(entry, plan, operation, deadline, options);
          providerMs = Math.round(performance.now() - providerStarted);
        } finally {
          providerPermit.release();
        }
        const model = plan.capabilities.model;
        if (model !== undefined && response.model !== model) {
          throw new ImageError("protocol", "provider answered with a different model", {
            provider: entry.name,
            details: { expected: model, actual: response.model },
          });
        }
        checkOutputSet(response.effective, response);
        response.id = options.requestId;
        response.provider = entry.name;
        if (request.policies.revisedPrompt === "omit") delete response.revisedPrompt;
        if (request.responseFormat === "metadata") for (const image of response.data) delete image.data;
        response.timings = { ...response.timings, queueMs, providerMs, totalMs: Math.round(performance.now() - started) };
        breaker.succeeded();
        this.options.onOutcome?.({ ok: true, provider: entry.name, generated: response.data.length, failed: response.failures.length, providerMs });
        return response;
      } catch (error) {
        let failure = toImageError(error);
        // A wait for our own fan-out capacity that ended before any call went out.
        const neverSent = failure.details["stage"] === "capacity_wait" && failure.details["outcome"] === undefined;
        if (!dispatched || neverSent) failure = this.stoppedBeforeDispatch(failure, operation);
        if (failure.provider === undefined && failure.code !== "invalid_request") failure = failure.withProvider(entry.name);
        const callerGone = (failure.code === "cancelled" || failure.code === "timeout") && options.signal.aborted;
        // A caller that went away, our own full queue, or our own shutdown says
        // nothing about the provider; what its capabilities said before the
        // call went out counts only when it is a provider fault (protocol).
        if (callerGone || neverSent || !consulted || this.stoppedByShutdown(operation)) breaker.abandon();
        else if (!dispatched) breaker.failedBeforeCall(failure);
        else breaker.failed(failure);
        this.options.onOutcome?.({
          ok: false,
          provider: entry.name,
          failed: request.parameters.n,
          error: failure,
          ...(dispatched ? { providerMs: performance.now() - providerStarted } : {}),
        });
        throw failure;
      }
    } finally {
      globalPermit.release();
    }
  }

  /**
   * A request that had not reached its provider when the shutdown grace
   * ended: a retryable `timeout` (another instance may serve it). Anything
   * else passes unchanged.
   */
  private stoppedBeforeDispatch(failure: ImageError, operation: AbortSignal): ImageError {
    if (!this.stoppedByShutdown(operation)) return failure;
    if (failure.code !== "cancelled" && failure.code !== "timeout") return failure;
    return new ImageError("timeout", "the runtime shut down before the request reached its provider", {
      retryable: true,
      ...(failure.provider !== undefined ? { provider: failure.provider } : {}),
      details: { stage: "shutdown" },
      suggestions: ["Send the request again; this instance is shutting down."],
    });
  }

  /**
   * Calls the provider under the operation signal. An interrupted provider
   * gets the cancellation grace to finish; whatever it did is then unknown.
   */
  private async runProvider(
    entry: RegisteredProvider,
    plan: FanoutPlan,
    operation: AbortSignal,
    deadline: number,
    options: ExecuteOptions,
  ): Promise<ImageResponse> {
    const execution = entry.provider.executePlan(plan, {
      requestId: options.requestId,
      deadline,
      signal: operation,
      ...(options.events ? { events: boundedPartials(options.events, plan.request.parameters) } : {}),
    });
    try {
      return await raceAbort(execution, operation);
    } catch {
      if (operation.aborted && !(await settleWithin(execution, this.options.cancellationGraceMs))) {
        throw this.interruption(operation, deadline);
      }
    }
    // It settled: failed on its own, or within the grace.
    try {
      return await execution;
    } catch (error) {
      const failure = toImageError(error);
      if (failure.details["outcome"] !== undefined || failure.details["stage"] === "capacity_wait") throw failure;
      if (operation.aborted || failure.code === "timeout" || failure.code === "cancelled") {
        throw this.interruption(operation, deadline, failure);
      }
      throw failure;
    }
  }

  private interruption(operation: AbortSignal, deadline: number, cause?: ImageError): ImageError {
    let base: ImageError;
    if (this.stoppedByShutdown(operation)) base = new ImageError("timeout", "the runtime shut down before the provider finished", { details: { stage: "shutdown" } });
    else if (operation.aborted && isDeadline(operation.reason, deadline)) base = new ImageError("timeout", "the request deadline passed");
    else if (operation.aborted) base = new ImageError("cancelled", "the request was cancelled");
    else base = cause ?? new ImageError("internal", "the provider was interrupted");
    return base
      .withRetryable(false)
      .withDetail("outcome", "unknown")
      .withSuggestion("The provider may have produced images; do not blindly retry the same request.");
  }

  /**
   * Stops admitting new requests, lets the ones in flight finish for up to
   * the shutdown grace (or until `options.signal` fires), aborts what is
   * left (those get `timeout`), then shuts every provider down. Concurrent
   * and later calls share the first call's result.
   */
  shutdown(options: ShutdownOptions = {}): Promise<ShutdownResult> {
    const stop = options.signal;
    if (stop) {
      if (stop.aborted) this.endGrace();
      else stop.addEventListener("abort", () => this.endGrace(), { once: true });
    }
    this.shutdownResult ??= this.drainAndStop();
    return this.shutdownResult;
  }

  /**
   * Whether `operation` was aborted by the end of the shutdown grace (and
   * not before, by its caller or its deadline). The host aborts its calls
   * right after the module's grace signal fires, so the first reason decides.
   */
  private stoppedByShutdown(operation: AbortSignal): boolean {
    return operation.aborted && this.shutdownController.signal.aborted && operation.reason === this.shutdownController.signal.reason;
  }

  private endGrace(): void {
    if (!this.shutdownController.signal.aborted) this.shutdownController.abort();
  }

  private async drainAndStop(): Promise<ShutdownResult> {
    this.closing = true;
    const running = [...this.inFlight];
    const graceMs = this.options.shutdownGraceMs ?? DEFAULT_SHUTDOWN_GRACE_MS;
    const all = Promise.allSettled(running);
    const graceOver = new Promise<void>((resolve) => {
      if (this.shutdownController.signal.aborted) resolve();
      else this.shutdownController.signal.addEventListener("abort", () => resolve(), { once: true });
    });
    const drained = await settleWithin(Promise.race([all, graceOver]), graceMs) && !this.shutdownController.signal.aborted;
    const interrupted = drained ? 0 : this.inFlight.size;
    this.endGrace();
    this.globalGate.close();
    for (const entry of this.registry.list()) entry.gate.close();
    // Aborted requests answer at once, or after the cancellation grace when a provider holds on.
    if (!drained) await settleWithin(all, this.options.cancellationGraceMs + 100);
    await Promise.allSettled(this.registry.list().map((entry) => entry.provider.shutdown()));
    return { drained, interrupted };
  }
}

/** The answer to a request that arrives once shutdown has started. */
function shuttingDown(): ImageError {
  return new ImageError("cancelled", "runtime is shutting down", {
    retryable: true,
    suggestions: ["Send the request to another instance; this one is shutting down."],
  });
}
