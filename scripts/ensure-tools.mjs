// Installs the Debian packages the tests use when they are missing: openssl
// (throwaway TLS certificates), etcd-server (a real etcd for the discovery
// tests), nats-server (a real NATS server for the relay's NATS source;
// Debian puts it in /usr/sbin), ffmpeg (ffprobe and ffmpeg, which the
// media module's video decoder runs) and prometheus (its promtool checks
// deploy/prometheus/alerts.yaml) and chromium (the browser the console's
// tests in test/browser drive). `npm test` runs it first, so a fresh
// machine needs nothing by hand.
// Without apt-get or root it says what is missing and leaves the tests to
// skip (or, with CI set, to fail).
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";

const tools = [
  { command: "openssl", pkg: "openssl" },
  { command: "etcd", pkg: "etcd-server" },
  { command: "nats-server", pkg: "nats-server" },
  { command: "ffmpeg", pkg: "ffmpeg" },
  { command: "ffprobe", pkg: "ffmpeg" },
  { command: "promtool", pkg: "prometheus" },
  { command: "chromium", pkg: "chromium" },
];

// /usr/sbin is not on every user's PATH, and Debian's nats-server lives there.
const has = (command) =>
  spawnSync("sh", ["-c", `command -v ${command}`], { stdio: "ignore" }).status === 0 || existsSync(`/usr/sbin/${command}`);
const missing = tools.filter((t) => !has(t.command));
if (missing.length > 0) {
  const packages = [...new Set(missing.map((t) => t.pkg))];
  const root = typeof process.getuid === "function" && process.getuid() === 0;
  if (root && has("apt-get")) {
    process.stdout.write(`installing ${packages.join(", ")} (apt-get)\n`);
    const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
    execFileSync("apt-get", ["update", "-qq"], { stdio: "inherit", env });
    execFileSync("apt-get", ["install", "-y", "-qq", ...packages], { stdio: ["ignore", "ignore", "inherit"], env });
  } else {
    process.stderr.write(`missing ${packages.join(", ")}: install them (Debian: apt-get install ${packages.join(" ")}) or the tests that need them skip\n`);
  }
}
