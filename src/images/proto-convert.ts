/**
 * Conversion between the protobuf messages of mmgate.images.v1 and the
 * model (`model.ts`), and of ImageError to its gRPC status. Enums map by
 * name (FAIL_FAST ⇄ "fail_fast"); UNSPECIFIED means the contract default;
 * unknown enum numbers are request issues.
 */
import { create, fromJson, type JsonObject } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import * as pb from "../../gen/mmgate/images/v1/images_pb.js";
import * as caps from "../../gen/mmgate/images/v1/capabilities_pb.js";
import type * as m from "./model.js";
import type { ErrorCode, ImageError } from "./core/errors.js";
import { collectIssues, validationError, type RequestLimits, type ValidationIssue } from "./core/validation.js";

type NumericEnum = Record<string, string | number>;

const MAX_U64 = (1n << 64n) - 1n;

function u64(value: number): bigint {
  if (!Number.isFinite(value) || value <= 0) return 0n;
  const big = BigInt(Math.floor(value));
  return big > MAX_U64 ? MAX_U64 : big;
}

function num(value: bigint): number {
  return value > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(value);
}

function enumToProto(enumObject: NumericEnum, value: string): number {
  const found = enumObject[value.toUpperCase()];
  if (typeof found !== "number") throw new Error(`no protobuf value for ${value}`);
  return found;
}

function enumName(enumObject: NumericEnum, value: number): string | undefined {
  const name = enumObject[value];
  return typeof name === "string" ? name.toLowerCase() : undefined;
}

class IssueCollector {
  readonly issues: ValidationIssue[] = [];
  /** Domain value of an enum field; the default for UNSPECIFIED. */
  enumValue<T extends string>(enumObject: NumericEnum, value: number, field: string, fallback: T): T {
    if (value === 0) return fallback;
    const name = enumName(enumObject, value);
    if (name === undefined) {
      this.issues.push({ field, code: "invalid_enum", message: `unknown value ${value}` });
      return fallback;
    }
    return name as T;
  }
  optionalEnum<T extends string>(enumObject: NumericEnum, value: number, field: string): T | undefined {
    if (value === 0) return undefined;
    const name = enumName(enumObject, value);
    if (name === undefined) this.issues.push({ field, code: "invalid_enum", message: `unknown value ${value}` });
    return name as T | undefined;
  }
}

function gcd(a: number, b: number): number {
  return b === 0 ? a : gcd(b, a % b);
}

/** "1920:1080" → "16:9"; anything else unchanged (validation reports it). */
export function reduceAspectRatio(value: string): string {
  const match = /^([1-9][0-9]{0,8}):([1-9][0-9]{0,8})$/.exec(value);
  if (!match) return value;
  const w = Number(match[1]);
  const h = Number(match[2]);
  const d = gcd(w, h);
  return `${w / d}:${h / d}`;
}

const RESOLUTIONS: Record<number, m.Resolution> = {
  [pb.Resolution.RESOLUTION_1K]: "1k",
  [pb.Resolution.RESOLUTION_2K]: "2k",
  [pb.Resolution.RESOLUTION_4K]: "4k",
};

function resolutionToProto(value: m.Resolution | undefined): pb.Resolution {
  if (value === "1k") return pb.Resolution.RESOLUTION_1K;
  if (value === "2k") return pb.Resolution.RESOLUTION_2K;
  if (value === "4k") return pb.Resolution.RESOLUTION_4K;
  return pb.Resolution.RESOLUTION_UNSPECIFIED;
}

function inputFromProto(input: pb.ImageInput): m.ImageInput {
  const out: { data: Uint8Array; mediaType?: string; filename?: string } = { data: input.data };
  if (input.mediaType !== "") out.mediaType = input.mediaType;
  if (input.filename !== "") out.filename = input.filename;
  return out;
}

