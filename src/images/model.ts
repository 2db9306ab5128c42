import type { ImageError } from "./core/errors.js";

/**
 * The image domain model: plain objects whose enum values are the
 * reference's snake_case wire strings. `proto-convert.ts` converts to and
 * from the protobuf messages.
 */

export type Quality = "auto" | "low" | "medium" | "high";
export type OutputFormat = "png" | "jpeg" | "webp";
export type Background = "auto" | "opaque" | "transparent";
export type Moderation = "auto" | "low";
export type FailurePolicy = "fail_fast" | "best_effort";
export type InputFidelity = "low" | "high";
export type ImageAction = "auto" | "generate" | "edit";
export type Resolution = "1k" | "2k" | "4k";
export type SessionMode = "isolated" | "persistent" | "thread";
export type CompatibilityMode = "strict" | "normalize" | "best_effort";
export type NegativePromptMode = "auto" | "native" | "merge" | "reject";
export type RevisedPromptPolicy = "include" | "omit" | "require";
export type BatchExecution = "auto" | "sequential" | "parallel";
export type ResponseFormat = "bytes" | "b64_json" | "metadata";
export type SupportLevel = "native" | "emulated" | "unsupported";
export type BatchMode = "native" | "fan_out";

export interface ImageInput {
  readonly data: Uint8Array;
  readonly mediaType?: string;
  readonly filename?: string;
}

export type ImageOperation =
  | { readonly kind: "generate" }
  | { readonly kind: "edit"; readonly images: readonly ImageInput[]; readonly mask?: ImageInput };

export interface GenerationParameters {
  n: number;
  size: string;
  aspectRatio?: string;
  resolution?: Resolution;
  quality: Quality;
  outputFormat: OutputFormat;
  outputCompression?: number;
  background: Background;
  moderation: Moderation;
  partialImages: number;
  failurePolicy: FailurePolicy;
  inputFidelity?: InputFidelity;
  action: ImageAction;
}

export type FallbackPolicy = "on_unavailable" | "on_error";

/** One fallback route: a registered provider and optionally its model. */
export interface FallbackRoute {
  readonly provider: string;
  readonly model?: string;
}

export interface RoutingOptions {
  provider?: string;
  model?: string;
  /** Tried in order when the primary fails and the policy allows it (runtime/fallback.ts). */
  fallbacks?: readonly FallbackRoute[];
  /** Absent means on_unavailable. */
  fallbackPolicy?: FallbackPolicy;
}

export interface SessionOptions {
  mode: SessionMode;
  key?: string;
  threadId?: string;
}

export interface RequestPolicies {
  compatibility: CompatibilityMode;
  negativePrompt: NegativePromptMode;
  revisedPrompt: RevisedPromptPolicy;
  batchExecution: BatchExecution;
}

export interface ImageRequest {
  version: string;
  prompt: string;
  negativePrompt?: string;
  operation: ImageOperation;
  referenceImages: readonly ImageInput[];
  parameters: GenerationParameters;
  routing: RoutingOptions;
  session: SessionOptions;
  policies: RequestPolicies;
  timeoutMs?: number;
  idempotencyKey?: string;
  user?: string;
  responseFormat: ResponseFormat;
}

/** The contract's default parameters. */
function defaultParameters(): GenerationParameters {
  return {
    n: 1,
    size: "auto",
    quality: "auto",
    outputFormat: "png",
    background: "auto",
    moderation: "auto",
    partialImages: 0,
    failurePolicy: "fail_fast",
    action: "auto",
  };
}

export interface ImageRequestInit {
  prompt: string;
  negativePrompt?: string;
  operation?: ImageOperation;
  referenceImages?: readonly ImageInput[];
  parameters?: Partial<GenerationParameters>;
  routing?: RoutingOptions;
  session?: Partial<SessionOptions>;
  policies?: Partial<RequestPolicies>;
  timeoutMs?: number;
  idempotencyKey?: string;
  user?: string;
  responseFormat?: ResponseFormat;
  version?: string;
}

/** Builds a request with every absent field defaulted. */
export function createImageRequest(init: ImageRequestInit): ImageRequest {
  const request: ImageRequest = {
    version: init.version ?? "1",
    prompt: init.prompt,
    operation: init.operation ?? { kind: "generate" },
    referenceImages: init.referenceImages ?? [],
    parameters: { ...defaultParameters(), ...init.parameters },
    routing: { ...init.routing },
    session: { mode: "isolated", ...init.session },
    policies: {
      compatibility: "strict",
      negativePrompt: "auto",
      revisedPrompt: "include",
      batchExecution: "auto",
      ...init.policies,
    },
    responseFormat: init.responseFormat ?? "bytes",
  };
  if (init.negativePrompt !== undefined) request.negativePrompt = init.negativePrompt;
  if (init.timeoutMs !== undefined) request.timeoutMs = init.timeoutMs;
  if (init.idempotencyKey !== undefined) request.idempotencyKey = init.idempotencyKey;
  if (init.user !== undefined) request.user = init.user;
  return request;
}

