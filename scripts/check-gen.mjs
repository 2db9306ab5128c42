// Fails when gen/ differs from what `npm run generate` writes for proto/:
// the stubs of `buf generate` and the descriptor image of `buf build` that
// reflection serves. Generates into a temporary folder and compares file by
// file, so the working tree is never touched.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";

const root = new URL("..", import.meta.url).pathname;

// The image's build, as the generate script runs it; the script is checked to
// still run exactly this, so the two cannot drift apart unnoticed.
const image = "gen/descriptors.binpb";
const imageArgs = ["build", "--exclude-imports", "-o"];
const generateScript = JSON.parse(readFileSync(join(root, "package.json"), "utf8")).scripts?.generate ?? "";
if (!generateScript.includes(`buf ${imageArgs.join(" ")} ${image}`)) {
  console.error(`package.json's generate script no longer runs \`buf ${imageArgs.join(" ")} ${image}\`: update scripts/check-gen.mjs with it`);
  process.exit(1);
}

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
  const buf = join(root, "node_modules/.bin/buf");
  execFileSync(buf, ["generate", "--template", templatePath], { cwd: root, stdio: "inherit" });
  execFileSync(buf, [...imageArgs, join(out, image)], { cwd: root, stdio: "inherit" });
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