function parametersFromProto(p: pb.GenerationParameters | undefined, issues: IssueCollector): m.GenerationParameters {
  const params: m.GenerationParameters = {
    n: p?.n ?? 1,
    size: p === undefined || p.size === "" ? "auto" : p.size,
    quality: issues.enumValue(pb.Quality, p?.quality ?? 0, "parameters.quality", "auto"),
    outputFormat: issues.enumValue(pb.OutputFormat, p?.outputFormat ?? 0, "parameters.output_format", "png"),
    background: issues.enumValue(pb.Background, p?.background ?? 0, "parameters.background", "auto"),
    moderation: issues.enumValue(pb.Moderation, p?.moderation ?? 0, "parameters.moderation", "auto"),
    partialImages: p?.partialImages ?? 0,
    failurePolicy: issues.enumValue(pb.FailurePolicy, p?.failurePolicy ?? 0, "parameters.failure_policy", "fail_fast"),
    action: issues.enumValue(pb.ImageAction, p?.action ?? 0, "parameters.action", "auto"),
  };
  if (p === undefined) return params;
  if (p.aspectRatio !== "") params.aspectRatio = reduceAspectRatio(p.aspectRatio);
  if (p.resolution !== 0) {
    const resolution = RESOLUTIONS[p.resolution];
    if (resolution) params.resolution = resolution;
    else issues.issues.push({ field: "parameters.resolution", code: "invalid_enum", message: `unknown value ${p.resolution}` });
  }
  if (p.outputCompression !== undefined) params.outputCompression = p.outputCompression;
  const fidelity = issues.optionalEnum<m.InputFidelity>(pb.InputFidelity, p.inputFidelity, "parameters.input_fidelity");
  if (fidelity) params.inputFidelity = fidelity;
  return params;
}

/**
 * The core request of a wire request; throws invalid_request for unknown
 * enum values. No operation set means generate. With `limits`, that error
 * lists every other issue of the request too, as validation would.
 */
export function requestFromProto(request: pb.ImageRequest | undefined, limits?: RequestLimits): m.ImageRequest {
  const issues = new IssueCollector();
  if (!request) {
    throw validationError([{ field: "request", code: "required", message: "the request is missing" }]);
  }
  let operation: m.ImageOperation = { kind: "generate" };
  if (request.operation.case === "edit") {
    const edit = request.operation.value;
    operation = {
      kind: "edit",
      images: edit.images.map(inputFromProto),
      ...(edit.mask ? { mask: inputFromProto(edit.mask) } : {}),
    };
  }
  // No operation set (neither generate nor edit) means generate.
  const policies = request.policies;
  const session = request.session;
  const out: m.ImageRequest = {
    version: request.version === "" ? "1" : request.version,
    prompt: request.prompt,
    operation,
    referenceImages: request.referenceImages.map(inputFromProto),
    parameters: parametersFromProto(request.parameters, issues),
    routing: {},
    session: { mode: issues.enumValue(pb.SessionMode, session?.mode ?? 0, "session.mode", "isolated") },
    policies: {
      compatibility: issues.enumValue(pb.CompatibilityMode, policies?.compatibility ?? 0, "policies.compatibility", "strict"),
      negativePrompt: issues.enumValue(pb.NegativePromptMode, policies?.negativePrompt ?? 0, "policies.negative_prompt", "auto"),
      revisedPrompt: issues.enumValue(pb.RevisedPromptPolicy, policies?.revisedPrompt ?? 0, "policies.revised_prompt", "include"),
      batchExecution: issues.enumValue(pb.BatchExecution, policies?.batchExecution ?? 0, "policies.batch_execution", "auto"),
    },
    responseFormat: issues.enumValue(pb.ResponseFormat, request.responseFormat, "response_format", "bytes"),
  };
  if (request.negativePrompt !== undefined) out.negativePrompt = request.negativePrompt;
  if (request.routing?.provider) out.routing.provider = request.routing.provider;
  if (request.routing?.model) out.routing.model = request.routing.model;
  if (request.routing && request.routing.fallbacks.length > 0) {
    out.routing.fallbacks = request.routing.fallbacks.map((f) => (f.model !== "" ? { provider: f.provider, model: f.model } : { provider: f.provider }));
  }
  if (request.routing && request.routing.fallbackPolicy !== 0) {
    out.routing.fallbackPolicy = issues.enumValue(pb.FallbackPolicy, request.routing.fallbackPolicy, "routing.fallback_policy", "on_unavailable");
  }
  if (session?.key !== undefined) out.session.key = session.key;
  if (session?.threadId !== undefined) out.session.threadId = session.threadId;
  if (request.timeoutMs !== undefined) out.timeoutMs = num(request.timeoutMs);
  if (request.idempotencyKey !== undefined) out.idempotencyKey = request.idempotencyKey;
  if (request.user !== undefined) out.user = request.user;
  if (issues.issues.length > 0) {
    const all = limits ? collectIssues(out, limits, issues.issues) : issues.issues;
    throw validationError(all);
  }
  return out;
}

