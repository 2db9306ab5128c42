/**
 * What every mmgate command shares: one error format
 * (`mmgate <command>: [code] message`, then hint lines), one exit code
 * table (2 for usage errors everywhere), one --timeout, -n/--count, required
 * options marked in help, config errors that name their real source, and
 * --json on images generate. In process (runMmgate) throughout; the process
 * boundary itself is tested once, in test/server/cli.test.ts.
 */
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "chai";
import type { Command } from "commander";
import { subcommands } from "../../src/cli/main.js";
import { imagesModule } from "../../src/images/index.js";
import { builtinModules } from "../../src/modules.js";
import { parseTimeout, tlsMismatch } from "../../src/rpc/index.js";
import { nearestName } from "../../src/server/config/index.js";
import { ConfigError, loadConfig, parseScalar, type ConfigSources } from "../../src/server/index.js";
import { freePort } from "../support/process.js";
import type { CliResult, InProcessServer } from "../support/index.js";
import { runMmgate, selfSignedCertificate, startServer } from "../support/index.js";

/** `^mmgate <command>: [code] ` as a pattern. */
function errorLine(command: string, code: string): RegExp {
  const name = command === "" ? "mmgate" : `mmgate ${command}`;
  return new RegExp(`^${name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}: \\[${code}\\] \\S`);
}

/** The one format: the error line first, then only detail (`details: `, indented) or `hint: ` lines. */
function expectOneError(res: CliResult, command: string, code: string, exitCode: number): void {
  expect(res.code, res.stderr).to.equal(exitCode);
  const [first = "", ...rest] = res.stderr.trimEnd().split("\n");
  expect(first).to.match(errorLine(command, code));
  for (const line of rest) expect(line, res.stderr).to.match(/^(hint: |details: | {2})/);
}

/** Every command below `command` with its path (`images generate`). */
function tree(command: Command, prefix: string[] = []): { path: string[]; command: Command }[] {
  const path = [...prefix, command.name()];
  return [{ path, command }, ...command.commands.filter((c) => c.name() !== "help").flatMap((c) => tree(c, path))];
}

