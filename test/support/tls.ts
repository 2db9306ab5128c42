import { execFileSync } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** A self-signed certificate for 127.0.0.1, made with the system's openssl (CI installs it). */
export function selfSignedCertificate(): { certFile: string; keyFile: string } {
  const dir = mkdtempSync(join(tmpdir(), "mmgate-tls-"));
  const certFile = join(dir, "cert.pem");
  const keyFile = join(dir, "key.pem");
  execFileSync(
    "openssl",
    [
      "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
      "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
      "-keyout", keyFile, "-out", certFile,
    ],
    { stdio: "ignore" },
  );
  return { certFile, keyFile };
}
