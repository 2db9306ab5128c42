/**
 * A throwaway PKI for TLS tests, made with the system's openssl in a temp
 * directory: certificate authorities, and server or client certificates
 * they sign, with any validity window. Certificates are issued with
 * `openssl ca`, which takes explicit start and end dates, so an expired
 * certificate needs neither a fake clock nor an openssl newer than 3.0.
 */
import { execFileSync } from "node:child_process";
import { randomBytes, X509Certificate } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const P256 = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

export interface TestCa {
  readonly name: string;
  /** The CA's certificate: what a peer trusts. */
  readonly certFile: string;
  readonly keyFile: string;
  /** openssl ca's configuration (database, serial) for this CA. */
  readonly configFile: string;
}

export interface TestCertificate {
  readonly certFile: string;
  readonly keyFile: string;
  /** Upper-case hex, as Node's getPeerCertificate() gives it. */
  readonly serialNumber: string;
}

export interface IssueOptions {
  /** Common name; a server certificate also gets SAN IP:127.0.0.1 and DNS:localhost. */
  readonly cn: string;
  readonly usage: "server" | "client";
  /** The validity window; default: from an hour ago for `days` days. */
  readonly notBefore?: Date;
  readonly notAfter?: Date;
  /** Default 1. */
  readonly days?: number;
  /** Where the files go (default: a fresh name in the PKI's directory). */
  readonly certFile?: string;
  readonly keyFile?: string;
}

function openssl(args: readonly string[]): void {
  try {
    execFileSync("openssl", [...args], { stdio: ["ignore", "ignore", "pipe"] });
  } catch (err) {
    const stderr = (err as { stderr?: Buffer }).stderr?.toString().trim();
    throw new Error(`openssl ${args[0]} failed: ${stderr || (err as Error).message}`, { cause: err });
  }
}

/** openssl ca's date form, YYYYMMDDHHMMSSZ. */
function asn1Time(date: Date): string {
  return `${date.toISOString().replace(/[-:T]/g, "").slice(0, 14)}Z`;
}

/** True when openssl is on PATH (a suite skips itself otherwise). */
export function opensslAvailable(): boolean {
  try {
    execFileSync("openssl", ["version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

export class TestPki {
  readonly dir: string;
  private issued = 0;

  constructor() {
    this.dir = mkdtempSync(join(tmpdir(), "mmgate-pki-"));
  }

  /** A self-signed CA, valid for ten days. */
  ca(name: string): TestCa {
    const home = join(this.dir, name);
    mkdirSync(join(home, "issued"), { recursive: true });
    const certFile = join(home, "ca.pem");
    const keyFile = join(home, "ca.key");
    openssl([
      "req", "-x509", ...P256, "-days", "10", "-subj", `/CN=${name}`,
      "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
      "-keyout", keyFile, "-out", certFile,
    ]);
    writeFileSync(join(home, "index.txt"), "");
    // Serials differ between CAs too, so a test can tell certificates apart by serial alone.
    writeFileSync(join(home, "serial"), `10${randomBytes(7).toString("hex").toUpperCase()}\n`);
    const configFile = join(home, "ca.cnf");
    writeFileSync(
      configFile,
      [
        "[ca]",
        "default_ca = this",
        "[this]",
        `database = ${join(home, "index.txt")}`,
        `new_certs_dir = ${join(home, "issued")}`,
        `serial = ${join(home, "serial")}`,
        "default_md = sha256",
        "policy = any",
        "unique_subject = no",
        "copy_extensions = none",
        "[any]",
        "commonName = supplied",
        "",
      ].join("\n"),
    );
    return { name, certFile, keyFile, configFile };
  }

  /** A certificate `ca` signs, with a fresh P-256 key. */
  issue(ca: TestCa, options: IssueOptions): TestCertificate {
    const n = ++this.issued;
    const base = join(this.dir, `${options.cn.replace(/[^a-zA-Z0-9.-]/g, "_")}-${n}`);
    const keyFile = options.keyFile ?? `${base}.key`;
    const certFile = options.certFile ?? `${base}.pem`;
    const csr = `${base}.csr`;
    const ext = `${base}.ext`;
    openssl(["req", "-new", ...P256, "-subj", `/CN=${options.cn}`, "-keyout", keyFile, "-out", csr]);
    writeFileSync(
      ext,
      [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        `extendedKeyUsage=${options.usage === "server" ? "serverAuth" : "clientAuth"}`,
        ...(options.usage === "server" ? ["subjectAltName=IP:127.0.0.1,DNS:localhost"] : []),
        "",
      ].join("\n"),
    );
    const notBefore = options.notBefore ?? new Date(Date.now() - 3_600_000);
    const notAfter = options.notAfter ?? new Date(notBefore.getTime() + (options.days ?? 1) * 86_400_000);
    openssl([
      "ca", "-batch", "-notext", "-config", ca.configFile, "-cert", ca.certFile, "-keyfile", ca.keyFile,
      "-startdate", asn1Time(notBefore), "-enddate", asn1Time(notAfter), "-extfile", ext, "-in", csr, "-out", certFile,
    ]);
    rmSync(csr);
    rmSync(ext);
    return { certFile, keyFile, serialNumber: new X509Certificate(readFileSync(certFile)).serialNumber.toUpperCase() };
  }

  remove(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}
