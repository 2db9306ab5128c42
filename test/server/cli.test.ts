import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { expect } from "chai";
import { Help } from "commander";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { subcommands } from "../../src/cli/main.js";
import { builtinModules } from "../../src/modules.js";
import type { ConfigSources } from "../../src/server/index.js";
import { ConfigError, loadConfig, parseScalar, redactedConfig } from "../../src/server/index.js";
import type { CliResult, InProcessServer } from "../support/index.js";
import { eventually, expectRejection, repoRoot, runMmgate, spawnMmgate, startServer } from "../support/index.js";

const ADMIN = "mmgate.admin.v1.AdminService";

/** Modules that `version`, `--help` and `health` must not load. */
const HEAVY = /\/node_modules\/sharp\/|\/src\/images\/providers\/|\/src\/media\/image-decoder\.ts$/;

interface Traced extends CliResult {
  /** URL of every module the process resolved. */
  readonly modules: string[];
}

/** Runs the executable with the module trace (test/fixtures/loaded-modules.mjs) on. */
async function traced(dir: string, name: string, args: string[]): Promise<Traced> {
  const log = join(dir, `${name}.modules`);
  const result = await spawnMmgate(args, {
    nodeArgs: ["--import", `${repoRoot}test/fixtures/loaded-modules.mjs`],
    // The trace names each source module only when the sources run (the bundle is one file a chunk).
    env: { MMGATE_TEST_MODULE_LOG: log, MMGATE_FROM_SOURCE: "1" },
  });
  const modules = await readFile(log, "utf8").then(
    (text) => text.split("\n").filter(Boolean),
    () => [],
  );
  return { ...result, modules };
}

/** Loads the config as `mmgate serve` does, from no environment but `env`. */
function load(sources: ConfigSources = {}) {
  return loadConfig({ env: {}, ...sources }, builtinModules);
}

