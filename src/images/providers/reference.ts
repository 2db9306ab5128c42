import { createHash, randomUUID } from "node:crypto";
import { LRUCache } from "lru-cache";
import {
  zeroTimings,
  type GeneratedImage,
  type ImageRequest,
  type ImageResponse,
  type ProviderCapabilities,
  type ProviderDescriptor,
  type SessionMetadata,
} from "../model.js";
import { ImageError, type ErrorCode } from "../core/errors.js";
import type { ImageProvider, ProviderContext } from "../core/provider.js";
import { delay } from "../../util/index.js";
import { parseSize } from "../core/validation.js";
import { renderImage, renderPreview, type RenderSpec } from "./render.js";

export interface ReferenceFailureInjection {
  /** Calls whose prompt contains this text fail; empty disables. */
  readonly promptContains: string;
  /** Calls producing any of these output indices fail. */
  readonly outputIndices: readonly number[];
  readonly code: ErrorCode;
  readonly retryable: boolean;
}

export interface ReferenceProviderConfig {
  readonly name: string;
  readonly model: string;
  /** Outputs per call; larger requests need the fan-out decorator. */
  readonly nativeCount: number;
  /** Simulated time per call, spread over the partial previews. */
  readonly latencyMs: number;
  /** Upper bound of parameters.partial_images. */
  readonly maxPartialImages: number;
  /** What size "auto" renders. */
  readonly defaultSize: string;
  readonly maxEdge: number;
  readonly failure: ReferenceFailureInjection;
}

const REFERENCE_PROVIDER_VERSION = "1.0.0";
const MAX_SESSIONS = 10_000;
const CELLS_BY_QUALITY = { auto: 16, low: 8, medium: 16, high: 32 } as const;

/** The output offset a fan-out sub-request id carries, or 0. */
export function outputOffsetOf(requestId: string): number {
  const match = /(?::output:|^fanout:[0-9a-f]{32}:)(\d+)$/.exec(requestId);
  return match ? Number(match[1]) : 0;
}

/** Waits `ms`; a cancellation during the wait is the `cancelled` error. */
async function pause(ms: number, signal: AbortSignal): Promise<void> {
  try {
    await delay(ms, signal);
  } catch (reason) {
    throw new ImageError("cancelled", "the operation was cancelled", { cause: reason });
  }
}

function sha256Hex(data: Uint8Array | string): string {
  return createHash("sha256").update(data).digest("hex");
}

/**
 * The embedded provider: deterministic images drawn from a hash of the
 * prompt and inputs, with configurable native count, latency, partial
 * previews and failure injection.
 */
export class ReferenceProvider implements ImageProvider {
  private readonly sessions = new LRUCache<string, string>({ max: MAX_SESSIONS });

  constructor(readonly config: ReferenceProviderConfig) {}

  descriptor(): ProviderDescriptor {
    return {
      name: this.config.name,
      displayName: "Reference renderer",
      version: REFERENCE_PROVIDER_VERSION,
      experimental: false,
      models: [this.config.model],
    };
  }

  async capabilities(_model?: string): Promise<ProviderCapabilities> {
    const count = { min: 1, max: this.config.nativeCount };
    const input = { support: "native" as const, maxCount: 4, maxBytesEach: 16 * 1024 * 1024, maxBytesTotal: 64 * 1024 * 1024 };
    return {
      provider: this.config.name,
      implementationVersion: REFERENCE_PROVIDER_VERSION,
      // Only the configured model is served; negotiation rejects any other by name.
      model: this.config.model,
      experimental: false,
      generation: true,
      edits: true,
      count,
      batching: { mode: "native", nativeCount: { ...count }, maxParallelOutputs: 1 },
      sizes: { auto: true, allowed: ["256x256", "512x512", "1024x1024", "1536x1024", "1024x1536"], arbitrary: true, minEdge: 16, maxEdge: this.config.maxEdge, edgeMultiple: 8 },
      aspectRatio: "unsupported",
      resolution: "unsupported",
      transparentBackground: "native",
      negativePrompt: "native",
      revisedPrompt: "native",
      userAttribution: "native",
      qualities: ["auto", "low", "medium", "high"],
      outputFormats: ["png", "jpeg", "webp"],
      backgrounds: ["auto", "opaque", "transparent"],
      moderation: ["auto", "low"],
      inputFidelities: ["low", "high"],
      actions: ["auto", "generate", "edit"],
      referenceImages: input,
      editImages: input,
      masks: { ...input, maxCount: 1 },
      partialImages: { min: 0, max: this.config.maxPartialImages },
      persistentSessions: true,
      explicitThreads: true,
    };
  }

