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
import { openHttpClientSpan, type HttpClientSpan } from "../../telemetry/index.js";

const OPENAI_PROVIDER_VERSION = "1.0.0";
const GENERATIONS_PATH = "/v1/images/generations";
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

/** Retry-After in milliseconds: delta seconds or an HTTP date. */
export function parseRetryAfter(value: string | null, now = Date.now()): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  if (/^\d+$/.test(value.trim())) return Number(value.trim()) * 1000;
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

/**
 * Upstream error codes that mean a safety system refused: `moderation_blocked`
 * (GPT Image), `content_policy_violation` (DALL·E and compatible gateways),
 * `content_filter` (Azure OpenAI). Compared case-insensitively.
 */
const SAFETY_CODES: ReadonlySet<string> = new Set(["moderation_blocked", "content_policy_violation", "content_filter"]);

/** What an upstream code says, when it says more than the status. */
const CODE_VERDICTS: Readonly<Record<string, { code: ErrorCode; retryable: boolean; message: string }>> = {
  rate_limit_exceeded: { code: "rate_limited", retryable: true, message: "the provider rate-limited the request" },
  insufficient_quota: { code: "rate_limited", retryable: false, message: "the provider's quota is exhausted" },
  billing_hard_limit_reached: { code: "rate_limited", retryable: false, message: "the provider's billing limit is reached" },
  invalid_api_key: { code: "authentication", retryable: false, message: "the provider rejected the API key" },
  model_not_found: { code: "configuration", retryable: false, message: "the provider does not know this model" },
  server_error: { code: "upstream", retryable: true, message: "the provider failed" },
};

/** What an upstream error `type` says, for stream errors that carry no status. */
const TYPE_VERDICTS: Readonly<Record<string, { code: ErrorCode; retryable: boolean; message: string }>> = {
  invalid_request_error: { code: "invalid_request", retryable: false, message: "the provider rejected the request" },
  image_generation_user_error: { code: "invalid_request", retryable: false, message: "the provider rejected the request" },
  authentication_error: { code: "authentication", retryable: false, message: "the provider rejected the API key" },
  permission_error: { code: "permission_denied", retryable: false, message: "the provider denied the request" },
  permission_denied_error: { code: "permission_denied", retryable: false, message: "the provider denied the request" },
  rate_limit_error: { code: "rate_limited", retryable: true, message: "the provider rate-limited the request" },
  server_error: { code: "upstream", retryable: true, message: "the provider failed" },
  api_error: { code: "upstream", retryable: true, message: "the provider failed" },
};

/** An upstream error, from an unsuccessful HTTP response or an SSE `error` event. */
export interface UpstreamFailure {
  /** The HTTP status; absent for an error inside a stream. */
  readonly status?: number;
  readonly type?: string | undefined;
  readonly code?: string | undefined;
  readonly message?: string | undefined;
  readonly param?: string | undefined;
  readonly retryAfterMs?: number | undefined;
  readonly upstreamRequestId?: string | undefined;
}

/** The verdict for an upstream failure without the safety case: code first, then status, then type. */
function verdictOf(failure: UpstreamFailure): { code: ErrorCode; retryable: boolean; message: string } {
  const byCode = failure.code === undefined ? undefined : CODE_VERDICTS[failure.code.toLowerCase()];
  if (byCode) return byCode;
  const status = failure.status;
  if (status !== undefined) {
    if (status === 429) return { code: "rate_limited", retryable: true, message: "the provider rate-limited the request" };
    if (status === 401) return { code: "authentication", retryable: false, message: "the provider rejected the API key" };
    if (status === 403) return { code: "permission_denied", retryable: false, message: "the provider denied the request" };
    if (status === 404) return { code: "configuration", retryable: false, message: "the provider does not know this model or endpoint" };
    if (status === 408 || status === 504) return { code: "timeout", retryable: true, message: "the provider timed out" };
    if (status >= 500) return { code: "upstream", retryable: status !== 501, message: "the provider failed" };
    if (status === 400 || status === 422) return { code: "invalid_request", retryable: false, message: "the provider rejected the request" };
    return { code: "upstream", retryable: false, message: "the provider returned an unexpected status" };
  }
  const byType = failure.type === undefined ? undefined : TYPE_VERDICTS[failure.type.toLowerCase()];
  return byType ?? { code: "upstream", retryable: false, message: "the provider reported an error in the stream" };
}

/**
 * The ImageError for an upstream failure; HTTP errors and stream errors go
 * through here alike. Safety is decided by the upstream code alone (a
 * moderation code is `safety_rejected`, whatever the type or status); the
 * upstream code, type and message are kept in the details.
 */
export function classifyUpstreamError(provider: string, failure: UpstreamFailure): ImageError {
  const details: Record<string, string | number | boolean> = {};
  if (failure.status !== undefined) details["http_status"] = failure.status;
  if (failure.code) details["upstream_code"] = failure.code;
  if (failure.type) details["upstream_type"] = failure.type;
  const upstreamMessage = failure.message ? failure.message.slice(0, 500) : undefined;
  if (upstreamMessage) details["upstream_message"] = upstreamMessage;
  if (failure.param) details["field"] = failure.param;
  const safety = failure.code !== undefined && SAFETY_CODES.has(failure.code.toLowerCase());
  const verdict = safety
    ? { code: "safety_rejected" as const, retryable: false, message: "the provider's safety system refused the request" }
    : verdictOf(failure);
  if (verdict.code === "rate_limited" && failure.retryAfterMs !== undefined) details["retry_after_ms"] = failure.retryAfterMs;
  return new ImageError(verdict.code, upstreamMessage ? `${verdict.message}: ${upstreamMessage}` : verdict.message, {
    retryable: verdict.retryable,
    provider,
    details,
    ...(failure.upstreamRequestId ? { upstreamRequestId: failure.upstreamRequestId } : {}),
  });
}

