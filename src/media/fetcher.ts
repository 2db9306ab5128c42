import * as dns from "node:dns";
import * as http from "node:http";
import * as https from "node:https";
import type { LookupFunction } from "node:net";
import { Code } from "@connectrpc/connect";
import { MediaError } from "./errors.js";
import { blockedNetworkOf, checkUrlAllowed, ipLiteralOf, isDataUrl, type UrlPolicy } from "./url-policy.js";
import { openHttpClientSpan, type HttpClientSpan } from "../telemetry/index.js";
import { raceAbort } from "../util/index.js";

export interface FetchPolicy extends UrlPolicy {
  /** Whole fetch, redirects and body included. */
  readonly timeoutMs: number;
  /** Largest body accepted, enforced while streaming (and for data URLs). */
  readonly maxBodyBytes: number;
  /** Redirects followed; each hop is checked again. */
  readonly maxRedirects: number;
  readonly userAgent: string;
  /**
   * A name that resolves to both allowed and blocked addresses: "refuse"
   * (the default) fails the hop with URL_BLOCKED_IP; "dropBlocked" connects
   * to the allowed addresses only, as the reference's HTTP client resolver
   * does. A name with no allowed address is refused either way.
   */
  readonly mixedAddresses?: MixedAddressPolicy;
}

export type MixedAddressPolicy = "refuse" | "dropBlocked";

/** The redirect statuses followed (with a Location); any other 3xx is an error. */
export const REDIRECT_STATUSES: ReadonlySet<number> = new Set([301, 302, 303, 307, 308]);

export interface ResolvedAddress {
  readonly address: string;
  readonly family: 4 | 6;
}

/** Name resolution, replaceable in tests. */
export type Resolver = (host: string) => Promise<readonly ResolvedAddress[]>;

const systemResolver: Resolver = async (host) => {
  const found = await dns.promises.lookup(host, { all: true, verbatim: true });
  return found.map((a) => ({ address: a.address, family: a.family === 6 ? 6 : 4 }));
};

export interface FetchOptions {
  readonly signal?: AbortSignal;
  readonly resolver?: Resolver;
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;
const BASE64_VALUES = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/**
 * Payload of a data URL: everything after the first comma, decoded as
 * strictly as Rust's base64 STANDARD engine: the standard alphabet only (no
 * whitespace, no URL-safe "-" or "_", no percent-escapes), canonical padding
 * (the length a multiple of 4, "=" only at the end) and zero trailing bits
 * in the last symbol ("QQ==" is accepted, "QR==" is not). The media type is
 * not inspected, as in the reference. The decoded size is checked against
 * the cap before decoding.
 */
export function decodeDataUrl(url: string, maxBytes: number): Uint8Array {
  const comma = url.indexOf(",");
  if (comma < 0) throw new MediaError("DATA_URL_INVALID", "Invalid data URL: no comma");
  const payload = url.slice(comma + 1);
  if (payload.length === 0) throw new MediaError("DATA_URL_INVALID", "Invalid data URL: empty payload");
  const padding = payload.endsWith("==") ? 2 : payload.endsWith("=") ? 1 : 0;
  const decodedLength = Math.floor(payload.length / 4) * 3 - padding;
  if (decodedLength > maxBytes) {
    throw new MediaError(
      "FETCH_BODY_TOO_LARGE",
      `Media body of ${decodedLength} bytes exceeds the limit of ${maxBytes} bytes`,
      BigInt(maxBytes),
      BigInt(decodedLength),
    );
  }
  if (payload.length % 4 !== 0 || !BASE64.test(payload)) {
    throw new MediaError("DATA_URL_INVALID", "Invalid data URL: payload is not standard base64");
  }
  if (padding > 0) {
    // The last symbol before the padding carries 4 (one byte) or 2 (two
    // bytes) bits beyond the data; a canonical encoding leaves them zero.
    const last = BASE64_VALUES.indexOf(payload[payload.length - padding - 1]!);
    if ((last & (padding === 2 ? 0x0f : 0x03)) !== 0) {
      throw new MediaError("DATA_URL_INVALID", "Invalid data URL: payload has non-zero trailing bits");
    }
  }
  const bytes = Buffer.from(payload, "base64");
  return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.length);
}

