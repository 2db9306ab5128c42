/**
 * Certificate rotation without a restart: the listener's certificate, key
 * and client CA files are watched, and once they change (and check out)
 * new connections get them; connections already open keep theirs.
 *
 * Change notifications come from fs.watch on each file's directory (a
 * directory, not the file: a mounted Secret or cert-manager replaces a
 * file by swapping a link, which a watch on the old file never sees), and,
 * since notifications can be missed (network file systems, a watch that
 * failed), from a periodic look at the files' stat. Bursts of
 * notifications (a key and a certificate written one after the other) are
 * debounced into one look. A pair that does not check out (unreadable, a
 * key that is not the certificate's, expired) is logged and counted, and
 * the credentials in use stay; a later change is tried again.
 */
import { watch } from "node:fs";
import type { FSWatcher } from "node:fs";
import { dirname } from "node:path";
import type { Logger } from "pino";
import { expiresAt, filesStamp, loadTlsFiles, TlsFileError } from "../util/index.js";
import type { TlsFields, TlsFiles, TlsMaterial, TlsMetrics } from "../util/index.js";

/** Notifications within this of each other make one look at the files. */
export const RELOAD_DEBOUNCE_MS = 200;

export interface TlsReloaderOptions {
  readonly files: TlsFiles;
  readonly fields: TlsFields;
  /** The periodic look at the files' stat; 0: notifications only. */
  readonly intervalMs: number;
  readonly debounceMs?: number;
  /** Puts checked files in use for new connections (server.setSecureContext); throws when Node refuses them. */
  readonly apply: (material: TlsMaterial) => void;
  readonly logger: Logger;
  readonly metrics: TlsMetrics;
}

function sameBytes(a: Buffer | undefined, b: Buffer | undefined): boolean {
  return a === undefined || b === undefined ? a === b : a.equals(b);
}

/** Watches the files of credentials in use and replaces them when they change. */
export class TlsReloader {
  private stamp: string;
  private current: TlsMaterial;
  private readonly watchers: FSWatcher[] = [];
  private interval: NodeJS.Timeout | undefined = undefined;
  private pending: NodeJS.Timeout | undefined = undefined;
  private stopped = false;

  /** `stamp` is filesStamp taken before `current` was read, so that a change in between is still seen. */
  constructor(
    private readonly options: TlsReloaderOptions,
    current: TlsMaterial,
    stamp: string,
  ) {
    this.current = current;
    this.stamp = stamp;
    this.reportExpiry(current);
  }

  /** Starts watching; nothing here keeps the process alive. */
  start(): void {
    const { files, intervalMs, logger } = this.options;
    const dirs = new Set([files.certFile, files.keyFile, files.caFile].filter((f) => f !== "").map((f) => dirname(f)));
    for (const dir of dirs) {
      try {
        const watcher = watch(dir, { persistent: false }, () => this.schedule());
        watcher.on("error", (err) => {
          logger.warn({ dir, err: err.message, intervalMs }, "watching the TLS files failed: changes are seen by the periodic check only");
          watcher.close();
        });
        this.watchers.push(watcher);
      } catch (err) {
        logger.warn({ dir, err: (err as Error).message, intervalMs }, "cannot watch the TLS files: changes are seen by the periodic check only");
      }
    }
    if (intervalMs > 0) {
      this.interval = setInterval(() => this.check(), intervalMs);
      this.interval.unref();
    }
  }

  stop(): void {
    this.stopped = true;
    for (const watcher of this.watchers.splice(0)) watcher.close();
    clearInterval(this.interval);
    clearTimeout(this.pending);
  }

  /**
   * Looks at the files: when their stat changed since the last look, reads
   * and checks them, and puts them in use if their contents differ from
   * what is in use. Returns whether new credentials went into use.
   */
  check(): boolean {
    if (this.stopped) return false;
    const { files, fields, apply, logger, metrics } = this.options;
    const stamp = filesStamp(files);
    if (stamp === this.stamp) return false;
    this.stamp = stamp;
    let material: TlsMaterial;
    try {
      material = loadTlsFiles(files, fields, { refuseExpired: true });
    } catch (err) {
      metrics.reloaded("server", "error");
      const code = err instanceof TlsFileError ? err.code : undefined;
      logger.warn({ err: (err as Error).message, code }, "the TLS files changed but cannot be used: the certificate in use stays");
      return false;
    }
    const now = this.current;
    if (sameBytes(material.cert, now.cert) && sameBytes(material.key, now.key) && sameBytes(material.ca, now.ca)) return false;
    try {
      apply(material);
    } catch (err) {
      metrics.reloaded("server", "error");
      logger.warn({ err: (err as Error).message }, "the TLS files changed but Node refused them: the certificate in use stays");
      return false;
    }
    this.current = material;
    metrics.reloaded("server", "success");
    this.reportExpiry(material);
    const leaf = material.leaf;
    logger.info({ subject: leaf?.subject, serialNumber: leaf?.serialNumber, validTo: leaf?.validTo, clientCaChanged: !sameBytes(material.ca, now.ca) }, "TLS certificate reloaded: new connections use it");
    return true;
  }

  private schedule(): void {
    if (this.stopped) return;
    clearTimeout(this.pending);
    this.pending = setTimeout(() => this.check(), this.options.debounceMs ?? RELOAD_DEBOUNCE_MS);
    this.pending.unref();
  }

  private reportExpiry(material: TlsMaterial): void {
    if (material.leaf !== undefined) this.options.metrics.expires("server", this.options.files.certFile, expiresAt(material.leaf));
  }
}
