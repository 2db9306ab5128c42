import { createHash } from "node:crypto";
import { createParser, type EventSourceMessage } from "eventsource-parser";
import sharp, { type Metadata } from "sharp";
import {
  zeroTimings,
  type GeneratedImage,
  type ImageRequest,
  type ImageResponse,
  type OutputFormat,
  type ProviderCapabilities,
  type ProviderDescriptor,
  type Usage,
} from "../model.js";
import type { OpenAiProviderConfig } from "../config.js";
import { ImageError, type ErrorCode } from "../core/errors.js";
import type { ImageProvider, ProviderContext } from "../core/provider.js";

const OPENAI_PROVIDER_VERSION = "1.0.0";
const GENERATIONS_PATH = "/v1/images/generations";
/** Upstream error codes that mean a safety system refused. */
const SAFETY_CODES = new Set(["moderation_blocked", "content_policy_violation", "content_filter"]);
const MAX_ERROR_BODY_BYTES = 64 * 1024;

interface UpstreamImage {
  b64_json?: string;
  revised_prompt?: string;
}

interface UpstreamUsage {
  input_tokens?: number;
  output_tokens?: number;
  total_tokens?: number;
}

interface UpstreamBody {
  data?: UpstreamImage[];
  usage?: UpstreamUsage;
}

interface UpstreamErrorBody {
  error?: { message?: string; type?: string; code?: string | null; param?: string | null };
}

/** Retry-After in milliseconds: delta seconds or an HTTP date. */
export function parseRetryAfter(value: string | null, now = Date.now()): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  if (/^\d+$/.test(value.trim())) return Number(value.trim()) * 1000;
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

/** The ImageError for an unsuccessful upstream HTTP response. */
function upstreamHttpError(provider: string, status: number, headers: Headers, body: UpstreamErrorBody | undefined): ImageError {
  const upstream = body?.error;
  const upstreamCode = upstream?.code ?? undefined;
  const upstreamRequestId = headers.get("x-request-id") ?? undefined;
  const details: Record<string, string | number | boolean> = { http_status: status };
  if (upstreamCode) details["upstream_code"] = upstreamCode;
  if (upstream?.param) details["field"] = upstream.param;
  const init = (code: ErrorCode, retryable: boolean) => ({
    retryable,
    provider,
    details,
    ...(upstreamRequestId ? { upstreamRequestId } : {}),
  });
  const message = (fallback: string) => (upstream?.message ? `${fallback}: ${upstream.message.slice(0, 500)}` : fallback);
  if (SAFETY_CODES.has(upstreamCode ?? "") || upstream?.type === "image_generation_user_error") {
    Object.assign(details, {
      safety_category: "content_policy",
      recovery: "revise_prompt_or_inputs",
      retry_same_request: false,
      safety_controls_relaxed: false,
    });
    return new ImageError("safety_rejected", message("the provider's safety system refused the request"), init("safety_rejected", false));
  }
  if (status === 429) {
    const retryAfter = parseRetryAfter(headers.get("retry-after"));
    if (retryAfter !== undefined) details["retry_after_ms"] = retryAfter;
    const quota = upstreamCode === "insufficient_quota";
    return new ImageError("rate_limited", message("the provider rate-limited the request"), init("rate_limited", !quota));
  }
  if (status === 401) return new ImageError("authentication", message("the provider rejected the API key"), init("authentication", false));
  if (status === 403) return new ImageError("permission_denied", message("the provider denied the request"), init("permission_denied", false));
  if (status === 404) return new ImageError("configuration", message("the provider does not know this model or endpoint"), init("configuration", false));
  if (status === 408 || status === 504) return new ImageError("timeout", message("the provider timed out"), init("timeout", true));
  if (status >= 500) return new ImageError("upstream", message("the provider failed"), init("upstream", status !== 501));
  if (status === 400 || status === 422) return new ImageError("invalid_request", message("the provider rejected the request"), init("invalid_request", false));
  return new ImageError("upstream", message("the provider returned an unexpected status"), init("upstream", false));
}

async function readLimited(body: ReadableStream<Uint8Array> | null, limit: number, provider: string): Promise<Buffer> {
  if (!body) return Buffer.alloc(0);
  const chunks: Uint8Array[] = [];
  let total = 0;
  const reader = body.getReader();
  while (true) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (total > limit) {
      await reader.cancel().catch(() => undefined);
      throw new ImageError("protocol", "the provider's response is too large", { provider, details: { limit } });
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks, total);
}

function usageOf(usage: UpstreamUsage | undefined): Usage | undefined {
  if (!usage) return undefined;
  const out: Usage = { provider: {} };
  if (typeof usage.input_tokens === "number") out.inputTokens = usage.input_tokens;
  if (typeof usage.output_tokens === "number") out.outputTokens = usage.output_tokens;
  if (typeof usage.total_tokens === "number") out.totalTokens = usage.total_tokens;
  return out;
}

const SHARP_FORMATS: Record<string, OutputFormat> = { png: "png", jpeg: "jpeg", jpg: "jpeg", webp: "webp" };

