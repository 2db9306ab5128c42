import { cors as connectCors } from "@connectrpc/connect";
import type { HostConfig } from "./config/index.js";
import { authorityHeader, parseAuthority } from "./request-host.js";

type Headers = Record<string, string | string[] | undefined>;
interface HeaderSink {
  setHeader(name: string, value: string): unknown;
}

/**
 * Headers browsers may send beyond connect's list: the bearer token, the
 * idempotency key and a request id, which mmgate's own methods read.
 */
const EXTRA_ALLOWED_HEADERS = ["Authorization", "Idempotency-Key", "X-Request-Id"];
/** Headers scripts may read beyond connect's list: the request id, a retry hint, an idempotent replay. */
const EXTRA_EXPOSED_HEADERS = ["X-Request-Id", "Retry-After", "Idempotency-Replayed"];
/** An HTTP header name (RFC 9110 token); anything else in Access-Control-Request-Headers is not echoed. */
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/** Most header names a preflight's answer echoes (the OpenAI SDKs send about ten of their own). */
const MAX_REQUESTED_HEADERS = 64;

/** The answer to a preflight: its status and headers, never an RPC. */
export interface PreflightAnswer {
  readonly status: 204 | 403 | 405;
  readonly headers: Record<string, string>;
  /** `allowed`, `origin_not_allowed` or `cors_disabled`: the `code` label of its metric. */
  readonly outcome: "allowed" | "origin_not_allowed" | "cors_disabled";
}

/**
 * Opt-in CORS for browser clients of Connect and gRPC-Web (and the plain
 * HTTP routes): allowed origins come from `cors.allowedOrigins`; the methods
 * and headers allowed and exposed are connect's own lists plus the headers
 * mmgate reads. Responses echo the caller's origin (with `Vary: Origin`)
 * rather than `*`, so one answer is right whether "*" or a list is set.
 */
export class CorsPolicy {
  private readonly any: boolean;
  private readonly origins: ReadonlySet<string>;
  private readonly allowHeaders: string;
  /** The names in `allowHeaders`, lower case: a preflight's own requests are added only when not among them. */
  private readonly allowHeaderNames: ReadonlySet<string>;
  private readonly exposeHeaders: string;
  private readonly allowMethods: string;
  private readonly maxAge: string;

  /** `secure`: the listener speaks TLS, so its own pages are https. */
  constructor(
    config: HostConfig["cors"],
    private readonly secure = false,
  ) {
    this.any = config.allowedOrigins.includes("*");
    // Origins compare without a trailing slash and case-insensitively in scheme and host.
    this.origins = new Set(config.allowedOrigins.map(normalizeOrigin));
    const allowed = [...connectCors.allowedHeaders, ...EXTRA_ALLOWED_HEADERS];
    this.allowHeaders = allowed.join(", ");
    this.allowHeaderNames = new Set(allowed.map((name) => name.toLowerCase()));
    this.exposeHeaders = [...connectCors.exposedHeaders, ...EXTRA_EXPOSED_HEADERS].join(", ");
    this.allowMethods = connectCors.allowedMethods.join(", ");
    this.maxAge = String(config.maxAgeSeconds);
  }

  /** Whether CORS is on at all (some origin is allowed). */
  get enabled(): boolean {
    return this.origins.size > 0;
  }

  /** The request's Origin when it is one CORS lets through, else undefined. */
  allowedOrigin(headers: Headers): string | undefined {
    const origin = headers["origin"];
    if (typeof origin !== "string" || !this.enabled) return undefined;
    return this.any || this.origins.has(normalizeOrigin(origin)) ? origin : undefined;
  }

  /**
   * Whether a request may act at all: no Origin (not a browser), an allowed
   * origin, or the server's own: a page it served, by the scheme of this
   * listener and the host and port the request was sent to.
   */
  admits(headers: Headers): boolean {
    const origin = headers["origin"];
    if (origin === undefined) return true;
    return this.allowedOrigin(headers) !== undefined || sameOrigin(origin, authorityHeader(headers), this.secure);
  }

  /** Adds the CORS headers of an actual (not preflight) request from an allowed origin. */
  decorate(headers: Headers, res: HeaderSink): void {
    if (!this.enabled || headers["origin"] === undefined) return;
    const origin = this.allowedOrigin(headers);
    if (origin === undefined) {
      // The answer depends on the origin: a shared cache must not hand it to another.
      res.setHeader("vary", "Origin");
      return;
    }
    res.setHeader("access-control-allow-origin", origin);
    res.setHeader("access-control-expose-headers", this.exposeHeaders);
    res.setHeader("vary", "Origin");
  }

  /**
   * The allowed request headers: connect's and mmgate's, plus what the
   * preflight asks for (well-formed names only): clients such as the
   * OpenAI SDKs send headers of their own, which the server ignores.
   */
  private allowHeadersFor(headers: Headers): string {
    const extra = requestedHeaders(headers).filter((name) => !this.allowHeaderNames.has(name.toLowerCase()));
    return extra.length === 0 ? this.allowHeaders : `${this.allowHeaders}, ${extra.join(", ")}`;
  }

  /** The answer to an OPTIONS request. */
  preflight(headers: Headers): PreflightAnswer {
    if (!this.enabled) return { status: 405, headers: { allow: "POST, GET" }, outcome: "cors_disabled" };
    const origin = this.allowedOrigin(headers);
    if (origin === undefined) return { status: 403, headers: { vary: "Origin" }, outcome: "origin_not_allowed" };
    return {
      status: 204,
      headers: {
        "access-control-allow-origin": origin,
        "access-control-allow-methods": this.allowMethods,
        "access-control-allow-headers": this.allowHeadersFor(headers),
        "access-control-max-age": this.maxAge,
        vary: "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
      },
      outcome: "allowed",
    };
  }
}

/** Any header CORS lets through in a request may be named in a preflight, so the list is connect's, mmgate's, and what the client asks for. */
function requestedHeaders(headers: Headers): string[] {
  const asked = headers["access-control-request-headers"];
  if (typeof asked !== "string") return [];
  const names = asked
    .split(",")
    .map((name) => name.trim())
    .filter((name) => name !== "" && HEADER_NAME.test(name));
  return names.slice(0, MAX_REQUESTED_HEADERS);
}

/** Scheme, host and port all equal (RFC 6454), default ports filled in on both sides. */
function sameOrigin(origin: string | string[], authority: string | undefined, secure: boolean): boolean {
  if (typeof origin !== "string") return false;
  const scheme = secure ? "https:" : "http:";
  const defaultPort = secure ? 443 : 80;
  const target = parseAuthority(authority);
  if (target === undefined || !URL.canParse(origin)) return false;
  const url = new URL(origin);
  if (url.protocol !== scheme) return false;
  const from = parseAuthority(url.host);
  if (from === undefined) return false;
  return from.host === target.host && (from.port ?? defaultPort) === (target.port ?? defaultPort);
}

function normalizeOrigin(origin: string): string {
  if (origin === "*") return origin;
  return origin.replace(/\/+$/, "").toLowerCase();
}
