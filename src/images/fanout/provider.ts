import { defaultMaxListeners, setMaxListeners } from "node:events";
import type {
  GenerationParameters,
  ImageRequest,
  ImageResponse,
  Normalization,
  ProviderCapabilities,
  ProviderDescriptor,
  ProviderEvent,
} from "../model.js";
import { validateCapabilities } from "../core/capabilities.js";
import { ImageError, toImageError } from "../core/errors.js";
import { negotiateRequest } from "../core/negotiation.js";
import type { ImageProvider, ProviderContext, ProviderEventSink } from "../core/provider.js";
import { MAX_OUTPUTS_CEILING, validateRequest, type RequestLimits } from "../core/validation.js";
import { aggregateChunks, type ChunkResult } from "./aggregate.js";
import { AcquireError, Semaphore, settleWithin, type Permit } from "../../util/index.js";
import { planChunks, subrequestId, type ChunkSpec } from "./subrequest.js";
import { inSpan } from "../../telemetry/index.js";

export interface OutputFanoutConfig {
  /** The logical maximum output count advertised by the decorated provider. */
  readonly maxOutputs: number;
  /** Size of the provider-wide semaphore of simultaneous upstream operations. */
  readonly maxParallelOutputs: number;
  /** Longest wait for a permit; the request deadline applies as well. */
  readonly permitTimeoutMs?: number;
  /** How long fail-fast waits for cancelled siblings to wind down. */
  readonly siblingGraceMs?: number;
}

const DEFAULT_SIBLING_GRACE_MS = 1000;
/** Marks errors raised before anything was dispatched upstream. */
const CAPACITY_WAIT = { stage: "capacity_wait" } as const;

/**
 * A request resolved against the provider and negotiated: what one
 * execution needs, computed once per request (one capability lookup, one
 * negotiation).
 */
export interface FanoutPlan {
  /** The negotiated request: what the inner provider is asked for. */
  readonly request: ImageRequest;
  /** The parameters as the caller sent them. */
  readonly requested: GenerationParameters;
  readonly normalizations: readonly Normalization[];
  /** The effective capabilities (after the fan-out transform). */
  readonly capabilities: ProviderCapabilities;
  /** Most outputs one inner call makes (the inner `count.max`). */
  readonly nativeMax: number;
}

function validateConfig(config: OutputFanoutConfig, limits: RequestLimits): void {
  const integer = (value: number): boolean => Number.isInteger(value) && value > 0;
  if (
    !integer(config.maxOutputs) ||
    !integer(config.maxParallelOutputs) ||
    config.maxOutputs > MAX_OUTPUTS_CEILING ||
    config.maxParallelOutputs > config.maxOutputs ||
    config.maxOutputs > limits.maxOutputs ||
    (config.permitTimeoutMs !== undefined && !(config.permitTimeoutMs > 0)) ||
    (config.siblingGraceMs !== undefined && !(config.siblingGraceMs >= 0))
  ) {
    throw new ImageError("configuration", "output fan-out limits are invalid");
  }
}

/** Maps a chunk's event into the batch's output order; undefined drops it. */
function mapChunkEvent(event: ProviderEvent, chunk: ChunkSpec): ProviderEvent | undefined {
  switch (event.type) {
    case "progress": {
      const index = event.index ?? 0;
      if (index >= chunk.count) return undefined;
      return { type: "progress", stage: event.stage, index: chunk.offset + index };
    }
    case "partial_image":
      if (event.index >= chunk.count) return undefined;
      return { ...event, index: chunk.offset + event.index };
    case "started":
    case "completed":
      // The transport sends its own.
      return undefined;
  }
}

/** Where a running chunk stands. */
interface ChunkState {
  /** Set when its inner call was made (it may have reached upstream). */
  dispatched: boolean;
  /** Set when its inner call settled. */
  settled: boolean;
  /** Set when the batch stopped waiting for it. */
  abandoned: boolean;
  /** The fan-out permit while the chunk holds one. */
  permit: Permit | undefined;
}