/**
 * A provider speaking the OpenAI Images API (`POST /v1/images/generations`)
 * to a configured base URL. The API key is read from the named environment
 * variable on every call and never logged or echoed.
 */
export class OpenAiImageProvider implements ImageProvider {
  constructor(
    readonly config: OpenAiProviderConfig,
    private readonly env: Readonly<Record<string, string | undefined>>,
  ) {}

  descriptor(): ProviderDescriptor {
    return {
      name: this.config.name,
      displayName: "OpenAI-compatible images",
      version: OPENAI_PROVIDER_VERSION,
      experimental: false,
      models: [this.config.model],
    };
  }

  async capabilities(_model?: string): Promise<ProviderCapabilities> {
    const count = { min: 1, max: this.config.nativeCount };
    const none = { support: "unsupported" as const, maxCount: 0, maxBytesEach: 0, maxBytesTotal: 0 };
    return {
      provider: this.config.name,
      implementationVersion: OPENAI_PROVIDER_VERSION,
      // Only the configured model is served; negotiation rejects any other by name.
      model: this.config.model,
      experimental: false,
      generation: true,
      edits: false,
      count,
      batching: { mode: "native", nativeCount: { ...count }, maxParallelOutputs: 1 },
      sizes: { auto: true, allowed: [...this.config.sizes], arbitrary: false },
      aspectRatio: "unsupported",
      resolution: "unsupported",
      transparentBackground: "native",
      negativePrompt: "emulated",
      revisedPrompt: "native",
      userAttribution: "native",
      qualities: ["auto", "low", "medium", "high"],
      outputFormats: ["png", "jpeg", "webp"],
      backgrounds: ["auto", "opaque", "transparent"],
      moderation: ["auto", "low"],
      inputFidelities: [],
      actions: ["auto"],
      referenceImages: none,
      editImages: none,
      masks: none,
      partialImages: { min: 0, max: 3 },
      persistentSessions: false,
      explicitThreads: false,
    };
  }

  private apiKey(): string {
    const key = this.env[this.config.apiKeyEnv];
    if (key === undefined || key === "") {
      throw new ImageError("authentication", `the API key variable ${this.config.apiKeyEnv} is not set`, {
        provider: this.config.name,
      });
    }
    return key;
  }

  private body(request: ImageRequest, stream: boolean): Record<string, unknown> {
    const p = request.parameters;
    const body: Record<string, unknown> = {
      model: request.routing.model ?? this.config.model,
      prompt: request.prompt,
      n: p.n,
      size: p.size,
      quality: p.quality,
      output_format: p.outputFormat,
      background: p.background,
      moderation: p.moderation,
    };
    if (p.outputCompression !== undefined) body["output_compression"] = p.outputCompression;
    if (request.user !== undefined) body["user"] = request.user;
    if (stream) {
      body["stream"] = true;
      body["partial_images"] = p.partialImages;
    }
    return body;
  }

  async execute(request: ImageRequest, context: ProviderContext): Promise<ImageResponse> {
    const started = performance.now();
    const key = this.apiKey();
    const stream = request.parameters.n === 1 && request.parameters.partialImages > 0 && context.events !== undefined;
    const signal = AbortSignal.any([context.signal, AbortSignal.timeout(this.config.requestTimeoutMs)]);
    const url = new URL(GENERATIONS_PATH, this.config.baseUrl.endsWith("/") ? this.config.baseUrl : `${this.config.baseUrl}/`);
    let response: Response;
    try {
      response = await fetch(url, {
        method: "POST",
        headers: {
          authorization: `Bearer ${key}`,
          "content-type": "application/json",
          accept: stream ? "text/event-stream" : "application/json",
          "x-client-request-id": context.requestId.slice(0, 512),
        },
        body: JSON.stringify(this.body(request, stream)),
        signal,
      });
    } catch (error) {
      throw this.transportError(error, context);
    }
    if (!response.ok) {
      let parsed: UpstreamErrorBody | undefined;
      try {
        parsed = JSON.parse((await readLimited(response.body, MAX_ERROR_BODY_BYTES, this.config.name)).toString("utf8")) as UpstreamErrorBody;
      } catch {
        parsed = undefined;
      }
      throw upstreamHttpError(this.config.name, response.status, response.headers, parsed);
    }
    let body: UpstreamBody;
    try {
      body = stream ? await this.readStream(response, context) : await this.readJson(response);
    } catch (error) {
      throw error instanceof ImageError ? error : this.transportError(error, context);
    }
    const images = body.data ?? [];
    if (images.length !== request.parameters.n) {
      throw new ImageError("protocol", "the provider returned a different number of images", {
        provider: this.config.name,
        details: { expected: request.parameters.n, actual: images.length },
      });
    }
    const data: GeneratedImage[] = [];
    for (const [index, image] of images.entries()) data.push(await this.decode(image, index, request.parameters.outputFormat));
    const revised = images.find((image) => typeof image.revised_prompt === "string" && image.revised_prompt !== "")?.revised_prompt;
    const result: ImageResponse = {
      id: context.requestId,
      created: Math.floor(Date.now() / 1000),
      provider: this.config.name,
      model: request.routing.model ?? this.config.model,
      requested: { ...request.parameters },
      effective: { ...request.parameters },
      normalizations: [],
      data,
      failures: [],
      timings: { ...zeroTimings(), providerMs: Math.round(performance.now() - started) },
      warnings: request.parameters.partialImages > 0 && !stream ? ["partial_images_not_streamed"] : [],
    };
    if (revised !== undefined) result.revisedPrompt = revised;
    const usage = usageOf(body.usage);
    if (usage) result.usage = usage;
    return result;
  }

