import { create, toBinary } from "@bufbuild/protobuf";
import type { Interceptor } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Logger } from "pino";
import { observeStream } from "../util/index.js";
import type { ErrorMapper, HostStatusDecorator, HostStatusOrigin } from "./module.js";
import { recordStatus, rpcRecordKey } from "./rpc-observer.js";

export interface CallInterceptorOptions {
  /** True once the server drains: new calls answer UNAVAILABLE, except to `exempt` services. */
  readonly draining: () => boolean;
  /** Services still answered while draining (health, so probes see NOT_SERVING). */
  readonly exempt: ReadonlySet<string>;
  /** The error mapper of the module that owns a service. */
  readonly mapperFor: (serviceTypeName: string) => ErrorMapper | undefined;
  /** The decorator of the module that owns a service, for the statuses built here (unmapped errors, drain refusals). */
  readonly decoratorFor?: (serviceTypeName: string) => HostStatusDecorator | undefined;
  readonly logger: Logger;
}

/**
 * The host's one interceptor around every handler, for every RPC shape:
 *
 * - refuses new calls while the server drains;
 * - turns errors into statuses, in one place: a ConnectError passes as it
 *   is, a cancellation or deadline keeps its meaning, anything else goes to
 *   the owning module's mapper, and what no mapper claims is logged with its
 *   stack and answers INTERNAL (never UNKNOWN) naming the request id;
 * - lets the owning module decorate the two statuses it builds itself (the
 *   INTERNAL of an unmapped error, the drain's UNAVAILABLE), say with a
 *   contract's reason trailer, keeping their codes;
 * - records the status for the RPC log and metrics, as a fallback for
 *   responses whose status never reaches the wire in a readable form.
 *
 * One interceptor rather than three keeps the per-call cost to one closure
 * and, for streams, one wrapper.
 */
export function callInterceptor(options: CallInterceptorOptions): Interceptor {
  const { draining, exempt, mapperFor, decoratorFor, logger } = options;
  return (next) => async (req) => {
    const record = req.contextValues.get(rpcRecordKey);
    /** A status built here, as the owning module decorates it; the code stays the host's. */
    const hostStatus = (status: ConnectError, origin: HostStatusOrigin): ConnectError => {
      let decorated: ConnectError | undefined;
      try {
        decorated = decoratorFor?.(req.service.typeName)?.(status, origin);
      } catch (decoratorError) {
        logger.error({ err: decoratorError, service: req.service.typeName }, "status decorator threw");
      }
      return decorated !== undefined && decorated.code === status.code ? decorated : status;
    };
    const fail = (error: unknown): ConnectError => {
      let status: ConnectError;
      if (error instanceof ConnectError) status = error;
      else if (error instanceof Error && error.name === "TimeoutError") status = new ConnectError(error.message, Code.DeadlineExceeded);
      else if (error instanceof Error && error.name === "AbortError") status = ConnectError.from(error);
      else {
        let mapped: ConnectError | undefined;
        try {
          mapped = mapperFor(req.service.typeName)?.(error);
        } catch (mapperError) {
          logger.error({ err: mapperError, service: req.service.typeName }, "error mapper threw");
        }
        if (mapped) status = mapped;
        else {
          const requestId = record?.requestId;
          logger.error({ err: error, service: req.service.typeName, method: req.method.name, requestId }, "unmapped error: answering INTERNAL");
          status = hostStatus(new ConnectError(`internal error${requestId ? ` (request id ${requestId})` : ""}`, Code.Internal), "unmapped");
        }
      }
      status = encodableStatus(status, logger, req.service.typeName, req.method.name);
      recordStatus(record, status);
      return status;
    };
    if (draining() && !exempt.has(req.service.typeName)) throw fail(hostStatus(new ConnectError("server is shutting down", Code.Unavailable), "draining"));
    const series = record?.series;
    // Messages received: the one of a unary or server-streaming call now;
    // a client stream's as the handler reads them.
    if (series !== undefined) {
      if (!req.stream || req.method.methodKind === "server_streaming") series.received();
      else req = { ...req, message: observeStream(req.message, { value: () => series.received() }) };
    }
    let res;
    try {
      res = await next(req);
    } catch (error) {
      throw fail(error);
    }
    if (!res.stream) {
      series?.sent();
      return res;
    }
    return { ...res, message: observeStream(res.message, series === undefined ? { error: fail } : { error: fail, value: () => series.sent() }) };
  };
}

/** A UTF-16 surrogate without its pair: text that has no UTF-8 form. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const LONE_SURROGATES = new RegExp(LONE_SURROGATE.source, "g");

/**
 * A status whose details cannot be encoded (a uint64 past 2^64 - 1, say)
 * would fail inside the transport after the handler is done, and the call
 * would never answer. Such details are dropped here, keeping the code and
 * message, and the drop is logged; a message with a lone surrogate gets
 * U+FFFD in its place.
 */
function encodableStatus(status: ConnectError, logger: Logger, service: string, method: string): ConnectError {
  // grpc-message is percent-encoded, which a lone surrogate cannot be: the
  // trailers could not be built, and the call would get no status at all.
  if (LONE_SURROGATE.test(status.rawMessage)) {
    const wellFormed = new ConnectError(status.rawMessage.replace(LONE_SURROGATES, "\uFFFD"), status.code, status.metadata, undefined, status.cause);
    wellFormed.details = status.details;
    status = wellFormed;
  }
  for (const detail of status.details) {
    if (!("desc" in detail)) continue;
    try {
      toBinary(detail.desc, create(detail.desc, detail.value));
    } catch (err) {
      logger.error({ err, service, method, code: status.code, detail: detail.desc.typeName }, "error details cannot be encoded: sent without them");
      return new ConnectError(status.rawMessage, status.code, status.metadata, undefined, status.cause);
    }
  }
  return status;
}
