// Runs every benchmark in bench/ one after the other (they compete for the
// same two cores, so never in parallel) and fails if any of them fails.
import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";

const root = new URL("..", import.meta.url).pathname;
const only = process.argv.slice(2);
const files = readdirSync(`${root}bench`)
  .filter((f) => f.endsWith(".ts") && !f.startsWith("_"))
  .filter((f) => only.length === 0 || only.some((o) => f.includes(o)))
  .sort();
let failed = 0;
for (const file of files) {
  process.stdout.write(`\n=== bench/${file}\n`);
  const res = spawnSync(process.execPath, ["--import", "tsx", `bench/${file}`], { cwd: root, stdio: "inherit" });
  if (res.status !== 0) {
    failed++;
    process.stdout.write(`bench/${file} failed (exit ${res.status ?? res.signal})\n`);
  }
}
process.exitCode = failed === 0 ? 0 : 1;
