import { Code, ConnectError } from "@connectrpc/connect";

/** HTTP/2 error codes by number (RFC 9113, section 7), for messages. */
const NAMES = [
  "NO_ERROR",
  "PROTOCOL_ERROR",
  "INTERNAL_ERROR",
  "FLOW_CONTROL_ERROR",
  "SETTINGS_TIMEOUT",
  "STREAM_CLOSED",
  "FRAME_SIZE_ERROR",
  "REFUSED_STREAM",
  "CANCEL",
  "COMPRESSION_ERROR",
  "CONNECT_ERROR",
  "ENHANCE_YOUR_CALM",
  "INADEQUATE_SECURITY",
  "HTTP_1_1_REQUIRED",
];

/** The status each reset code means, as connect-node maps it; codes not listed mean no error. */
const CODES: Record<number, Code> = {
  1: Code.Internal,
  2: Code.Internal,
  3: Code.Internal,
  4: Code.Internal,
  6: Code.Internal,
  7: Code.Unavailable,
  8: Code.Canceled,
  9: Code.Internal,
  10: Code.Internal,
  11: Code.ResourceExhausted,
  12: Code.PermissionDenied,
  13: Code.PermissionDenied,
};

/**
 * The error an RST_STREAM code stands for, worded and classified as
 * connect-node does, so that both request paths (and both client
 * transports) report a reset alike; undefined for NO_ERROR, STREAM_CLOSED
 * and codes the protocol does not define.
 */
export function h2ResetError(rstCode: number): ConnectError | undefined {
  const code = CODES[rstCode];
  if (code === undefined) return undefined;
  return new ConnectError(`http/2 stream closed with error code ${NAMES[rstCode]} (0x${rstCode.toString(16)})`, code);
}
