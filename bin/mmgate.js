#!/usr/bin/env node
// The mmgate executable. Runs the bundle of src/cli/main.ts in dist/
// (scripts/build-cli.mjs; `npm ci` and `npm test` build it) while it is newer
// than every file it is built from (bin/dist.js), and the TypeScript sources
// through tsx's loader otherwise, so a clone works right after `npm ci`, an
// edit runs at once, and an old build never runs. MMGATE_FROM_SOURCE=1 always
// runs the sources. Either way the command runs in this process, so signals
// (SIGTERM to a server) reach it directly.
import { builtEntry } from "./dist.js";

const fromSource = !["", "0", undefined].includes(process.env.MMGATE_FROM_SOURCE);
// The launcher's setting, not the server's: `serve` would warn that it is no config key.
delete process.env.MMGATE_FROM_SOURCE;
const entry = fromSource ? undefined : builtEntry();

let main;
if (entry !== undefined) {
  // Stack traces name the src/ files, through the bundle's source maps, as under tsx.
  process.setSourceMapsEnabled(true);
  ({ main } = await import(entry.href));
} else {
  const { register } = await import("tsx/esm/api");
  register();
  ({ main } = await import("../src/cli/main.ts"));
}
await main(process.argv.slice(2));
