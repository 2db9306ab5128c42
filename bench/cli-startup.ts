/**
 * Start-up of the mmgate executable: the wall time of `node bin/mmgate.js
 * <command>` from spawn to exit, for `version`, `--help`, and two client
 * commands (`health`, `images providers`) against a server the bench runs
 * as a child (`mmgate serve`, embedded defaults, ephemeral port).
 *
 * Contenders, in the same rounds (order alternating, forward then reversed,
 * after two untimed rounds):
 * - `node -e 0`: Node's own start, the floor under every command;
 * - the default path: the bundle in dist/, which the bench builds first
 *   (scripts/build-cli.mjs, timed) and, before each of these runs and
 *   outside its time, checks is what bin/mmgate.js picks (rebuilding it,
 *   and counting the rebuild, when a source file changed meanwhile);
 * - the sources through tsx (MMGATE_FROM_SOURCE=1): what every command cost
 *   before the bundle.
 * Prints the median and p90 of each, the bundle/tsx ratio (median of the
 * per-round ratios, with their min–max), the cost of the freshness check
 * bin/mmgate.js makes on every start (bin/dist.js, its first call in a fresh
 * process, as bin pays it), and the targets on the default path's median:
 * `version` under 0.5 s, a client command under 1 s.
 *
 * Env: BENCH_ROUNDS (11). Exits 1 when a command fails or the bundle is not
 * fresh after the build. Run: node --import tsx bench/cli-startup.ts
 */
import { spawn, spawnSync } from "node:child_process";
import { performance } from "node:perf_hooks";
import { createInterface } from "node:readline";
import { builtEntry } from "../bin/dist.js";
import { median, ratios, spread } from "./_stats.js";

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 11);
const TARGET_VERSION_S = 0.5;
const TARGET_CLIENT_S = 1;

const root = new URL("..", import.meta.url).pathname;
const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))]!;
const verdict = (met: boolean) => (met ? "met" : "NOT met");
const seconds = (ms: number) => `${(ms / 1000).toFixed(3)} s`;

// Whatever the caller's environment says, the default path is the default.
const baseEnv = { ...process.env, MMGATE_FROM_SOURCE: "" };

/** Runs `node args` in the repo and fails the bench unless it exits 0. */
function run(args: string[], env: NodeJS.ProcessEnv = baseEnv): void {
  const res = spawnSync(process.execPath, args, { cwd: root, env, stdio: ["ignore", "ignore", "pipe"], encoding: "utf8" });
  if (res.status !== 0) throw new Error(`node ${args.join(" ")} exited ${res.status ?? res.signal}: ${res.stderr}`);
}

// The build, timed; afterwards the default path must be the bundle.
const buildStarted = performance.now();
run(["scripts/build-cli.mjs"]);
const buildMs = performance.now() - buildStarted;
let rebuilds = 0;
/** Makes sure bin/mmgate.js will take the bundle: rebuilds when a source file changed since. */
function ensureFresh(): void {
  if (builtEntry() !== undefined) return;
  rebuilds++;
  run(["scripts/build-cli.mjs"]);
  if (builtEntry() === undefined) {
    console.error("dist/ is not fresh right after its build (a source file changing all the time?): the default path would run the sources");
    process.exit(1);
  }
}
ensureFresh();

// The server the client commands call, its log read (and dropped) as it comes.
const server = spawn(process.execPath, ["bin/mmgate.js", "serve", "--listen", "127.0.0.1:0", "--admin-listen", ""], {
  cwd: root,
  env: baseEnv,
  stdio: ["ignore", "pipe", "inherit"],
});
process.once("exit", () => server.kill("SIGTERM"));
const addr = await new Promise<string>((resolve, reject) => {
  createInterface({ input: server.stdout! }).on("line", (line) => {
    if (!line.includes('"mmgate serving"')) return;
    const entry = JSON.parse(line) as { address?: string };
    if (entry.address) resolve(entry.address);
  });
  server.once("exit", (code) => reject(new Error(`mmgate serve exited (${code}) before serving`)));
  setTimeout(() => reject(new Error("mmgate serve did not start within 30 s")), 30_000).unref();
});