  private transportError(error: unknown, context: ProviderContext): ImageError {
    if (context.signal.aborted) return new ImageError("cancelled", "the operation was cancelled", { provider: this.config.name });
    if (error instanceof Error && error.name === "TimeoutError") {
      return new ImageError("timeout", "the provider did not answer in time", { provider: this.config.name, retryable: true });
    }
    return new ImageError("upstream", "the provider could not be reached", { provider: this.config.name, retryable: true });
  }

  private async readJson(response: Response): Promise<UpstreamBody> {
    const declared = Number(response.headers.get("content-length") ?? "0");
    if (declared > this.config.maxResponseBytes) {
      throw new ImageError("protocol", "the provider's response is too large", { provider: this.config.name });
    }
    const raw = await readLimited(response.body, this.config.maxResponseBytes, this.config.name);
    try {
      return JSON.parse(raw.toString("utf8")) as UpstreamBody;
    } catch {
      throw new ImageError("protocol", "the provider's response is not valid JSON", { provider: this.config.name });
    }
  }

  /** Reads an SSE response: partial images are forwarded, the completed event is the result. */
  private async readStream(response: Response, context: ProviderContext): Promise<UpstreamBody> {
    const events: EventSourceMessage[] = [];
    let parseFailure: ImageError | undefined;
    const parser = createParser({
      maxBufferSize: this.config.maxResponseBytes,
      onEvent: (event) => events.push(event),
      onError: () => {
        parseFailure = new ImageError("protocol", "the provider's event stream is malformed", { provider: this.config.name });
      },
    });
    if (!response.body) throw new ImageError("protocol", "the provider sent no event stream", { provider: this.config.name });
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let total = 0;
    let completed: UpstreamBody | undefined;
    while (completed === undefined) {
      const { done, value } = await reader.read();
      if (done) break;
      total += value.length;
      if (total > this.config.maxResponseBytes) {
        await reader.cancel().catch(() => undefined);
        throw new ImageError("protocol", "the provider's response is too large", { provider: this.config.name });
      }
      parser.feed(value);
      if (parseFailure) throw parseFailure;
      for (const event of events.splice(0)) {
        if (event.data === "[DONE]") continue;
        let payload: { type?: string; b64_json?: string; partial_image_index?: number; usage?: UpstreamUsage; revised_prompt?: string };
        try {
          payload = JSON.parse(event.data) as typeof payload;
        } catch {
          throw new ImageError("protocol", "the provider sent an event that is not JSON", { provider: this.config.name });
        }
        const type = payload.type ?? event.event;
        if (type === "image_generation.partial_image" && typeof payload.b64_json === "string") {
          await context.events?.({
            type: "partial_image",
            index: 0,
            partialIndex: payload.partial_image_index ?? 0,
            image: new Uint8Array(Buffer.from(payload.b64_json, "base64")),
          });
        } else if (type === "image_generation.completed") {
          const image: UpstreamImage = {};
          if (typeof payload.b64_json === "string") image.b64_json = payload.b64_json;
          if (typeof payload.revised_prompt === "string") image.revised_prompt = payload.revised_prompt;
          completed = { data: [image], ...(payload.usage ? { usage: payload.usage } : {}) };
        } else if (type === "error") {
          throw new ImageError("upstream", "the provider reported an error in the stream", { provider: this.config.name });
        }
      }
    }
    await reader.cancel().catch(() => undefined);
    if (!completed) throw new ImageError("protocol", "the provider's stream ended without a result", { provider: this.config.name });
    return completed;
  }

  private async decode(image: UpstreamImage, index: number, requested: OutputFormat): Promise<GeneratedImage> {
    if (typeof image.b64_json !== "string" || image.b64_json === "") {
      throw new ImageError("protocol", "the provider returned an image without b64_json", {
        provider: this.config.name,
        details: { output_index: index },
      });
    }
    const bytes = Buffer.from(image.b64_json, "base64");
    let metadata: Metadata;
    try {
      metadata = await sharp(bytes).metadata();
    } catch {
      throw new ImageError("protocol", "the provider returned an undecodable image", {
        provider: this.config.name,
        details: { output_index: index },
      });
    }
    const format = SHARP_FORMATS[metadata.format ?? ""] ?? requested;
    return {
      index,
      format,
      width: metadata.width ?? 0,
      height: metadata.height ?? 0,
      bytes: bytes.byteLength,
      sha256: createHash("sha256").update(bytes).digest("hex"),
      data: new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength),
    };
  }

  async shutdown(): Promise<void> {}
}
