import { spawnSync } from "node:child_process";
import { mkdir, mkdtemp, readFile, readdir, rm, stat, unlink, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { expect } from "chai";
import { BUILD_INPUTS, DIST_ENTRY, DIST_STAMP, builtEntry, isFresh } from "../../bin/dist.js";
import { repoRoot, spawnMmgate, type CliResult } from "../support/index.js";

/** Seconds since the epoch: the inputs' mtime in the fixture; the stamp is 10 s newer. */
const T = 1_700_000_000;

/** Sets the mtime of `path` and everything below it, files before their folders (writing a file would move its folder's). */
async function setTimes(path: string, seconds: number): Promise<void> {
  if ((await stat(path)).isDirectory()) {
    for (const entry of await readdir(path)) await setTimes(join(path, entry), seconds);
  }
  await utimes(path, seconds, seconds);
}

describe("bin/dist.js: when bin/mmgate.js runs the bundle", () => {
  let root: string;

  const write = async (path: string, text = "") => {
    await mkdir(dirname(join(root, path)), { recursive: true });
    await writeFile(join(root, path), text);
  };

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), "mmgate-fresh-"));
    for (const file of ["src/cli/main.ts", "src/server/deep/a.ts", "gen/mmgate/x_pb.ts", "package.json", "tsconfig.json", "scripts/build-cli.mjs", DIST_ENTRY]) await write(file);
    await write(DIST_STAMP, "{}");
    await setTimes(root, T);
    await utimes(join(root, DIST_STAMP), T + 10, T + 10);
  });
  afterEach(() => rm(root, { recursive: true, force: true }));

  it("runs the bundle while its stamp is newer than every input", () => {
    expect(isFresh(root)).to.equal(true);
    expect(builtEntry(root)?.href).to.equal(`file://${root}/${DIST_ENTRY}`);
    expect(BUILD_INPUTS).to.include.members(["src", "gen", "package.json"]);
  });

  it("runs the sources once any input is as new as the stamp or newer, however deep", async () => {
    for (const [input, seconds] of [
      ["src/server/deep/a.ts", T + 10],
      ["src/server/deep/a.ts", T + 11],
      ["gen/mmgate/x_pb.ts", T + 11],
      ["package.json", T + 11],
      ["tsconfig.json", T + 11],
      ["scripts/build-cli.mjs", T + 11],
    ] as const) {
      await utimes(join(root, input), seconds, seconds);
      expect(isFresh(root), `${input} at stamp ${seconds === T + 10 ? "+ 0" : "+ 1"} s`).to.equal(false);
      expect(builtEntry(root)).to.equal(undefined);
      await utimes(join(root, input), T, T);
      expect(isFresh(root), `${input} back`).to.equal(true);
    }
  });

  it("runs the sources after a file is removed or added, through its folder's mtime", async () => {
    await unlink(join(root, "src/server/deep/a.ts"));
    expect(isFresh(root)).to.equal(false);
    await setTimes(root, T);
    await utimes(join(root, DIST_STAMP), T + 10, T + 10);
    expect(isFresh(root)).to.equal(true);
    // An old file copied in with its mtime kept: only the folder tells.
    await write("src/server/new.ts");
    await utimes(join(root, "src/server/new.ts"), T, T);
    expect(isFresh(root)).to.equal(false);
  });

  it("runs the sources without a stamp or without the bundle's entry", async () => {
    await unlink(join(root, DIST_STAMP));
    expect(isFresh(root)).to.equal(false);
    await write(DIST_STAMP);
    await utimes(join(root, DIST_STAMP), T + 10, T + 10);
    expect(isFresh(root)).to.equal(true);
    await unlink(join(root, DIST_ENTRY));
    expect(isFresh(root)).to.equal(false);
  });

  it("does not count inputs that are absent (the image has no tsconfig.json or scripts/)", async () => {
    await rm(join(root, "tsconfig.json"));
    await rm(join(root, "scripts"), { recursive: true });
    expect(isFresh(root)).to.equal(true);
  });
});

