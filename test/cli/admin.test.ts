import { createClient } from "@connectrpc/connect";
import { expect } from "chai";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { imagesModule } from "../../src/images/index.js";
import { versionLine } from "../../src/cli/main.js";
import type { InProcessServer } from "../support/index.js";
import { runMmgate, startServer } from "../support/index.js";

const ADMIN = "mmgate.admin.v1.AdminService";
const TOKEN = "admin-cli-test-token-0123456789";

describe("mmgate admin", function () {
  this.timeout(30_000);
  let server: InProcessServer;
  before(async () => {
    server = await startServer({ config: { auth: { token: TOKEN } } });
  });
  after(() => server?.close());

  it("status prints the server's status as text and as JSON, without a token", async () => {
    const text = await runMmgate(["admin", "status", "--addr", server.addr]);
    expect(text.code, text.stderr).to.equal(0);
    expect(text.stdout).to.match(/^version {3}\S+\nuptime {4}[\d.]+s\n/).and.include("draining  no").and.match(new RegExp(`${ADMIN.replace(/\./g, "\\.")} +SERVING`));
    const json = await runMmgate(["admin", "status", "--addr", server.addr, "--json"]);
    expect(json.code, json.stderr).to.equal(0);
    const status = JSON.parse(json.stdout) as { version: string; uptime_seconds: number; draining: boolean; services: { name: string; status: string }[] };
    expect(status.draining).to.equal(false);
    expect(status.uptime_seconds).to.be.a("number");
    expect(status.services).to.deep.include({ name: ADMIN, status: "SERVING" });
  });

  it("config needs the token and prints the redacted configuration", async () => {
    const denied = await runMmgate(["admin", "config", "--addr", server.addr]);
    expect(denied.code).to.equal(1);
    expect(denied.stderr).to.match(/^mmgate admin config: \[unauthenticated\] /);
    const res = await runMmgate(["admin", "config", "--addr", server.addr, "--token", TOKEN, "--json"]);
    expect(res.code, res.stderr).to.equal(0);
    const config = JSON.parse(res.stdout) as { auth: { token: string } };
    expect(config.auth.token).to.equal("<redacted>");
    expect(res.stdout).to.not.include(TOKEN);
    const text = await runMmgate(["admin", "config", "--addr", server.addr, "--token", TOKEN]);
    expect(JSON.parse(text.stdout)).to.deep.equal(config);
  });

  it("serving takes a service out of rotation and back, with the token", async () => {
    const denied = await runMmgate(["admin", "serving", "off", ADMIN, "--addr", server.addr]);
    expect(denied.code).to.equal(1);
    const off = await runMmgate(["admin", "serving", "off", ADMIN, "--addr", server.addr, "--token", TOKEN, "--json"]);
    expect(off.code, off.stderr).to.equal(0);
    expect(JSON.parse(off.stdout)).to.deep.equal({ service: ADMIN, status: "NOT_SERVING" });
    const status = await createClient(AdminService, server.transport).getStatus({});
    expect(status.services.find((s) => s.name === ADMIN)?.status).to.equal(2); // NOT_SERVING
    const on = await runMmgate(["admin", "serving", "on", ADMIN, "--addr", server.addr, "--token", TOKEN]);
    expect(on).to.include({ code: 0, stdout: `${ADMIN}  SERVING\n` });
    const unknown = await runMmgate(["admin", "serving", "off", "no.such.Service", "--addr", server.addr, "--token", TOKEN]);
    expect(unknown.code).to.equal(1);
    expect(unknown.stderr).to.include("unknown service");
    const bad = await runMmgate(["admin", "serving", "maybe", "--addr", server.addr, "--token", TOKEN]);
    expect(bad.code).to.equal(2);
    expect(bad.stderr).to.match(/^mmgate admin serving: \[usage\] .*expected on or off/);
  });

  it("documents its exit codes and lists every command", async () => {
    const help = await runMmgate(["admin", "status", "--help"]);
    expect(help.stdout).to.include("Exit codes:");
    const admin = await runMmgate(["admin", "--help"]);
    expect(admin.stdout).to.include("status").and.include("config").and.include("serving").and.match(/\bdrain\b/);
  });

  it("reports an unreachable server with exit code 1", async () => {
    const res = await runMmgate(["admin", "status", "--addr", "127.0.0.1:1", "--timeout", "2000"]);
    expect(res.code).to.equal(1);
    expect(res.stderr).to.match(/^mmgate admin status: \[unavailable\] /);
  });
});

describe("mmgate version and --version", () => {
  it("print the same line", async () => {
    // One at a time: each run captures process.stdout.
    const sub = await runMmgate(["version"]);
    const flag = await runMmgate(["--version"]);
    const short = await runMmgate(["-V"]);
    expect(sub).to.deep.equal({ code: 0, stdout: `${versionLine()}\n`, stderr: "" });
    expect(flag).to.deep.equal(sub);
    expect(short).to.deep.equal(sub);
    expect(sub.stdout).to.match(/^mmgate \d+\.\d+\.\d+ \(node v\d+/);
  });
});

describe("mmgate images providers --json", function () {
  this.timeout(30_000);
  let server: InProcessServer;
  before(async () => {
    server = await startServer({ modules: [imagesModule] });
  });
  after(() => server?.close());

  it("prints the ListProviders answer as JSON", async () => {
    const res = await runMmgate(["images", "providers", "--addr", server.addr, "--json"]);
    expect(res.code, res.stderr).to.equal(0);
    const answer = JSON.parse(res.stdout) as { providers: { name: string; default?: boolean; models?: string[] }[] };
    expect(answer.providers).to.be.an("array").that.is.not.empty;
    expect(answer.providers.some((p) => p.default === true)).to.equal(true);
    const text = await runMmgate(["images", "providers", "--addr", server.addr]);
    for (const p of answer.providers) expect(text.stdout).to.include(p.name);
  });
});

describe("mmgate admin drain", function () {
  this.timeout(30_000);
  it("needs the token, then drains the server, which closes", async () => {
    const server = await startServer({ config: { auth: { token: TOKEN }, shutdown: { graceMs: 2500 } } });
    try {
      const denied = await runMmgate(["admin", "drain", "--addr", server.addr]);
      expect(denied.code).to.equal(1);
      expect(denied.stderr).to.match(/^mmgate admin drain: \[unauthenticated\] /);
      const drained = await runMmgate(["admin", "drain", "--addr", server.addr, "--token", TOKEN, "--json"]);
      expect(drained.code, drained.stderr).to.equal(0);
      expect(JSON.parse(drained.stdout)).to.deep.equal({ grace_ms: 2500, already_draining: false });
      await server.host.closed;
    } finally {
      await server.close();
    }
  });
});
