/**
 * TLS credentials read from PEM files, shared by the listener (its
 * certificate and the CA of its clients) and outbound channels (the CA
 * they trust and the certificate they present): reading and checking the
 * files with errors that name the setting, noticing that they changed,
 * and the metrics of their reloads and expiry. The files are re-read
 * rather than cached forever because certificate managers (cert-manager,
 * a mounted Secret) replace them in place before they expire.
 */
import { createPrivateKey, X509Certificate } from "node:crypto";
import type { KeyObject } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import { Counter, Gauge } from "prom-client";
import type { Registry } from "prom-client";
import { registeredMetric } from "./metrics.js";

export type TlsFileErrorCode =
  /** The file cannot be read (missing, permissions). */
  | "UNREADABLE"
  /** No certificate in a certificate file, or one that does not parse. */
  | "BAD_CERTIFICATE"
  /** The key file holds no private key that parses (an encrypted one included: no passphrase is taken). */
  | "BAD_KEY"
  /** The key is not the certificate's: a pair half replaced, or two files swapped. */
  | "KEY_MISMATCH"
  /** The certificate's validity ended. */
  | "EXPIRED"
  /** A CA file without a certificate that parses. */
  | "BAD_CA";

/** A TLS file that cannot be used; `field` is the setting that names it (`tls.certFile`, `caFile`). */
export class TlsFileError extends Error {
  override readonly name = "TlsFileError";
  constructor(
    readonly code: TlsFileErrorCode,
    readonly field: string,
    /** What is wrong, without the field name. */
    readonly detail: string,
  ) {
    super(`${field}: ${detail}`);
  }
}

/** The files of one TLS identity and the CA it checks peers against; "" leaves one out. */
export interface TlsFiles {
  readonly certFile: string;
  readonly keyFile: string;
  readonly caFile: string;
}

/** What each file is called in errors: its setting. */
export type TlsFields = Record<keyof TlsFiles, string>;

/** The contents of TlsFiles, checked: a parsed certificate whose key matches, and CA certificates that parse. */
export interface TlsMaterial {
  readonly cert: Buffer | undefined;
  readonly key: Buffer | undefined;
  readonly ca: Buffer | undefined;
  /** The certificate `cert` starts with (the leaf of a chain). */
  readonly leaf: X509Certificate | undefined;
}

function readPem(field: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    throw new TlsFileError("UNREADABLE", field, `cannot read ${path}: ${(err as Error).message}`);
  }
}

const PEM_CERTIFICATE = /-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g;

/** Every certificate of a PEM bundle; throws (a parse error) for one that does not parse. */
function certificatesOf(pem: Buffer): X509Certificate[] {
  return (pem.toString("latin1").match(PEM_CERTIFICATE) ?? []).map((block) => new X509Certificate(block));
}

/**
 * Reads and checks the files: the certificate and key parse and belong
 * together, the CA file holds certificates. With `refuseExpired`, a
 * certificate past its end is refused too (a reload keeps the pair it has
 * rather than take one no peer accepts). Throws a TlsFileError.
 */
