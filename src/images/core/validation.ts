import type { ImageInput, ImageRequest } from "../model.js";
import { ImageError } from "./errors.js";

/** Intrinsic request limits, independent of any provider. */
export interface RequestLimits {
  readonly maxPromptBytes: number;
  readonly maxNegativePromptBytes: number;
  readonly maxOutputs: number;
  readonly maxInputs: number;
  /** Per input and for all inputs together. */
  readonly maxInlineEncodedBytes: number;
  readonly maxEdge: number;
  readonly maxTimeoutMs: number;
  readonly maxIdentifierBytes: number;
}

export const DEFAULT_REQUEST_LIMITS: RequestLimits = Object.freeze({
  maxPromptBytes: 131_072,
  maxNegativePromptBytes: 65_536,
  maxOutputs: 16,
  maxInputs: 16,
  maxInlineEncodedBytes: 64 * 1024 * 1024,
  maxEdge: 16_384,
  maxTimeoutMs: 1_800_000,
  maxIdentifierBytes: 256,
});

/** Hard ceiling of any output count: indices travel as u8 in the reference. */
export const MAX_OUTPUTS_CEILING = 255;
const MAX_PARTIAL_IMAGES = 3;
/** At most this many issues are reported; the last slot marks the overflow. */
export const MAX_ISSUES = 64;
/** At most this many inputs get per-input checks. */
const MAX_DETAILED_INPUTS = 64;
const MAX_FILENAME_BYTES = 160;

export interface ValidationIssue {
  readonly field: string;
  readonly code: string;
  readonly message: string;
}

const SIZE_PATTERN = /^(auto|[1-9][0-9]*x[1-9][0-9]*)$/;
const ASPECT_PATTERN = /^[1-9][0-9]*:[1-9][0-9]*$/;
// eslint-disable-next-line no-control-regex
const CONTROL_CHARACTERS = /[\u0000-\u001f\u007f]/;

function byteLength(value: string): number {
  return Buffer.byteLength(value, "utf8");
}

/** Parses "WxH"; undefined for "auto" or anything malformed. */
export function parseSize(size: string): { width: number; height: number } | undefined {
  if (size === "auto" || !SIZE_PATTERN.test(size)) return undefined;
  const [w, h] = size.split("x");
  return { width: Number(w), height: Number(h) };
}

export function isValidSize(size: string): boolean {
  return SIZE_PATTERN.test(size);
}

class IssueList {
  readonly issues: ValidationIssue[] = [];
  add(field: string, code: string, message: string): void {
    this.issues.push({ field, code, message });
  }
}

function checkIdentifier(list: IssueList, field: string, value: string | undefined, limits: RequestLimits): void {
  if (value === undefined) return;
  if (value.trim().length === 0) list.add(field, "empty", "must not be blank");
  else if (byteLength(value) > limits.maxIdentifierBytes) {
    list.add(field, "too_large", `must be at most ${limits.maxIdentifierBytes} bytes`);
  } else if (CONTROL_CHARACTERS.test(value)) list.add(field, "invalid", "must not contain control characters");
}

function checkInput(list: IssueList, field: string, input: ImageInput, limits: RequestLimits): void {
  if (input.data.byteLength === 0) list.add(field, "empty", "image data must not be empty");
  else if (input.data.byteLength > limits.maxInlineEncodedBytes) {
    list.add(field, "too_large", `image data must be at most ${limits.maxInlineEncodedBytes} bytes`);
  }
  if (input.mediaType !== undefined && input.mediaType !== "" && !input.mediaType.startsWith("image/")) {
    list.add(field, "invalid", "media_type must start with image/");
  }
  if (input.filename !== undefined && input.filename !== "") {
    const name = input.filename;
    if (
      byteLength(name) > MAX_FILENAME_BYTES ||
      name === "." ||
      name === ".." ||
      /[/\\]/.test(name) ||
      CONTROL_CHARACTERS.test(name)
    ) {
      list.add(field, "invalid_filename", "filename must be one safe path component of at most 160 bytes");
    }
  }
}