function parametersToProto(p: m.GenerationParameters): pb.GenerationParameters {
  return create(pb.GenerationParametersSchema, {
    n: p.n,
    size: p.size,
    aspectRatio: p.aspectRatio ?? "",
    resolution: resolutionToProto(p.resolution),
    quality: enumToProto(pb.Quality, p.quality),
    outputFormat: enumToProto(pb.OutputFormat, p.outputFormat),
    ...(p.outputCompression !== undefined ? { outputCompression: p.outputCompression } : {}),
    background: enumToProto(pb.Background, p.background),
    moderation: enumToProto(pb.Moderation, p.moderation),
    partialImages: p.partialImages,
    failurePolicy: enumToProto(pb.FailurePolicy, p.failurePolicy),
    inputFidelity: p.inputFidelity ? enumToProto(pb.InputFidelity, p.inputFidelity) : 0,
    action: enumToProto(pb.ImageAction, p.action),
  });
}

function errorCodeToProto(code: ErrorCode): pb.ErrorCode {
  return enumToProto(pb.ErrorCode, code);
}

export function errorCodeFromProto(code: pb.ErrorCode): ErrorCode {
  return (enumName(pb.ErrorCode, code) as ErrorCode | undefined) ?? "internal";
}

export function errorToProto(error: ImageError): pb.ErrorDetail {
  return create(pb.ErrorDetailSchema, {
    code: errorCodeToProto(error.code),
    message: error.message,
    retryable: error.retryable,
    ...(error.provider !== undefined ? { provider: error.provider } : {}),
    ...(error.upstreamRequestId !== undefined ? { upstreamRequestId: error.upstreamRequestId } : {}),
    ...(Object.keys(error.details).length > 0 ? { details: { ...error.details } as JsonObject } : {}),
    suggestions: [...error.suggestions],
  });
}

function imageToProto(image: m.GeneratedImage, format: m.ResponseFormat): pb.GeneratedImage {
  let payload: pb.GeneratedImage["payload"] = { case: undefined };
  if (image.data && format === "bytes") payload = { case: "image", value: image.data };
  else if (image.data && format === "b64_json") {
    payload = { case: "b64Json", value: Buffer.from(image.data.buffer, image.data.byteOffset, image.data.byteLength).toString("base64") };
  }
  return create(pb.GeneratedImageSchema, {
    index: image.index,
    format: enumToProto(pb.OutputFormat, image.format),
    width: image.width,
    height: image.height,
    byteSize: u64(image.bytes),
    sha256: image.sha256,
    ...(image.generationMs !== undefined ? { generationMs: u64(image.generationMs) } : {}),
    payload,
  });
}