/**
 * Resolves a host and checks its addresses: with any blocked one the host
 * is refused (policy.mixedAddresses "refuse", the default), or the blocked
 * ones are dropped and the rest returned ("dropBlocked"); a host with no
 * allowed address is refused either way. A resolver that never answers
 * cannot outlive the fetch's deadline or the caller's cancellation.
 */
async function resolveChecked(
  host: string,
  policy: FetchPolicy,
  resolver: Resolver,
  signal: AbortSignal,
): Promise<readonly ResolvedAddress[]> {
  let addresses: readonly ResolvedAddress[];
  try {
    addresses = await raceAbort(resolver(host), signal);
  } catch (error) {
    signal.throwIfAborted();
    const why = error instanceof Error ? error.message : String(error);
    throw new MediaError("URL_RESOLVE_FAILED", `Failed to resolve ${host}: ${why}`);
  }
  if (addresses.length === 0) throw new MediaError("URL_RESOLVE_FAILED", `Failed to resolve ${host}: no addresses`);
  if (policy.allowPrivateIps) return addresses;
  const allowed: ResolvedAddress[] = [];
  let blocked: { readonly address: string; readonly network: string } | null = null;
  for (const a of addresses) {
    const network = blockedNetworkOf(a.address, policy.allowedIpNetworks);
    if (network === null) allowed.push(a);
    else blocked ??= { address: a.address, network };
  }
  if (blocked !== null && (allowed.length === 0 || policy.mixedAddresses !== "dropBlocked")) {
    throw new MediaError("URL_BLOCKED_IP", `Host ${host} resolves to a blocked IP address: ${blocked.address} (in ${blocked.network})`);
  }
  return allowed;
}

/** A lookup that only ever answers with the addresses already checked. */
function pinnedLookup(addresses: readonly ResolvedAddress[]): LookupFunction {
  return (_host, options, callback) => {
    const first = addresses[0]!;
    if (options.all) {
      (callback as (e: null, a: dns.LookupAddress[]) => void)(null, addresses.map((a) => ({ ...a })));
    } else {
      (callback as (e: null, a: string, f: number) => void)(null, first.address, first.family);
    }
  };
}

/** How one HTTP hop ended: a redirect to follow, a body, or a status that is neither. */
type Hop =
  | { readonly kind: "redirect"; readonly location: string }
  | { readonly kind: "body"; readonly body: Uint8Array }
  | { readonly kind: "failed"; readonly status: number };

function request(url: URL, addresses: readonly ResolvedAddress[] | null, policy: FetchPolicy, signal: AbortSignal, span?: HttpClientSpan): Promise<Hop> {
  return new Promise<Hop>((resolve, reject) => {
    const client = url.protocol === "https:" ? https : http;
    const req = client.request(
      url,
      {
        method: "GET",
        // With tracing on, the client span's traceparent; nothing is added otherwise.
        headers: { "user-agent": policy.userAgent, accept: "*/*", ...span?.headers },
        signal,
        agent: false,
        ...(addresses !== null ? { lookup: pinnedLookup(addresses) } : {}),
      },
      (res) => {
        const status = res.statusCode ?? 0;
        span?.status(status);
        if (REDIRECT_STATUSES.has(status) && res.headers.location !== undefined) {
          res.resume();
          resolve({ kind: "redirect", location: res.headers.location });
          return;
        }
        if (status < 200 || status >= 300) {
          res.resume();
          resolve({ kind: "failed", status });
          return;
        }
        const declared = Number(res.headers["content-length"] ?? Number.NaN);
        if (declared > policy.maxBodyBytes) {
          reject(tooLarge(policy.maxBodyBytes, BigInt(declared)));
          res.destroy();
          return;
        }
        const chunks: Buffer[] = [];
        let received = 0;
        res.on("data", (chunk: Buffer) => {
          received += chunk.length;
          if (received > policy.maxBodyBytes) {
            // Reject before destroying: destroy() reports its own abort.
            reject(tooLarge(policy.maxBodyBytes, BigInt(received)));
            res.destroy();
            return;
          }
          chunks.push(chunk);
        });
        res.on("end", () => {
          const body = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, received);
          resolve({ kind: "body", body: new Uint8Array(body.buffer, body.byteOffset, body.length) });
        });
        res.on("error", reject);
        res.on("aborted", () => reject(new Error("response aborted")));
      },
    );
    req.on("error", reject);
    req.end();
  });
}