export function loadTlsFiles(files: TlsFiles, fields: TlsFields, options: { readonly refuseExpired?: boolean } = {}): TlsMaterial {
  let cert: Buffer | undefined;
  let key: Buffer | undefined;
  let ca: Buffer | undefined;
  let leaf: X509Certificate | undefined;
  if (files.certFile !== "") {
    cert = readPem(fields.certFile, files.certFile);
    key = readPem(fields.keyFile, files.keyFile);
    try {
      leaf = certificatesOf(cert)[0];
    } catch (err) {
      throw new TlsFileError("BAD_CERTIFICATE", fields.certFile, `${files.certFile}: ${(err as Error).message}`);
    }
    if (leaf === undefined) throw new TlsFileError("BAD_CERTIFICATE", fields.certFile, `${files.certFile} holds no PEM certificate`);
    let privateKey: KeyObject;
    try {
      privateKey = createPrivateKey(key);
    } catch (err) {
      throw new TlsFileError("BAD_KEY", fields.keyFile, `${files.keyFile}: ${(err as Error).message}`);
    }
    if (!leaf.checkPrivateKey(privateKey)) {
      throw new TlsFileError("KEY_MISMATCH", fields.keyFile, `${files.keyFile} is not the key of the certificate in ${files.certFile}`);
    }
    if (options.refuseExpired === true && expiresAt(leaf) <= Date.now()) {
      throw new TlsFileError("EXPIRED", fields.certFile, `the certificate in ${files.certFile} expired at ${leaf.validTo}`);
    }
  }
  if (files.caFile !== "") {
    ca = readPem(fields.caFile, files.caFile);
    let count: number;
    try {
      count = certificatesOf(ca).length;
    } catch (err) {
      throw new TlsFileError("BAD_CA", fields.caFile, `${files.caFile}: ${(err as Error).message}`);
    }
    if (count === 0) throw new TlsFileError("BAD_CA", fields.caFile, `${files.caFile} holds no PEM certificate`);
  }
  return { cert, key, ca, leaf };
}

/** When `certificate` stops being valid, in milliseconds since the epoch. */
export function expiresAt(certificate: X509Certificate): number {
  return Date.parse(certificate.validTo);
}

/**
 * A cheap fingerprint of the files' state (device, inode, size, change and
 * modification times, following symbolic links): it changes whenever a
 * file is written or replaced, including a mounted Secret's swap of its
 * `..data` link. A missing file is part of the state too.
 */
export function filesStamp(files: TlsFiles): string {
  let stamp = "";
  for (const path of [files.certFile, files.keyFile, files.caFile]) {
    if (path === "") continue;
    try {
      const s = statSync(path, { bigint: true });
      stamp += `${s.dev}:${s.ino}:${s.size}:${s.mtimeNs}:${s.ctimeNs};`;
    } catch (err) {
      stamp += `${(err as NodeJS.ErrnoException).code ?? "error"};`;
    }
  }
  return stamp;
}

/** Whose credentials: the listener's own certificate, or the one an outbound channel presents. */
export type TlsRole = "server" | "client";

/** Counts reloads and shows when certificates expire; one set per registry, shared by the listener and channels. */
export interface TlsMetrics {
  reloaded(role: TlsRole, result: "success" | "error"): void;
  /** The certificate in `file` expires at `ms` (epoch milliseconds). */
  expires(role: TlsRole, file: string, ms: number): void;
}

const RELOADS = "mmgate_tls_reload_total";
const EXPIRY = "mmgate_tls_certificate_expiry_timestamp_seconds";

/** The TLS metrics of `registry`, created on first use; with `role`, its reload series start at zero. */
export function tlsMetrics(registry: Registry, role?: TlsRole): TlsMetrics {
  const reloads = registeredMetric(
    registry,
    RELOADS,
    Counter,
    () =>
      new Counter({
        name: RELOADS,
        help: "TLS certificate reloads after their files changed: success (new connections use the new files) or error (the previous credentials stay; the log says why), by role (server: the listener; client: an outbound channel).",
        labelNames: ["role", "result"],
        registers: [registry],
      }),
  ) as Counter<"role" | "result">;
  const expiry = registeredMetric(
    registry,
    EXPIRY,
    Gauge,
    () =>
      new Gauge({
        name: EXPIRY,
        help: "When the certificate in use expires (its notAfter), by role (server: the listener; client: an outbound channel's) and file.",
        labelNames: ["role", "file"],
        registers: [registry],
      }),
  ) as Gauge<"role" | "file">;
  if (role !== undefined) {
    reloads.labels(role, "success").inc(0);
    reloads.labels(role, "error").inc(0);
  }
  return {
    reloaded: (r, result) => reloads.labels(r, result).inc(),
    expires: (r, file, ms) => expiry.labels(r, file).set(Math.floor(ms / 1000)),
  };
}
