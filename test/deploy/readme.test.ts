/**
 * The README's quick start, followed as a new user would: a generated image
 * through gRPC (the CLI), Connect JSON over plain HTTP/1.1 (the curl line,
 * decoded by the node line it pipes into), the OpenAI-shaped route with
 * plain curl, and the OpenAI SDK (examples/openai-images.mjs). The commands
 * are read from README.md itself, so the README cannot drift from what works.
 * And the README's inventories held to the tree: the Layout lists every
 * folder of src/, the Dependencies section every runtime dependency.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "chai";
import { builtinModules } from "../../src/modules.js";
import { repoRoot, runMmgate, startServer, type InProcessServer } from "../support/index.js";

const PNG_MAGIC = "89504e470d0a1a0a";
const README_ADDR = "127.0.0.1:50051";

/** The README's section under the level-2 heading `title`, up to the next one. */
function readmeSection(title: string): string {
  const readme = readFileSync(join(repoRoot, "README.md"), "utf8");
  const start = readme.indexOf(`\n## ${title}\n`);
  expect(start, `README has a "## ${title}" section`).to.be.above(-1);
  const end = readme.indexOf("\n## ", start + 1);
  return readme.slice(start, end === -1 ? undefined : end);
}

/** The quick start section's shell blocks, with `\`-continued lines joined. */
function quickStartCommands(): string[] {
  const readme = readFileSync(join(repoRoot, "README.md"), "utf8");
  const start = readme.indexOf("\n## Quick start");
  const end = readme.indexOf("\n## ", start + 1);
  expect(start, "README has a Quick start section").to.be.above(-1);
  const section = readme.slice(start, end);
  const blocks = [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
  return blocks
    .join("\n")
    .replace(/\\\n\s*/g, "")
    .split("\n")
    .map((line) => line.trim())
    .filter((line) => line !== "" && !line.startsWith("#"));
}

function commandStartingWith(prefix: string, containing: string): string {
  const found = quickStartCommands().find((c) => c.startsWith(prefix) && c.includes(containing));
  expect(found, `the quick start has a "${prefix} … ${containing}" command`).to.not.equal(undefined);
  return found!;
}

/** The parts of a `curl URL -H 'h: v' -d 'body'` line this test needs: URL, headers, body. */
function parseCurl(line: string): { url: string; headers: Record<string, string>; body: string } {
  const url = /\bhttp:\/\/\S+/.exec(line)?.[0];
  const body = /-d '([^']*)'/.exec(line)?.[1];
  const headers: Record<string, string> = {};
  for (const m of line.matchAll(/-H '([^:']+):\s*([^']*)'/g)) headers[m[1]!.toLowerCase()] = m[2]!;
  if (url === undefined || body === undefined) throw new Error(`cannot read the curl line: ${line}`);
  return { url, headers, body };
}

function run(command: string, args: string[], options: { cwd: string; env?: Record<string, string>; stdin?: string }): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd: options.cwd, env: { ...process.env, ...options.env }, stdio: ["pipe", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code: code ?? 1, stdout, stderr }));
    child.stdin.end(options.stdin ?? "");
  });
}

/** The PNG files in `dir`, checked to be numbered 0 … count - 1 (as `image-0.png` or `fox-0.png`). */
function numberedPngs(dir: string, count: number): string[] {
  const files = pngsIn(dir);
  expect(files.map((f) => Number(/-(\d+)\.png$/.exec(f)?.[1])).sort((a, b) => a - b)).to.deep.equal([...Array(count).keys()]);
  return files;
}

function pngsIn(dir: string): string[] {
  return readdirSync(dir)
    .filter((f) => f.endsWith(".png"))
    .filter((f) => readFileSync(join(dir, f)).subarray(0, 8).toString("hex") === PNG_MAGIC)
    .sort();
}

