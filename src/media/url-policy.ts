import ipaddr from "ipaddr.js";
import { MediaError } from "./errors.js";

/** Which URLs the media fetcher may touch. */
export interface UrlPolicy {
  /** Allow hosts written as IP literals. */
  readonly allowDirectIp: boolean;
  /** Allow URLs with an explicit port. */
  readonly allowDirectPort: boolean;
  /** Disable the blocked host names and blocked IP networks entirely. */
  readonly allowPrivateIps: boolean;
  /** CIDR networks exempt from BLOCKED_IP_NETWORKS (e.g. "127.0.0.1/32"). */
  readonly allowedIpNetworks: readonly string[];
  /** When set, the only hosts that may be fetched (exact match, case-insensitive). */
  readonly allowedMediaDomains: readonly string[] | null;
}

export const DEFAULT_URL_POLICY: UrlPolicy = {
  allowDirectIp: false,
  allowDirectPort: false,
  allowPrivateIps: false,
  allowedIpNetworks: [],
  allowedMediaDomains: null,
};

/** Names of loopback, cluster-internal and cloud metadata endpoints. */
export const BLOCKED_HOSTS: readonly string[] = [
  "localhost",
  "localhost.localdomain",
  "ip6-localhost",
  "ip6-loopback",
  "metadata",
  "metadata.google.internal",
  "metadata.goog",
  "kubernetes.default",
  "kubernetes.default.svc",
];

/** Private, loopback, link-local, shared, documentation and multicast ranges. */
export const BLOCKED_IP_NETWORKS: readonly string[] = [
  "0.0.0.0/8",
  "10.0.0.0/8",
  "100.64.0.0/10",
  "127.0.0.0/8",
  "169.254.0.0/16",
  "172.16.0.0/12",
  "192.0.0.0/24",
  "192.0.2.0/24",
  "192.168.0.0/16",
  "198.18.0.0/15",
  "198.51.100.0/24",
  "203.0.113.0/24",
  "224.0.0.0/4",
  "240.0.0.0/4",
  "255.255.255.255/32",
  "::/128",
  "::1/128",
  "::ffff:0:0/96",
  "fc00::/7",
  "fe80::/10",
  "ff00::/8",
];

type Cidr = [ipaddr.IPv4 | ipaddr.IPv6, number];

const BLOCKED_CIDRS: readonly [string, Cidr][] = BLOCKED_IP_NETWORKS.map((n) => [n, ipaddr.parseCIDR(n)]);

const exemptionCache = new WeakMap<readonly string[], Cidr[]>();

function exemptions(networks: readonly string[]): Cidr[] {
  let parsed = exemptionCache.get(networks);
  if (parsed === undefined) {
    parsed = networks.map((n) => ipaddr.parseCIDR(n));
    exemptionCache.set(networks, parsed);
  }
  return parsed;
}

function inNetwork(addr: ipaddr.IPv4 | ipaddr.IPv6, cidr: Cidr): boolean {
  return addr.kind() === cidr[0].kind() && addr.match(cidr);
}

/**
 * The blocked network an address falls in, or null. Addresses inside one of
 * `allowedIpNetworks` are never blocked. Unparseable input counts as blocked.
 */
export function blockedNetworkOf(address: string, allowedIpNetworks: readonly string[] = []): string | null {
  let addr: ipaddr.IPv4 | ipaddr.IPv6;
  try {
    addr = ipaddr.parse(address.replace(/^\[|\]$/g, ""));
  } catch {
    return "invalid address";
  }
  if (exemptions(allowedIpNetworks).some((c) => inNetwork(addr, c))) return null;
  for (const [name, cidr] of BLOCKED_CIDRS) if (inNetwork(addr, cidr)) return name;
  return null;
}

export function isBlockedIp(address: string, allowedIpNetworks: readonly string[] = []): boolean {
  return blockedNetworkOf(address, allowedIpNetworks) !== null;
}

/** Lower-cased, trailing dot stripped, then looked up in BLOCKED_HOSTS. */
function isBlockedHostName(host: string): boolean {
  return BLOCKED_HOSTS.includes(host.toLowerCase().replace(/\.$/, ""));
}

/** The IP literal a WHATWG hostname holds, or null for a domain name. */
export function ipLiteralOf(hostname: string): string | null {
  if (hostname.startsWith("[") && hostname.endsWith("]")) return hostname.slice(1, -1);
  // WHATWG parsing normalizes every IPv4 spelling to dotted decimal.
  return /^\d{1,3}(\.\d{1,3}){3}$/.test(hostname) ? hostname : null;
}

export function isDataUrl(url: string): boolean {
  return /^data:/i.test(url);
}

function deny(code: ConstructorParameters<typeof MediaError>[0], message: string): MediaError {
  return new MediaError(code, message);
}

/**
 * The reference's URL checks, in its order: scheme, data pass, host present,
 * direct IP, explicit port, blocked names and IP literals, domain allowlist.
 * Returns the parsed URL (null for data URLs); throws a MediaError naming
 * the rule otherwise. DNS is checked separately (see the fetcher).
 */
export function checkUrlAllowed(url: string, policy: UrlPolicy): URL | null {
  if (isDataUrl(url)) return null;
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw deny("URL_INVALID", `Invalid URL: ${url.length > 200 ? `${url.slice(0, 200)}…` : url}`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw deny("URL_SCHEME_NOT_ALLOWED", "Only HTTP(S) and data URLs are allowed");
  }
  const host = parsed.hostname;
  if (host === "") throw deny("URL_HOST_MISSING", "URL must have a host");
  const literal = ipLiteralOf(host);
  if (!policy.allowDirectIp && literal !== null) {
    throw deny("URL_DIRECT_IP_NOT_ALLOWED", `Direct IP access is not allowed: ${host}`);
  }
  if (!policy.allowDirectPort && parsed.port !== "") {
    throw deny("URL_DIRECT_PORT_NOT_ALLOWED", `Explicit ports are not allowed: ${parsed.port}`);
  }
  if (!policy.allowPrivateIps) {
    if (literal === null && isBlockedHostName(host)) {
      throw deny("URL_BLOCKED_HOST", `Access to blocked host is not allowed: ${host}`);
    }
    if (literal !== null) {
      const network = blockedNetworkOf(literal, policy.allowedIpNetworks);
      if (network !== null) {
        throw deny("URL_BLOCKED_IP", `Access to blocked IP address is not allowed: ${literal} (in ${network})`);
      }
    }
  }
  if (policy.allowedMediaDomains !== null && !policy.allowedMediaDomains.some((d) => d.toLowerCase() === host)) {
    throw deny("URL_DOMAIN_NOT_ALLOWED", `Domain is not in the allowed media domains: ${host}`);
  }
  return parsed;
}
