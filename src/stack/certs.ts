/**
 * The stack's secrets, fresh on every start: a private CA and one server
 * certificate it signs (SAN IP:127.0.0.1 and DNS:localhost, what every role
 * is dialled as), made with the system's openssl as the tests make theirs,
 * and a bearer token of 32 random bytes. Keys and the token are 0600.
 */
import { execFileSync, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { MissingToolError } from "./processes.js";

export interface StackCertificates {
  /** The CA's certificate (PEM): what clients trust (`--ca`, `caFile`). */
  readonly caFile: string;
  /** The server certificate and its key, shared by every role. */
  readonly certFile: string;
  readonly keyFile: string;
}

/** Days the certificates are valid; a stack regenerates them at every start. */
const DAYS = "30";

function openssl(args: readonly string[]): void {
  try {
    execFileSync("openssl", [...args], { stdio: ["ignore", "ignore", "pipe"] });
  } catch (err) {
    const stderr = (err as { stderr?: Buffer }).stderr?.toString().trim();
    throw new Error(`openssl ${args[0]} failed: ${stderr || (err as Error).message}`, { cause: err });
  }
}

/** Throws a MissingToolError when openssl is not on PATH. */
export function requireOpenssl(): void {
  if (spawnSync("openssl", ["version"], { stdio: "ignore" }).status !== 0) throw new MissingToolError("openssl", "openssl");
}

/** Makes `<tlsDir>/ca.pem`, `ca.key`, `server.pem`, `server.key` (keys 0600). */
export function makeCertificates(tlsDir: string): StackCertificates {
  requireOpenssl();
  mkdirSync(tlsDir, { recursive: true, mode: 0o700 });
  const caKey = join(tlsDir, "ca.key");
  const caFile = join(tlsDir, "ca.pem");
  const keyFile = join(tlsDir, "server.key");
  const csr = join(tlsDir, "server.csr");
  const certFile = join(tlsDir, "server.pem");
  const ext = join(tlsDir, "server.ext");
  const p256 = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  openssl([
    "req", "-x509", ...p256, "-days", DAYS, "-subj", "/CN=mmgate stack CA",
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    "-keyout", caKey, "-out", caFile,
  ]);
  openssl(["req", "-new", ...p256, "-subj", "/CN=localhost", "-keyout", keyFile, "-out", csr]);
  writeFileSync(
    ext,
    [
      "basicConstraints=critical,CA:FALSE",
      "keyUsage=critical,digitalSignature,keyEncipherment",
      "extendedKeyUsage=serverAuth",
      "subjectAltName=IP:127.0.0.1,DNS:localhost",
      "",
    ].join("\n"),
  );
  openssl(["x509", "-req", "-in", csr, "-CA", caFile, "-CAkey", caKey, "-CAcreateserial", "-days", DAYS, "-extfile", ext, "-out", certFile]);
  chmodSync(caKey, 0o600);
  chmodSync(keyFile, 0o600);
  return { caFile, certFile, keyFile };
}

/** 32 random bytes as hex, written to `file` (0600). */
export function makeToken(file: string): string {
  const token = randomBytes(32).toString("hex");
  writeFileSync(file, `${token}\n`, { mode: 0o600 });
  chmodSync(file, 0o600);
  return token;
}
