// Decides whether bin/mmgate.js may run the bundle scripts/build-cli.mjs
// writes to dist/ instead of the TypeScript sources: only while the bundle's
// stamp is newer than every file the bundle is built from, so that an edit is
// never hidden behind an older build. Plain JavaScript without dependencies:
// it runs on every start, before anything could compile TypeScript, and a
// walk of a few hundred stat calls costs a few milliseconds.
//
// mtimes, not ctimes: they survive what moves a tree about (git, tar, image
// layers, COPY), where a ctime becomes the copy's time. The price: a file
// overwritten in place with an older mtime kept (cp -p, touch -d) goes
// unnoticed until the next build.
import { readdirSync, statSync } from "node:fs";
import { fileURLToPath, pathToFileURL } from "node:url";

/**
 * What the bundle is built from, relative to the root. A folder counts with
 * everything below it and itself: its own mtime changes when an entry is
 * added, removed or renamed, so a deleted source file counts as a change too.
 * A missing input is no change (the image leaves the build's own files out).
 */
export const BUILD_INPUTS = ["src", "gen", "package.json", "tsconfig.json", "scripts/build-cli.mjs"];

/** The bundle's entry module, relative to the root. */
export const DIST_ENTRY = "dist/main.js";

/**
 * Written last by a successful build, with its mtime set to the moment the
 * build started (minus a margin), not the moment it ended: a file saved while
 * esbuild was reading the sources is then newer than the stamp.
 */
export const DIST_STAMP = "dist/build-stamp.json";

/** The repository root as a path ending in "/" (this file sits in bin/). */
export const repoRoot = fileURLToPath(new URL("..", import.meta.url));

/**
 * The newest mtime (ms since the epoch) of `path` and everything below it,
 * -Infinity when it does not exist. Stops walking once it has seen one
 * newer than `limit`, since that already decides.
 */
export function newestMtime(path, limit = Infinity) {
  const stats = statSync(path, MAYBE);
  if (stats === undefined) return -Infinity;
  let newest = stats.mtimeMs;
  if (stats.isDirectory()) {
    for (const entry of readdirSync(path)) {
      if (newest >= limit) break;
      // Concatenated, not path.join: join's normalising tripled the walk's cost.
      const mtime = newestMtime(`${path}/${entry}`, limit);
      if (mtime > newest) newest = mtime;
    }
  }
  return newest;
}

const MAYBE = { throwIfNoEntry: false };

/** `root` with one trailing "/". */
const dir = (root) => (root.endsWith("/") ? root : `${root}/`);

/**
 * True when the bundle under `root` may run: its entry and stamp exist and
 * the stamp is strictly newer than every input (equal is stale, so that
 * coarse file system clocks err on the side of the sources).
 */
export function isFresh(root = repoRoot) {
  const base = dir(root);
  const stamp = statSync(`${base}${DIST_STAMP}`, MAYBE);
  if (stamp === undefined || statSync(`${base}${DIST_ENTRY}`, MAYBE) === undefined) return false;
  return BUILD_INPUTS.every((input) => newestMtime(`${base}${input}`, stamp.mtimeMs) < stamp.mtimeMs);
}

/** The URL of the bundle's entry when it is fresh, undefined when the sources must run. */
export function builtEntry(root = repoRoot) {
  return isFresh(root) ? pathToFileURL(`${dir(root)}${DIST_ENTRY}`) : undefined;
}
