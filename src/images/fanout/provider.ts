import {
  cloneCapabilities,
  cloneRequest,
  type CountRange,
  type ImageRequest,
  type ImageResponse,
  type ProviderCapabilities,
  type ProviderDescriptor,
  type ProviderEvent,
  type SessionMetadata,
} from "../contract/types.js";
import { validateCapabilities } from "../core/capabilities.js";
import { ImageError, toImageError } from "../core/errors.js";
import { negotiateRequest } from "../core/negotiation.js";
import type { ImageProvider, ProviderContext, ProviderEventSink } from "../core/provider.js";
import { MAX_OUTPUTS_CEILING, validateRequest, type RequestLimits } from "../core/validation.js";
import { aggregateChunks, type ChunkResult } from "./aggregate.js";
import { AcquireError, Semaphore, type Permit } from "../../util/index.js";
import { planChunks, subrequestId, type ChunkSpec } from "./subrequest.js";

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

export const DEFAULT_SIBLING_GRACE_MS = 1000;
/** Marks errors raised before anything was dispatched upstream. */
const CAPACITY_WAIT = { stage: "capacity_wait" } as const;

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
export function mapChunkEvent(event: ProviderEvent, chunk: ChunkSpec): ProviderEvent | undefined {
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

/**
 * Serves a logical request for more outputs than the inner provider makes
 * per call by splitting it into bounded calls, all under one provider-wide
 * semaphore, and merging the results in requested order.
 */
export class OutputFanoutProvider implements ImageProvider {
  private readonly permits: Semaphore;
  private readonly siblingGraceMs: number;

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

  descriptor(): ProviderDescriptor {
    return this.inner.descriptor();
  }

  async capabilities(model?: string): Promise<ProviderCapabilities> {
    return this.effectiveCapabilities(await this.inner.capabilities(model));
  }

  private effectiveCapabilities(native: ProviderCapabilities): ProviderCapabilities {
    validateCapabilities(native);
    if (this.config.maxOutputs <= native.count.max) return native;
    const effective = cloneCapabilities(native);
    effective.count = { min: native.count.min, max: this.config.maxOutputs };
    effective.batching = {
      mode: "fan_out",
      nativeCount: { ...native.count },
      maxParallelOutputs: this.config.maxParallelOutputs,
    };
    validateCapabilities(effective);
    return effective;
  }

  async execute(request: ImageRequest, context: ProviderContext): Promise<ImageResponse> {
    validateRequest(request, this.limits);
    const native = await this.inner.capabilities(request.routing.model);
    const negotiated = negotiateRequest(request, this.effectiveCapabilities(native));
    const effective = negotiated.effectiveRequest;
    let response: ImageResponse;
    if (effective.parameters.n <= native.count.max) {
      const permit = await this.acquire(context);
      try {
        response = await this.inner.execute(cloneRequest(effective), context);
      } finally {
        permit.release();
      }
    } else {
      response = await this.executeFanout(effective, context, native.count);
    }
    response.requested = negotiated.requested;
    response.effective = { ...effective.parameters };
    response.normalizations = [...negotiated.normalizations, ...response.normalizations];
    return response;
  }

  private async acquire(context: ProviderContext): Promise<Permit> {
    const timeout = this.config.permitTimeoutMs;
    const deadline = timeout === undefined ? context.deadline : Math.min(context.deadline, Date.now() + timeout);
    try {
      return await this.permits.acquire(context.signal, deadline);
    } catch (error) {
      if (!(error instanceof AcquireError)) throw error;
      switch (error.reason) {
        case "closed":
          throw new ImageError("cancelled", "output fan-out is shutting down", { details: CAPACITY_WAIT });
        case "aborted":
          throw new ImageError("cancelled", "output fan-out was cancelled while waiting for capacity", {
            details: CAPACITY_WAIT,
          });
        case "deadline":
          throw new ImageError("timeout", "output fan-out timed out while waiting for capacity", {
            retryable: true,
            details: CAPACITY_WAIT,
          });
      }
    }
  }

  private batchParallelism(request: ImageRequest): number {
    const execution = request.policies.batchExecution;
    if (execution === "parallel") return this.config.maxParallelOutputs;
    if (execution === "auto" && request.session.mode === "isolated") return this.config.maxParallelOutputs;
    return 1;
  }

  private async executeFanout(request: ImageRequest, context: ProviderContext, native: CountRange): Promise<ImageResponse> {
    const started = performance.now();
    const failurePolicy = request.parameters.failurePolicy;
    const batch = new AbortController();
    const forwardAbort = (): void => batch.abort(context.signal.reason);
    if (context.signal.aborted) forwardAbort();
    else context.signal.addEventListener("abort", forwardAbort, { once: true });

    const queue = planChunks(request.parameters.n, native.max);
    const active = new Map<number, Promise<ChunkResult>>();
    const results: ChunkResult[] = [];
    const launchNext = (): void => {
      const chunk = queue.shift();
      if (!chunk) return;
      active.set(chunk.offset, this.executeChunk(request, context, chunk, batch.signal));
    };
    try {
      for (let i = 0; i < this.batchParallelism(request); i += 1) launchNext();
      while (active.size > 0) {
        const result = await Promise.race(active.values());
        active.delete(result.offset);
        if (failurePolicy === "fail_fast" && result.error) {
          const siblingsMayHaveRun = active.size > 0 || results.length > 0;
          batch.abort();
          await this.waitForSiblings([...active.values()]);
          let error = result.error.withDetail("output_index", result.offset).withDetail("generation_ms", result.elapsedMs);
          if (siblingsMayHaveRun) {
            error = error
              .withRetryable(false)
              .withDetail("outcome", "unknown")
              .withDetail("retry_scope", "do_not_retry_full_batch");
          }
          throw error;
        }
        results.push(result);
        launchNext();
      }
    } finally {
      context.signal.removeEventListener("abort", forwardAbort);
    }
    results.sort((a, b) => a.offset - b.offset);
    return aggregateChunks(request, context.requestId, failurePolicy, results, Math.round(performance.now() - started));
  }

  private async waitForSiblings(siblings: Promise<ChunkResult>[]): Promise<void> {
    if (siblings.length === 0) return;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const grace = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, this.siblingGraceMs);
    });
    await Promise.race([Promise.allSettled(siblings), grace]);
    clearTimeout(timer);
  }

  private async executeChunk(
    request: ImageRequest,
    context: ProviderContext,
    chunk: ChunkSpec,
    batchSignal: AbortSignal,
  ): Promise<ChunkResult> {
    const started = performance.now();
    const chunkRequest = cloneRequest(request);
    chunkRequest.parameters.n = chunk.count;
    const outer = context.events;
    const events: ProviderEventSink | undefined = outer
      ? async (event) => {
          const mapped = mapChunkEvent(event, chunk);
          if (!mapped) return;
          try {
            await outer(mapped);
          } catch {
            // A closed outer sink must not fail the chunk.
          }
        }
      : undefined;
    const chunkContext: ProviderContext = {
      requestId: subrequestId(context.requestId, chunk.offset),
      deadline: context.deadline,
      signal: batchSignal,
      ...(events ? { events } : {}),
    };
    const elapsed = (): number => Math.round(performance.now() - started);
    try {
      const permit = await this.acquire(chunkContext);
      try {
        const response = await this.inner.execute(chunkRequest, chunkContext);
        return { offset: chunk.offset, count: chunk.count, elapsedMs: elapsed(), response };
      } finally {
        permit.release();
      }
    } catch (error) {
      return { offset: chunk.offset, count: chunk.count, elapsedMs: elapsed(), error: toImageError(error) };
    }
  }

  checkReady(): Promise<void> {
    return this.inner.checkReady();
  }

  getSession(key: string): Promise<SessionMetadata> {
    return this.inner.getSession(key);
  }

  deleteSession(key: string): Promise<void> {
    return this.inner.deleteSession(key);
  }

  restartCount(): number | undefined {
    return this.inner.restartCount();
  }

  async shutdown(): Promise<void> {
    this.permits.close();
    await this.inner.shutdown();
  }
}