function tooLarge(limit: number, actual: bigint): MediaError {
  return new MediaError(
    "FETCH_BODY_TOO_LARGE",
    `Media body exceeds the limit of ${limit} bytes`,
    BigInt(limit),
    actual,
  );
}

/**
 * Fetches encoded media from a data or http(s) URL under the URL policy:
 * every hop is checked by rule and by resolved address (connections go only
 * to the checked addresses), at most maxRedirects redirects (301, 302, 303,
 * 307 and 308 with a Location; any other 3xx fails as a non-2xx status),
 * one deadline for the whole fetch and a body cap enforced while streaming.
 */
export async function fetchMedia(url: string, policy: FetchPolicy, options: FetchOptions = {}): Promise<Uint8Array> {
  if (isDataUrl(url)) return decodeDataUrl(url, policy.maxBodyBytes);
  const resolver = options.resolver ?? systemResolver;
  const timeout = AbortSignal.timeout(policy.timeoutMs);
  const signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;

  let current = url;
  try {
    for (let redirects = 0; ; redirects++) {
      const parsed = checkUrlAllowed(current, policy);
      if (parsed === null) {
        throw new MediaError("FETCH_REDIRECT_INVALID", "Redirect to a data URL is not allowed");
      }
      const host = parsed.hostname;
      const addresses = ipLiteralOf(host) === null ? await resolveChecked(host, policy, resolver, signal) : null;
      signal.throwIfAborted();
      // One client span per HTTP request (tracing on); a redirect's request counts as a resend.
      const span = openHttpClientSpan("GET", parsed, redirects > 0 ? { "http.request.resend_count": redirects } : undefined);
      const hop = await request(parsed, addresses, policy, signal, span).then(
        (answered) => (span?.end(), answered),
        (error: unknown) => {
          span?.end(error);
          throw error;
        },
      );
      switch (hop.kind) {
        case "redirect":
          if (redirects >= policy.maxRedirects) {
            throw new MediaError("FETCH_TOO_MANY_REDIRECTS", `Too many redirects (limit ${policy.maxRedirects})`);
          }
          try {
            current = new URL(hop.location, parsed).toString();
          } catch {
            throw new MediaError("FETCH_REDIRECT_INVALID", `Invalid redirect location: ${hop.location}`);
          }
          continue;
        case "failed": {
          // 3xx (a redirect status not followed, or one without a Location)
          // and 4xx are answers about the URL itself; retrying will not help.
          const status = hop.status >= 300 && hop.status < 500 ? Code.InvalidArgument : Code.Unavailable;
          throw new MediaError("FETCH_HTTP_STATUS", `Fetching media failed with HTTP status ${hop.status}`, undefined, BigInt(hop.status), status);
        }
        case "body":
          if (hop.body.length === 0) throw new MediaError("FETCH_EMPTY_BODY", "Fetched media body is empty");
          return hop.body;
      }
    }
  } catch (error) {
    if (error instanceof MediaError) throw error;
    if (options.signal?.aborted) throw new MediaError("FETCH_CANCELED", "Fetching media was canceled");
    if (timeout.aborted) throw new MediaError("FETCH_TIMEOUT", `Fetching media timed out after ${policy.timeoutMs} ms`);
    const why = error instanceof Error ? error.message : String(error);
    throw new MediaError("FETCH_FAILED", `Fetching media failed: ${why}`);
  }
}