describe("the mmgate executable", function () {
  // A spawned `serve` loads every capability; on a loaded 2-core machine that takes seconds.
  this.timeout(30_000);

  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), "mmgate-cli-"));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  describe("as a process", function () {
    // Seven processes at once; a bound for a failure, generous for a loaded machine.
    this.timeout(60_000);
    let server: InProcessServer;
    /** The processes of the tests below: independent of each other, so they run side by side. */
    let runs: {
      version: Traced;
      help: Traced;
      health: Traced;
      media: Traced;
      printConfig: CliResult;
      badConfig: CliResult;
      busyPort: CliResult;
      usage: CliResult;
    };

    before(async () => {
      server = await startServer();
      const layers = join(dir, "layers.yaml");
      await writeFile(layers, "listen: 0.0.0.0:6000\nadminListen: ''\nlimits:\n  maxConcurrentStreams: 50\nshutdown:\n  graceMs: 1500\n");
      const [version, help, health, media, printConfig, badConfig, busyPort, usage] = await Promise.all([
        traced(dir, "version", ["version"]),
        traced(dir, "help", ["--help"]),
        traced(dir, "health", ["health", "--addr", server.addr]),
        // The control: a command that does need the decoder shows that the trace sees it.
        traced(dir, "media", ["media", "--help"]),
        spawnMmgate(["serve", "--config", layers, "--print-config", "--set", "shutdown.graceMs=2500"], {
          env: {
            MMGATE_LISTEN: "127.0.0.1:7000",
            MMGATE_LIMITS__MAX_RECEIVE_MESSAGE_BYTES: "65536",
            MMGATE_AUTH_TOKEN: "a-token-of-sufficient-length",
            MMGATE_OPENAI_API_KEY: "sk-test",
          },
        }),
        spawnMmgate(["serve", "--print-config", "--admin-listen", "", "--set", 'auth.token="two words, sixteen chars"'], {
          env: { MMGATE_LIMITS__MAX_SEND_MESSAGE_BYTES: "10" },
        }),
        spawnMmgate(["serve", "--listen", server.addr, "--admin-listen", ""]),
        // Commander ends the process itself for a usage error: the exit code must still be 2.
        spawnMmgate(["health", "--addr", server.addr, "--bogus"]),
      ]);
      runs = { version, help, health, media, printConfig, badConfig, busyPort, usage };
    });
    after(() => server?.close());

    it("runs version, --help and health without loading sharp, the image providers or the media decoder", () => {
      const { version, help, health, media } = runs;
      expect(version).to.include({ code: 0, stderr: "" });
      expect(version.stdout).to.match(/^mmgate \d+\.\d+\.\d+ \(node v\d+/);
      expect(help.code).to.equal(0);
      for (const sub of subcommands) expect(help.stdout).to.include(sub.term);
      expect(health).to.include({ code: 0, stdout: "SERVING\n" });
      expect(media.code).to.equal(0);
      expect(media.stdout).to.include("decode").and.include("hash");
      for (const run of [version, help, health, media]) {
        expect(run.modules.some((url) => url.endsWith("/src/cli/main.ts")), "the module trace works").to.equal(true);
      }
      const heavy = (run: Traced) => run.modules.filter((url) => HEAVY.test(url));
      expect({ version: heavy(version), help: heavy(help), health: heavy(health) }).to.deep.equal({ version: [], help: [], health: [] });
      expect(heavy(media)).to.not.be.empty;
    });

    it("serve --print-config layers file < MMGATE_* env < flags, redacts the token and warns about stray MMGATE_* variables", () => {
      const res = runs.printConfig;
      expect(res.code, res.stderr).to.equal(0);
      const config = JSON.parse(res.stdout) as Record<string, Record<string, unknown>>;
      expect(config.listen).to.equal("127.0.0.1:7000");
      expect(config.adminListen).to.equal("");
      expect(config.limits).to.include({ maxConcurrentStreams: 50, maxReceiveMessageBytes: 65536 });
      expect(config.shutdown).to.deep.equal({ graceMs: 2500, delayMs: 0 });
      expect(config.auth).to.deep.equal({ token: "<redacted>", keysFile: "", certificates: [] });
      expect(res.stdout).to.not.include("a-token-of-sufficient-length").and.not.include("sk-test");
      expect(res.stderr).to.include("mmgate serve: warning: MMGATE_OPENAI_API_KEY is not a config key");
    });

    it("serve refuses a bad config with exit code 2, naming each field and where its value came from", () => {
      const res = runs.badConfig;
      expect(res.code).to.equal(2);
      expect(res.stdout).to.equal("");
      expect(res.stderr).to.match(/^mmgate serve: \[config\] invalid configuration:\n/);
      expect(res.stderr).to.match(/limits\.maxSendMessageBytes: Too small.*\(from MMGATE_LIMITS__MAX_SEND_MESSAGE_BYTES\)/);
      expect(res.stderr).to.match(/auth\.token: a token cannot contain white space \(from --set auth\.token\)/);
      expect(res.stderr).to.not.match(/\n\s+at /); // no stack trace
    });

    it("serve names an address already in use and exits 1", () => {
      const res = runs.busyPort;
      expect(res.code).to.equal(1);
      expect(res.stderr).to.include(`mmgate serve: [io] cannot listen on ${server.addr}: EADDRINUSE`);
      expect(res.stderr).to.not.match(/\n\s+at /);
    });

    it("ends a usage error with exit code 2 and the one error format", () => {
      const res = runs.usage;
      expect(res).to.include({ code: 2, stdout: "" });
      expect(res.stderr).to.equal("mmgate health: [usage] unknown option '--bogus'\nhint: see 'mmgate health --help'\n");
    });
  });

  describe("commands and help", () => {
    it("lists every subcommand with its description, from stubs that match the real commands", async () => {
      const help = await runMmgate(["--help"]);
      expect(help.code).to.equal(0);
      const text = help.stdout.replace(/\s+/g, " ");
      for (const sub of [...subcommands, { term: "version", description: "print the version" }]) {
        expect(text).to.include(`${sub.term} ${sub.description}`);
      }
      for (const sub of subcommands) {
        const real = await sub.load();
        expect([real.name(), real.description(), new Help().subcommandTerm(real)]).to.deep.equal([sub.name, sub.description, sub.term]);
      }
    });

    it("shows each subcommand's own commands and options in its help", async () => {
      const serve = await runMmgate(["serve", "--help"]);
      expect(serve.stdout).to.include("--print-config").and.include("--admin-listen");
      const media = await runMmgate(["media", "--help"]);
      expect(media.stdout).to.match(/decode \[options\] <file\|url>/).and.match(/hash \[options\]/);
      const images = await runMmgate(["images", "--help"]);
      expect(images.stdout).to.include("generate [options] <prompt>").and.include("providers").and.include("capabilities");
      expect((await runMmgate(["help", "images"])).stdout).to.equal(images.stdout);
      const decode = await runMmgate(["media", "decode", "--help"]);
      expect(decode.stdout).to.include("--local");
      for (const res of [serve, media, images, decode]) expect(res.code).to.equal(0);
    });

    it("prints its version, and refuses an unknown command with exit code 2", async () => {
      const version = await runMmgate(["version"]);
      expect(version).to.include({ code: 0 });
      expect(version.stdout).to.match(/^mmgate \d+\.\d+\.\d+ \(node v\d+/);
      const bogus = await runMmgate(["bogus"]);
      expect(bogus.code).to.equal(2);
      expect(bogus.stderr).to.match(/^mmgate: \[usage\] unknown command 'bogus'\n/);
    });
  });

  describe("health", () => {
    let server: InProcessServer;
    before(async () => {
      server = await startServer();
    });
    after(() => server?.close());

    it("exits 0 and prints SERVING for a serving server and service", async () => {
      expect(await runMmgate(["health", "--addr", server.addr])).to.include({ code: 0, stdout: "SERVING\n" });
      expect(await runMmgate(["health", "--addr", server.addr, "--service", ADMIN])).to.include({ code: 0, stdout: "SERVING\n" });
    });

    it("exits 1 and prints the status for a service out of rotation", async () => {
      const admin = createClient(AdminService, server.transport);
      await admin.setServingStatus({ service: ADMIN, serving: false });
      try {
        expect(await runMmgate(["health", "--addr", server.addr, "--service", ADMIN])).to.include({ code: 1, stdout: "NOT_SERVING\n" });
      } finally {
        await admin.setServingStatus({ service: ADMIN, serving: true });
      }
    });

    it("exits 1 for an unknown service or an unreachable server, naming the code", async () => {
      const unknown = await runMmgate(["health", "--addr", server.addr, "--service", "nope"]);
      expect(unknown.code).to.equal(1);
      expect(unknown.stderr).to.match(/^mmgate health: \[not_found\] /);
      const unreachable = await runMmgate(["health", "--addr", "127.0.0.1:1", "--timeout", "2000"]);
      expect(unreachable.code).to.equal(1);
      expect(unreachable.stderr).to.match(/^mmgate health: \[unavailable\] /);
    });

    it("rejects a malformed --addr as a usage error", async () => {
      const res = await runMmgate(["health", "--addr", "http://x"]);
      expect(res.code).to.equal(2);
      expect(res.stderr).to.match(/^mmgate health: \[usage\] .*expected HOST:PORT/);
    });

    it("--watch prints each status change until the server ends the stream", async () => {
      const watched = await startServer();
      const lines: string[] = [];
      const watching = runMmgate(["health", "--watch", "--addr", watched.addr, "--service", ADMIN], {
        onStdout: (text) => lines.push(...text.split("\n").filter(Boolean)),
      });
      const statuses = () => lines.map((l) => l.split(" ")[1]);
      try {
        await eventually(() => expect(statuses()).to.deep.equal(["SERVING"]));
        const admin = createClient(AdminService, watched.transport);
        await admin.setServingStatus({ service: ADMIN, serving: false });
        await eventually(() => expect(statuses()).to.deep.equal(["SERVING", "NOT_SERVING"]));
        await admin.setServingStatus({ service: ADMIN, serving: true });
        await eventually(() => expect(statuses()).to.deep.equal(["SERVING", "NOT_SERVING", "SERVING"]));
      } finally {
        await watched.close();
      }
      // The drain turns every service NOT_SERVING, then ends the stream; the exit code follows the last status.
      expect((await watching).code).to.equal(1);
      expect(statuses()).to.deep.equal(["SERVING", "NOT_SERVING", "SERVING", "NOT_SERVING"]);
      expect(lines[0]).to.match(/^\d{4}-\d\d-\d\dT/);
    });
  });

  describe("serve's configuration", () => {
    it("has embedded defaults", () => {
      const config = redactedConfig(load());
      expect(config).to.include({ listen: "127.0.0.1:50051", adminListen: "127.0.0.1:9464" });
      expect(config.limits).to.include({ maxReceiveMessageBytes: 8 * 1024 * 1024, maxSendMessageBytes: 8 * 1024 * 1024 });
      expect(config.shutdown).to.deep.equal({ graceMs: 10_000, delayMs: 0 });
    });

    it("layers file < MMGATE_* env < flags, and redacts the token", async () => {
      const file = join(dir, "mmgate.yaml");
      await writeFile(file, "listen: 0.0.0.0:6000\nadminListen: ''\nlimits:\n  maxConcurrentStreams: 50\nshutdown:\n  graceMs: 1500\n");
      const config = redactedConfig(
        load({
          file,
          env: { MMGATE_LISTEN: "127.0.0.1:7000", MMGATE_LIMITS__MAX_RECEIVE_MESSAGE_BYTES: "65536", MMGATE_AUTH_TOKEN: "a-token-of-sufficient-length" },
          overrides: { "shutdown.graceMs": parseScalar("2500") },
        }),
      ) as Record<string, Record<string, unknown>>;
      expect(config.listen).to.equal("127.0.0.1:7000");
      expect(config.adminListen).to.equal("");
      expect(config.limits).to.include({ maxConcurrentStreams: 50, maxReceiveMessageBytes: 65536 });
      expect(config.shutdown).to.deep.equal({ graceMs: 2500, delayMs: 0 });
      expect(config.auth).to.deep.equal({ token: "<redacted>", keysFile: "", certificates: [] });
      expect(JSON.stringify(config)).to.not.include("a-token-of-sufficient-length");
    });

    it("leaves unrelated MMGATE_* variables alone, with a warning", () => {
      const warnings: string[] = [];
      const config = load({ env: { MMGATE_OPENAI_API_KEY: "sk-test", MMGATE_LISTN: "1.2.3.4:1" }, onWarning: (m) => warnings.push(m) });
      const text = warnings.join("\n");
      expect(text).to.include("MMGATE_OPENAI_API_KEY is not a config key").and.include("MMGATE_LISTN is not a config key");
      expect(JSON.stringify(redactedConfig(config))).to.not.include("sk-test");
    });

    it("keeps long numeric values as strings", () => {
      const value = parseScalar("12345678901234567890");
      expect(value).to.equal("12345678901234567890");
      expect(load({ overrides: { "auth.token": value } }).auth.token).to.equal("12345678901234567890");
    });

    // What `serve` passes for --listen, --services and --set: the flag's value, parsed by --set's rule for --set.
    const invalid: [string, ConfigSources, RegExp][] = [
      ["a bad listen address", { overrides: { listen: "nowhere" } }, /listen: expected HOST:PORT/],
      ["an unknown key", { overrides: { "limits.bogus": parseScalar("1") } }, /limits\.bogus: unknown key \(from --set limits\.bogus\)/],
      ["a limit out of range", { env: { MMGATE_LIMITS__MAX_SEND_MESSAGE_BYTES: "10" } }, /limits\.maxSendMessageBytes: Too small.*\(from MMGATE_LIMITS__MAX_SEND_MESSAGE_BYTES\)/],
      ["a short token", { env: { MMGATE_AUTH_TOKEN: "short" } }, /auth\.token: a token needs at least 16 characters \(from MMGATE_AUTH_TOKEN\)/],
      ["a token with white space", { overrides: { "auth.token": parseScalar('"two words, sixteen chars"') } }, /auth\.token: a token cannot contain white space \(from --set auth\.token\)/],
      ["an unknown module, set by its old flag name", { overrides: { services: "teleport" } }, /modules: unknown module "teleport" \(known: media, images, encodeWorker, tokenWorker, encodeHop, relay[^)]*\) \(from --set services\)/],
      ["half a TLS pair", { overrides: { "tls.certFile": "/tmp/x.pem" } }, /tls: tls\.certFile and tls\.keyFile go together/],
    ];
    for (const [what, sources, message] of invalid) {
      it(`refuses ${what}, naming the field`, async () => {
        await expectRejection(() => load(sources), { type: ConfigError, message });
      });
    }

    it("refuses an unreadable TLS file when serving starts, naming the field", async () => {
      const tls = { certFile: "/no/cert.pem", keyFile: "/no/key.pem" };
      const config = load({ overrides: { "tls.certFile": tls.certFile, "tls.keyFile": tls.keyFile } });
      expect(config.tls).to.deep.equal({ ...tls, clientCaFile: "", clientAuth: "none", reloadIntervalMs: 60_000 });
      await expectRejection(startServer({ config: { tls } }), { type: ConfigError, message: /tls\.certFile: cannot read \/no\/cert\.pem/ });
    });
  });
});
