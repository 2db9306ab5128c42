import type { Interceptor } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Logger } from "pino";
import type { ErrorMapper } from "./module.js";
import { rpcRecordKey } from "./rpc-observer.js";

/**
 * The one place where errors become statuses. A ConnectError passes as it
 * is; a cancellation or deadline keeps its meaning; anything else goes to the
 * mapper of the module that owns the service, and what no mapper claims is
 * logged with its stack and answers INTERNAL (never UNKNOWN), naming the
 * request id so that an operator can find the log line.
 */
export function errorMappingInterceptor(mapperFor: (serviceTypeName: string) => ErrorMapper | undefined, logger: Logger): Interceptor {
  return (next) => async (req) => {
    const toStatus = (error: unknown): ConnectError => {
      if (error instanceof ConnectError) return error;
      if (error instanceof Error && (error.name === "AbortError" || error.name === "TimeoutError")) return ConnectError.from(error);
      const mapped = mapperFor(req.service.typeName)?.(error);
      if (mapped) return mapped;
      const requestId = req.contextValues.get(rpcRecordKey)?.requestId;
      logger.error({ err: error, service: req.service.typeName, method: req.method.name, requestId }, "unmapped error: answering INTERNAL");
      return new ConnectError(`internal error${requestId ? ` (request id ${requestId})` : ""}`, Code.Internal);
    };
    let res;
    try {
      res = await next(req);
    } catch (error) {
      throw toStatus(error);
    }
    if (!res.stream) return res;
    return { ...res, message: mapStreamErrors(res.message, toStatus) };
  };
}

async function* mapStreamErrors<T>(source: AsyncIterable<T>, toStatus: (error: unknown) => ConnectError): AsyncGenerator<T> {
  try {
    yield* source;
  } catch (error) {
    throw toStatus(error);
  }
}