/** One chunk of a batch while it runs. */
interface ChunkRun {
  /** Its position in the batch's chunk list. */
  readonly index: number;
  readonly state: ChunkState;
  /** Resolves (never rejects) when the chunk ends. */
  readonly result: Promise<ChunkResult>;
}

/**
 * Serves a logical request for more outputs than the inner provider makes
 * per call by splitting it into bounded calls, all under one provider-wide
 * semaphore, and merging the results in requested order.
 */
export class OutputFanoutProvider implements ImageProvider {
  private readonly permits: Semaphore;
  private readonly siblingGraceMs: number;
  private abandonedCalls = 0;

  constructor(
    private readonly inner: ImageProvider,
    readonly config: OutputFanoutConfig,
    private readonly limits: RequestLimits,
  ) {
    validateConfig(config, limits);
    this.permits = new Semaphore(config.maxParallelOutputs);
    this.siblingGraceMs = config.siblingGraceMs ?? DEFAULT_SIBLING_GRACE_MS;
  }

  /** Permits currently held, for diagnostics and tests. */
  get activeOperations(): number {
    return this.permits.inUse;
  }

  /**
   * Inner calls still running after their fail-fast batch stopped waiting
   * for them (their permits were freed at the sibling grace).
   */
  get abandonedOperations(): number {
    return this.abandonedCalls;
  }

  descriptor(): ProviderDescriptor {
    return this.inner.descriptor();
  }

  async capabilities(model?: string): Promise<ProviderCapabilities> {
    return this.effectiveCapabilities(await this.inner.capabilities(model));
  }

  /** The capabilities callers see; validated before and after the transform. */
  private effectiveCapabilities(native: ProviderCapabilities): ProviderCapabilities {
    validateCapabilities(native);
    if (this.config.maxOutputs <= native.count.max) return native;
    const effective: ProviderCapabilities = {
      ...native,
      count: { min: native.count.min, max: this.config.maxOutputs },
      batching: {
        mode: "fan_out",
        nativeCount: { min: native.count.min, max: native.count.max },
        maxParallelOutputs: this.config.maxParallelOutputs,
      },
    };
    validateCapabilities(effective);
    return effective;
  }

  /** Validates against the configured limits, then plans and runs the request. */
  async execute(request: ImageRequest, context: ProviderContext): Promise<ImageResponse> {
    validateRequest(request, this.limits);
    return this.executePlan(await this.plan(request), context);
  }

  /**
   * Resolves a request that already passed `validateRequest`: fetches the
   * inner capabilities once and negotiates against the effective ones.
   */
  async plan(request: ImageRequest): Promise<FanoutPlan> {
    const native = await this.inner.capabilities(request.routing.model);
    const capabilities = this.effectiveCapabilities(native);
    const negotiated = negotiateRequest(request, capabilities);
    return {
      request: negotiated.effectiveRequest,
      requested: negotiated.requested,
      normalizations: negotiated.normalizations,
      capabilities,
      nativeMax: native.count.max,
    };
  }

  /** Runs a plan: one call under one permit when it fits, else the fan-out. */
  async executePlan(plan: FanoutPlan, context: ProviderContext): Promise<ImageResponse> {
    const request = plan.request;
    let response: ImageResponse;
    if (request.parameters.n <= plan.nativeMax) {
      let permit: Permit;
      try {
        permit = await this.acquire(context.signal, context.deadline);
      } catch (error) {
        throw capacityWaitError(error);
      }
      try {
        response = await this.inner.execute(request, context);
      } finally {
        permit.release();
      }
    } else {
      response = await this.executeFanout(request, context, plan.nativeMax);
    }
    response.requested = plan.requested;
    response.effective = { ...request.parameters };
    if (plan.normalizations.length > 0) response.normalizations = [...plan.normalizations, ...response.normalizations];
    return response;
  }

