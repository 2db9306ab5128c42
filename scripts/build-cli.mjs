// Bundles the executable (src/cli/main.ts) into dist/, which bin/mmgate.js
// runs instead of compiling the sources through tsx at every start, as long
// as bin/dist.js finds it fresh. `npm ci` runs this (prepare), so does
// `npm test` (scripts/checks.mjs) and `npm run build`; the Docker image runs
// it in its build stage. esbuild comes with tsx, a runtime dependency.
//
// - Code splitting: every subcommand main.ts imports lazily stays a chunk of
//   its own, so `mmgate version` still loads none of what `serve` needs.
// - Packages stay external: imported from node_modules at run time, exactly
//   as the sources import them.
// - The Node target as tsx compiles the sources, without keepNames: with it,
//   every closure made at run time (several per RPC) calls a helper that
//   redefines its `name`, a few per cent of a call's CPU. Names stay the
//   sources' except where the bundle renames a top-level binding that two
//   modules share (a helper function's stack-frame name gets a digit); a
//   class is never renamed (the build fails if one would be), since its name
//   is what logs and errors show (pino's `type`).
// - Source maps (without the sources' text): stack traces name src/ files
//   once bin/mmgate.js turns source maps on.
//
// The build writes beside a bundle that may be running: files whose content
// did not change are left alone, the others are written and renamed into
// place, main.js last, and the stamp (bin/dist.js) only after everything else;
// until then the stamp is absent and bin/mmgate.js runs the sources. Builds
// take turns (a lock file in dist/): two at once could leave one's main.js
// under the other's stamp.
import { createHash } from "node:crypto";
import { readFileSync, readdirSync, renameSync, rmSync, mkdirSync, utimesSync, writeFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";
import { BUILD_INPUTS, DIST_ENTRY, DIST_STAMP, newestMtime } from "../bin/dist.js";

const root = fileURLToPath(new URL("..", import.meta.url));
const dist = join(root, dirname(DIST_ENTRY));
const stampPath = join(root, DIST_STAMP);
/** The one module that may read import.meta (src/paths.ts says why). */
const PATHS_MODULE = "src/paths.ts";
/**
 * The stamp's mtime is the build's start minus this: a file saved just after
 * the start may carry an mtime up to a clock tick earlier than Date.now() said
 * (file systems take a coarse clock), and must still count as newer.
 */
const STAMP_MARGIN_MS = 100;

const rel = (path) => relative(root, path);
const fail = (message) => {
  process.stderr.write(`build-cli: ${message}\n`);
  process.exit(1);
};

const lockPath = join(dist, ".build-lock");

/** Whether process `pid` is running (EPERM: it is, as another user). */
const alive = (pid) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return err.code === "EPERM";
  }
};

/** Takes the build lock, waiting up to a minute for another build; a dead build's lock is taken over. */
async function lock() {
  mkdirSync(dist, { recursive: true });
  const deadline = Date.now() + 60_000;
  for (;;) {
    try {
      writeFileSync(lockPath, `${process.pid}\n`, { flag: "wx" });
      return;
    } catch (err) {
      if (err.code !== "EEXIST") throw err;
    }
    let owner;
    try {
      owner = Number.parseInt(readFileSync(lockPath, "utf8"), 10);
    } catch {
      continue; // released in between
    }
    // A half-written lock (NaN) is left to its writer until the deadline.
    if (Number.isInteger(owner) && !alive(owner)) rmSync(lockPath, { force: true });
    else if (Date.now() > deadline) fail(`another build (pid ${owner}) holds ${rel(lockPath)}; remove it if that is wrong`);
    else await sleep(50);
  }
}

await lock();
process.once("exit", () => rmSync(lockPath, { force: true }));

// Taken once the lock is held: everything esbuild reads, it reads after this.
const started = Date.now();
// From here until the new stamp is written, bin/mmgate.js runs the sources.
rmSync(stampPath, { force: true });

let result;
try {
  result = await esbuild.build({
    absWorkingDir: root,
    entryPoints: { main: "src/cli/main.ts" },
    outdir: dist,
    bundle: true,
    splitting: true,
    packages: "external",
    platform: "node",
    format: "esm",
    target: "node20.19",
    keepNames: false,
    sourcemap: "linked",
    sourcesContent: false,
    chunkNames: "chunk-[hash]",
    metafile: true,
    write: false,
    logLevel: "warning",
  });
} catch {
  // esbuild has printed the errors.
  fail("esbuild failed");
}

const outputs = result.outputFiles;

// Every output sits directly in dist/, one folder below the root as
// src/paths.ts does, which is what makes its "../" the root in the bundle.
for (const file of outputs) {
  if (dirname(file.path) !== dist) fail(`${rel(file.path)} is not directly in ${rel(dist)}/: src/paths.ts's root would be wrong there`);
}
if (!(PATHS_MODULE in result.metafile.inputs)) fail(`${PATHS_MODULE} is not in the bundle; nothing else may locate files`);

