/**
 * The authority a request names (HTTP/2 `:authority`, HTTP/1.x `Host`):
 * parsed strictly, before anything else reads it, and checked against the
 * hosts this server answers to. A request whose authority cannot be used
 * (missing, `[`, a user part, a bad port) is refused as malformed; one that
 * names a host outside `server.allowedHosts` is refused as forbidden, which
 * is what stops DNS rebinding: a page on `http://attacker.example:50051`
 * whose name resolves to 127.0.0.1 sends `Host: attacker.example:50051`.
 */
import ipaddr from "ipaddr.js";

/** Longest authority read; a DNS name is at most 253 characters, a port 5 more. */
export const MAX_AUTHORITY_CHARS = 300;

/** A parsed authority: the host in lower case (IPv6 in brackets, no trailing dot) and the port if one was named. */
export interface Authority {
  readonly host: string;
  readonly port: number | undefined;
}

/** RFC 3986 reg-name and IPv4 characters (unreserved, sub-delims, pct-encoded); `:` `@` `[` `]` `/` `?` `#` are not among them. */
const REG_NAME = /^(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})+$/;
const PORT = /^[0-9]{1,5}$/;

/** Parses `host[:port]` or `[v6]:port`; undefined when it is not a usable authority. */
export function parseAuthority(raw: string | undefined): Authority | undefined {
  if (raw === undefined || raw === "" || raw.length > MAX_AUTHORITY_CHARS) return undefined;
  let host: string;
  let rest: string;
  if (raw.startsWith("[")) {
    const close = raw.indexOf("]");
    if (close === -1) return undefined;
    const literal = raw.slice(1, close);
    if (!ipaddr.IPv6.isValid(literal)) return undefined;
    host = `[${ipaddr.IPv6.parse(literal).toString()}]`;
    rest = raw.slice(close + 1);
  } else {
    const colon = raw.indexOf(":");
    host = colon === -1 ? raw : raw.slice(0, colon);
    rest = colon === -1 ? "" : raw.slice(colon);
    if (!REG_NAME.test(host)) return undefined;
    host = host.toLowerCase().replace(/\.$/, "");
    if (host === "") return undefined;
  }
  let port: number | undefined = undefined;
  if (rest !== "") {
    const digits = rest.slice(1);
    if (rest[0] !== ":" || !PORT.test(digits) || Number(digits) > 65535) return undefined;
    port = Number(digits);
  }
  // What the handlers build of it (connect makes a URL of scheme and authority) must not fail either.
  if (!URL.canParse(`http://${raw}`)) return undefined;
  return { host, port };
}

/** The authority of a request's headers: `:authority` over HTTP/2, else `Host`. */
export function authorityHeader(headers: Record<string, string | string[] | undefined>): string | undefined {
  const value = headers[":authority"] ?? headers["host"];
  return typeof value === "string" ? value : undefined;
}

/** Whether `entry` may stand in `server.allowedHosts`. */
export function isAllowedHostEntry(entry: string): boolean {
  if (entry === "*") return true;
  if (entry.startsWith(".")) return entry.length > 1 && parseAuthority(entry.slice(1)) !== undefined && !entry.includes(":");
  const parsed = parseAuthority(ipaddr.IPv6.isValid(entry) ? `[${entry}]` : entry);
  return parsed !== undefined && parsed.port === undefined;
}

/** What the host check says of a request. */
export type HostVerdict =
  | { readonly ok: true }
  | { readonly ok: false; readonly reason: "bad_authority" | "host_not_allowed"; readonly message: string };

const OK: HostVerdict = { ok: true };

/** Names that always mean this machine: the default allow-list of a loopback listener. */
const LOOPBACK_NAMES = ["localhost", "127.0.0.1", "[::1]"];