  /** Waits for a permit until the request deadline or the permit timeout, whichever is first. */
  private acquire(signal: AbortSignal, requestDeadline: number): Promise<Permit> {
    const timeout = this.config.permitTimeoutMs;
    const deadline = timeout === undefined ? requestDeadline : Math.min(requestDeadline, Date.now() + timeout);
    return this.permits.acquire(signal, deadline);
  }

  private batchParallelism(request: ImageRequest): number {
    const execution = request.policies.batchExecution;
    if (execution === "parallel") return this.config.maxParallelOutputs;
    if (execution === "auto" && request.session.mode === "isolated") return this.config.maxParallelOutputs;
    return 1;
  }

  private async executeFanout(request: ImageRequest, context: ProviderContext, nativeMax: number): Promise<ImageResponse> {
    const started = performance.now();
    const failurePolicy = request.parameters.failurePolicy;
    // Fail-fast cancels the siblings of a failed chunk through its own signal.
    const batch = failurePolicy === "fail_fast" ? new AbortController() : undefined;
    const forwardAbort = batch ? (): void => batch.abort(context.signal.reason) : undefined;
    if (forwardAbort) {
      if (context.signal.aborted) forwardAbort();
      else context.signal.addEventListener("abort", forwardAbort, { once: true });
    }
    const batchSignal = batch?.signal ?? context.signal;

    const chunks = planChunks(request.parameters.n, nativeMax);
    // Each chunk's call listens on the batch signal (and its permit wait too): a fan-out of more
    // chunks than Node's default of 10 listeners is expected, not a leak to warn about.
    setMaxListeners(Math.max(defaultMaxListeners, 2 * chunks.length + defaultMaxListeners), batchSignal);
    const results: ChunkResult[] = new Array<ChunkResult>(chunks.length);
    const running = new Map<number, ChunkRun>();
    // Chunks report here as they end; the loop below takes them in that order.
    const ended: ChunkResult[] = [];
    let taken = 0;
    let wake: (() => void) | undefined;
    const onEnded = (result: ChunkResult): void => {
      ended.push(result);
      const resume = wake;
      wake = undefined;
      resume?.();
    };
    let launched = 0;
    const launchNext = (): void => {
      const index = launched;
      const chunk = chunks[index];
      if (chunk === undefined) return;
      launched += 1;
      const state: ChunkState = { dispatched: false, settled: false, abandoned: false, permit: undefined };
      // A span per chunk (tracing on), failed when the chunk is; a chunk's result never rejects.
      const attributes = { "mmgate.images.chunk.offset": chunk.offset, "mmgate.images.chunk.count": chunk.count };
      const result = inSpan("images.chunk", attributes, async (span) => {
        const ended = await this.executeChunk(state, chunk, request, context, batchSignal);
        if (!ended.ok) span?.fail(ended.error, ended.error.code);
        return ended;
      });
      running.set(chunk.offset, { index, state, result });
      void result.then(onEnded);
    };
    try {
      for (let i = this.batchParallelism(request); i > 0; i -= 1) launchNext();
      while (running.size > 0) {
        if (taken === ended.length) {
          await new Promise<void>((resolve) => {
            wake = resolve;
          });
        }
        const result = ended[taken++]!;
        const run = running.get(result.offset)!;
        running.delete(result.offset);
        if (batch && !result.ok) throw await this.failFast(result, running, results, batch);
        results[run.index] = result;
        launchNext();
      }
    } finally {
      if (forwardAbort) context.signal.removeEventListener("abort", forwardAbort);
    }
    return aggregateChunks(request, context.requestId, failurePolicy, results, Math.round(performance.now() - started));
  }

