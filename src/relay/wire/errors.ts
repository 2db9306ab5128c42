/**
 * The relay's failures as the contract names them (C.3): one reason each,
 * a fixed gRPC code per reason, and the reason's enum value name in the
 * `kv-relay-error-reason` trailer, so that any client can act on a failure
 * without parsing its message.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { RelayErrorReason } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { RELAY_ERROR_REASON_TRAILER } from "./constants.js";

/** The reasons, by their short names (the enum value without its prefix). */
export const RELAY_ERROR_REASONS = [
  "CONTRACT_MISMATCH",
  "INVALID_REQUEST",
  "UNSUPPORTED_FEATURE",
  "POOL_NOT_FOUND",
  "PRODUCER_CHANGED",
  "RESOURCE_LIMIT",
  "SUBSCRIBER_LAGGED",
  "SNAPSHOT_PROGRESS_TIMEOUT",
  "PUBLICATION_UNAVAILABLE",
  "INVALID_PUBLICATION",
  "INTERNAL",
] as const;

export type RelayErrorReasonName = (typeof RELAY_ERROR_REASONS)[number];

const CODE_OF: Record<RelayErrorReasonName, Code> = {
  CONTRACT_MISMATCH: Code.FailedPrecondition,
  INVALID_REQUEST: Code.InvalidArgument,
  UNSUPPORTED_FEATURE: Code.FailedPrecondition,
  POOL_NOT_FOUND: Code.NotFound,
  PRODUCER_CHANGED: Code.FailedPrecondition,
  RESOURCE_LIMIT: Code.ResourceExhausted,
  SUBSCRIBER_LAGGED: Code.ResourceExhausted,
  SNAPSHOT_PROGRESS_TIMEOUT: Code.ResourceExhausted,
  PUBLICATION_UNAVAILABLE: Code.Unavailable,
  INVALID_PUBLICATION: Code.FailedPrecondition,
  INTERNAL: Code.Internal,
};

/** The gRPC code the contract gives `reason`. */
export function relayErrorCode(reason: RelayErrorReasonName): Code {
  return CODE_OF[reason];
}

/** The full enum value name the trailer carries, e.g. RELAY_ERROR_REASON_PRODUCER_CHANGED. */
export function relayReasonValueName(reason: RelayErrorReasonName): string {
  return `RELAY_ERROR_REASON_${reason}`;
}

/** The wire enum value of `reason`. */
export function relayReasonEnum(reason: RelayErrorReasonName): RelayErrorReason {
  return RelayErrorReason[reason];
}

/** A failure of the relay contract: its reason decides the status code and the trailer. */
export class RelayError extends Error {
  override readonly name = "RelayError";
  constructor(
    readonly reason: RelayErrorReasonName,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }

  get code(): Code {
    return CODE_OF[this.reason];
  }

  /** The status a client sees, with the reason trailer. */
  toConnectError(): ConnectError {
    return new ConnectError(this.message, this.code, { [RELAY_ERROR_REASON_TRAILER]: relayReasonValueName(this.reason) }, undefined, this);
  }
}

/**
 * `status` with the `kv-relay-error-reason` trailer naming `reason`, for a
 * status built outside the relay (the host's INTERNAL for an unexpected
 * error, its UNAVAILABLE while draining): code, message, details and other
 * metadata kept. A status that already names a reason is returned as is.
 */
export function withRelayReason(status: ConnectError, reason: RelayErrorReasonName): ConnectError {
  if (status.metadata.has(RELAY_ERROR_REASON_TRAILER)) return status;
  const metadata = new Headers(status.metadata);
  metadata.set(RELAY_ERROR_REASON_TRAILER, relayReasonValueName(reason));
  const withReason = new ConnectError(status.rawMessage, status.code, metadata, undefined, status.cause);
  withReason.details = status.details;
  return withReason;
}

export function isRelayError(error: unknown, reason?: RelayErrorReasonName): error is RelayError {
  return error instanceof RelayError && (reason === undefined || error.reason === reason);
}

/**
 * The reason a failed call carried, read from its `kv-relay-error-reason`
 * trailer; undefined when there is none or it names no known reason (a peer
 * newer than this build, or a failure below the relay such as a reset).
 */
export function relayReasonOf(error: unknown): RelayErrorReasonName | undefined {
  if (!(error instanceof ConnectError)) return undefined;
  const value = error.metadata.get(RELAY_ERROR_REASON_TRAILER);
  if (value === null) return undefined;
  const short = value.startsWith("RELAY_ERROR_REASON_") ? value.slice("RELAY_ERROR_REASON_".length) : undefined;
  return short !== undefined && (RELAY_ERROR_REASONS as readonly string[]).includes(short) ? (short as RelayErrorReasonName) : undefined;
}
