/**
 * The host's auth interceptor: every call of a MUTATING or ADMIN method
 * needs a caller (a bearer key, or a verified client certificate) whose
 * scopes grant it; PUBLIC methods are open to anyone. Access control
 * (./access/) decides; this puts its verdict on the call: the caller in the
 * context values (`callerKey`), the RPC record (the log line and the
 * metrics' `caller` label) and the call's trace span (`mmgate.caller`).
 */
import type { Interceptor } from "@connectrpc/connect";
import { setCurrentSpanAttribute } from "../telemetry/index.js";
import type { AccessControl } from "./access/index.js";
import { callerKey, callerLabelKey, type CallerLabel, peerCertificateKey } from "./caller.js";
import { rpcRecordKey } from "./rpc-observer.js";

export { Access, methodAccess } from "./access/index.js";

/** Installed when auth is on (authEnabled): token, keys file or certificate rules. */
export function authInterceptor(access: AccessControl): Interceptor {
  const label: CallerLabel = (name) => access.callerLabel(name);
  return (next) => async (req) => {
    const verdict = access.authorize(req.method, req.header.get("authorization"), req.contextValues.get(peerCertificateKey));
    const caller = verdict.caller;
    if (caller !== undefined) {
      req.contextValues.set(callerKey, caller);
      req.contextValues.set(callerLabelKey, label);
      const record = req.contextValues.get(rpcRecordKey);
      if (record !== undefined) record.caller = caller.name;
      setCurrentSpanAttribute("mmgate.caller", caller.name);
    }
    if (verdict.refusal !== undefined) throw verdict.refusal;
    return next(req);
  };
}