/** A shallow-per-section copy, enough for changing parameters or routing. */
export function cloneRequest(request: ImageRequest): ImageRequest {
  return {
    ...request,
    parameters: { ...request.parameters },
    routing: { ...request.routing },
    session: { ...request.session },
    policies: { ...request.policies },
  };
}

export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

export interface Normalization {
  field: string;
  requested?: JsonValue;
  effective?: JsonValue;
  reason: string;
}

export interface GeneratedImage {
  index: number;
  format: OutputFormat;
  width: number;
  height: number;
  /** Encoded size in bytes. */
  bytes: number;
  /** Lowercase hex SHA-256 of the encoded image. */
  sha256: string;
  generationMs?: number;
  /** The encoded image; absent for metadata-only results. */
  data?: Uint8Array;
}

export interface ImageFailure {
  index: number;
  error: ImageError;
  generationMs: number;
}

export interface Usage {
  inputTokens?: number;
  outputTokens?: number;
  totalTokens?: number;
  provider: Record<string, number>;
}

export interface SessionMetadata {
  key?: string;
  threadId?: string;
  reused: boolean;
}

export interface Timings {
  queueMs: number;
  inputMs: number;
  providerMs: number;
  artifactMs: number;
  totalMs: number;
}

export function zeroTimings(): Timings {
  return { queueMs: 0, inputMs: 0, providerMs: 0, artifactMs: 0, totalMs: 0 };
}

/** One route tried for a request with fallbacks. */
export interface ProviderAttempt {
  provider: string;
  model?: string;
  outcome: "succeeded" | "failed";
  errorCode?: ImageError["code"];
  durationMs: number;
}

export interface ImageResponse {
  id: string;
  /** Unix seconds at completion. */
  created: number;
  provider: string;
  model: string;
  requested: GenerationParameters;
  effective: GenerationParameters;
  normalizations: Normalization[];
  data: GeneratedImage[];
  failures: ImageFailure[];
  revisedPrompt?: string;
  usage?: Usage;
  session?: SessionMetadata;
  timings: Timings;
  warnings: string[];
  /** Only when the request had routing.fallbacks. */
  attempts?: ProviderAttempt[];
}

/** Streaming events a provider pushes while it executes. */
export type ProviderEvent =
  | { readonly type: "started" }
  | { readonly type: "progress"; readonly stage: string; readonly index?: number }
  | {
      readonly type: "partial_image";
      readonly index: number;
      readonly partialIndex: number;
      readonly image: Uint8Array;
    }
  | { readonly type: "completed"; readonly response: ImageResponse };

export interface CountRange {
  min: number;
  max: number;
}

export interface BatchCapabilities {
  mode: BatchMode;
  nativeCount: CountRange;
  maxParallelOutputs: number;
}

export interface SizeCapabilities {
  auto: boolean;
  allowed: string[];
  arbitrary: boolean;
  minEdge?: number;
  maxEdge?: number;
  edgeMultiple?: number;
  minPixels?: number;
  maxPixels?: number;
  maxAspectRatio?: number;
}

export interface InputCapabilities {
  support: SupportLevel;
  maxCount: number;
  maxBytesEach: number;
  maxBytesTotal: number;
}

export interface ProviderCapabilities {
  provider: string;
  implementationVersion: string;
  model?: string;
  experimental: boolean;
  generation: boolean;
  edits: boolean;
  count: CountRange;
  batching: BatchCapabilities;
  sizes: SizeCapabilities;
  aspectRatio: SupportLevel;
  resolution: SupportLevel;
  transparentBackground: SupportLevel;
  negativePrompt: SupportLevel;
  revisedPrompt: SupportLevel;
  userAttribution: SupportLevel;
  qualities: Quality[];
  outputFormats: OutputFormat[];
  backgrounds: Background[];
  moderation: Moderation[];
  inputFidelities: InputFidelity[];
  actions: ImageAction[];
  referenceImages: InputCapabilities;
  editImages: InputCapabilities;
  masks: InputCapabilities;
  partialImages: CountRange;
  persistentSessions: boolean;
  explicitThreads: boolean;
}

export interface ProviderDescriptor {
  name: string;
  displayName: string;
  version: string;
  experimental: boolean;
  models: string[];
}
