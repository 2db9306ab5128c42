/**
 * The client commands' --cert and --key: a server with tls.clientAuth
 * require answers a command that presents a certificate its client CA
 * signed, and turns away one that presents none; an auth.certificates rule
 * makes the certificate a caller with scopes, so an admin command works
 * without a bearer key. The flags go together, and a file that cannot be
 * read is an io error naming its flag.
 */
import { expect } from "chai";
import { runMmgate, startServer, type InProcessServer } from "../support/index.js";
import { TestPki, opensslAvailable, type TestCa, type TestCertificate } from "../support/pki.js";

describe("client commands: --cert and --key for mutual TLS", function () {
  this.timeout(30_000);
  let pki: TestPki;
  let ca: TestCa;
  let operator: TestCertificate;
  let server: InProcessServer;

  before(async function () {
    if (!opensslAvailable()) this.skip();
    pki = new TestPki();
    ca = pki.ca("mmgate-cli-ca");
    const serverCert = pki.issue(ca, { cn: "localhost", usage: "server" });
    operator = pki.issue(ca, { cn: "operator", usage: "client" });
    server = await startServer({
      config: {
        tls: { certFile: serverCert.certFile, keyFile: serverCert.keyFile, clientCaFile: ca.certFile, clientAuth: "require" },
        auth: { certificates: [{ name: "operator", subject: "CN=operator", scopes: ["admin"] }] },
      },
    });
  });
  after(async () => {
    await server?.close();
    pki?.remove();
  });

  it("health answers with a certificate the client CA signed, and fails without one", async () => {
    const tls = ["--addr", server.addr, "--ca", ca.certFile];
    expect(await runMmgate(["health", ...tls, "--cert", operator.certFile, "--key", operator.keyFile])).to.include({ code: 0, stdout: "SERVING\n" });
    const refused = await runMmgate(["health", ...tls, "--timeout", "3000"]);
    expect(refused.code).to.equal(1);
  });

  it("an admin command runs as the certificate's caller, without a bearer key", async () => {
    const result = await runMmgate(["admin", "config", "--addr", server.addr, "--ca", ca.certFile, "--cert", operator.certFile, "--key", operator.keyFile]);
    expect(result.code, result.stderr).to.equal(0);
  });

  it("--cert without --key is a usage error; an unreadable --key an io error naming it", async () => {
    const alone = await runMmgate(["health", "--addr", server.addr, "--ca", ca.certFile, "--cert", operator.certFile]);
    expect(alone.code).to.equal(2);
    expect(alone.stderr).to.match(/\[usage\] --cert needs --key/);
    const unreadable = await runMmgate(["health", "--addr", server.addr, "--ca", ca.certFile, "--cert", operator.certFile, "--key", "/no/key.pem"]);
    expect(unreadable.code).to.equal(1);
    expect(unreadable.stderr).to.match(/\[io\] --key: /);
  });
});