describe("node bin/mmgate.js version, from the bundle and from the sources", function () {
  // A build and three processes on a loaded 2-core machine.
  this.timeout(60_000);

  interface Traced extends CliResult {
    /** URL of every module the process resolved. */
    readonly modules: string[];
  }
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), "mmgate-startup-"));
    // `npm test` has built it; a lone run of this file may need to.
    if (!isFresh()) {
      const build = spawnSync(process.execPath, ["scripts/build-cli.mjs"], { cwd: repoRoot, encoding: "utf8" });
      expect(build.status, build.stderr).to.equal(0);
    }
  });
  after(() => rm(dir, { recursive: true, force: true }));

  /** Runs the executable with the module trace (test/fixtures/loaded-modules.mjs) on. */
  async function traced(name: string, args: string[], env: Record<string, string>): Promise<Traced> {
    const log = join(dir, `${name}.modules`);
    const result = await spawnMmgate(args, {
      nodeArgs: ["--import", `${repoRoot}test/fixtures/loaded-modules.mjs`],
      env: { ...env, MMGATE_TEST_MODULE_LOG: log },
    });
    const modules = (await readFile(log, "utf8").catch(() => "")).split("\n").filter(Boolean);
    return { ...result, modules };
  }

  it("prints package.json's version either way, and runs the bundle only while it is fresh", async () => {
    const { version } = JSON.parse(await readFile(join(repoRoot, "package.json"), "utf8")) as { version: string };
    const expected = `mmgate ${version} (node ${process.version})\n`;
    const freshBefore = isFresh();
    const [bundle, help, source, serve] = await Promise.all([
      traced("default", ["version"], { MMGATE_FROM_SOURCE: "" }),
      traced("help", ["--help"], { MMGATE_FROM_SOURCE: "" }),
      traced("source", ["version"], { MMGATE_FROM_SOURCE: "1" }),
      // The launcher's variable never reaches the config loader, which warns about unknown MMGATE_* names.
      spawnMmgate(["serve", "--print-config", "--admin-listen", ""], { env: { MMGATE_FROM_SOURCE: "1" } }),
    ]);
    const freshAfter = isFresh();

    const fromBundle = (run: Traced) => run.modules.some((url) => url.endsWith(`/${DIST_ENTRY}`));
    const fromSource = (run: Traced) => run.modules.some((url) => url.endsWith("/src/cli/main.ts"));
    for (const run of [bundle, source]) {
      expect(run, run.stderr).to.include({ code: 0, stdout: expected, stderr: "" });
      expect(fromBundle(run) || fromSource(run), "the module trace works").to.equal(true);
    }
    expect([fromSource(source), fromBundle(source)], "MMGATE_FROM_SOURCE=1: the sources").to.deep.equal([true, false]);
    // Someone may save a source file meanwhile; then only the version is certain.
    if (freshBefore && freshAfter) {
      expect([fromBundle(bundle), fromSource(bundle)], "fresh: the bundle").to.deep.equal([true, false]);
      expect(bundle.modules.filter((url) => url.includes("/node_modules/tsx/")), "no TypeScript loader").to.deep.equal([]);
      // The lazy subcommands stayed chunks of their own: neither loads sharp.
      expect(help.code, help.stderr).to.equal(0);
      expect(fromBundle(help)).to.equal(true);
      const sharp = (run: Traced) => run.modules.filter((url) => url.includes("/node_modules/sharp/"));
      expect({ version: sharp(bundle), help: sharp(help) }).to.deep.equal({ version: [], help: [] });
    } else if (!freshBefore && !freshAfter) {
      expect([fromSource(bundle), fromBundle(bundle)], "stale: the sources").to.deep.equal([true, false]);
    }

    expect(serve.code, serve.stderr).to.equal(0);
    expect(serve.stderr).to.not.include("MMGATE_FROM_SOURCE");
  });
});
