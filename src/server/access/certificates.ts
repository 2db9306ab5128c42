/**
 * Callers known by their client certificate (`auth.certificates`): a rule
 * names the subject attributes and/or the subject alternative name a
 * certificate the TLS handshake verified must carry. The transport has
 * verified the chain already (`peerCertificateKey`); this only says which
 * caller a verified certificate is.
 */
import type { PeerCertificate } from "node:tls";
import ipaddr from "ipaddr.js";
import type { CertificateRule } from "./schema.js";

/** One subject alternative name: its type as Node writes it (`DNS`, `URI`, `IP`, `email`, …) and value. */
export interface AltName {
  readonly type: string;
  readonly value: string;
}

/**
 * Node's `subjectaltname` text (`DNS:a.example, URI:spiffe://td/w, IP Address:10.0.0.1`)
 * as a list. Values with characters that would make the text ambiguous come
 * JSON-quoted (`URI:"https://x/a,b"`), as Node has written them since the
 * CVE-2021-44532 fix.
 */
export function parseAltNames(text: string | undefined): AltName[] {
  const names: AltName[] = [];
  if (text === undefined) return names;
  let at = 0;
  while (at < text.length) {
    const colon = text.indexOf(":", at);
    if (colon < 0) break;
    const rawType = text.slice(at, colon).trim();
    let value: string;
    let end: number;
    if (text[colon + 1] === '"') {
      let close = colon + 2;
      while (close < text.length && text[close] !== '"') close += text[close] === "\\" ? 2 : 1;
      try {
        value = JSON.parse(text.slice(colon + 1, close + 1)) as string;
      } catch {
        value = text.slice(colon + 2, close);
      }
      end = close + 1;
    } else {
      const comma = text.indexOf(", ", colon + 1);
      end = comma < 0 ? text.length : comma;
      value = text.slice(colon + 1, end);
    }
    names.push({ type: rawType === "IP Address" ? "IP" : rawType, value });
    const next = text.indexOf(",", end);
    at = next < 0 ? text.length : next + 1;
  }
  return names;
}

/** "CN=a,O=Acme" → [["cn", "a"], ["o", "Acme"]]: attribute names lower-cased, values as written. */
function parseSubject(text: string): [string, string][] {
  return text.split(",").map((pair) => {
    const eq = pair.indexOf("=");
    return [pair.slice(0, eq).trim().toLowerCase(), pair.slice(eq + 1).trim()];
  });
}

/** An IP address in one spelling (IPv6 zeros written out or not), or the text as it is when it is none. */
function normalizeIp(text: string): string {
  try {
    return ipaddr.parse(text).toNormalizedString();
  } catch {
    return text.toLowerCase();
  }
}

/** A SAN compared as its type says: DNS names and e-mail addresses without case, addresses in one spelling, URIs exactly. */
function altNameKey(type: string, value: string): string {
  switch (type) {
    case "DNS":
    case "email":
      return `${type}:${value.toLowerCase()}`;
    case "IP":
      return `IP:${normalizeIp(value)}`;
    default:
      return `${type}:${value}`;
  }
}

/** A rule's `san` as the key altNameKey gives a certificate's: a bare URI (`spiffe://…`) is a URI SAN. */
function ruleAltNameKey(san: string): string {
  const typed = /^(DNS|URI|IP|email):(.*)$/.exec(san);
  return typed ? altNameKey(typed[1]!, typed[2]!) : altNameKey("URI", san);
}

/** The values of one subject attribute (`CN`, `O`, …: a name matched case aside), a string or a list in Node's object. */
function subjectValues(cert: PeerCertificate, attribute: string): string[] {
  const subject = cert.subject as unknown as Record<string, string | string[] | undefined> | undefined;
  if (subject === undefined || subject === null) return [];
  for (const [name, value] of Object.entries(subject)) {
    if (name.toLowerCase() !== attribute || value === undefined) continue;
    return Array.isArray(value) ? value : [value];
  }
  return [];
}

/** Whether a certificate is the caller a rule describes: every subject attribute it names, and its SAN, present. */
export type CertificateTest = (cert: PeerCertificate) => boolean;

export function certificateTest(rule: Pick<CertificateRule, "subject" | "san">): CertificateTest {
  const attributes = rule.subject === undefined ? [] : parseSubject(rule.subject);
  const san = rule.san === undefined ? undefined : ruleAltNameKey(rule.san);
  return (cert) => {
    for (const [attribute, want] of attributes) if (!subjectValues(cert, attribute).includes(want)) return false;
    if (san !== undefined && !parseAltNames(cert.subjectaltname).some((n) => altNameKey(n.type, n.value) === san)) return false;
    return true;
  };
}

/** How a certificate is named in a refusal: its subject's CN, or its first SAN. Neither is a secret. */
export function describeCertificate(cert: PeerCertificate): string {
  const cn = subjectValues(cert, "cn")[0];
  if (cn !== undefined) return `CN=${cn}`;
  const first = parseAltNames(cert.subjectaltname)[0];
  return first === undefined ? "without a subject" : `${first.type}:${first.value}`;
}
