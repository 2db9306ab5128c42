import { Code } from "@connectrpc/connect";

/** Stable error codes of the media capability, carried in ErrorDetail.code. */
export type MediaErrorCode =
  | "IMAGE_FORMAT_UNSUPPORTED"
  | "IMAGE_DECODE_FAILED"
  | "IMAGE_DIMENSIONS_EXCEED_LIMITS"
  | "IMAGE_ALLOCATION_EXCEEDS_LIMIT"
  | "IMAGE_CHANNELS_UNSUPPORTED"
  | "TENSOR_INVALID"
  | "VIDEO_TENSOR_INVALID"
  | "VIDEO_METADATA_INVALID"
  | "VIDEO_OPTIONS_INVALID"
  | "VIDEO_FRAME_REQUEST_INVALID"
  | "VIDEO_ALLOCATION_EXCEEDS_LIMIT"
  | "VIDEO_DECODE_FAILED"
  | "VIDEO_DECODER_UNAVAILABLE"
  | "DATA_URL_INVALID"
  | "URL_INVALID"
  | "URL_SCHEME_NOT_ALLOWED"
  | "URL_HOST_MISSING"
  | "URL_DIRECT_IP_NOT_ALLOWED"
  | "URL_DIRECT_PORT_NOT_ALLOWED"
  | "URL_BLOCKED_HOST"
  | "URL_BLOCKED_IP"
  | "URL_DOMAIN_NOT_ALLOWED"
  | "URL_RESOLVE_FAILED"
  | "FETCH_TOO_MANY_REDIRECTS"
  | "FETCH_REDIRECT_INVALID"
  | "FETCH_HTTP_STATUS"
  | "FETCH_EMPTY_BODY"
  | "FETCH_BODY_TOO_LARGE"
  | "FETCH_TIMEOUT"
  | "FETCH_FAILED"
  | "FETCH_CANCELED"
  | "TENSOR_NOT_FOUND"
  | "TENSOR_TOO_LARGE_FOR_STORE"
  | "INLINE_PIXELS_TOO_LARGE"
  | "READ_RANGE_INVALID"
  | "OVERLOADED";

const STATUS: Record<MediaErrorCode, Code> = {
  IMAGE_FORMAT_UNSUPPORTED: Code.InvalidArgument,
  IMAGE_DECODE_FAILED: Code.InvalidArgument,
  IMAGE_DIMENSIONS_EXCEED_LIMITS: Code.InvalidArgument,
  IMAGE_ALLOCATION_EXCEEDS_LIMIT: Code.InvalidArgument,
  IMAGE_CHANNELS_UNSUPPORTED: Code.InvalidArgument,
  TENSOR_INVALID: Code.InvalidArgument,
  VIDEO_TENSOR_INVALID: Code.InvalidArgument,
  VIDEO_METADATA_INVALID: Code.InvalidArgument,
  VIDEO_OPTIONS_INVALID: Code.InvalidArgument,
  VIDEO_FRAME_REQUEST_INVALID: Code.InvalidArgument,
  VIDEO_ALLOCATION_EXCEEDS_LIMIT: Code.InvalidArgument,
  VIDEO_DECODE_FAILED: Code.InvalidArgument,
  // ffmpeg or ffprobe is missing on the server: nothing the caller can fix.
  VIDEO_DECODER_UNAVAILABLE: Code.FailedPrecondition,
  DATA_URL_INVALID: Code.InvalidArgument,
  URL_INVALID: Code.InvalidArgument,
  URL_SCHEME_NOT_ALLOWED: Code.InvalidArgument,
  URL_HOST_MISSING: Code.InvalidArgument,
  URL_DIRECT_IP_NOT_ALLOWED: Code.InvalidArgument,
  URL_DIRECT_PORT_NOT_ALLOWED: Code.InvalidArgument,
  URL_BLOCKED_HOST: Code.InvalidArgument,
  URL_BLOCKED_IP: Code.InvalidArgument,
  URL_DOMAIN_NOT_ALLOWED: Code.InvalidArgument,
  URL_RESOLVE_FAILED: Code.Unavailable,
  FETCH_TOO_MANY_REDIRECTS: Code.InvalidArgument,
  FETCH_REDIRECT_INVALID: Code.InvalidArgument,
  // 4xx answers are the caller's fault (InvalidArgument); 5xx are overridden
  // to Unavailable where the error is raised.
  FETCH_HTTP_STATUS: Code.InvalidArgument,
  FETCH_EMPTY_BODY: Code.InvalidArgument,
  FETCH_BODY_TOO_LARGE: Code.InvalidArgument,
  FETCH_TIMEOUT: Code.DeadlineExceeded,
  FETCH_FAILED: Code.Unavailable,
  FETCH_CANCELED: Code.Canceled,
  TENSOR_NOT_FOUND: Code.NotFound,
  TENSOR_TOO_LARGE_FOR_STORE: Code.ResourceExhausted,
  INLINE_PIXELS_TOO_LARGE: Code.ResourceExhausted,
  READ_RANGE_INVALID: Code.OutOfRange,
  OVERLOADED: Code.ResourceExhausted,
};

/**
 * The `retry-after` (seconds) sent with OVERLOADED. A queue place frees as
 * soon as one decode or fetch ends (tens of milliseconds for a typical
 * image), so the hint is the smallest the header can carry in whole seconds.
 */
export const OVERLOADED_RETRY_AFTER_SECONDS = 1;

/** A media failure with a stable code and, where one applies, the limit hit. */
export class MediaError extends Error {
  override readonly name = "MediaError";
  readonly status: Code;

  constructor(
    readonly code: MediaErrorCode,
    message: string,
    readonly limit?: bigint,
    readonly actual?: bigint,
    status?: Code,
  ) {
    super(message);
    this.status = status ?? STATUS[code];
  }
}
