/**
 * Who may call what, for the host's auth interceptor: the key set in force
 * (auth.token, the keys file, the certificate rules), the verdict on each
 * call, and the keys file's reloads. A reload that fails keeps the keys in
 * force and says why; one that succeeds replaces them in one assignment.
 */
import { createHash } from "node:crypto";
import { resolve } from "node:path";
import type { PeerCertificate } from "node:tls";
import type { DescMethod, DescService } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Logger } from "pino";
import type { Registry } from "prom-client";
import type { Caller } from "../caller.js";
import { ConfigError } from "../config/errors.js";
import type { HostConfig } from "../config/schema.js";
import { scopeCatalog } from "./catalog.js";
import { describeCertificate } from "./certificates.js";
import { KeysFileError } from "./errors.js";
import { FileWatch } from "./file-watch.js";
import { compileCertificateRules, KeySet, type CallerEntry, type CertificateEntry } from "./key-set.js";
import { parseKeysText, readKeysFileSync, readKeysText } from "./keys-file.js";
import { AccessMetrics } from "./metrics.js";
import type { KeyEntry } from "./schema.js";
import { Access, accessScope, cachedMethodAccess, grantingScopes, methodScope, serviceScope, type ScopeCatalog } from "./scopes.js";

export type AuthConfig = HostConfig["auth"];

/** How the keys file is watched: a change is read once events have been quiet this long; the file is stat'ed this often besides. */
export const KEYS_FILE_WATCH = { debounceMs: 200, pollMs: 5000 } as const;

export interface AccessControlOptions {
  readonly auth: AuthConfig;
  readonly logger: Logger;
  readonly registry: Registry;
  /** The clock keys expire by (ms since the epoch). */
  readonly now?: () => number;
  readonly watch?: { readonly debounceMs?: number; readonly pollMs?: number };
}

/** The outcome of one call's check: the caller when one is known (refused calls too), and the refusal, if any. */
export interface Verdict {
  readonly caller?: Caller | undefined;
  readonly refusal?: ConnectError | undefined;
}

const ANONYMOUS: Verdict = Object.freeze({});
const BEARER = /^Bearer\s+(\S+)\s*$/i;

/** Whether any of auth.token, auth.keysFile or auth.certificates is set: then mutating and admin methods need a caller. */
export function authEnabled(auth: AuthConfig): boolean {
  return auth.token !== "" || auth.keysFile !== "" || auth.certificates.length > 0;
}

/** `package.Service/Method`, as refusals name a method. */
function pathOf(method: DescMethod): string {
  return `${method.parent.typeName}/${method.name}`;
}

/** The refusal of a call that brought no credential (or one that is no bearer header). */
function needsCredential(method: DescMethod, keys: KeySet): ConnectError {
  return new ConnectError(`${pathOf(method)} requires a bearer token${keys.hasCertificates ? " or a client certificate" : ""}`, Code.Unauthenticated);
}

function textDigest(text: string): string {
  return createHash("sha256").update(text).digest("hex");
}

export class AccessControl {
  /** Whether the auth interceptor runs at all (authEnabled). */
  readonly enabled: boolean;
  /** The keys file, resolved; "" when there is none. */
  readonly keysFile: string;
  private keys: KeySet;
  private readonly token: string;
  private readonly certificates: readonly CertificateEntry[];
  private readonly metrics: AccessMetrics;
  private readonly logger: Logger;
  private readonly now: () => number;
  /** The digest of the keys file's text last read, good or bad: an unchanged file is not read again. */
  private seen: string | undefined = undefined;
  private reloads: Promise<unknown> = Promise.resolve();
  private watch: FileWatch | undefined = undefined;
  private catalog: ScopeCatalog | undefined = undefined;
  private closed = false;

  /** Reads the keys file once; one that cannot be used is a ConfigError, as any other bad setting at start-up. */
  constructor(private readonly options: AccessControlOptions) {
    const { auth } = options;
    this.enabled = authEnabled(auth);
    this.keysFile = auth.keysFile === "" ? "" : resolve(auth.keysFile);
    this.token = auth.token;
    this.logger = options.logger;
    this.now = options.now ?? Date.now;
    this.metrics = new AccessMetrics(options.registry);
    this.certificates = compileCertificateRules(auth.certificates);
    try {
      let keys: KeyEntry[] = [];
      if (this.keysFile !== "") {
        const read = readKeysFileSync(this.keysFile);
        this.seen = textDigest(read.text);
        keys = read.keys;
      }
      this.keys = this.build(keys);
    } catch (err) {
      if (err instanceof KeysFileError) throw new ConfigError("invalid configuration", [`auth.keysFile: ${err.message}`]);
      throw err;
    }
    this.metrics.keys.set(this.keys.keyCount);
  }

  /** The key set in force. */
  get current(): KeySet {
    return this.keys;
  }

