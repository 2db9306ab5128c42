/**
 * Who is calling: the contract between the transport (which learns the TLS
 * peer's certificate), authentication (which turns a bearer key or a
 * certificate into a named caller with scopes) and the services that act on
 * it (quotas, the request log, metrics, traces). Both request paths set these
 * context values the same way.
 */
import type { PeerCertificate } from "node:tls";
import { createContextKey } from "@connectrpc/connect";

/** Per-caller limits of the image API (token buckets); absent fields are unlimited. */
export interface CallerLimits {
  /** Image API requests per second (the bucket's refill rate; its burst is one second's worth, at least 1). */
  readonly requestsPerSecond?: number;
  /** Images per minute, counted by n of each request. */
  readonly imagesPerMinute?: number;
}

/** An authenticated caller: its name (logged, a metric label; never the key), scopes and limits. */
export interface Caller {
  readonly name: string;
  readonly scopes: ReadonlySet<string>;
  /** How it proved who it is. */
  readonly via: "token" | "key" | "certificate";
  readonly limits?: CallerLimits;
}

/** The call's caller once authentication ran; undefined for anonymous calls (public methods, auth off). */
export const callerKey = createContextKey<Caller | undefined>(undefined, { description: "mmgate caller" });

/**
 * A caller name as a metric label: a name of the key set in force,
 * "anonymous" without a caller, "other" for any other, so that a service's
 * own per-caller metrics stay as bounded as the request metrics. The auth
 * interceptor sets the access control's; without auth every caller is
 * anonymous.
 */
export type CallerLabel = (name: string | undefined) => string;

export const callerLabelKey = createContextKey<CallerLabel>((name) => (name === undefined ? "anonymous" : "other"), { description: "mmgate caller label" });

/**
 * The client certificate the TLS handshake verified against `tls.clientCa`,
 * set by the transport for both request paths; undefined without mutual TLS
 * or when the client presented none (clientAuth: request).
 */
export const peerCertificateKey = createContextKey<PeerCertificate | undefined>(undefined, { description: "mmgate verified peer certificate" });