describe("README quick start: a generated image three ways", function () {
  this.timeout(60_000);
  let server: InProcessServer;
  let work: string;
  before(async () => {
    // The embedded defaults, as `npm start` runs them, on a free port.
    server = await startServer({ modules: builtinModules, config: { images: { reference: { latencyMs: 0 } } } });
  });
  after(() => server?.close());
  beforeEach(() => {
    work = mkdtempSync(join(tmpdir(), "mmgate-readme-"));
  });
  afterEach(() => rmSync(work, { recursive: true, force: true }));
  const here = (url: string) => url.replace(README_ADDR, server.addr);

  it("gRPC: the CLI line writes the images", async () => {
    const line = commandStartingWith("npx mmgate images generate", "--out");
    const args = line.replace(/^npx mmgate /, "").replace(/\s+#.*$/, "");
    // The prompt is quoted in the README; split keeping it whole.
    const argv = [...args.matchAll(/"([^"]*)"|(\S+)/g)].map((m) => m[1] ?? m[2]!);
    const out = join(work, "fox");
    const outAt = argv.indexOf("--out");
    argv[outAt + 1] = out;
    const res = await runMmgate([...argv, "--addr", server.addr]);
    expect(res.code, res.stderr).to.equal(0);
    const count = Number(argv[argv.indexOf("-n") + 1]);
    numberedPngs(out, count);
  });

  it("Connect JSON over HTTP/1.1: the curl line's answer, decoded by the node line it pipes into", async () => {
    const line = commandStartingWith("curl", "ImageService/Generate");
    const [curlPart, decodePart] = line.split(/\s\|\s/);
    const { url, headers, body } = parseCurl(curlPart!);
    const answer = await fetch(here(url), { method: "POST", headers, body });
    expect(answer.status).to.equal(200);
    const text = await answer.text();
    const script = /node -e '([^']*)'/.exec(decodePart ?? "")?.[1];
    expect(script, "the curl line pipes into a node -e decoder").to.be.a("string");
    const decoded = await run(process.execPath, ["-e", script!], { cwd: work, stdin: text });
    expect(decoded.code, decoded.stderr).to.equal(0);
    const n = (JSON.parse(body) as { request: { parameters: { n: number } } }).request.parameters.n;
    numberedPngs(work, n);
  });

  it("the OpenAI-shaped route with plain curl answers OpenAI's shape", async () => {
    const { url, headers, body } = parseCurl(commandStartingWith("curl", "/v1/images/generations"));
    const answer = await fetch(here(url), { method: "POST", headers, body });
    expect(answer.status).to.equal(200);
    const json = (await answer.json()) as { created: number; data: { b64_json: string }[] };
    expect(json.created).to.be.a("number");
    expect(json.data).to.have.length((JSON.parse(body) as { n: number }).n);
    for (const image of json.data) expect(Buffer.from(image.b64_json, "base64").subarray(0, 8).toString("hex")).to.equal(PNG_MAGIC);
  });

  it("the OpenAI SDK: examples/openai-images.mjs writes the images", async () => {
    const line = commandStartingWith("node examples/openai-images.mjs", "");
    const argv = [...line.replace(/\s+#.*$/, "").matchAll(/"([^"]*)"|(\S+)/g)].map((m) => m[1] ?? m[2]!).slice(1);
    argv[0] = join(repoRoot, argv[0]!);
    const res = await run(process.execPath, argv, { cwd: work, env: { MMGATE_URL: `http://${server.addr}` } });
    expect(res.code, res.stderr).to.equal(0);
    numberedPngs(work, Number(argv[2]));
    expect(res.stdout.trim().split("\n")).to.have.length(Number(argv[2]));
  });
});

describe("README inventories", () => {
  it("the Layout lists every folder of src/, each with what it is for, and no other", () => {
    const block = /```\n([\s\S]*?)```/.exec(readmeSection("Layout"))?.[1];
    expect(block, "the Layout section has a plain code block").to.be.a("string");
    const listed = new Map<string, string>();
    for (const line of block!.split("\n")) {
      const m = /^src\/([^/\s]+)\/\s+(\S.*)$/.exec(line);
      if (m) listed.set(m[1]!, m[2]!);
    }
    const folders = readdirSync(join(repoRoot, "src"), { withFileTypes: true })
      .filter((e) => e.isDirectory())
      .map((e) => e.name)
      .sort();
    expect(folders.filter((f) => !listed.has(f)), "src/ folders missing from the README's Layout").to.deep.equal([]);
    expect([...listed.keys()].filter((f) => !folders.includes(f)), "Layout entries for src/ folders that do not exist").to.deep.equal([]);
  });

  it("Dependencies and why names every runtime dependency of package.json, and only packages it declares", () => {
    const pkg = JSON.parse(readFileSync(join(repoRoot, "package.json"), "utf8")) as { dependencies: Record<string, string>; devDependencies: Record<string, string> };
    const named = new Set<string>();
    for (const line of readmeSection("Dependencies and why").split("\n")) {
      const firstCell = /^\|([^|]*)\|/.exec(line)?.[1];
      if (firstCell === undefined) continue;
      for (const m of firstCell.matchAll(/`([^`]+)`/g)) named.add(m[1]!);
    }
    expect(named.size, "the section has a table of packages").to.be.above(0);
    const runtime = Object.keys(pkg.dependencies).sort();
    expect(runtime.filter((d) => !named.has(d)), "runtime dependencies missing from the README's Dependencies and why").to.deep.equal([]);
    const declared = new Set([...runtime, ...Object.keys(pkg.devDependencies)]);
    expect([...named].filter((d) => !declared.has(d)), "packages the section names that package.json does not declare").to.deep.equal([]);
  });
});