  /**
   * The verdict on a call of `method` with this `authorization` header and
   * verified client certificate. A bearer header wins over a certificate.
   * PUBLIC methods are open to anyone: a credential there only names the
   * caller, and one that does not work leaves the call anonymous.
   */
  authorize(method: DescMethod, authorization: string | null, certificate: PeerCertificate | undefined): Verdict {
    const keys = this.keys;
    const open = cachedMethodAccess(method) === Access.PUBLIC;
    let entry: CallerEntry | undefined;
    if (authorization !== null) {
      const match = BEARER.exec(authorization);
      entry = match ? keys.byKey(match[1]!) : undefined;
      const expired = entry?.expiresAt !== undefined && this.now() >= entry.expiresAt;
      if (entry === undefined || expired) {
        if (open) return ANONYMOUS;
        if (!match) return { refusal: needsCredential(method, keys) };
        // A key's name is no secret; the key never appears in a message.
        return { refusal: new ConnectError(entry === undefined ? "invalid bearer token" : `key ${entry.caller.name} expired`, Code.Unauthenticated) };
      }
    } else if (certificate !== undefined && keys.hasCertificates) {
      entry = keys.byCertificate(certificate);
      if (entry === undefined && !open) {
        return {
          refusal: new ConnectError(
            `${pathOf(method)} requires a bearer token or a client certificate auth.certificates names; this one (${describeCertificate(certificate)}) matches none`,
            Code.Unauthenticated,
          ),
        };
      }
    }
    if (entry === undefined) return open ? ANONYMOUS : { refusal: needsCredential(method, keys) };
    const match = entry.match;
    if (open || grantingScopes(method).some((scope) => match.has(scope))) return { caller: entry.caller };
    const { typeName } = method.parent;
    const level = accessScope(cachedMethodAccess(method));
    const who = entry.caller.via === "certificate" ? "certificate" : "key";
    return {
      caller: entry.caller,
      refusal: new ConnectError(
        `${who} ${entry.caller.name} lacks scope ${level} for ${pathOf(method)} (${serviceScope(typeName)} or ${methodScope(typeName, method.name)} would grant it too)`,
        Code.PermissionDenied,
      ),
    };
  }

  /**
   * The `caller` label of the request metrics: a name of the set in force,
   * "anonymous" without a caller, "other" for any other name (one removed
   * by a reload while its call ran), so the label's values stay bounded.
   */
  callerLabel(name: string | undefined): string {
    if (name === undefined) return "anonymous";
    return this.keys.names.has(name) ? name : "other";
  }

  /**
   * From here the keys file is watched (a no-op without one), and the
   * scopes of every key and rule are checked against the services of
   * proto/ and `served`: one that names nothing is logged as a warning.
   */
  start(served: readonly DescService[] = []): void {
    if (this.closed || !this.enabled || this.watch !== undefined) return;
    if (this.keysFile !== "") {
      const { debounceMs = KEYS_FILE_WATCH.debounceMs, pollMs = KEYS_FILE_WATCH.pollMs } = this.options.watch ?? {};
      this.watch = new FileWatch(this.keysFile, {
        debounceMs,
        pollMs,
        onChange: () => void this.reload(),
        onWatchError: (err) => this.logger.warn({ file: this.keysFile, err: err.message }, "auth keys file: cannot watch its directory; changes are seen by polling only"),
      });
      void this.watch.start();
    }
    // auth.token alone has every scope: nothing to check.
    if (this.keysFile === "" && this.certificates.length === 0) return;
    void scopeCatalog(served).then((catalog) => {
      if (this.closed) return;
      this.catalog = catalog;
      this.warnUnknownScopes(this.keys);
    });
  }

  /**
   * Reads the keys file again. "ok": its keys are in force; "error": it was
   * refused (the warning says why) and the keys before stay; "unchanged":
   * its text is the one read last. Reloads run one at a time.
   */
  reload(): Promise<"ok" | "error" | "unchanged"> {
    const next = this.reloads.then(() => this.reloadOnce());
    this.reloads = next.catch(() => undefined);
    return next;
  }

  /** Stops watching the keys file. */
  close(): void {
    this.closed = true;
    this.watch?.close();
  }

  private build(keys: readonly KeyEntry[]): KeySet {
    return KeySet.build({ token: this.token, keys, certificates: this.certificates }, this.keysFile);
  }

  private async reloadOnce(): Promise<"ok" | "error" | "unchanged"> {
    if (this.closed || this.keysFile === "") return "unchanged";
    let next: KeySet;
    try {
      const text = await readKeysText(this.keysFile);
      const digest = textDigest(text);
      if (digest === this.seen) return "unchanged";
      this.seen = digest;
      next = this.build(parseKeysText(text, this.keysFile));
    } catch (err) {
      if (!(err instanceof KeysFileError)) throw err;
      this.metrics.reloads.inc({ result: "error" });
      const inForce = this.keys.keyCount;
      this.logger.warn(
        { file: this.keysFile, code: err.code, problems: err.problems },
        `auth keys file not reloaded: ${err.problems.join("; ")}; the ${inForce} key${inForce === 1 ? "" : "s"} loaded before stay in force`,
      );
      return "error";
    }
    // The one assignment: calls from here on are judged against the new set.
    this.keys = next;
    this.metrics.reloads.inc({ result: "ok" });
    this.metrics.keys.set(next.keyCount);
    this.logger.info({ file: this.keysFile, keys: next.keyCount }, "auth keys reloaded");
    this.warnUnknownScopes(next);
    return "ok";
  }

  /** A warning per caller whose scopes name no level, service or method known here: such a scope grants nothing. */
  private warnUnknownScopes(keys: KeySet): void {
    const catalog = this.catalog;
    if (catalog === undefined || catalog.size === 0) return;
    for (const [name, scopes] of keys.writtenScopes()) {
      const unknown = scopes.filter((s) => !catalog.has(s));
      if (unknown.length === 0) continue;
      this.logger.warn({ caller: name, scopes: unknown }, `auth: caller ${name}: ${unknown.map((s) => catalog.describeUnknown(s)).join("; ")}; it grants nothing`);
    }
  }
}
