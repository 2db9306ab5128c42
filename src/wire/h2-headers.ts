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
 * Set by a server call that holds the request's headers as Node gave them:
 * reads one as `requestHeader.get` would, without making the `Headers`
 * (most handlers read a few of them, and a `Headers` costs a copy of all).
 */
export const requestHeaderValueKey = Symbol("mmgate.requestHeaderValue");

interface RawHeaderReader {
  readonly [requestHeaderValueKey]?: ((name: string) => string | null) | undefined;
}

/** A request header of the handler's call (`ctx.requestHeader.get(name)`), from Node's headers where the call holds them. */
export function requestHeaderValue(ctx: { readonly requestHeader: Headers }, name: string): string | null {
  const read = (ctx as RawHeaderReader)[requestHeaderValueKey];
  return read !== undefined ? read.call(ctx, name) : ctx.requestHeader.get(name);
}

/** `name`'s value in Node's form of request headers as `webHeadersOf(incoming).get(name)` gives it (each value trimmed of HTTP whitespace, as `Headers` stores it). */
export function incomingHeaderValue(incoming: IncomingHttpHeaders, name: string): string | null {
  const value = incoming[name];
  if (value === undefined) return null;
  return Array.isArray(value) ? value.map(trimmedHeaderValue).join(", ") : trimmedHeaderValue(String(value));
}

const HTTP_WHITESPACE = /^[\t\n\r ]+|[\t\n\r ]+$/g;

function trimmedHeaderValue(value: string): string {
  const first = value.charCodeAt(0);
  const last = value.charCodeAt(value.length - 1);
  const padded = first === 0x20 || first === 0x09 || first === 0x0a || first === 0x0d || last === 0x20 || last === 0x09 || last === 0x0a || last === 0x0d;
  return padded ? value.replace(HTTP_WHITESPACE, "") : value;
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
