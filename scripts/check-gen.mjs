// Fails when gen/ differs from what `buf generate` writes for proto/.
// Generates into a temporary folder and compares file by file, so the
// working tree is never touched.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";

const root = new URL("..", import.meta.url).pathname;
const out = mkdtempSync(join(tmpdir(), "mmgate-gen-"));
const template = readFileSync(join(root, "buf.gen.yaml"), "utf8").replace(/out: gen\b/, `out: ${out}/gen`);
const templatePath = join(out, "buf.gen.yaml");
writeFileSync(templatePath, template);

function list(dir) {
  const files = [];
  const walk = (d) => {
    for (const name of readdirSync(d)) {
      const p = join(d, name);
      if (statSync(p).isDirectory()) walk(p);
      else files.push(relative(dir, p));
    }
  };
  try { walk(dir); } catch { /* missing folder lists as empty */ }
  return files.sort();
}

try {
  execFileSync(join(root, "node_modules/.bin/buf"), ["generate", "--template", templatePath], { cwd: root, stdio: "inherit" });
  const want = list(join(out, "gen"));
  const have = list(join(root, "gen"));
  const problems = [];
  for (const f of want) {
    if (!have.includes(f)) problems.push(`missing: gen/${f}`);
    else if (!readFileSync(join(out, "gen", f)).equals(readFileSync(join(root, "gen", f)))) problems.push(`differs: gen/${f}`);
  }
  for (const f of have) if (!want.includes(f)) problems.push(`stale: gen/${f}`);
  if (problems.length > 0) {
    console.error(`gen/ is out of step with proto/ (run \`npm run generate\`):\n  ${problems.join("\n  ")}`);
    process.exitCode = 1;
  } else {
    console.log(`gen/ matches proto/ (${want.length} files)`);
  }
} finally {
  rmSync(out, { recursive: true, force: true });
}