describe("the mmgate CLI, consistently", function () {
  this.timeout(60_000);
  let dir: string;
  let closed: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), "mmgate-cli-consistency-"));
    closed = `127.0.0.1:${await freePort()}`;
    await writeFile(join(dir, "request.json"), JSON.stringify({ token_ids: [1] }));
    await writeFile(join(dir, "events.jsonl"), "");
    await writeFile(join(dir, "image.png"), "not really a png");
  });
  after(() => rm(dir, { recursive: true, force: true }));

  describe("usage errors", () => {
    // [arguments, the command the error names, what the message says]
    const cases: [string[], string, RegExp][] = [
      [["bogus"], "", /unknown command 'bogus'/],
      [["--bogus"], "", /unknown option '--bogus'/],
      [["health", "--bogus"], "health", /unknown option '--bogus'/],
      [["health", "--addr", "http://x"], "health", /--addr.*expected HOST:PORT/],
      [["health", "--timeout", "soon"], "health", /--timeout.*expected milliseconds/],
      [["admin", "serving", "maybe"], "admin serving", /expected on or off/],
      [["admin", "status", "--json", "extra"], "admin status", /too many arguments/],
      [["images", "generate", "a cat"], "images generate", /required option '--out <dir>' not specified/],
      [["images", "generate", "a cat", "--out", "/tmp/x", "-n", "0"], "images generate", /-n, --count.*integer from 1/],
      [["images", "generate", "a cat", "--out", "/tmp/x", "--save-partials"], "images generate", /--save-partials needs --stream/],
      [["images", "generate", "a cat", "--out", "/tmp/x", "--format", "gif"], "images generate", /format must be one of png, jpeg, webp/],
      [["images", "capabilities", "--timeout", "-1"], "images capabilities", /--timeout/],
      [["kv", "hash", "--block-size", "0", "1"], "kv hash", /--block-size must be an integer/],
      [["kv", "locate", "1"], "kv locate", /required option '--buckets <n>'/],
      [["kv", "publish", "events.jsonl"], "kv publish", /required option '--pool <name>'/],
      [["cbi1", "decode", "--seed", "1", "00"], "cbi1 decode", /--seed and --buckets go together/],
      [["relay", "watch", "not-an-address"], "relay watch", /expected HOST:PORT/],
      [["relay", "watch", "127.0.0.1:1", "--timeout", "1y"], "relay watch", /--timeout/],
      [["media", "release", "x"], "media release", /expected a decimal u64 handle/],
      [["media", "decode", "f.png", "--num-frames", "2", "--fps", "1"], "media decode", /cannot be used with/],
      [["media", "hash", "--hex", "00"], "media hash", /required option '--shape <dims>'/],
      [["hop", "generate"], "hop generate", /missing required argument 'file'/],
      [["serve", "--format", "xml"], "serve", /Allowed choices are json, yaml/],
      [["router", "--relay", "nowhere"], "router", /expected HOST:PORT/],
    ];
    for (const [args, command, message] of cases) {
      it(`mmgate ${args.join(" ")}: exit 2, "mmgate ${command}: [usage] …" and a pointer to the help`, async () => {
        const res = await runMmgate(args);
        expectOneError(res, command, "usage", 2);
        expect(res.stderr).to.match(message);
        expect(res.stdout).to.equal("");
      });
    }

    it("turns commander's suggestion into a hint and points at the command's help", async () => {
      const res = await runMmgate(["images", "generate", "a cat", "--out", join(dir, "x"), "--cuont", "2"]);
      expect(res.stderr).to.equal(
        "mmgate images generate: [usage] unknown option '--cuont'\nhint: did you mean --count?\nhint: see 'mmgate images generate --help'\n",
      );
    });

    it("says which command is missing after a group, below its help", async () => {
      const res = await runMmgate(["images"]);
      expect(res.code).to.equal(2);
      expect(res.stderr).to.include("Usage: mmgate images").and.match(/^mmgate images: \[usage\] missing command: one of generate, providers, capabilities$/m);
    });
  });

  describe("failed calls", () => {
    const cases = (): [string[], string][] => [
      [["health"], "health"],
      [["admin", "status"], "admin status"],
      [["admin", "config"], "admin config"],
      [["admin", "serving", "on"], "admin serving"],
      [["hop", "status"], "hop status"],
      [["hop", "generate", join(dir, "request.json")], "hop generate"],
      [["kv", "publish", "--pool", "default", join(dir, "events.jsonl")], "kv publish"],
      [["media", "decode", join(dir, "image.png")], "media decode"],
      [["media", "read", "1"], "media read"],
      [["media", "release", "1"], "media release"],
      [["images", "providers"], "images providers"],
      [["images", "capabilities"], "images capabilities"],
      [["images", "generate", "a cat", "--out", join(dir, "never")], "images generate"],
    ];
    it("every client command reports an unreachable server as exit 1, [unavailable], one line", async () => {
      for (const [args, command] of cases()) {
        const res = await runMmgate([...args, "--addr", closed]);
        expectOneError(res, command, "unavailable", 1);
        expect(res.stderr, command).to.include("ECONNREFUSED");
        expect(res.stdout, command).to.equal("");
      }
    });

    it("relay watch says the same of a relay it could not reach within --timeout", async () => {
      const res = await runMmgate(["relay", "watch", closed, "--timeout", "300ms"]);
      expect(res.code).to.equal(1);
      const lines = res.stderr.trimEnd().split("\n");
      expect(lines.slice(0, -1).every((l) => l.startsWith("mmgate relay watch: warning: "))).to.equal(true);
      expect(lines.at(-1)).to.match(/^mmgate relay watch: \[unavailable\] could not reach relay .* within 300 ms/);
    });

    it("an unreadable --ca is an io error naming the flag", async () => {
      const res = await runMmgate(["health", "--addr", closed, "--ca", join(dir, "no-ca.pem")]);
      expectOneError(res, "health", "io", 1);
      expect(res.stderr).to.match(/--ca: cannot read .*no-ca\.pem/);
    });
  });

  describe("a client and a server that disagree about TLS", () => {
    let tlsServer: InProcessServer;
    let plain: InProcessServer;
    let ca: string;
    before(async () => {
      const tls = selfSignedCertificate();
      ca = tls.certFile;
      tlsServer = await startServer({ config: { tls } });
      plain = await startServer();
    });
    after(async () => {
      await tlsServer?.close();
      await plain?.close();
    });

    const clients: [string[], string][] = [
      [["health"], "health"],
      [["admin", "status"], "admin status"],
      [["hop", "status"], "hop status"],
      [["media", "release", "1"], "media release"],
      [["images", "providers"], "images providers"],
    ];

    it("plaintext to a TLS port: [unavailable] and a hint naming --tls, from every client command", async () => {
      for (const [args, command] of clients) {
        const res = await runMmgate([...args, "--addr", tlsServer.addr]);
        expectOneError(res, command, "unavailable", 1);
        expect(res.stderr, command).to.match(/closed the connection before answering/);
        expect(res.stderr, command).to.match(/^hint: .*add --tls/m);
      }
      const watch = await runMmgate(["relay", "watch", tlsServer.addr, "--timeout", "500ms"]);
      expect(watch.code).to.equal(1);
      expect(watch.stderr).to.match(/^hint: .*add --tls/m);
    });

    it("TLS to a plaintext port: the handshake failure in words and a hint to leave --tls out", async () => {
      for (const flag of [["--tls"], ["--ca", ca]]) {
        const res = await runMmgate(["health", "--addr", plain.addr, ...flag]);
        expectOneError(res, "health", "unavailable", 1);
        expect(res.stderr).to.match(/TLS handshake with the server at .* failed: wrong version number/).and.not.match(/SSL routines/);
        expect(res.stderr).to.match(/^hint: .*leave out --tls and --ca$/m);
      }
      const watch = await runMmgate(["relay", "watch", plain.addr, "--tls", "--timeout", "500ms"]);
      expect(watch.stderr).to.match(/^hint: .*leave out --tls/m).and.not.match(/SSL routines/);
    });

    it("TLS without the server's CA: a hint at --ca; with it the call succeeds", async () => {
      const res = await runMmgate(["health", "--addr", tlsServer.addr, "--tls"]);
      expectOneError(res, "health", "unavailable", 1);
      expect(res.stderr).to.match(/^hint: .*--ca FILE/m);
      expect(await runMmgate(["health", "--addr", tlsServer.addr, "--ca", ca])).to.include({ code: 0, stdout: "SERVING\n" });
    });

    // The errors other stacks and servers produce for the same mistakes.
    const texts: [string, boolean, RegExp | undefined][] = [
      ["http/2 stream closed with error code CANCEL (0x8)", false, /add --tls/],
      ["Received HTTP/0.9 when not allowed", false, /add --tls/],
      ["read ECONNRESET", false, /add --tls/],
      ["Protocol error ERR_HTTP2_ERROR", false, /add --tls/],
      ["stream closed with error code NGHTTP2_PROTOCOL_ERROR", false, /add --tls/],
      ["connect ECONNREFUSED 127.0.0.1:1", false, undefined],
      ["read ECONNRESET", true, undefined],
      ["error:0A00010B:SSL routines:ssl3_get_record:wrong version number:x.c:350:", true, /leave out --tls/],
      ["packet length too long", true, /leave out --tls/],
      ["self-signed certificate", true, /--ca FILE/],
      ["unable to verify the first certificate", true, /--ca FILE/],
      ["wrong version number", false, undefined],
    ];
    for (const [text, tls, hint] of texts) {
      it(`${tls ? "TLS" : "plaintext"} client, "${text}": ${hint ? `hint ${hint}` : "no hint"}`, () => {
        const mismatch = tlsMismatch(text, { addr: "h:1", tls });
        if (hint === undefined) expect(mismatch).to.equal(undefined);
        else expect(mismatch?.hint).to.match(hint);
      });
    }
  });

  describe("--timeout", () => {
    const values: [string, number][] = [
      ["5000", 5000],
      ["500ms", 500],
      ["1.5s", 1500],
      ["2m", 120_000],
      ["1h", 3_600_000],
      ["0", 0],
      ["none", 0],
      [" 30S ", 30_000],
      // A deadline under a millisecond is rounded up, never to 0 (which means none).
      ["0.4", 1],
      ["0.0001s", 1],
    ];
    for (const [text, ms] of values) it(`reads "${text}" as ${ms} ms`, () => expect(parseTimeout(text)).to.equal(ms));
    for (const bad of ["", "-1", "5x", "1e3", "s", "30 s", "25d", String(2 ** 31)]) {
      it(`refuses "${bad}"`, () => expect(() => parseTimeout(bad)).to.throw(/expected milliseconds/));
    }

    it("every client command takes the same --timeout, with the same parser and help; probes default to 5 s, work to none", async () => {
      // Commands that ask how a server is must not hang on a stuck one.
      const probes = new Set(["health", "admin status", "admin config", "hop status"]);
      const clientCommands = [
        ["health"],
        ["admin", "status"],
        ["admin", "config"],
        ["admin", "serving"],
        ["admin", "drain"],
        ["hop", "generate"],
        ["hop", "status"],
        ["kv", "publish"],
        ["media", "decode"],
        ["media", "read"],
        ["media", "release"],
        ["images", "generate"],
        ["images", "providers"],
        ["images", "capabilities"],
        ["relay", "watch"],
      ];
      for (const path of clientCommands) {
        const help = await runMmgate([...path, "--help"]);
        const expected = probes.has(path.join(" ")) ? "5s" : "none";
        expect(help.stdout, path.join(" ")).to.match(new RegExp(`--timeout <ms\\|duration>\\s+\\S[\\s\\S]*?\\(default: ${expected}\\)`));
        const bad = await runMmgate([...path, "--timeout", "5x"]);
        expect(bad.code, path.join(" ")).to.equal(2);
        expect(bad.stderr, path.join(" ")).to.match(/\[usage\] option '--timeout <ms\|duration>' argument '5x' is invalid\. expected milliseconds/);
      }
    });

    describe("is the call's deadline", () => {
      let hole: Server;
      let silent: string;
      const sockets = new Set<Socket>();
      before(async () => {
        // Accepts connections and never answers.
        hole = createServer((socket) => void sockets.add(socket));
        await new Promise<void>((resolve) => hole.listen(0, "127.0.0.1", resolve));
        silent = `127.0.0.1:${(hole.address() as { port: number }).port}`;
      });
      after(async () => {
        // The commands' channels stay open (the process would end them): close them from this side.
        for (const socket of sockets) socket.destroy();
        await new Promise<void>((resolve) => hole.close(() => resolve()));
      });

      const calls: [() => string[], string][] = [
        [() => ["health"], "health"],
        [() => ["admin", "status"], "admin status"],
        [() => ["hop", "status"], "hop status"],
        [() => ["media", "release", "1"], "media release"],
        [() => ["images", "providers"], "images providers"],
        [() => ["kv", "publish", "--pool", "default", join(dir, "events.jsonl")], "kv publish"],
      ];
      for (const [args, command] of calls) {
        it(`mmgate ${command} --timeout 300ms ends the call with [deadline_exceeded]`, async () => {
          const started = performance.now();
          const res = await runMmgate([...args(), "--addr", silent, "--timeout", "300ms"]);
          expect(performance.now() - started).to.be.lessThan(5000);
          expectOneError(res, command, "deadline_exceeded", 1);
          expect(res.stderr).to.include("(--timeout 300 ms)").and.match(/^hint: raise --timeout/m);
        });
      }
    });

    it("ends health --watch the way the end of the stream does: the exit code follows the last status", async () => {
      const server = await startServer();
      try {
        const res = await runMmgate(["health", "--watch", "--addr", server.addr, "--timeout", "300ms"]);
        expect(res.code, res.stderr).to.equal(0);
        expect(res.stdout).to.match(/ SERVING\n$/);
        expect(res.stderr).to.equal("");
      } finally {
        await server.close();
      }
    });
  });

  describe("help", () => {
    let commands: { path: string[]; command: Command }[];
    before(async () => {
      commands = [];
      for (const sub of subcommands) commands.push(...tree(await sub.load()));
    });

    it("marks every required option (required)", async () => {
      const required = commands.filter(({ command }) => command.options.some((o) => o.mandatory));
      expect(required.map((c) => c.path.join(" "))).to.include.members(["images generate", "kv hash", "kv locate", "kv publish", "cbi1 encode-delta", "media hash"]);
      for (const { path, command } of required) {
        const help = await runMmgate([...path, "--help"]);
        for (const option of command.options.filter((o) => o.mandatory)) {
          const line = help.stdout.split("\n").find((l) => l.trimStart().startsWith(option.flags));
          expect(line, `${path.join(" ")} ${option.flags}`).to.be.a("string");
          // The description may wrap: the marker ends the option's entry.
          const entry = help.stdout.slice(help.stdout.indexOf(line!)).split(/\n {2}-/)[0]!;
          expect(entry.replace(/\s+/g, " "), `${path.join(" ")} ${option.flags}`).to.include("(required)");
        }
      }
    });

    it("lists the exit codes of every command that runs something, and the shared ones at the root", async () => {
      const root = await runMmgate(["--help"]);
      expect(root.stdout).to.match(/Exit codes:\n {2}0 +done\n {2}1 +failed: [^]*?\n {2}2 +usage: [^]*?\n {2}3 +partly done/);
      for (const { path } of commands.filter((c) => c.command.commands.length === 0)) {
        const help = await runMmgate([...path, "--help"]);
        expect(help.stdout, path.join(" ")).to.match(/Exit codes:\n {2}0 /).and.match(/\n {2}2 +usage/);
      }
      expect((await runMmgate(["health", "--help"])).stdout).to.match(/\n {2}1 +any other status, or the call failed/);
      expect((await runMmgate(["images", "generate", "--help"])).stdout).to.match(/\n {2}3 +some images failed \(--best-effort\)/);
      expect((await runMmgate(["kv", "publish", "--help"])).stdout).to.match(/\n {2}3 +the relay rejected some events/);
      expect((await runMmgate(["media", "release", "--help"])).stdout).to.match(/\n {2}3 +the handle was unknown/);
      expect((await runMmgate(["relay", "watch", "--help"])).stdout).to.match(/\n {2}130 +interrupted/);
    });

    it("spells the image count -n, --count, and keeps the old --n and --timeout-ms working but out of the help", async () => {
      const help = (await runMmgate(["images", "generate", "--help"])).stdout;
      expect(help).to.match(/-n, --count <count>/).and.not.match(/--n <count>/).and.not.include("--timeout-ms");
    });
  });

  describe("configuration errors name their source", () => {
    // [serve flags, what the error says]
    const flags: [string[], RegExp][] = [
      [["--log-level", "loud"], /\n {2}log\.level: [^\n]* \(from --log-level\)\n/],
      [["--set", "nope.key=1"], /\n {2}nope\.key: unknown key \(from --set nope\.key\)\n/],
      [["--set", "log.levle=debug"], /\n {2}log\.levle: unknown key; did you mean log\.level\? \(from --set log\.levle\)\n/],
      [["--set", "lgo.level=debug"], /\n {2}lgo\.level: unknown key; did you mean log\.level\? \(from --set lgo\.level\)\n/],
      [["--set", "limits.maxRecieveMessageBytes=1"], /did you mean limits\.maxReceiveMessageBytes\? \(from --set limits\.maxRecieveMessageBytes\)/],
      [["--listen", "nowhere"], /\n {2}listen: expected HOST:PORT[^\n]* \(from --listen\)\n/],
      [["--admin-listen", "x"], /\n {2}adminListen: [^\n]* \(from --admin-listen\)\n/],
      [["--modules", "imgaes"], /\n {2}modules: unknown module "imgaes"; did you mean "images"\? \(known: [^)]*\) \(from --modules\)\n/],
      [["--services", "teleport"], /\n {2}modules: unknown module "teleport" \(known: [^)]*\) \(from --services\)\n/],
      [["--set", "cors.allowedOrigins=[oops"], /cors\.allowedOrigins: not a JSON array .*\(from --set cors\.allowedOrigins\)/],
      [["--set", "shutdown.graceMs=-1", "--log-level", "info"], /\n {2}shutdown\.graceMs: [^\n]* \(from --set shutdown\.graceMs\)\n/],
      // Names an object inherits are no keys: never a way onto Object.prototype, never "from function toString()".
      [["--set", "toString=1"], /\n {2}toString: unknown key \(from --set toString\)\n/],
    ];
    for (const key of ["__proto__.x", "log.__proto__.level", "constructor.prototype.x", "__proto__"]) {
      it(`serve --set ${key}=1: exit 2, [config], and Object.prototype untouched`, async () => {
        const res = await runMmgate(["serve", "--print-config", "--set", `${key}=1`]);
        expect(res.code, res.stderr).to.equal(2);
        expect(res.stderr).to.match(/is no config key \(from --set /);
        expect(({} as Record<string, unknown>)["x"]).to.equal(undefined);
        expect(({} as Record<string, unknown>)["level"]).to.equal(undefined);
      });
    }
    for (const [args, message] of flags) {
      it(`serve ${args.join(" ")}: exit 2, [config], ${message}`, async () => {
        const res = await runMmgate(["serve", "--print-config", ...args]);
        expect(res.code, res.stderr).to.equal(2);
        expect(res.stderr).to.match(/^mmgate serve: \[config\] invalid configuration:\n/);
        expect(`${res.stderr}`).to.match(message);
        expect(res.stderr).to.not.match(/--set log\.level|\(root\)/);
        expect(res.stdout).to.equal("");
      });
    }

    /** Loads with no environment but `env`; the message of the ConfigError it throws. */
    function failure(sources: ConfigSources): string {
      try {
        loadConfig({ env: {}, ...sources }, builtinModules);
      } catch (err) {
        if (err instanceof ConfigError) return err.message;
        throw err;
      }
      return "(loaded)";
    }

    it("names the variable, with the nearest variable for an unknown one", () => {
      expect(failure({ env: { MMGATE_LOG__LEVLE: "debug" } })).to.include("log.levle: unknown key; did you mean MMGATE_LOG__LEVEL? (from MMGATE_LOG__LEVLE)");
      expect(failure({ env: { MMGATE_LOG_LEVEL: "loud" } })).to.match(/log\.level: .* \(from MMGATE_LOG_LEVEL\)$/m);
    });

    it("names the file and the key path; a later source takes over the paths it sets", async () => {
      const file = join(dir, "config.yaml");
      await writeFile(file, "log:\n  levle: debug\nlimits:\n  maxSendMessageBytes: 10\nshutdown:\n  graceMs: 5\n");
      const message = failure({ file });
      expect(message).to.include(`log.levle: unknown key; did you mean log.level? (from ${file})`);
      expect(message).to.match(new RegExp(`limits\\.maxSendMessageBytes: Too small.* \\(from ${file.replace(/[.]/g, "\\.")}\\)`));
      const fixed = join(dir, "fixed.yaml");
      await writeFile(fixed, "shutdown:\n  graceMs: 5\n");
      expect(failure({ file: fixed, env: { MMGATE_SHUTDOWN__GRACE_MS: "-1" } })).to.match(/shutdown\.graceMs: .* \(from MMGATE_SHUTDOWN__GRACE_MS\)$/m);
      expect(failure({ file: fixed, overrides: { "shutdown.graceMs": -1 } })).to.match(/shutdown\.graceMs: .* \(from --set shutdown\.graceMs\)$/m);
    });

    it("warns of a stray MMGATE_* variable with the nearest config variable, when one is near", () => {
      const warnings: string[] = [];
      loadConfig({ env: { MMGATE_LISTN: "127.0.0.1:1", MMGATE_OPENAI_API_KEY: "sk" }, onWarning: (w) => warnings.push(w) }, builtinModules);
      expect(warnings).to.include("MMGATE_LISTN is not a config key; left to whatever reads it by name (did you mean MMGATE_LISTEN?)");
      expect(warnings).to.include("MMGATE_OPENAI_API_KEY is not a config key; left to whatever reads it by name");
    });

    const near: [string, string[], string | undefined][] = [
      ["log.levle", ["log.level", "log.format"], "log.level"],
      ["LOG.LEVEL", ["log.level"], "log.level"],
      ["listn", ["listen", "limits"], "listen"],
      ["nope.key", ["log.level", "tls.keyFile", "listen"], undefined],
      ["tls.certfile", ["tls.certFile", "tls.keyFile"], "tls.certFile"],
      ["imgaes", ["media", "images"], "images"],
    ];
    for (const [word, candidates, expected] of near) {
      it(`suggests ${expected ?? "nothing"} for "${word}"`, () => expect(nearestName(word, candidates)).to.equal(expected));
    }
  });

  describe("list settings from the environment and flags", () => {
    const origins = ["https://a.example", "https://b.example"];
    // Each form, as an env value and as a --set value (which serve reads with parseScalar).
    const forms: [string, string[]][] = [
      ["https://a.example,https://b.example", origins],
      [" https://a.example , https://b.example ", origins],
      ['["https://a.example","https://b.example"]', origins],
      ["https://a.example", ["https://a.example"]],
      ["*", ["*"]],
      ["", []],
    ];
    for (const [text, expected] of forms) {
      it(`cors.allowedOrigins ${JSON.stringify(text)} from MMGATE_CORS__ALLOWED_ORIGINS and from --set`, () => {
        const fromEnv = loadConfig({ env: { MMGATE_CORS__ALLOWED_ORIGINS: text } }, builtinModules);
        const fromFlag = loadConfig({ env: {}, overrides: { "cors.allowedOrigins": parseScalar(text) } }, builtinModules);
        expect(fromEnv.cors.allowedOrigins).to.deep.equal(expected);
        expect(fromFlag.cors.allowedOrigins).to.deep.equal(expected);
      });
    }

    it("modules take a,b and a JSON array from MMGATE_MODULES, --modules and --set alike", async () => {
      for (const text of ["media,images", '["media","images"]', " media , images "]) {
        expect(loadConfig({ env: { MMGATE_MODULES: text } }, builtinModules).modules).to.deep.equal(["media", "images"]);
        const res = await runMmgate(["serve", "--print-config", "--modules", text]);
        expect(res.code, res.stderr).to.equal(0);
        expect((JSON.parse(res.stdout) as { modules: string[] }).modules).to.deep.equal(["media", "images"]);
      }
      const res = await runMmgate(["serve", "--print-config", "--set", "cors.allowedOrigins=https://a.example,https://b.example"]);
      expect((JSON.parse(res.stdout) as { cors: { allowedOrigins: string[] } }).cors.allowedOrigins).to.deep.equal(origins);
    });

    it("a list of numbers reads its items as numbers", () => {
      for (const text of ["1,3", "[1,3]"]) {
        const config = loadConfig({ env: { MMGATE_IMAGES__REFERENCE__FAILURE__OUTPUT_INDICES: text } }, builtinModules);
        expect((config.sections.images as { reference: { failure: { outputIndices: number[] } } }).reference.failure.outputIndices).to.deep.equal([1, 3]);
      }
    });
  });

  describe("images generate --json", () => {
    let server: InProcessServer;
    before(async () => {
      server = await startServer({
        modules: [imagesModule],
        config: { images: { reference: { latencyMs: 5, defaultSize: "32x32", failure: { outputIndices: [2] } } } },
      });
    });
    after(() => server?.close());

    interface Result {
      provider: string;
      model: string;
      dir: string;
      files: string[];
      images: { index: number; file: string; width: number; height: number; format: string; byteSize: number; sha256: string }[];
      partials: string[];
      failures: { index: number; code: string; message: string; retryable: boolean }[];
      warnings: { code: string; message: string }[];
      normalizations: { field: string; flag: string; requested: unknown; effective: unknown; reason: string; message: string }[];
      removed: string[];
      totalMs: number;
    }

    /** Runs generate with --json; stdout must be exactly one JSON object on one line. */
    async function generate(args: string[]): Promise<{ res: CliResult; result: Result }> {
      const res = await runMmgate(["images", "generate", "a cat", "--addr", server.addr, "--json", ...args]);
      expect(res.stdout.endsWith("\n") && res.stdout.indexOf("\n") === res.stdout.length - 1, res.stdout).to.equal(true);
      return { res, result: JSON.parse(res.stdout) as Result };
    }

    it("prints the files written, each image's metadata, the failures and the warnings, and nothing else", async () => {
      const out = join(dir, "json-partial");
      const { res, result } = await generate(["-n", "4", "--best-effort", "--out", out]);
      expect(res.code).to.equal(3);
      expect(res.stderr).to.equal("");
      expect(result.provider).to.equal("reference");
      expect(result.dir).to.equal(out);
      expect(result.images.map((i) => i.index)).to.deep.equal([0, 1, 3]);
      expect(result.files).to.deep.equal(result.images.map((i) => i.file));
      expect((await readdir(out)).map((name) => join(out, name))).to.have.members(result.files);
      for (const image of result.images) {
        expect(image).to.include({ width: 32, height: 32, format: "png" });
        const bytes = await readFile(image.file);
        expect(image.byteSize).to.equal(bytes.length);
        const { createHash } = await import("node:crypto");
        expect(image.sha256).to.equal(createHash("sha256").update(bytes).digest("hex"));
      }
      expect(result.failures).to.have.length(1);
      expect(result.failures[0]).to.include({ index: 2, code: "upstream" });
      expect(result.warnings.map((w) => w.code)).to.include.members(["partial_output_failure", "emulated_multi_image_fanout"]);
      expect(result.warnings.find((w) => w.code === "partial_output_failure")!.message).to.include("--best-effort");
      expect(result.totalMs).to.be.a("number");
      expect(result.removed).to.deep.equal([]);
    });

    it("reports normalized options, streamed previews and removed files", async () => {
      const out = join(dir, "json-normalized");
      const first = await generate(["-n", "3", "--out", out, "--best-effort"]);
      expect(first.result.images).to.have.length(2);
      const { res, result } = await generate(["--size", "100x100", "--normalize", "--stream", "--save-partials", "--out", out]);
      expect(res.code, res.stderr).to.equal(0);
      expect(result.normalizations).to.have.length(1);
      expect(result.normalizations[0]).to.include({ field: "parameters.size", flag: "--size", requested: "100x100", effective: "auto" });
      expect(result.normalizations[0]!.message).to.match(/^normalized --size: 100x100 -> auto/);
      expect(result.partials.length).to.be.greaterThan(0);
      expect(result.files).to.deep.equal([...result.images.map((i) => i.file), ...result.partials]);
      expect(result.removed).to.deep.equal(["image-1.png"]);
      expect((await readdir(out)).map((name) => join(out, name))).to.have.members(result.files);
    });

    it("a failed call prints nothing on stdout and the one error format on stderr", async () => {
      const res = await runMmgate(["images", "generate", "a cat", "--addr", server.addr, "--json", "--size", "100x100", "--out", join(dir, "json-failed")]);
      expect(res.stdout).to.equal("");
      expectOneError(res, "images generate", "failed_precondition", 1);
    });

    it("keeps -n, --count and the old --n alike", async () => {
      for (const flag of ["-n", "--count", "--n"]) {
        const { result } = await generate([flag, "2", "--out", join(dir, `count${flag}`)]);
        expect(result.images, flag).to.have.length(2);
      }
      const { res } = await generate(["--timeout-ms", "60000", "--out", join(dir, "old-timeout")]);
      expect(res.code).to.equal(0);
    });

    it("is consistent with images providers --json: one object on one line, camelCase keys, the same provider names", async () => {
      const providers = await runMmgate(["images", "providers", "--addr", server.addr, "--json"]);
      expect(providers.code).to.equal(0);
      expect(providers.stdout.indexOf("\n")).to.equal(providers.stdout.length - 1);
      const listed = JSON.parse(providers.stdout) as { providers: { name: string }[] };
      const { result } = await generate(["--out", join(dir, "json-consistent")]);
      expect(listed.providers.map((p) => p.name)).to.include(result.provider);
      const keys = (value: unknown): string[] =>
        typeof value !== "object" || value === null ? [] : Object.entries(value).flatMap(([k, v]) => [...(Array.isArray(value) ? [] : [k]), ...keys(v)]);
      for (const key of [...keys(listed), ...keys(result)]) expect(key).to.match(/^[a-z][a-zA-Z0-9]*$/);
    });
  });
});