// import.meta only in src/paths.ts's code. esbuild drops comments and marks
// each module's code with a `// <path>` line, so every import.meta of the
// output is code and belongs to the module whose marker precedes it.
const strays = new Set();
for (const file of outputs) {
  if (!file.path.endsWith(".js")) continue;
  let module = "(chunk preamble)";
  for (const line of file.text.split("\n")) {
    const marker = /^\/\/ ((?:src|gen)\/\S+\.ts)$/.exec(line);
    if (marker) module = marker[1];
    else if (/\bimport\.meta\b/.test(line) && module !== PATHS_MODULE) strays.add(module);
  }
}
if (strays.size > 0) {
  fail(
    `import.meta in ${[...strays].join(", ")}: a URL relative to a file's own location breaks in the bundle, ` +
      `whose chunks sit at another depth; locate files from rootUrl (${PATHS_MODULE}) instead`,
  );
}

// Every class keeps its source name: one the bundle renamed to avoid a
// collision (`class Foo2`, `var Foo2 = class`) would log and report under the
// wrong name without keepNames.
const sourceClasses = new Set();
const walk = (dir) => {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) walk(path);
    else if (entry.name.endsWith(".ts")) for (const m of readFileSync(path, "utf8").matchAll(/\bclass\s+([A-Za-z_$][\w$]*)/g)) sourceClasses.add(m[1]);
  }
};
walk(join(root, "src"));
walk(join(root, "gen"));
const renamed = new Set();
for (const file of outputs) {
  if (!file.path.endsWith(".js")) continue;
  for (const m of file.text.matchAll(/(?:\b(?:var|let|const)\s+([A-Za-z_$][\w$]*)\s*=\s*class\b|^\s*class\s+([A-Za-z_$][\w$]*))/gm)) {
    const name = m[1] ?? m[2];
    if (!sourceClasses.has(name)) renamed.add(name);
  }
}
if (renamed.size > 0) fail(`the bundle renamed classes (${[...renamed].sort().join(", ")}): give them names no other module uses`);

// Write what changed; main.js, the file that leads to all others, last.
const entry = join(root, DIST_ENTRY);
const ordered = [...outputs.filter((f) => f.path !== entry), ...outputs.filter((f) => f.path === entry)];
let written = 0;
for (const file of ordered) {
  let current;
  try {
    current = readFileSync(file.path);
  } catch {
    current = undefined;
  }
  if (current?.equals(file.contents)) continue;
  const temporary = `${file.path}.tmp-${process.pid}`;
  writeFileSync(temporary, file.contents);
  renameSync(temporary, file.path);
  written++;
}

// Outputs of earlier builds that this one no longer has. A process that runs
// the bundle imports its chunks at start; one that started on unchanged
// inputs finds them again here, since their names are their content's hash.
const keep = new Set([...outputs.map((f) => f.path), stampPath, lockPath]);
let removed = 0;
for (const name of readdirSync(dist)) {
  const path = join(dist, name);
  if (keep.has(path)) continue;
  rmSync(path, { recursive: true, force: true });
  removed++;
}

// What the bundle was built from: enough to tell two builds apart and to
// see why bin/mmgate.js takes one or the other path. The modules are hashed
// as they are now; had one changed while esbuild ran, its mtime is past the
// stamp's and the bundle does not run anyway.
const inputHash = createHash("sha256");
let inputFiles = 0;
for (const [path] of Object.entries(result.metafile.inputs).sort(([a], [b]) => a.localeCompare(b))) {
  inputHash.update(`${path}\0`).update(readFileSync(join(root, path))).update("\0");
  inputFiles++;
}
const newest = Math.max(...BUILD_INPUTS.map((input) => newestMtime(join(root, input))));
const stamp = {
  builtAt: new Date(started).toISOString(),
  entry: "src/cli/main.ts",
  version: JSON.parse(readFileSync(join(root, "package.json"), "utf8")).version,
  node: process.version,
  esbuild: esbuild.version,
  freshWhileNewerThan: BUILD_INPUTS,
  newestInputAtEnd: new Date(newest).toISOString(),
  modules: inputFiles,
  modulesSha256: inputHash.digest("hex"),
  outputs: outputs.map((f) => rel(f.path)).sort(),
};
const stampTime = (started - STAMP_MARGIN_MS) / 1000;
const temporary = `${stampPath}.tmp-${process.pid}`;
writeFileSync(temporary, `${JSON.stringify(stamp, null, 2)}\n`);
// The mtime is set before the rename: the stamp never shows the later write time.
utimesSync(temporary, stampTime, stampTime);
renameSync(temporary, stampPath);

const bytes = outputs.filter((f) => f.path.endsWith(".js")).reduce((sum, f) => sum + f.contents.length, 0);
const stale = newest >= stampTime * 1000 ? "; an input changed while it built, so the sources run until the next build" : "";
process.stdout.write(
  `${rel(dist)}/: ${outputs.length} files (${(bytes / 1024).toFixed(0)} KiB of JavaScript), ${written} written, ${removed} removed, ` +
    `${((Date.now() - started) / 1000).toFixed(2)} s${stale}\n`,
);