import { createHash, timingSafeEqual } from "node:crypto";
import type { DescMethod } from "@bufbuild/protobuf";
import { getOption } from "@bufbuild/protobuf";
import type { Interceptor } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";
import { Access, access } from "../../gen/mmgate/options/v1/options_pb.js";

export { Access };

/** The access level a method declares with `(mmgate.options.v1.access)`; PUBLIC when absent. */
export function methodAccess(method: DescMethod): Access {
  const level = getOption(method, access);
  return level === Access.UNSPECIFIED ? Access.PUBLIC : level;
}

function digest(text: string): Buffer {
  return createHash("sha256").update(text).digest();
}

/**
 * Requires `authorization: Bearer <token>` on MUTATING and ADMIN methods
 * when a token is configured. Comparing digests keeps the check constant
 * time whatever the presented token's length.
 */
export function bearerAuthInterceptor(token: string): Interceptor {
  const expected = digest(token);
  return (next) => async (req) => {
    if (token !== "" && methodAccess(req.method) !== Access.PUBLIC) {
      const header = req.header.get("authorization") ?? "";
      const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
      if (!match) {
        throw new ConnectError(`${req.method.parent.typeName}/${req.method.name} requires a bearer token`, Code.Unauthenticated);
      }
      if (!timingSafeEqual(digest(match[1]!), expected)) {
        throw new ConnectError("invalid bearer token", Code.Unauthenticated);
      }
    }
    return next(req);
  };
}