function checkInputs(list: IssueList, request: ImageRequest, limits: RequestLimits): void {
  const edits = request.operation.kind === "edit" ? request.operation.images : [];
  const mask = request.operation.kind === "edit" ? request.operation.mask : undefined;
  const total = edits.length + (mask ? 1 : 0) + request.referenceImages.length;
  if (request.operation.kind === "edit" && edits.length === 0) {
    list.add("images", "required", "an edit needs at least one source image");
  }
  if (total > limits.maxInputs) {
    list.add("operation", "too_many_inputs", `at most ${limits.maxInputs} input images are allowed`);
  }
  let detailed = 0;
  let totalBytes = 0;
  const visit = (field: string, input: ImageInput): void => {
    totalBytes += input.data.byteLength;
    if (detailed >= MAX_DETAILED_INPUTS) return;
    detailed += 1;
    checkInput(list, field, input, limits);
  };
  edits.forEach((input, i) => visit(`images[${i}]`, input));
  if (mask) visit("mask", mask);
  request.referenceImages.forEach((input, i) => visit(`reference_images[${i}]`, input));
  if (totalBytes > limits.maxInlineEncodedBytes) {
    list.add("operation", "too_large", `input images together must be at most ${limits.maxInlineEncodedBytes} bytes`);
  }
}

function checkParameters(list: IssueList, request: ImageRequest, limits: RequestLimits): void {
  const p = request.parameters;
  if (!Number.isInteger(p.n) || p.n < 1 || p.n > limits.maxOutputs) {
    list.add("parameters.n", "out_of_range", `must be between 1 and ${limits.maxOutputs}`);
  }
  if (!SIZE_PATTERN.test(p.size)) {
    list.add("parameters.size", "invalid_format", "must be auto or WxH");
  } else {
    const size = parseSize(p.size);
    if (size && (size.width > limits.maxEdge || size.height > limits.maxEdge)) {
      list.add("parameters.size", "out_of_range", `edges must be at most ${limits.maxEdge}`);
    }
    if (size && (p.aspectRatio !== undefined || p.resolution !== undefined)) {
      list.add("parameters.size", "ambiguous", "an explicit size cannot be combined with aspect_ratio or resolution");
    }
  }
  if (p.aspectRatio !== undefined && !ASPECT_PATTERN.test(p.aspectRatio)) {
    list.add("parameters.aspect_ratio", "invalid_format", "must be W:H with positive integers");
  }
  if (p.outputCompression !== undefined) {
    if (!Number.isInteger(p.outputCompression) || p.outputCompression < 0 || p.outputCompression > 100) {
      list.add("parameters.output_compression", "out_of_range", "must be between 0 and 100");
    }
    if (p.outputFormat !== "jpeg" && p.outputFormat !== "webp") {
      list.add("parameters.output_compression", "incompatible", "only jpeg and webp take a compression level");
    }
  }
  if (!Number.isInteger(p.partialImages) || p.partialImages < 0 || p.partialImages > MAX_PARTIAL_IMAGES) {
    list.add("parameters.partial_images", "out_of_range", `must be between 0 and ${MAX_PARTIAL_IMAGES}`);
  }
  const hasSource = request.operation.kind === "edit" && request.operation.images.length > 0;
  const hasReference = request.referenceImages.length > 0;
  if (p.inputFidelity !== undefined && !hasSource && !hasReference) {
    list.add("parameters.input_fidelity", "incompatible", "needs at least one source or reference image");
  }
  if (p.action === "edit" && request.operation.kind === "generate" && !hasReference) {
    list.add("parameters.action", "incompatible", "an edit action needs reference images on a generate request");
  }
  if (p.action === "generate" && request.operation.kind === "edit") {
    list.add("parameters.action", "incompatible", "a generate action cannot be used on an edit request");
  }
}

/** At most this many routing.fallbacks (the reference's limit). */
export const MAX_FALLBACKS = 4;

/**
 * routing.fallbacks: at most MAX_FALLBACKS, each an identifier pair, none
 * repeated or equal to an explicit primary route, isolated sessions only.
 * Whether each provider is registered is checked when the routes are
 * resolved (runtime/fallback.ts), as for routing.provider.
 */
function checkFallbacks(list: IssueList, request: ImageRequest, limits: RequestLimits): void {
  const fallbacks = request.routing.fallbacks ?? [];
  if (fallbacks.length === 0) return;
  if (fallbacks.length > MAX_FALLBACKS) list.add("routing.fallbacks", "too_many", `at most ${MAX_FALLBACKS} fallbacks are allowed`);
  if (request.session.mode !== "isolated") {
    list.add("routing.fallbacks", "incompatible", "fallbacks need an isolated session");
  }
  const routeKey = (provider: string, model: string | undefined) => JSON.stringify([provider, model ?? null]);
  const seen = new Set<string>();
  if (request.routing.provider !== undefined) seen.add(routeKey(request.routing.provider, request.routing.model));
  fallbacks.forEach((route, i) => {
    checkIdentifier(list, `routing.fallbacks[${i}].provider`, route.provider, limits);
    checkIdentifier(list, `routing.fallbacks[${i}].model`, route.model, limits);
    const key = routeKey(route.provider, route.model);
    if (seen.has(key)) list.add(`routing.fallbacks[${i}]`, "duplicate", "repeats the primary route or an earlier fallback");
    seen.add(key);
  });
}

