/**
 * Errors of the OpenAI-shaped HTTP API: `{ error: { message, type, param,
 * code } }` with an HTTP status, built here from our own checks or from
 * the status an ImageService call ended with.
 */
import type { JsonObject, JsonValue } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorCode, ErrorDetailSchema, type ErrorDetail } from "../../../gen/mmgate/images/v1/images_pb.js";

/** The `type` values this API answers with. */
export type OpenAiErrorType =
  | "invalid_request_error"
  | "authentication_error"
  | "permission_error"
  | "not_found_error"
  | "rate_limit_error"
  | "server_error";

export interface OpenAiErrorBody {
  readonly error: { readonly message: string; readonly type: OpenAiErrorType; readonly param: string | null; readonly code: string | null };
}

/** An answer in OpenAI's error shape, with its HTTP status and extra response headers (retry-after). */
export class OpenAiApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: OpenAiErrorType,
    readonly param: string | null = null,
    readonly code: string | null = null,
    readonly headers: Readonly<Record<string, string>> = {},
  ) {
    super(message);
    this.name = "OpenAiApiError";
  }

  body(): OpenAiErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

/** A 400 naming the parameter at fault. */
export function invalidParam(param: string | null, message: string, code = "invalid_value"): OpenAiApiError {
  return new OpenAiApiError(400, message, "invalid_request_error", param, code);
}

/**
 * The OpenAI parameter behind an ImageRequest field path, so that an error
 * names what the HTTP client sent (`parameters.n` → `n`). Null when the
 * field has no OpenAI counterpart.
 */
export function openAiParamOf(field: string): string | null {
  const indexed = /^images\[(\d+)\]$/.exec(field);
  if (indexed) return `image[${indexed[1]}]`;
  if (field.startsWith("parameters.")) {
    const name = field.slice("parameters.".length);
    return PARAMETERS.has(name) ? name : null;
  }
  return FIELDS[field] ?? null;
}

const PARAMETERS = new Set([
  "n",
  "size",
  "quality",
  "output_format",
  "output_compression",
  "background",
  "moderation",
  "partial_images",
  "input_fidelity",
]);

const FIELDS: Readonly<Record<string, string>> = {
  prompt: "prompt",
  user: "user",
  images: "image",
  mask: "mask",
  operation: "image",
  "routing.provider": "model",
  "routing.model": "model",
};

interface Issue {
  readonly field: string;
  readonly code: string;
  readonly message: string;
}

function issuesOf(details: JsonObject | undefined): Issue[] {
  const raw = details?.["issues"];
  if (!Array.isArray(raw)) return [];
  const out: Issue[] = [];
  for (const item of raw) {
    if (item === null || typeof item !== "object" || Array.isArray(item)) continue;
    const { field, code, message } = item as Record<string, JsonValue>;
    if (typeof field === "string" && typeof code === "string" && typeof message === "string") out.push({ field, code, message });
  }
  return out;
}

function stringDetail(details: JsonObject | undefined, key: string): string | undefined {
  const value = details?.[key];
  return typeof value === "string" ? value : undefined;
}

/** A validation failure, reworded in OpenAI's parameter names. */
function fromValidation(detail: ErrorDetail): OpenAiApiError {
  const issues = issuesOf(detail.details);
  const first = issues[0];
  if (!first) return invalidParam(null, detail.message, "invalid_request");
  const param = openAiParamOf(first.field);
  const more = issues.length > 1 ? ` (and ${issues.length - 1} more)` : "";
  return invalidParam(param, `${param ?? first.field}: ${first.message}${more}`, first.code);
}

export interface RpcErrorContext {
  /** Whether the HTTP request carried an Authorization header (tells "missing" from "wrong"). */
  readonly authorizationSent: boolean;
}

/**
 * The HTTP answer for a failed ImageService call. Errors with an images
 * ErrorDetail map by their code; the host's own statuses (auth, draining,
 * internal) by their gRPC code. `retry-after` metadata becomes the
 * Retry-After header.
 */
export function fromRpcError(error: unknown, context: RpcErrorContext): OpenAiApiError {
  if (error instanceof OpenAiApiError) return error;
  const rpc = ConnectError.from(error);
  const retryAfter = rpc.metadata.get("retry-after");
  const headers: Record<string, string> = retryAfter !== null && /^\d+$/.test(retryAfter) ? { "retry-after": retryAfter } : {};
  const [detail] = rpc.findDetails(ErrorDetailSchema);
  return detail ? fromDetail(detail, headers) : fromStatus(rpc, headers, context);
}