  /**
   * The first failed chunk of a fail-fast batch: cancels the rest, waits up
   * to the sibling grace for them, abandons (and frees the permits of) those
   * still running, and returns the error that stands for the batch.
   */
  private async failFast(
    failed: Extract<ChunkResult, { ok: false }>,
    running: ReadonlyMap<number, ChunkRun>,
    finished: readonly (ChunkResult | undefined)[],
    batch: AbortController,
  ): Promise<ImageError> {
    batch.abort();
    const siblings = [...running.values()];
    // Outputs of siblings may exist only if one of them reached upstream;
    // chunks that were still waiting for a permit never did.
    const siblingsMayHaveRun = siblings.some((run) => run.state.dispatched) || finished.some((result) => result !== undefined);
    if (siblings.length > 0) {
      const settled = await settleWithin(Promise.all(siblings.map((run) => run.result)), this.siblingGraceMs);
      if (!settled) for (const run of siblings) this.abandon(run.state);
    }
    let error = failed.error.withDetail("output_index", failed.offset).withDetail("generation_ms", failed.elapsedMs);
    if (siblingsMayHaveRun) {
      error = error.withRetryable(false).withDetail("outcome", "unknown").withDetail("retry_scope", "do_not_retry_full_batch");
    }
    return error;
  }

  /** The batch stops waiting for a running chunk: its permit is freed now. */
  private abandon(state: ChunkState): void {
    if (state.settled || state.abandoned || !state.dispatched) return;
    state.abandoned = true;
    this.abandonedCalls += 1;
    state.permit?.release();
    state.permit = undefined;
  }

  private async executeChunk(
    state: ChunkState,
    chunk: ChunkSpec,
    request: ImageRequest,
    context: ProviderContext,
    batchSignal: AbortSignal,
  ): Promise<ChunkResult> {
    const started = performance.now();
    const { offset, count } = chunk;
    let permit: Permit;
    try {
      permit = await this.acquire(batchSignal, context.deadline);
    } catch (error) {
      return { ok: false, offset, count, elapsedMs: Math.round(performance.now() - started), error: capacityWaitError(error) };
    }
    if (batchSignal.aborted) {
      // Granted as the batch was cancelled: nothing goes out.
      permit.release();
      return { ok: false, offset, count, elapsedMs: Math.round(performance.now() - started), error: capacityWaitCancelled() };
    }
    state.permit = permit;
    state.dispatched = true;
    const chunkRequest: ImageRequest = { ...request, parameters: { ...request.parameters, n: count } };
    const outer = context.events;
    const chunkContext: ProviderContext = {
      requestId: subrequestId(context.requestId, offset),
      deadline: context.deadline,
      signal: batchSignal,
      ...(outer ? { events: chunkEvents(outer, chunk) } : {}),
    };
    try {
      const response = await this.inner.execute(chunkRequest, chunkContext);
      return { ok: true, offset, count, elapsedMs: Math.round(performance.now() - started), response };
    } catch (error) {
      return { ok: false, offset, count, elapsedMs: Math.round(performance.now() - started), error: toImageError(error) };
    } finally {
      state.settled = true;
      permit.release();
      state.permit = undefined;
      if (state.abandoned) this.abandonedCalls -= 1;
    }
  }

  async shutdown(): Promise<void> {
    this.permits.close();
    await this.inner.shutdown();
  }
}

/** The error of a permit wait that ended without a permit. */
function capacityWaitError(error: unknown): ImageError {
  if (!(error instanceof AcquireError)) return toImageError(error);
  switch (error.reason) {
    case "closed":
      return new ImageError("cancelled", "output fan-out is shutting down", { details: CAPACITY_WAIT });
    case "aborted":
      return capacityWaitCancelled();
    case "deadline":
      return new ImageError("timeout", "output fan-out timed out while waiting for capacity", {
        retryable: true,
        details: CAPACITY_WAIT,
      });
  }
}

function capacityWaitCancelled(): ImageError {
  return new ImageError("cancelled", "output fan-out was cancelled while waiting for capacity", { details: CAPACITY_WAIT });
}

/** The sink a chunk's provider gets: events re-indexed into the batch; a failing outer sink never fails the chunk. */
function chunkEvents(outer: ProviderEventSink, chunk: ChunkSpec): ProviderEventSink {
  return async (event) => {
    const mapped = mapChunkEvent(event, chunk);
    if (!mapped) return;
    try {
      await outer(mapped);
    } catch {
      // A closed outer sink must not fail the chunk.
    }
  };
}