/**
 * The hosts requests may name. An entry is a host name or address
 * (`api.example.com`, `10.0.0.5`, `[::1]` or `::1`), `.example.com` for that
 * domain and every name under it, or `*` for any host. An empty list means
 * the default: the listener's own names when it is bound to loopback
 * (`localhost`, `127.0.0.1`, `[::1]`, names under `.localhost`, the bound
 * and advertised hosts), and any host otherwise, since a server bound to a
 * routable or wildcard address is reached under names it cannot know
 * (Services, ingresses, load balancers); such a server names its hosts
 * in `server.allowedHosts` to be checked.
 */
export class HostAllowList {
  private readonly any: boolean;
  private readonly exact: ReadonlySet<string>;
  private readonly suffixes: readonly string[];
  private lastRaw: string | undefined = undefined;
  private lastVerdict: HostVerdict = OK;

  private constructor(entries: readonly string[]) {
    this.any = entries.includes("*");
    const exact = new Set<string>();
    const suffixes: string[] = [];
    for (const entry of entries) {
      if (entry === "*") continue;
      if (entry.startsWith(".")) {
        suffixes.push(entry.toLowerCase().replace(/\.$/, ""));
        continue;
      }
      if (!isAllowedHostEntry(entry)) throw new Error(`server.allowedHosts: ${JSON.stringify(entry)} is not a host name, an address, ".domain" or "*"`);
      exact.add(parseAuthority(ipaddr.IPv6.isValid(entry) ? `[${entry}]` : entry)!.host);
    }
    this.exact = exact;
    this.suffixes = suffixes;
  }

  /**
   * The list in force for a listener bound to `listenHost` (no brackets),
   * given the configured entries and the advertised address ("" for none).
   */
  static forListener(configured: readonly string[], listenHost: string, advertiseAddress: string): HostAllowList {
    if (configured.length > 0) return new HostAllowList(configured);
    if (!isLoopback(listenHost)) return new HostAllowList(["*"]);
    // The advertised address is free text: a host is taken from it only when it has one.
    const advertised = parseAuthority(advertiseAddress)?.host;
    const own = [listenHost, ...(advertised === undefined ? [] : [advertised])];
    return new HostAllowList([...LOOPBACK_NAMES, ".localhost", ...own]);
  }

  /** True when every host is allowed (nothing is checked but the authority's form). */
  get allowsAny(): boolean {
    return this.any;
  }

  /** The entries, for the start-up log. */
  describe(): string[] {
    return this.any ? ["*"] : [...this.exact, ...this.suffixes];
  }

  /** Whether the request's authority is well formed and names an allowed host. */
  check(headers: Record<string, string | string[] | undefined>): HostVerdict {
    const raw = authorityHeader(headers);
    // Clients send the same authority call after call: the last answer is kept.
    if (raw !== undefined && raw === this.lastRaw) return this.lastVerdict;
    const verdict = this.judge(raw);
    if (raw !== undefined) {
      this.lastRaw = raw;
      this.lastVerdict = verdict;
    }
    return verdict;
  }

  private judge(raw: string | undefined): HostVerdict {
    const authority = parseAuthority(raw);
    if (authority === undefined) {
      const shown = raw === undefined ? "no Host or :authority" : `the authority ${JSON.stringify(raw.slice(0, 100))}`;
      return { ok: false, reason: "bad_authority", message: `the request names ${shown}: expected host[:port]` };
    }
    if (this.allows(authority.host)) return OK;
    return {
      ok: false,
      reason: "host_not_allowed",
      message: `host ${authority.host.slice(0, 100)} is not one this server answers to (see server.allowedHosts)`,
    };
  }

  private allows(host: string): boolean {
    if (this.any || this.exact.has(host)) return true;
    return this.suffixes.some((suffix) => host.endsWith(suffix) || host === suffix.slice(1));
  }
}

function isLoopback(host: string): boolean {
  if (host.toLowerCase() === "localhost") return true;
  const bare = host.replace(/^\[(.*)\]$/, "$1");
  if (!ipaddr.isValid(bare)) return false;
  const address = ipaddr.process(bare);
  return address.range() === "loopback";
}