export function responseToProto(response: m.ImageResponse, format: m.ResponseFormat): pb.ImageResponse {
  const usage = response.usage;
  return create(pb.ImageResponseSchema, {
    id: response.id,
    created: u64(response.created),
    provider: response.provider,
    model: response.model,
    requested: parametersToProto(response.requested),
    effective: parametersToProto(response.effective),
    normalizations: response.normalizations.map((n) =>
      create(pb.NormalizationSchema, {
        field: n.field,
        reason: n.reason,
        ...(n.requested !== undefined ? { requested: fromJson(ValueSchema, n.requested) } : {}),
        ...(n.effective !== undefined ? { effective: fromJson(ValueSchema, n.effective) } : {}),
      }),
    ),
    data: response.data.map((image) => imageToProto(image, format)),
    failures: response.failures.map((f) =>
      create(pb.ImageFailureSchema, { index: f.index, error: errorToProto(f.error), generationMs: u64(f.generationMs) }),
    ),
    ...(response.revisedPrompt !== undefined ? { revisedPrompt: response.revisedPrompt } : {}),
    ...(usage
      ? {
          usage: create(pb.UsageSchema, {
            ...(usage.inputTokens !== undefined ? { inputTokens: u64(usage.inputTokens) } : {}),
            ...(usage.outputTokens !== undefined ? { outputTokens: u64(usage.outputTokens) } : {}),
            ...(usage.totalTokens !== undefined ? { totalTokens: u64(usage.totalTokens) } : {}),
            provider: Object.fromEntries(Object.entries(usage.provider).map(([k, v]) => [k, u64(v)])),
          }),
        }
      : {}),
    ...(response.session
      ? {
          session: create(pb.SessionMetadataSchema, {
            ...(response.session.key !== undefined ? { key: response.session.key } : {}),
            ...(response.session.threadId !== undefined ? { threadId: response.session.threadId } : {}),
            reused: response.session.reused,
          }),
        }
      : {}),
    timings: create(pb.TimingsSchema, {
      queueMs: u64(response.timings.queueMs),
      inputMs: u64(response.timings.inputMs),
      providerMs: u64(response.timings.providerMs),
      artifactMs: u64(response.timings.artifactMs),
      totalMs: u64(response.timings.totalMs),
    }),
    warnings: [...response.warnings],
    attempts: (response.attempts ?? []).map((a) =>
      create(pb.ProviderAttemptSchema, {
        provider: a.provider,
        ...(a.model !== undefined ? { model: a.model } : {}),
        outcome: enumToProto(pb.ProviderAttemptOutcome, a.outcome),
        ...(a.errorCode !== undefined ? { errorCode: errorCodeToProto(a.errorCode) } : {}),
        durationMs: u64(a.durationMs),
      }),
    ),
  });
}

function rangeToProto(range: m.CountRange): caps.CountRange {
  return create(caps.CountRangeSchema, { min: range.min, max: range.max });
}

function inputCapsToProto(input: m.InputCapabilities): caps.InputCapabilities {
  return create(caps.InputCapabilitiesSchema, {
    support: enumToProto(caps.SupportLevel, input.support),
    maxCount: input.maxCount,
    maxBytesEach: u64(input.maxBytesEach),
    maxBytesTotal: u64(input.maxBytesTotal),
  });
}