/** A string field of an upstream JSON object, or undefined. */
function text(value: unknown): string | undefined {
  return typeof value === "string" && value !== "" ? value : undefined;
}

/** The error object of an upstream error body or SSE `error` event: nested under `error`, or at the top level. */
function upstreamErrorFields(payload: unknown): Pick<UpstreamFailure, "type" | "code" | "message" | "param"> {
  if (typeof payload !== "object" || payload === null) return {};
  const outer = payload as Record<string, unknown>;
  const inner = typeof outer["error"] === "object" && outer["error"] !== null ? (outer["error"] as Record<string, unknown>) : outer;
  // A top-level `type` of a stream event is the event type ("error"), not the error type.
  const type = text(inner["type"]);
  return {
    type: type === "error" ? undefined : type,
    code: text(inner["code"]),
    message: text(inner["message"]),
    param: text(inner["param"]),
  };
}

/** The ImageError for an unsuccessful upstream HTTP response. */
function upstreamHttpError(provider: string, status: number, headers: Headers, body: unknown): ImageError {
  return classifyUpstreamError(provider, {
    status,
    ...upstreamErrorFields(body),
    retryAfterMs: status === 429 ? parseRetryAfter(headers.get("retry-after")) : undefined,
    upstreamRequestId: headers.get("x-request-id") ?? undefined,
  });
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

  private generationsUrl(): URL {
    return new URL(GENERATIONS_PATH, this.config.baseUrl.endsWith("/") ? this.config.baseUrl : `${this.config.baseUrl}/`);
  }

  async execute(request: ImageRequest, context: ProviderContext): Promise<ImageResponse> {
    // The upstream call's client span (tracing on) lasts until its body is read and decoded.
    const span = openHttpClientSpan("POST", this.generationsUrl(), { "mmgate.images.provider": this.config.name });
    if (span === undefined) return this.call(request, context, undefined);
    try {
      const response = await span.run(() => this.call(request, context, span));
      span.end();
      return response;
    } catch (error) {
      span.end(error);
      throw error;
    }
  }

  private async call(request: ImageRequest, context: ProviderContext, span: HttpClientSpan | undefined): Promise<ImageResponse> {
    const started = performance.now();
    const key = this.apiKey();
    const stream = request.parameters.n === 1 && request.parameters.partialImages > 0 && context.events !== undefined;
    const signal = AbortSignal.any([context.signal, AbortSignal.timeout(this.config.requestTimeoutMs)]);
    const url = this.generationsUrl();
    let response: Response;
    try {
      response = await fetch(url, {
        method: "POST",
        headers: {
          authorization: `Bearer ${key}`,
          "content-type": "application/json",
          accept: stream ? "text/event-stream" : "application/json",
          "x-client-request-id": context.requestId.slice(0, 512),
          ...span?.headers,
        },
        body: JSON.stringify(this.body(request, stream)),
        signal,
      });
    } catch (error) {
      throw this.transportError(error, context);
    }
    span?.status(response.status);
    if (!response.ok) {
      let parsed: unknown;
      try {
        parsed = JSON.parse((await readLimited(response.body, MAX_ERROR_BODY_BYTES, this.config.name)).toString("utf8")) as unknown;
      } catch {
        parsed = undefined;
      }
      throw upstreamHttpError(this.config.name, response.status, response.headers, parsed);
    }
    let body: UpstreamBody;
    try {
      body = stream ? await this.readStream(response, context, request.parameters.partialImages) : await this.readJson(response);
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
  private async readStream(response: Response, context: ProviderContext, partialImages: number): Promise<UpstreamBody> {
    const events: EventSourceMessage[] = [];
    let partialsSeen = 0;
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
          // Previews are bounded by the request: an index outside 0..partial_images is dropped, like an
          // out-of-range output index in fan-out. An upstream that sends no index gets them counted.
          const partialIndex = payload.partial_image_index ?? partialsSeen;
          partialsSeen += 1;
          if (!Number.isInteger(partialIndex) || partialIndex < 0 || partialIndex >= partialImages) continue;
          await context.events?.({
            type: "partial_image",
            index: 0,
            partialIndex,
            image: new Uint8Array(Buffer.from(payload.b64_json, "base64")),
          });
        } else if (type === "image_generation.completed") {
          const image: UpstreamImage = {};
          if (typeof payload.b64_json === "string") image.b64_json = payload.b64_json;
          if (typeof payload.revised_prompt === "string") image.revised_prompt = payload.revised_prompt;
          completed = { data: [image], ...(payload.usage ? { usage: payload.usage } : {}) };
        } else if (type === "error") {
          await reader.cancel().catch(() => undefined);
          throw classifyUpstreamError(this.config.name, {
            ...upstreamErrorFields(payload),
            upstreamRequestId: response.headers.get("x-request-id") ?? undefined,
          });
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
