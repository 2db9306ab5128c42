import {
  zeroTimings,
  type ImageRequest,
  type ImageResponse,
  type ProviderCapabilities,
  type ProviderDescriptor,
  type SessionMetadata,
} from "../../src/images/model.js";
import { ImageError } from "../../src/images/core/errors.js";
import type { ImageProvider, ProviderContext } from "../../src/images/core/provider.js";
import { delay } from "../../src/util/index.js";

/** Native capabilities of the reference's fan-out test provider. */
export function fakeCapabilities(): ProviderCapabilities {
  return {
    provider: "fanout-test",
    implementationVersion: "test",
    experimental: false,
    generation: true,
    edits: false,
    count: { min: 1, max: 1 },
    batching: { mode: "native", nativeCount: { min: 1, max: 1 }, maxParallelOutputs: 1 },
    sizes: { auto: true, allowed: [], arbitrary: false },
    aspectRatio: "unsupported",
    resolution: "unsupported",
    transparentBackground: "emulated",
    negativePrompt: "unsupported",
    revisedPrompt: "native",
    userAttribution: "unsupported",
    qualities: ["auto"],
    outputFormats: ["png"],
    backgrounds: ["auto"],
    moderation: ["auto"],
    inputFidelities: ["high"],
    actions: ["auto"],
    referenceImages: { support: "unsupported", maxCount: 0, maxBytesEach: 0, maxBytesTotal: 0 },
    editImages: { support: "unsupported", maxCount: 0, maxBytesEach: 0, maxBytesTotal: 0 },
    masks: { support: "unsupported", maxCount: 0, maxBytesEach: 0, maxBytesTotal: 0 },
    partialImages: { min: 0, max: 0 },
    persistentSessions: true,
    explicitThreads: true,
  };
}

export interface FakeOptions {
  failOffset?: number;
  /** Every call fails. */
  failAll?: boolean;
  delayMs?: number;
  /** Per chunk offset delay overrides. */
  delayByOffset?: Record<number, number>;
  /** Replaces the response before it is returned, per chunk offset. */
  tamper?: (response: ImageResponse, offset: number) => void;
  /** Extra events to send before the regular partial. */
  extraEvents?: boolean;
  capabilities?: ProviderCapabilities;
}

/**
 * The reference's fan-out fixture: counts calls and peak concurrency, sleeps
 * 20 ms, fails at one chunk offset read back from the sub-request id.
 */
export class FakeProvider implements ImageProvider {
  calls = 0;
  capabilityCalls = 0;
  active = 0;
  maxActive = 0;
  aborted = 0;
  readonly requestIds: string[] = [];
  shutdowns = 0;

  constructor(private readonly options: FakeOptions = {}) {}

  descriptor(): ProviderDescriptor {
    return { name: "fanout-test", displayName: "Fan-out test", version: "test", experimental: false, models: [] };
  }

  async capabilities(): Promise<ProviderCapabilities> {
    this.capabilityCalls += 1;
    return this.options.capabilities ?? fakeCapabilities();
  }

  async execute(request: ImageRequest, context: ProviderContext): Promise<ImageResponse> {
    this.calls += 1;
    this.active += 1;
    this.maxActive = Math.max(this.maxActive, this.active);
    this.requestIds.push(context.requestId);
    try {
      const offset = Number(context.requestId.slice(context.requestId.lastIndexOf(":") + 1));
      try {
        await delay(this.options.delayByOffset?.[offset] ?? this.options.delayMs ?? 20, context.signal);
      } catch {
        this.aborted += 1;
        throw new ImageError("cancelled", "the operation was cancelled");
      }
      if (this.options.failAll || (this.options.failOffset !== undefined && offset === this.options.failOffset)) {
        throw new ImageError("upstream", "fake output failed", { retryable: true });
      }
      if (context.events) {
        if (this.options.extraEvents) {
          await context.events({ type: "started" });
          await context.events({ type: "partial_image", index: request.parameters.n, partialIndex: 0, image: new Uint8Array([9]) });
        }
        await context.events({ type: "partial_image", index: 0, partialIndex: 0, image: new Uint8Array([1]) });
      }
      let session: SessionMetadata | undefined;
      if (request.session.mode === "persistent") {
        session = { key: request.session.key!, threadId: "thread-persistent", reused: true };
      } else if (request.session.mode === "thread") {
        session = { threadId: request.session.threadId!, reused: true };
      }
      const response: ImageResponse = {
        id: context.requestId,
        created: 0,
        provider: "fanout-test",
        model: "test-image",
        requested: { ...request.parameters },
        effective: { ...request.parameters },
        normalizations: [],
        data: Array.from({ length: request.parameters.n }, (_, index) => ({
          index,
          format: "png" as const,
          width: 1,
          height: 1,
          bytes: 0,
          sha256: "0".repeat(64),
        })),
        failures: [],
        revisedPrompt: request.prompt,
        usage: { totalTokens: 1, provider: {} },
        timings: zeroTimings(),
        warnings: [],
      };
      if (session) response.session = session;
      this.options.tamper?.(response, offset);
      return response;
    } finally {
      this.active -= 1;
    }
  }

  async shutdown(): Promise<void> {
    this.shutdowns += 1;
  }
}