function checkSession(list: IssueList, request: ImageRequest, limits: RequestLimits): void {
  const { mode, key, threadId } = request.session;
  if (mode === "persistent") {
    if (key === undefined) list.add("session.key", "required", "persistent sessions need a key");
    if (threadId !== undefined) list.add("session.thread_id", "incompatible", "only thread sessions take a thread_id");
  } else if (mode === "thread") {
    if (threadId === undefined) list.add("session.thread_id", "required", "thread sessions need a thread_id");
    if (key !== undefined) list.add("session.key", "incompatible", "only persistent sessions take a key");
  } else {
    if (key !== undefined) list.add("session.key", "incompatible", "only persistent sessions take a key");
    if (threadId !== undefined) list.add("session.thread_id", "incompatible", "only thread sessions take a thread_id");
  }
  checkIdentifier(list, "session.key", key, limits);
  checkIdentifier(list, "session.thread_id", threadId, limits);
  if (request.policies.batchExecution === "parallel" && mode !== "isolated") {
    list.add("policies.batch_execution", "incompatible", "parallel batches need an isolated session");
  }
}

/**
 * Every issue of a request, sorted by field then code, capped at MAX_ISSUES.
 * `found` are issues already found while reading the request off the wire
 * (unknown enum values, a missing operation), reported together with these.
 */
export function collectIssues(request: ImageRequest, limits: RequestLimits, found: readonly ValidationIssue[] = []): ValidationIssue[] {
  const list = new IssueList();
  for (const issue of found) list.add(issue.field, issue.code, issue.message);
  if (request.version !== "1") list.add("version", "unsupported_version", "only contract version 1 is supported");
  if (request.prompt.trim().length === 0) list.add("prompt", "required", "must not be blank");
  else if (byteLength(request.prompt) > limits.maxPromptBytes) {
    list.add("prompt", "too_large", `must be at most ${limits.maxPromptBytes} bytes`);
  }
  if (request.negativePrompt !== undefined) {
    if (request.negativePrompt.trim().length === 0) list.add("negative_prompt", "empty", "must not be blank");
    else if (byteLength(request.negativePrompt) > limits.maxNegativePromptBytes) {
      list.add("negative_prompt", "too_large", `must be at most ${limits.maxNegativePromptBytes} bytes`);
    }
    if (request.policies.negativePrompt === "reject") {
      list.add("policies.negative_prompt", "rejected_by_policy", "a negative prompt is not allowed by the policy");
    }
  }
  checkParameters(list, request, limits);
  checkIdentifier(list, "routing.provider", request.routing.provider, limits);
  checkIdentifier(list, "routing.model", request.routing.model, limits);
  checkFallbacks(list, request, limits);
  checkIdentifier(list, "idempotency_key", request.idempotencyKey, limits);
  checkIdentifier(list, "user", request.user, limits);
  checkSession(list, request, limits);
  if (request.timeoutMs !== undefined && (request.timeoutMs <= 0 || request.timeoutMs > limits.maxTimeoutMs)) {
    list.add("timeout_ms", "out_of_range", `must be between 1 and ${limits.maxTimeoutMs}`);
  }
  checkInputs(list, request, limits);

  const sorted = list.issues.sort((a, b) =>
    a.field < b.field ? -1 : a.field > b.field ? 1 : a.code < b.code ? -1 : a.code > b.code ? 1 : 0,
  );
  if (sorted.length <= MAX_ISSUES) return sorted;
  const kept = sorted.slice(0, MAX_ISSUES - 1);
  kept.push({ field: "$", code: "too_many_issues", message: `only the first ${MAX_ISSUES - 1} issues are reported` });
  return kept;
}

/**
 * The `invalid_request` error of a list of issues: the first issue is in the
 * message (`request validation failed: prompt: must not be blank (and 1
 * more)`), every issue is in `details.issues`.
 */
export function validationError(issues: readonly ValidationIssue[]): ImageError {
  const [first] = issues;
  let message = "request validation failed";
  if (first) {
    message += `: ${first.field}: ${first.message}`;
    if (issues.length > 1) message += ` (and ${issues.length - 1} more)`;
  }
  return new ImageError("invalid_request", message, {
    details: { issues: issues.map((issue) => ({ ...issue })) },
  });
}

/** Throws `invalid_request` with every issue when the request is not valid. */
export function validateRequest(request: ImageRequest, limits: RequestLimits): void {
  const issues = collectIssues(request, limits);
  if (issues.length === 0) return;
  throw validationError(issues);
}