export function capabilitiesToProto(c: m.ProviderCapabilities): caps.ProviderCapabilities {
  const s = c.sizes;
  const support = (level: m.SupportLevel) => enumToProto(caps.SupportLevel, level);
  return create(caps.ProviderCapabilitiesSchema, {
    provider: c.provider,
    implementationVersion: c.implementationVersion,
    ...(c.model !== undefined ? { model: c.model } : {}),
    experimental: c.experimental,
    generation: c.generation,
    edits: c.edits,
    count: rangeToProto(c.count),
    batching: create(caps.BatchCapabilitiesSchema, {
      mode: enumToProto(caps.BatchMode, c.batching.mode),
      nativeCount: rangeToProto(c.batching.nativeCount),
      maxParallelOutputs: c.batching.maxParallelOutputs,
    }),
    sizes: create(caps.SizeCapabilitiesSchema, {
      auto: s.auto,
      allowed: [...s.allowed],
      arbitrary: s.arbitrary,
      ...(s.minEdge !== undefined ? { minEdge: s.minEdge } : {}),
      ...(s.maxEdge !== undefined ? { maxEdge: s.maxEdge } : {}),
      ...(s.edgeMultiple !== undefined ? { edgeMultiple: s.edgeMultiple } : {}),
      ...(s.minPixels !== undefined ? { minPixels: u64(s.minPixels) } : {}),
      ...(s.maxPixels !== undefined ? { maxPixels: u64(s.maxPixels) } : {}),
      ...(s.maxAspectRatio !== undefined ? { maxAspectRatio: s.maxAspectRatio } : {}),
    }),
    aspectRatio: support(c.aspectRatio),
    resolution: support(c.resolution),
    transparentBackground: support(c.transparentBackground),
    negativePrompt: support(c.negativePrompt),
    revisedPrompt: support(c.revisedPrompt),
    userAttribution: support(c.userAttribution),
    qualities: c.qualities.map((v) => enumToProto(pb.Quality, v)),
    outputFormats: c.outputFormats.map((v) => enumToProto(pb.OutputFormat, v)),
    backgrounds: c.backgrounds.map((v) => enumToProto(pb.Background, v)),
    moderation: c.moderation.map((v) => enumToProto(pb.Moderation, v)),
    inputFidelities: c.inputFidelities.map((v) => enumToProto(pb.InputFidelity, v)),
    actions: c.actions.map((v) => enumToProto(pb.ImageAction, v)),
    referenceImages: inputCapsToProto(c.referenceImages),
    editImages: inputCapsToProto(c.editImages),
    masks: inputCapsToProto(c.masks),
    partialImages: rangeToProto(c.partialImages),
    persistentSessions: c.persistentSessions,
    explicitThreads: c.explicitThreads,
  });
}

/** The gRPC status of each error code. */
export const GRPC_STATUS: Readonly<Record<ErrorCode, Code>> = {
  invalid_request: Code.InvalidArgument,
  unsupported_capability: Code.FailedPrecondition,
  configuration: Code.FailedPrecondition,
  authentication: Code.Unauthenticated,
  permission_denied: Code.PermissionDenied,
  safety_rejected: Code.InvalidArgument,
  rate_limited: Code.ResourceExhausted,
  overloaded: Code.Unavailable,
  timeout: Code.DeadlineExceeded,
  cancelled: Code.Canceled,
  upstream: Code.Unavailable,
  protocol: Code.Internal,
  input: Code.InvalidArgument,
  artifact: Code.Internal,
  session: Code.NotFound,
  idempotency_conflict: Code.AlreadyExists,
  internal: Code.Internal,
  quota_exceeded: Code.ResourceExhausted,
};

/**
 * A ConnectError with the mapped status and an ErrorDetail. Every
 * RESOURCE_EXHAUSTED and UNAVAILABLE answer carries `retry-after` metadata
 * (seconds): details.retry_after_ms rounded up, at least 1, and 1 when
 * nothing better is known.
 */
export function toConnectError(error: ImageError): ConnectError {
  const metadata = new Headers();
  const status = GRPC_STATUS[error.code];
  if (status === Code.ResourceExhausted || status === Code.Unavailable) {
    const retryAfter = error.details["retry_after_ms"];
    const seconds = typeof retryAfter === "number" && Number.isFinite(retryAfter) ? Math.max(1, Math.ceil(retryAfter / 1000)) : 1;
    metadata.set("retry-after", String(seconds));
  }
  return new ConnectError(error.message, status, metadata, [
    { desc: pb.ErrorDetailSchema, value: errorToProto(error) },
  ]);
}
