/**
 * `mmgate keys add|list|remove|hash`: a key is printed once and only its
 * digest written, the file is replaced atomically (a YAML file keeping its
 * comments), names and scopes are checked as the server checks them, and
 * the file comes from --file or the config's auth.keysFile.
 */
import { mkdir, mkdtemp, readdir, readFile, rm, stat, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "chai";
import { parse as parseYaml } from "yaml";
import { keysCommand, type KeysCliIo } from "../../src/cli/keys.js";
import { lock } from "proper-lockfile";
import type { KeysFileError} from "../../src/server/access/index.js";
import { addKey, keyDigest, parseKeysText, removeKey } from "../../src/server/access/index.js";
import { CliError } from "../../src/rpc/index.js";
import { expectRejection, runMmgate } from "../support/index.js";

describe("mmgate keys", function () {
  this.timeout(30_000);
  let dir: string;
  let n = 0;
  /** A fresh path in the test's directory. */
  const fresh = (ext = "yaml") => join(dir, `keys-${++n}.${ext}`);
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), "mmgate-cli-keys-"));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  it("add prints a new key once, writes only its digest (a new file 0600), and says so on stderr", async () => {
    const file = fresh();
    const res = await runMmgate(["keys", "add", "ci", "--scope", "mutating", "--scope", "images.generate,media", "--file", file]);
    expect(res.code, res.stderr).to.equal(0);
    const key = res.stdout.trim();
    expect(key).to.match(/^mmk_[A-Za-z0-9_-]{43}$/);
    expect(res.stderr).to.equal(`mmgate keys add: added ci (mutating, images.generate, media) to ${file}; the key above is shown only now\n`);
    const text = await readFile(file, "utf8");
    expect(text).to.not.include(key);
    expect(text).to.include(keyDigest(key)).and.match(/^# mmgate keys/);
    expect(parseKeysText(text, file)).to.deep.equal([{ name: "ci", sha256: keyDigest(key), scopes: ["mutating", "images.generate", "media"] }]);
    expect((await stat(file)).mode & 0o777).to.equal(0o600);
    // A second key never repeats the first.
    const again = await runMmgate(["keys", "add", "ci-2", "--scope", "admin", "--file", file, "--json"]);
    const printed = JSON.parse(again.stdout) as { name: string; key: string; sha256: string; scopes: string[]; file: string };
    expect(printed).to.deep.include({ name: "ci-2", scopes: ["admin"], file });
    expect(printed.key).to.not.equal(key);
    expect(printed.sha256).to.equal(keyDigest(printed.key));
  });

  it("add replaces the file by a rename (no temporary file left), keeps a YAML file's comments and its mode", async () => {
    const file = fresh();
    await writeFile(file, "# rotated quarterly: see the runbook\nkeys:\n  - name: old # the one to retire\n    sha256: " + keyDigest("an-old-key-0123456789") + "\n    scopes: [admin]\n", { mode: 0o640 });
    const before = await stat(file);
    const res = await runMmgate(["keys", "add", "new", "--scope", "admin", "--expires", "30d", "--images-per-minute", "60", "--file", file]);
    expect(res.code, res.stderr).to.equal(0);
    const after = await stat(file);
    expect(after.ino, "a new file took the old one's name").to.not.equal(before.ino);
    expect(after.mode & 0o777).to.equal(0o640);
    expect((await readdir(dir)).filter((f) => f.endsWith(".tmp"))).to.deep.equal([]);
    const text = await readFile(file, "utf8");
    expect(text).to.include("# rotated quarterly: see the runbook").and.include("# the one to retire");
    const [, added] = parseKeysText(text, file);
    expect(added).to.deep.include({ name: "new", scopes: ["admin"], limits: { imagesPerMinute: 60 } });
    const days = (Date.parse(added!.expires!) - Date.now()) / 86_400_000;
    expect(days).to.be.within(29.99, 30);
    expect(added!.expires).to.match(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
  });

  it("add and remove edit a JSON file as JSON", async () => {
    const file = fresh("json");
    expect((await runMmgate(["keys", "add", "a", "--scope", "public", "--file", file])).code).to.equal(0);
    expect((await runMmgate(["keys", "add", "b", "--scope", "mmgate.images.v1.ImageService/Generate", "--file", file])).code).to.equal(0);
    const data = JSON.parse(await readFile(file, "utf8")) as { keys: { name: string }[] };
    expect(data.keys.map((k) => k.name)).to.deep.equal(["a", "b"]);
    const removed = await runMmgate(["keys", "remove", "a", "--file", file]);
    expect(removed).to.deep.include({ code: 0, stdout: "", stderr: `mmgate keys remove: removed a from ${file}\n` });
    expect((JSON.parse(await readFile(file, "utf8")) as { keys: { name: string }[] }).keys.map((k) => k.name)).to.deep.equal(["b"]);
  });

  // [arguments after `keys`, the command, the code, exit code, what the message says]
  const failures: [string[], string, string, number, RegExp][] = [
    [["add", "ci"], "keys add", "usage", 2, /required option '--scope <scope\.\.\.>' not specified/],
    [["add", "c i", "--scope", "admin"], "keys add", "usage", 2, /a name is 1 to 64 letters/],
    [["add", "other", "--scope", "admin"], "keys add", "usage", 2, /"other" is reserved/],
    [["add", "ci", "--scope", "images.genrate"], "keys add", "usage", 2, /scope images\.genrate names no access level, service or method; did you mean images\.generate\?/],
    [["add", "ci", "--scope", "images generate"], "keys add", "usage", 2, /--scope images generate: expected an access level/],
    [["add", "ci", "--scope", "admin", "--expires", "2001-01-01T00:00:00Z"], "keys add", "usage", 2, /--expires: 2001-01-01T00:00:00Z is not in the future/],
    [["add", "ci", "--scope", "admin", "--expires", "next week"], "keys add", "usage", 2, /--expires: expected an RFC 3339 time/],
    [["add", "ci", "--scope", "admin", "--images-per-minute", "1.5"], "keys add", "usage", 2, /--images-per-minute must be a positive integer/],
    [["list"], "keys list", "usage", 2, /no keys file: give --file FILE, or --config FILE whose auth\.keysFile is set/],
  ];
  for (const [args, command, code, exitCode, message] of failures) {
    it(`keys ${args.join(" ")}: exit ${exitCode}, [${code}]`, async () => {
      const file = fresh();
      const res = await runMmgate(["keys", ...args, ...(args[0] === "list" ? [] : ["--file", file])]);
      expect(res.code, res.stderr).to.equal(exitCode);
      expect(res.stderr).to.match(new RegExp(`^mmgate ${command}: \\[${code}\\] `)).and.match(message);
      expect(res.stdout).to.equal("");
      await expectRejection(stat(file), { code: "ENOENT" });
    });
  }

  it("add refuses a name the file has (case aside) and leaves the file as it was; remove of an unknown name is not_found", async () => {
    const file = fresh();
    expect((await runMmgate(["keys", "add", "ci", "--scope", "admin", "--file", file])).code).to.equal(0);
    const text = await readFile(file, "utf8");
    const dup = await runMmgate(["keys", "add", "CI", "--scope", "admin", "--file", file]);
    expect(dup.code).to.equal(1);
    expect(dup.stderr).to.match(/^mmgate keys add: \[already_exists\] .*: a key named CI is there already \(mmgate keys remove CI first, to replace it\)\n$/);
    expect(dup.stdout, "no key is printed for a key not added").to.equal("");
    expect(await readFile(file, "utf8")).to.equal(text);
    const gone = await runMmgate(["keys", "remove", "nobody", "--file", file]);
    expect(gone.code).to.equal(1);
    expect(gone.stderr).to.match(/^mmgate keys remove: \[not_found\] .*: no key named nobody/);
  });

  describe("edits take turns (the file's edit lock)", () => {
    const entry = (i: number) => ({ name: `k${i}`, sha256: keyDigest(`mmk_test_${i}_${"x".repeat(24)}`), scopes: ["admin" as const] });

    it("keeps every one of eight adds made at once, and a remove among them", async () => {
      const file = fresh();
      await addKey(file, entry(0));
      await Promise.all([...Array.from({ length: 8 }, (_, i) => addKey(file, entry(i + 1))), removeKey(file, "k0")]);
      const names = parseKeysText(await readFile(file, "utf8"), file).map((k) => k.name);
      expect(names.sort()).to.deep.equal(["k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8"]);
      expect(await readdir(dir), "no lock left behind").to.not.include(`${file.split("/").pop()!}.lock`);
    });

    it("waits for a held lock, then refuses with locked, leaving the file as it was", async () => {
      const file = fresh();
      await addKey(file, entry(1));
      const text = await readFile(file, "utf8");
      const release = await lock(file, { realpath: false });
      try {
        const err = await expectRejection(addKey(file, entry(2), { lockWaitMs: 300 }), { name: "KeysFileError" });
        expect((err as KeysFileError).code).to.equal("locked");
        expect((err as KeysFileError).problems[0]).to.match(/^another edit holds .*\.lock \(waited 0\.3 s\)/);
      } finally {
        await release();
      }
      expect(await readFile(file, "utf8")).to.equal(text);
      await removeKey(file, "k1");
    });

    it("takes over a lock a crashed edit left (older than 10 s)", async () => {
      const file = fresh();
      await mkdir(`${file}.lock`);
      const old = new Date(Date.now() - 60_000);
      await utimes(`${file}.lock`, old, old);
      await addKey(file, entry(1), { lockWaitMs: 300 });
      expect(parseKeysText(await readFile(file, "utf8"), file).map((k) => k.name)).to.deep.equal(["k1"]);
    });
  });

  it("refuses to edit or list an invalid file, naming every problem", async () => {
    const file = fresh();
    await writeFile(file, "keys:\n  - { name: a, sha256: nope, scopes: [] }\n");
    const before = await readFile(file, "utf8");
    for (const args of [["add", "b", "--scope", "admin"], ["list"], ["remove", "a"]]) {
      const res = await runMmgate(["keys", ...args, "--file", file]);
      expect(res.code, args.join(" ")).to.equal(1);
      expect(res.stderr).to.match(/\[invalid_argument\] .*keys-\d+\.yaml: keys\[0\]\.sha256: expected the key's SHA-256/);
      expect(res.stderr).to.match(/\n {2}keys\[0\]\.scopes: give at least one scope/);
    }
    expect(await readFile(file, "utf8")).to.equal(before);
  });

  it("list shows names, scopes, expiry and limits, digests only when asked, never a key", async () => {
    const file = fresh();
    const digest = keyDigest("list-key-0123456789abcdef");
    await writeFile(
      file,
      [
        "keys:",
        `  - { name: ci, sha256: ${digest}, scopes: [mutating, images.generate], limits: { requestsPerSecond: 2, imagesPerMinute: 60 } }`,
        `  - { name: old, sha256: ${keyDigest("old-0123456789abcdef")}, scopes: [admin], expires: "2001-01-01T00:00:00Z" }`,
        "",
      ].join("\n"),
    );
    const text = await runMmgate(["keys", "list", "--file", file]);
    expect(text.stdout).to.equal(
      [
        "NAME  SCOPES                    EXPIRES                         LIMITS",
        "ci    mutating,images.generate  never                           2/s, 60 images/min",
        "old   admin                     2001-01-01T00:00:00Z (expired)  -",
        "",
      ].join("\n"),
    );
    expect(text.stdout).to.not.include(digest);
    const json = JSON.parse((await runMmgate(["keys", "list", "--file", file, "--json", "--digests"])).stdout) as { keys: Record<string, unknown>[] };
    expect(json.keys[0]).to.deep.equal({ name: "ci", scopes: ["mutating", "images.generate"], limits: { requestsPerSecond: 2, imagesPerMinute: 60 }, sha256: digest });
    expect(json.keys[1]).to.deep.include({ name: "old", expires: "2001-01-01T00:00:00Z", expired: true });
  });

  it("finds the file through --config's auth.keysFile, and MMGATE_AUTH__KEYS_FILE over it", async () => {
    const file = fresh();
    const config = join(dir, "mmgate.yaml");
    await writeFile(config, `listen: 127.0.0.1:0\nimages: { defaultProvider: reference }\nauth:\n  keysFile: ${file}\n`);
    expect((await runMmgate(["keys", "add", "via-config", "--scope", "admin", "--config", config])).code).to.equal(0);
    expect(parseKeysText(await readFile(file, "utf8"), file).map((k) => k.name)).to.deep.equal(["via-config"]);
    const other = fresh();
    process.env["MMGATE_AUTH__KEYS_FILE"] = other;
    try {
      expect((await runMmgate(["keys", "add", "via-env", "--scope", "admin", "-c", config])).code).to.equal(0);
    } finally {
      delete process.env["MMGATE_AUTH__KEYS_FILE"];
    }
    expect(parseKeysText(await readFile(other, "utf8"), other).map((k) => k.name)).to.deep.equal(["via-env"]);
    const missing = await runMmgate(["keys", "list", "--config", join(dir, "absent.yaml")]);
    expect(missing.code).to.equal(2);
    expect(missing.stderr).to.match(/^mmgate keys list: \[config\] /);
  });

  describe("hash", () => {
    /** `keys hash` with `input` on standard input; what it wrote. */
    async function hash(input: string): Promise<{ out: string; err: string }> {
      let out = "";
      let err = "";
      const io: KeysCliIo = { out: { write: (t: string) => (out += t) }, err: { write: (t: string) => (err += t) }, stdin: async () => input, env: {}, now: Date.now };
      await keysCommand(io).parseAsync(["hash"], { from: "user" });
      return { out, err };
    }

    it("prints the digest the keys file stores, without the line end", async () => {
      const key = "mmk_made-elsewhere-0123456789";
      expect(await hash(`${key}\n`)).to.deep.equal({ out: `${keyDigest(key)}\n`, err: "" });
      expect((await hash(key)).out).to.equal(`${keyDigest(key)}\n`);
      // The same digest the server compares: what `keys add` would have written.
      expect(parseYaml(`sha256: ${keyDigest(key)}`)).to.deep.equal({ sha256: keyDigest(key) });
    });

    it("warns of a short key, and refuses none or one with white space", async () => {
      expect((await hash("short\n")).err).to.equal("mmgate keys hash: warning: a key under 16 characters is easy to guess; mmgate keys add makes 256-bit ones\n");
      await expectRejection(hash("\n"), { type: CliError, code: "invalid_argument", message: /no key on standard input/ });
      await expectRejection(hash("two words-0123456789\n"), { type: CliError, code: "invalid_argument", message: /white space/ });
    });
  });
});
