// Runs the static checks of `npm test` side by side (typecheck, the
// console's browser code's typecheck, eslint,
// buf lint, the gen check, the docs' TypeScript blocks) and the
// executable's bundle build (so that the tests that spawn bin/mmgate.js run
// the current sources as a bundle, and a file that breaks the bundle fails
// here), prints each one's output as a block once it ends, and fails if any
// failed. Side by side they take about as long as the slowest one instead
// of the sum.
import { spawn } from "node:child_process";

const checks = [
  ["typecheck", "tsc", ["--noEmit", "-p", "."]],
  // The console's browser code has DOM types and a tsconfig of its own.
  ["typecheck:console", "tsc", ["--noEmit", "-p", "src/console/web"]],
  ["lint", "eslint", ["."]],
  ["lint:proto", "buf", ["lint"]],
  ["check:gen", process.execPath, ["scripts/check-gen.mjs"]],
  ["check:docs", process.execPath, ["scripts/check-doc-code.mjs"]],
  ["build", process.execPath, ["scripts/build-cli.mjs"]],
];

const root = new URL("..", import.meta.url).pathname;
const bin = (name) => (name === process.execPath ? name : `${root}node_modules/.bin/${name}`);

function run([name, command, args]) {
  const started = performance.now();
  return new Promise((resolve) => {
    // As `npm run` does: the project's own tools first on PATH (buf finds protoc-gen-es there).
    const env = { ...process.env, PATH: `${root}node_modules/.bin:${process.env.PATH ?? ""}` };
    const child = spawn(bin(command), args, { cwd: root, env, stdio: ["ignore", "pipe", "pipe"] });
    let output = "";
    child.stdout.on("data", (d) => (output += d));
    child.stderr.on("data", (d) => (output += d));
    child.on("error", (err) => resolve({ name, code: 1, output: `${output}${err.message}\n`, seconds: 0 }));
    child.on("close", (code) => resolve({ name, code: code ?? 1, output, seconds: (performance.now() - started) / 1000 }));
  });
}

const results = await Promise.all(checks.map(run));
let failed = 0;
for (const { name, code, output, seconds } of results) {
  process.stdout.write(`${code === 0 ? "ok" : "FAILED"}  ${name} (${seconds.toFixed(1)} s)\n`);
  if (output.trim() !== "") process.stdout.write(`${output.trimEnd()}\n`);
  if (code !== 0) failed++;
}
process.exit(failed === 0 ? 0 : 1);