/** Targets in seconds; --help has none of its own and is shown for reference. */
const commands: { name: string; args: string[]; target?: number }[] = [
  { name: "version", args: ["version"], target: TARGET_VERSION_S },
  { name: "--help", args: ["--help"] },
  { name: "health", args: ["health", "--addr", addr], target: TARGET_CLIENT_S },
  { name: "images providers", args: ["images", "providers", "--addr", addr], target: TARGET_CLIENT_S },
];
const sourceEnv = { ...baseEnv, MMGATE_FROM_SOURCE: "1" };
/** What is timed, and what has to hold before it (untimed). */
const contenders: { prepare?: () => void; time: () => void }[] = [
  { time: () => run(["-e", "0"]) },
  ...commands.flatMap((c) => [
    { prepare: ensureFresh, time: () => run(["bin/mmgate.js", ...c.args]) },
    { time: () => run(["bin/mmgate.js", ...c.args], sourceEnv) },
  ]),
];
console.log(`cli start-up: ${ROUNDS} rounds (after 2 warm-up rounds) of node -e 0 and each command from the bundle and from the sources, against ${addr}`);
const times = contenders.map(() => [] as number[]);
for (let round = -2; round < ROUNDS; round++) {
  const order = contenders.map((_, i) => i);
  if (round % 2 !== 0) order.reverse();
  for (const i of order) {
    contenders[i]!.prepare?.();
    const t0 = performance.now();
    contenders[i]!.time();
    if (round >= 0) times[i]!.push(performance.now() - t0);
  }
}

// What bin/mmgate.js pays on every start to decide: the first call in a fresh process.
const check = `const { isFresh } = await import(${JSON.stringify(`${root}bin/dist.js`)}); const t = performance.now(); isFresh(); process.stdout.write(String(performance.now() - t));`;
// Fresh, so that it walks everything rather than stopping at the first newer file.
const checkMs = Array.from({ length: ROUNDS }, () => {
  ensureFresh();
  return Number(spawnSync(process.execPath, ["--input-type=module", "-e", check], { cwd: root, encoding: "utf8" }).stdout);
});

server.kill("SIGTERM");

const floor = times[0]!;
const row = (label: string, xs: number[]) => `  ${label.padEnd(18)} median ${seconds(median(xs))}  p90 ${seconds(pct(xs, 90))}`;
console.log(`\nbuild (scripts/build-cli.mjs): ${seconds(buildMs)}`);
console.log(`freshness check (bin/dist.js, first call in a new process): median ${median(checkMs).toFixed(1)} ms, p90 ${pct(checkMs, 90).toFixed(1)} ms`);
console.log(`\n${row("node -e 0", floor)}`);
let missed = 0;
commands.forEach((c, i) => {
  const bundle = times[1 + 2 * i]!;
  const source = times[2 + 2 * i]!;
  const r = ratios(bundle, source);
  const met = c.target === undefined || median(bundle) < c.target * 1000;
  if (!met) missed++;
  console.log(`\nmmgate ${c.name}`);
  console.log(row("bundle (dist/)", bundle));
  console.log(row("sources (tsx)", source));
  console.log(`  bundle/tsx ${median(r).toFixed(2)}x (${spread(r, 2)}); above node -e 0: bundle ${seconds(median(bundle) - median(floor))}, tsx ${seconds(median(source) - median(floor))}`);
  if (c.target !== undefined) console.log(`  target: under ${c.target} s: ${verdict(met)}`);
});
if (rebuilds > 0) console.log(`\nnote: a source file changed during the run; the bundle was rebuilt ${rebuilds} time(s) between runs, untimed`);
console.log(`\n${missed === 0 ? "every target met" : `${missed} target(s) not met`}`);