  private injectFailure(request: ImageRequest, offset: number): void {
    const failure = this.config.failure;
    const byPrompt = failure.promptContains !== "" && request.prompt.includes(failure.promptContains);
    const byIndex = failure.outputIndices.some((index) => index >= offset && index < offset + request.parameters.n);
    if (byPrompt || byIndex) {
      throw new ImageError(failure.code, "injected reference provider failure", {
        retryable: failure.retryable,
        provider: this.config.name,
      });
    }
  }

  private session(request: ImageRequest): SessionMetadata | undefined {
    const { mode, key, threadId } = request.session;
    if (mode === "persistent" && key !== undefined) {
      const existing = this.sessions.get(key);
      const thread = existing ?? `thread-${randomUUID()}`;
      if (!existing) this.sessions.set(key, thread);
      return { key, threadId: thread, reused: existing !== undefined };
    }
    if (mode === "thread" && threadId !== undefined) return { threadId, reused: true };
    return undefined;
  }

  async execute(request: ImageRequest, context: ProviderContext): Promise<ImageResponse> {
    const started = performance.now();
    const offset = outputOffsetOf(context.requestId);
    const p = request.parameters;
    const size = parseSize(p.size === "auto" ? this.config.defaultSize : p.size);
    if (!size) throw new ImageError("configuration", "reference provider default size is invalid");
    const inputs = [
      ...(request.operation.kind === "edit" ? request.operation.images : []),
      ...(request.operation.kind === "edit" && request.operation.mask ? [request.operation.mask] : []),
      ...request.referenceImages,
    ].map((input) => sha256Hex(input.data));
    const base = [request.prompt, request.negativePrompt ?? "", ...inputs].join("\u0000");
    const specFor = (index: number): RenderSpec => ({
      seed: `${base}\u0000${index}`,
      width: size.width,
      height: size.height,
      cells: CELLS_BY_QUALITY[p.quality],
      background: p.background,
      format: p.outputFormat,
      quality: p.outputCompression ?? 90,
    });

    await context.events?.({ type: "started" });
    for (let local = 0; local < p.n; local += 1) {
      await context.events?.({ type: "progress", stage: "rendering", index: local });
    }
    const steps = p.partialImages;
    const slice = this.config.latencyMs / (steps + 1);
    for (let step = 0; step < steps; step += 1) {
      await pause(slice, context.signal);
      if (context.events) {
        for (let local = 0; local < p.n; local += 1) {
          const preview = await renderPreview(specFor(offset + local), step, steps);
          await context.events({ type: "partial_image", index: local, partialIndex: step, image: preview.data });
        }
      }
    }
    await pause(slice, context.signal);
    this.injectFailure(request, offset);

    const data: GeneratedImage[] = [];
    for (let local = 0; local < p.n; local += 1) {
      const imageStarted = performance.now();
      const image = await renderImage(specFor(offset + local));
      data.push({
        index: local,
        format: image.format,
        width: image.width,
        height: image.height,
        bytes: image.data.byteLength,
        sha256: sha256Hex(image.data),
        generationMs: Math.round(performance.now() - imageStarted + this.config.latencyMs),
        data: image.data,
      });
    }
    if (context.signal.aborted) throw new ImageError("cancelled", "the operation was cancelled");
    const inputTokens = Math.ceil(Buffer.byteLength(request.prompt, "utf8") / 4);
    const response: ImageResponse = {
      id: context.requestId,
      created: Math.floor(Date.now() / 1000),
      provider: this.config.name,
      model: this.config.model,
      requested: { ...p },
      effective: { ...p },
      normalizations: [],
      data,
      failures: [],
      revisedPrompt: request.prompt,
      usage: { inputTokens, outputTokens: 256 * p.n, totalTokens: inputTokens + 256 * p.n, provider: { images: p.n } },
      timings: { ...zeroTimings(), providerMs: Math.round(performance.now() - started) },
      warnings: [],
    };
    const session = this.session(request);
    if (session) response.session = session;
    await context.events?.({ type: "completed", response });
    return response;
  }

  async shutdown(): Promise<void> {
    this.sessions.clear();
  }
}
