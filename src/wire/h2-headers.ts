import type { IncomingHttpHeaders } from "node:http2";

/**
 * HTTP/2 headers as received (lower-case names, repeated ones as lists) as
 * web Headers, pseudo-headers left out; appended to `into` when given.
 */
export function webHeadersOf(incoming: IncomingHttpHeaders, into = new Headers()): Headers {
  for (const name of Object.keys(incoming)) {
    if (name.startsWith(":")) continue;
    const value = incoming[name];
    if (value === undefined) continue;
    if (Array.isArray(value)) for (const v of value) into.append(name, v);
    else into.append(name, String(value));
  }
  return into;
}

/**
 * Whether HTTP/2 forbids `name` (lower case) with `value` in a response
 * (RFC 9113, 8.2.2): the connection-specific headers, and TE other than
 * "trailers". Node refuses to send headers or trailers carrying one, which
 * would leave a call without an answer, so the host drops a handler's or an
 * error's copy on both request paths.
 */
export function isConnectionHeader(name: string, value: string): boolean {
  switch (name) {
    case "connection":
    case "keep-alive":
    case "proxy-connection":
    case "transfer-encoding":
    case "upgrade":
      return true;
    case "te":
      return value !== "trailers";
    default:
      return false;
  }
}
