/**
 * The callers a server knows at one moment: the bearer keys (auth.token as
 * the key `token`, and the keys file's), by digest, and the certificate
 * rules. Immutable: a reload builds a new set and swaps it in whole, so a
 * call is judged against one set from start to end.
 */
import type { PeerCertificate } from "node:tls";
import type { Caller, CallerLimits } from "../caller.js";
import { certificateTest, type CertificateTest } from "./certificates.js";
import { KeysFileError } from "./errors.js";
import { keyDigest } from "./keys-file.js";
import { TOKEN_CALLER_NAME, type CertificateRule, type KeyEntry } from "./schema.js";
import { ACCESS_SCOPES, expandScopes } from "./scopes.js";

/** A known caller: who it is, and what the checks need. */
export interface CallerEntry {
  readonly caller: Caller;
  /** The caller's scopes lower-cased, implied levels included, for matching. */
  readonly match: ReadonlySet<string>;
  /** When a key stops working, in ms since the epoch; undefined: never. */
  readonly expiresAt?: number | undefined;
  /** The expiry as the file wrote it. */
  readonly expires?: string | undefined;
}

/** A certificate rule ready to test certificates. */
export interface CertificateEntry extends CallerEntry {
  readonly test: CertificateTest;
}

function entryOf(name: string, via: Caller["via"], written: readonly string[], limits: CallerLimits | undefined, expires?: string): CallerEntry {
  const { scopes, match } = expandScopes(written);
  const caller: Caller = Object.freeze({ name, scopes, via, ...(limits !== undefined ? { limits: Object.freeze({ ...limits }) } : {}) });
  return expires === undefined ? { caller, match } : { caller, match, expires, expiresAt: Date.parse(expires) };
}

/** The certificate rules of the config, compiled once: they do not change while the process runs. */
export function compileCertificateRules(rules: readonly CertificateRule[]): CertificateEntry[] {
  return rules.map((rule) => ({ ...entryOf(rule.name, "certificate", rule.scopes, rule.limits), test: certificateTest(rule) }));
}

export class KeySet {
  /** Every caller name the set knows: the label values the request metrics may take besides "anonymous" and "other". */
  readonly names: ReadonlySet<string>;

  private constructor(
    private readonly byDigest: ReadonlyMap<string, CallerEntry>,
    private readonly certificates: readonly CertificateEntry[],
  ) {
    this.names = new Set([...[...byDigest.values()].map((e) => e.caller.name), ...certificates.map((c) => c.caller.name)]);
  }

  /**
   * The set of `token` (every scope; "" for none), the keys file's keys and
   * the certificate rules. Names are one namespace (they label the same
   * metrics): a clash is a "conflict" KeysFileError naming `file`.
   */
  static build(input: { readonly token: string; readonly keys: readonly KeyEntry[]; readonly certificates: readonly CertificateEntry[] }, file: string): KeySet {
    const byDigest = new Map<string, CallerEntry>();
    const problems: string[] = [];
    const taken = new Map<string, string>(input.certificates.map((c) => [c.caller.name.toLowerCase(), "auth.certificates"]));
    if (input.token !== "") {
      byDigest.set(keyDigest(input.token), entryOf(TOKEN_CALLER_NAME, "token", ACCESS_SCOPES, undefined));
      taken.set(TOKEN_CALLER_NAME, "auth.token");
    }
    input.keys.forEach((key, index) => {
      const owner = taken.get(key.name.toLowerCase());
      if (owner !== undefined) problems.push(`keys[${index}].name: ${key.name} is taken by ${owner}`);
      else if (byDigest.has(key.sha256)) problems.push(`keys[${index}].sha256: this is the digest of auth.token`);
      else byDigest.set(key.sha256, entryOf(key.name, "key", key.scopes, key.limits, key.expires));
    });
    if (problems.length > 0) throw new KeysFileError("conflict", file, problems);
    return new KeySet(byDigest, input.certificates);
  }

  /** Bearer keys known (auth.token's included). */
  get keyCount(): number {
    return this.byDigest.size;
  }

  get hasCertificates(): boolean {
    return this.certificates.length > 0;
  }

  /**
   * The caller a bearer key is. The key is hashed and the digest looked up:
   * whatever a lookup's timing reveals is about a digest, never the key.
   */
  byKey(key: string): CallerEntry | undefined {
    return this.byDigest.get(keyDigest(key));
  }

  /** The caller of the first certificate rule a verified certificate satisfies. */
  byCertificate(cert: PeerCertificate): CallerEntry | undefined {
    return this.certificates.find((rule) => rule.test(cert));
  }

  /** Every scope written for the set's keys and rules, for the check against the known services. */
  writtenScopes(): Map<string, string[]> {
    const out = new Map<string, string[]>();
    for (const entry of [...this.byDigest.values(), ...this.certificates]) {
      if (entry.caller.via !== "token") out.set(entry.caller.name, [...entry.caller.scopes]);
    }
    return out;
  }
}
