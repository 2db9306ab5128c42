/**
 * A channel's TLS credentials from files: the CA it trusts (`caFile`) and
 * the certificate and key it presents to peers that ask for one
 * (`certFile`, `keyFile`), as one SecureContext for the connections it
 * opens.
 *
 * Certificate managers replace these files before the certificate expires,
 * so they are looked at again each time a connection opens (three stat
 * calls; connections are long-lived and few) and re-read when they
 * changed: a new connection presents the new pair, an open one goes on
 * with the pair it has. No watcher or timer is needed: nothing but a new
 * connection uses the files. Files that changed but do not check out
 * (half written, a key that is not the certificate's, expired) leave the
 * previous credentials in use; that is logged and counted.
 */
import { createSecureContext } from "node:tls";
import type { SecureContext } from "node:tls";
import type { Logger } from "pino";
import type { Registry } from "prom-client";
import { expiresAt, filesStamp, loadTlsFiles, TlsFileError, tlsMetrics } from "../util/index.js";
import type { TlsFields, TlsFiles, TlsMaterial, TlsMetrics } from "../util/index.js";
import { ChannelConfigError, type ChannelOptions } from "./config.js";

const FIELDS: TlsFields = { certFile: "certFile", keyFile: "keyFile", caFile: "caFile" };

export interface ChannelTlsDeps {
  readonly registry?: Registry | undefined;
  readonly logger?: Pick<Logger, "info" | "warn"> | undefined;
}

function contextOf(material: TlsMaterial): SecureContext {
  // Without a CA file, Node's default CAs, as tls.connect would use.
  return createSecureContext({
    ...(material.ca !== undefined ? { ca: material.ca } : {}),
    ...(material.cert !== undefined ? { cert: material.cert, key: material.key } : {}),
  });
}

/** The credentials of one channel. */
export class ChannelTls {
  private context: SecureContext;
  private current: TlsMaterial;
  private stamp: string;
  private readonly files: TlsFiles;
  private readonly metrics: TlsMetrics | undefined;

  /** Reads the files now; one that cannot be used is a ChannelConfigError naming its setting. */
  constructor(
    options: ChannelOptions,
    private readonly target: string,
    private readonly deps: ChannelTlsDeps = {},
  ) {
    this.files = { certFile: options.certFile, keyFile: options.keyFile, caFile: options.caFile };
    // The stamp before the read: a change while the files are read is seen at the next connection.
    this.stamp = filesStamp(this.files);
    try {
      this.current = loadTlsFiles(this.files, FIELDS);
      this.context = contextOf(this.current);
    } catch (err) {
      if (err instanceof TlsFileError) throw new ChannelConfigError(err.field as keyof ChannelOptions, err.detail);
      throw new ChannelConfigError(options.certFile !== "" ? "certFile" : "caFile", (err as Error).message);
    }
    this.metrics = deps.registry !== undefined ? tlsMetrics(deps.registry, "client") : undefined;
    this.reportExpiry();
  }

  /** The context for a connection that opens now: re-read first when the files changed. */
  secureContext(): SecureContext {
    const stamp = filesStamp(this.files);
    if (stamp !== this.stamp) {
      this.stamp = stamp;
      this.reload();
    }
    return this.context;
  }

  private reload(): void {
    const { logger } = this.deps;
    let material: TlsMaterial;
    let context: SecureContext;
    try {
      material = loadTlsFiles(this.files, FIELDS, { refuseExpired: true });
      if (sameFiles(material, this.current)) return;
      context = contextOf(material);
    } catch (err) {
      this.metrics?.reloaded("client", "error");
      const code = err instanceof TlsFileError ? err.code : undefined;
      logger?.warn({ target: this.target, err: (err as Error).message, code }, "a channel's TLS files changed but cannot be used: its new connections keep the previous credentials");
      return;
    }
    this.current = material;
    this.context = context;
    this.metrics?.reloaded("client", "success");
    this.reportExpiry();
    logger?.info({ target: this.target, serialNumber: material.leaf?.serialNumber, validTo: material.leaf?.validTo }, "a channel's TLS files changed: its new connections use them");
  }

  private reportExpiry(): void {
    const leaf = this.current.leaf;
    if (leaf !== undefined) this.metrics?.expires("client", this.files.certFile, expiresAt(leaf));
  }
}

function sameFiles(a: TlsMaterial, b: TlsMaterial): boolean {
  const same = (x: Buffer | undefined, y: Buffer | undefined) => (x === undefined || y === undefined ? x === y : x.equals(y));
  return same(a.cert, b.cert) && same(a.key, b.key) && same(a.ca, b.ca);
}