function fromDetail(detail: ErrorDetail, headers: Record<string, string>): OpenAiApiError {
  const message = detail.message;
  const details = detail.details;
  const field = stringDetail(details, "field");
  const server = (status: number, code: string) => new OpenAiApiError(status, message, "server_error", null, code, headers);
  switch (detail.code) {
    case ErrorCode.INVALID_REQUEST:
      return fromValidation(detail);
    case ErrorCode.UNSUPPORTED_CAPABILITY:
      return invalidParam(field === undefined ? null : openAiParamOf(field), message, "unsupported_value");
    case ErrorCode.INPUT:
      return invalidParam(field === undefined ? "image" : (openAiParamOf(field) ?? "image"), message, "invalid_image");
    case ErrorCode.SAFETY_REJECTED:
      return new OpenAiApiError(400, message, "invalid_request_error", null, "moderation_blocked");
    case ErrorCode.CONFIGURATION:
      // An unknown route is the caller's choice of model; anything else is how this server is set up.
      if (field?.startsWith("routing.") || stringDetail(details, "provider") !== undefined) {
        return new OpenAiApiError(404, message, "not_found_error", "model", "model_not_found");
      }
      return server(500, "configuration");
    case ErrorCode.AUTHENTICATION:
      // The provider refused this server's key: a 401 would tell the client its own key is wrong.
      return server(502, "provider_authentication");
    case ErrorCode.PERMISSION_DENIED:
      return new OpenAiApiError(403, message, "permission_error", null, "permission_denied");
    // The caller's own quota reads as OpenAI's own rate limits do, a request too large for it included.
    case ErrorCode.RATE_LIMITED:
    case ErrorCode.QUOTA_EXCEEDED:
      return new OpenAiApiError(429, message, "rate_limit_error", null, "rate_limit_exceeded", headers);
    case ErrorCode.OVERLOADED:
      // An open circuit says the provider is down; a full queue asks the client to slow down.
      if (stringDetail(details, "circuit_state") !== undefined) return server(503, "provider_unavailable");
      return new OpenAiApiError(429, message, "rate_limit_error", null, "overloaded", headers);
    case ErrorCode.TIMEOUT:
      return server(504, "timeout");
    case ErrorCode.CANCELLED:
      // The client is gone when it cancelled itself, so what is left to answer is our own shutdown.
      return server(503, "unavailable");
    case ErrorCode.UPSTREAM:
      return server(502, "upstream_error");
    case ErrorCode.PROTOCOL:
      return server(502, "upstream_protocol_error");
    case ErrorCode.SESSION:
      return new OpenAiApiError(404, message, "not_found_error", null, "session_not_found");
    case ErrorCode.IDEMPOTENCY_CONFLICT:
      return new OpenAiApiError(409, message, "invalid_request_error", null, "idempotency_conflict");
    case ErrorCode.ARTIFACT:
      return server(500, "artifact");
    default:
      return server(500, "internal");
  }
}

function fromStatus(rpc: ConnectError, headers: Record<string, string>, context: RpcErrorContext): OpenAiApiError {
  const message = rpc.rawMessage;
  switch (rpc.code) {
    case Code.Unauthenticated:
      return new OpenAiApiError(401, message, "authentication_error", null, context.authorizationSent ? "invalid_api_key" : "missing_api_key");
    case Code.PermissionDenied:
      return new OpenAiApiError(403, message, "permission_error", null, "permission_denied");
    case Code.InvalidArgument:
    case Code.FailedPrecondition:
    case Code.OutOfRange:
      return invalidParam(null, message, "invalid_request");
    case Code.NotFound:
      return new OpenAiApiError(404, message, "not_found_error", null, "not_found");
    case Code.AlreadyExists:
    case Code.Aborted:
      return new OpenAiApiError(409, message, "invalid_request_error", null, "conflict");
    case Code.ResourceExhausted:
      return new OpenAiApiError(429, message, "rate_limit_error", null, "resource_exhausted", headers);
    case Code.Unavailable:
    case Code.Canceled:
      return new OpenAiApiError(503, message, "server_error", null, "unavailable", { "retry-after": "1", ...headers });
    case Code.DeadlineExceeded:
      return new OpenAiApiError(504, message, "server_error", null, "timeout");
    case Code.Unimplemented:
      return new OpenAiApiError(501, message, "server_error", null, "not_implemented");
    default:
      return new OpenAiApiError(500, message, "server_error", null, "internal");
  }
}
