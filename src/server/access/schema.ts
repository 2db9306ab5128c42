/**
 * The shapes of access control's settings: caller names, scopes and limits,
 * the keys file (`auth.keysFile`) and the certificate rules
 * (`auth.certificates`). Strict: an unknown field is an error, as in the
 * config.
 */
import { z } from "zod";
import { SCOPE_MAX_LENGTH, SCOPE_SYNTAX } from "./scopes.js";

/** A caller's name: it is logged and becomes a metric label, so its characters and length are bounded. */
export const CALLER_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

/** Names the metric label gives callers that are not (or no longer) in the set. */
export const RESERVED_CALLER_NAMES: ReadonlySet<string> = new Set(["anonymous", "other"]);

/** The name `auth.token` goes by, as a key with every scope. */
export const TOKEN_CALLER_NAME = "token";

export const callerNameSchema = z
  .string()
  .regex(CALLER_NAME, "a name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit")
  .refine((name) => !RESERVED_CALLER_NAMES.has(name.toLowerCase()), { error: (issue) => `"${String(issue.input)}" is reserved (the metrics' label for other callers)` });

export const scopeSchema = z
  .string()
  .max(SCOPE_MAX_LENGTH)
  .regex(SCOPE_SYNTAX, "expected an access level (public, mutating, admin), a service (images), a method (images.generate) or a full name (mmgate.images.v1.ImageService/Generate)");

const scopesSchema = z.array(scopeSchema).min(1, "give at least one scope (public for a caller that only names itself)");

/** Per-caller limits of the image API (CallerLimits); absent fields are unlimited. */
export const callerLimitsSchema = z.strictObject({
  requestsPerSecond: z.number().positive().max(1_000_000).optional(),
  imagesPerMinute: z.number().int().positive().max(1_000_000).optional(),
});

/** One key of the keys file: its name, the SHA-256 of the key (never the key), scopes, expiry, limits. */
export const keyEntrySchema = z.strictObject({
  name: callerNameSchema,
  sha256: z
    .string({ error: "expected the key's SHA-256 as a string of 64 hex digits (quote it if YAML reads it as a number)" })
    .regex(/^[0-9a-fA-F]{64}$/, "expected the key's SHA-256 as 64 hex digits (mmgate keys hash prints it)")
    .transform((hex) => hex.toLowerCase()),
  scopes: scopesSchema,
  /** RFC 3339, with a time zone: 2026-01-31T00:00:00Z. */
  expires: z.iso.datetime({ offset: true, error: "expected an RFC 3339 time with a zone, e.g. 2026-01-31T00:00:00Z" }).optional(),
  limits: callerLimitsSchema.optional(),
});

export type KeyEntry = z.output<typeof keyEntrySchema>;

/** Reports the second and later entries whose `field` (compared case aside) an earlier one has. */
function refuseDuplicates<T>(entries: readonly T[], field: (entry: T) => string, what: string, ctx: z.RefinementCtx, path: readonly (string | number)[], key: string): void {
  const seen = new Map<string, number>();
  entries.forEach((entry, index) => {
    const value = field(entry).toLowerCase();
    const first = seen.get(value);
    if (first === undefined) seen.set(value, index);
    else ctx.addIssue({ code: "custom", path: [...path, index, key], message: `duplicate ${what}: entry ${first} has it too` });
  });
}

/** The whole keys file: `keys: [...]`; names and digests unique. */
export const keysFileSchema = z
  .strictObject({ keys: z.array(keyEntrySchema) })
  .superRefine((file, ctx) => {
    refuseDuplicates(file.keys, (k) => k.name, "name", ctx, ["keys"], "name");
    refuseDuplicates(file.keys, (k) => k.sha256, "digest", ctx, ["keys"], "sha256");
  });

/** `CN=client-a` or `CN=client-a,O=Acme`: every attribute given must be in the certificate's subject. */
const SUBJECT = /^\s*[A-Za-z][A-Za-z0-9.]*=[^,=]+(?:,\s*[A-Za-z][A-Za-z0-9.]*=[^,=]+)*\s*$/;
/** `DNS:name`, `URI:uri`, `IP:address`, `email:address`, or a URI given as it is (`spiffe://trust.domain/workload`). */
const SAN = /^(?:(?:DNS|URI|IP|email):\S+|[A-Za-z][A-Za-z0-9+.-]*:\/\/\S+)$/;

/** One entry of `auth.certificates`: a verified client certificate that is this caller. */
export const certificateRuleSchema = z
  .strictObject({
    name: callerNameSchema,
    /** Attributes of the certificate's subject, e.g. "CN=ci-runner,O=Acme"; each one must match. */
    subject: z.string().regex(SUBJECT, 'expected attributes such as "CN=client-a" or "CN=client-a,O=Acme"').optional(),
    /** A subject alternative name the certificate must carry: "spiffe://…", "DNS:…", "URI:…", "IP:…" or "email:…". */
    san: z.string().regex(SAN, 'expected "spiffe://…" (any URI), "DNS:name", "URI:…", "IP:address" or "email:address"').optional(),
    scopes: scopesSchema,
    limits: callerLimitsSchema.optional(),
  })
  .refine((rule) => rule.subject !== undefined || rule.san !== undefined, "give subject, san or both: which certificates are this caller");

export type CertificateRule = z.output<typeof certificateRuleSchema>;

/** `auth.certificates`: names unique. */
export const certificateRulesSchema = z.array(certificateRuleSchema).superRefine((rules, ctx) => refuseDuplicates(rules, (r) => r.name, "name", ctx, [], "name"));
