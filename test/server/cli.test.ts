import { execFile, spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { createClient } from "@connectrpc/connect";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { expect } from "chai";
import type { ChildServer } from "../support/server.js";
import { repoRoot, startChildServer } from "../support/server.js";

const execFileAsync = promisify(execFile);

/** Runs the mmgate executable; resolves with exit code and output, never rejects. */
async function mmgate(args: string[], env: Record<string, string> = {}) {
  try {
    const { stdout, stderr } = await execFileAsync(process.execPath, [`${repoRoot}bin/mmgate.js`, ...args], {
      cwd: repoRoot,
      env: { ...process.env, ...env },
    });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe("the mmgate executable", function () {
  this.timeout(30_000);

  it("prints its version and help", async () => {
    const v = await mmgate(["version"]);
    expect(v.code).to.equal(0);
    expect(v.stdout).to.match(/^mmgate \d+\.\d+\.\d+ \(node v\d+/);
    const help = await mmgate(["--help"]);
    expect(help.stdout).to.include("serve").and.include("health");
    const serveHelp = await mmgate(["serve", "--help"]);
    expect(serveHelp.stdout).to.include("--print-config").and.include("--admin-listen");
  });

  describe("serve --print-config", () => {
    it("prints the embedded defaults", async () => {
      const res = await mmgate(["serve", "--print-config"]);
      expect(res.code).to.equal(0);
      const config = JSON.parse(res.stdout) as Record<string, unknown>;
      expect(config).to.include({ listen: "127.0.0.1:50051", adminListen: "127.0.0.1:9464" });
      expect(config.limits).to.include({ maxReceiveMessageBytes: 8 * 1024 * 1024, maxSendMessageBytes: 8 * 1024 * 1024 });
      expect(config.shutdown).to.deep.equal({ graceMs: 10_000 });
    });

    it("layers file < MMGATE_* env < flags, and redacts the token", async () => {
      const dir = mkdtempSync(join(tmpdir(), "mmgate-cli-"));
      const file = join(dir, "mmgate.yaml");
      writeFileSync(file, "listen: 0.0.0.0:6000\nadminListen: ''\nlimits:\n  maxConcurrentStreams: 50\nshutdown:\n  graceMs: 1500\n");
      const res = await mmgate(["serve", "--config", file, "--print-config", "--set", "shutdown.graceMs=2500"], {
        MMGATE_LISTEN: "127.0.0.1:7000",
        MMGATE_LIMITS__MAX_RECEIVE_MESSAGE_BYTES: "65536",
        MMGATE_AUTH_TOKEN: "a-token-of-sufficient-length",
      });
      expect(res.code, res.stderr).to.equal(0);
      const config = JSON.parse(res.stdout) as Record<string, Record<string, unknown>>;
      expect(config.listen).to.equal("127.0.0.1:7000");
      expect(config.adminListen).to.equal("");
      expect(config.limits).to.include({ maxConcurrentStreams: 50, maxReceiveMessageBytes: 65536 });
      expect(config.shutdown).to.deep.equal({ graceMs: 2500 });
      expect(config.auth).to.deep.equal({ token: "<redacted>" });
      expect(res.stdout).to.not.include("a-token-of-sufficient-length");
    });

    it("leaves unrelated MMGATE_* variables alone, with a warning", async () => {
      const res = await mmgate(["serve", "--print-config"], { MMGATE_OPENAI_API_KEY: "sk-test", MMGATE_LISTN: "1.2.3.4:1" });
      expect(res.code).to.equal(0);
      expect(res.stderr).to.include("MMGATE_OPENAI_API_KEY is not a config key").and.include("MMGATE_LISTN is not a config key");
      expect(res.stdout).to.not.include("sk-test");
    });

    it("keeps long numeric values as strings", async () => {
      const res = await mmgate(["serve", "--print-config", "--set", "auth.token=12345678901234567890"]);
      expect(res.code, res.stderr).to.equal(0);
      expect((JSON.parse(res.stdout) as { auth: { token: string } }).auth.token).to.equal("<redacted>");
    });

    const invalid: [string, string[], Record<string, string>, RegExp][] = [
      ["a bad listen address", ["--listen", "nowhere"], {}, /listen: expected HOST:PORT/],
      ["an unknown key", ["--set", "limits.bogus=1"], {}, /limits: Unrecognized key: "bogus"/],
      ["a limit out of range", [], { MMGATE_LIMITS__MAX_SEND_MESSAGE_BYTES: "10" }, /limits\.maxSendMessageBytes: Too small.*\(from MMGATE_LIMITS__MAX_SEND_MESSAGE_BYTES\)/],
      ["a short token", [], { MMGATE_AUTH_TOKEN: "short" }, /auth\.token: a token needs at least 16 characters \(from MMGATE_AUTH_TOKEN\)/],
      ["a token with white space", ["--set", "auth.token=\"two words, sixteen chars\""], {}, /auth\.token: a token cannot contain white space \(from --set auth\.token\)/],
      ["an unreadable TLS file", ["--set", "tls.certFile=/no/cert.pem", "--set", "tls.keyFile=/no/key.pem"], {}, /tls\.certFile: cannot read \/no\/cert\.pem/],
      ["an unknown service", ["--services", "teleport"], {}, /services: unknown module "teleport"/],
      ["half a TLS pair", ["--set", "tls.certFile=/tmp/x.pem"], {}, /tls: tls\.certFile and tls\.keyFile go together/],
    ];
    for (const [what, args, env, message] of invalid) {
      it(`refuses ${what}, naming the field, with exit code 2`, async () => {
        // TLS files are read when serving starts; everything else fails in --print-config already.
        const printOnly = what.includes("TLS file") ? [] : ["--print-config"];
        const res = await mmgate(["serve", ...printOnly, "--listen", "127.0.0.1:0", "--admin-listen", "", ...args], env);
        expect(res.code).to.equal(2);
        expect(res.stderr).to.match(message);
      });
    }
  });

  describe("health", () => {
    let server: ChildServer;
    before(async () => {
      server = await startChildServer();
    });
    after(() => server.close());

    it("exits 0 and prints SERVING for a serving server", async () => {
      const res = await mmgate(["health", "--addr", server.addr]);
      expect(res).to.include({ code: 0, stdout: "SERVING\n" });
      const one = await mmgate(["health", "--addr", server.addr, "--service", "mmgate.admin.v1.AdminService"]);
      expect(one.code).to.equal(0);
    });

    it("--watch prints each status change", async () => {
      const watcher = spawn(process.execPath, [`${repoRoot}bin/mmgate.js`, "health", "--watch", "--addr", server.addr, "--service", "mmgate.admin.v1.AdminService"], {
        cwd: repoRoot,
      });
      const lines: string[] = [];
      createInterface({ input: watcher.stdout }).on("line", (l) => lines.push(l));
      const until = async (n: number) => {
        for (let i = 0; i < 400 && lines.length < n; i++) await new Promise((r) => setTimeout(r, 25));
      };
      try {
        await until(1);
        const admin = createClient(AdminService, server.transport);
        await admin.setServingStatus({ service: "mmgate.admin.v1.AdminService", serving: false });
        await until(2);
        await admin.setServingStatus({ service: "mmgate.admin.v1.AdminService", serving: true });
        await until(3);
      } finally {
        watcher.kill();
      }
      expect(lines.map((l) => l.split(" ")[1])).to.deep.equal(["SERVING", "NOT_SERVING", "SERVING"]);
      expect(lines[0]).to.match(/^\d{4}-\d\d-\d\dT/);
    });

    it("exits 2 for an unknown service or an unreachable server", async () => {
      expect((await mmgate(["health", "--addr", server.addr, "--service", "nope"])).code).to.equal(2);
      expect((await mmgate(["health", "--addr", "127.0.0.1:1", "--timeout", "2000"])).code).to.equal(2);
    });

    it("serve names an address already in use and exits 1", async () => {
      const res = await mmgate(["serve", "--listen", server.addr, "--admin-listen", ""]);
      expect(res.code).to.equal(1);
      expect(res.stderr).to.include(`cannot listen on ${server.addr}: EADDRINUSE`);
    });

    it("rejects a malformed --addr", async () => {
      const res = await mmgate(["health", "--addr", "http://x"]);
      expect(res.code).to.not.equal(0);
      expect(res.stderr).to.include("expected HOST:PORT");
    });
  });
});
