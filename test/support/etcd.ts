/**
 * A real etcd for the discovery tests: one member on 127.0.0.1 with free
 * client and peer ports and a temporary data dir. CI installs etcd (the
 * Debian package etcd-server); a developer machine without it skips, but
 * CI never does.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Etcd3 } from "etcd3";
import { eventually } from "./eventually.js";
import { exited, freePort } from "./process.js";

export interface EtcdServer {
  /** `http://127.0.0.1:PORT`, the client URL. */
  readonly endpoint: string;
  readonly dataDir: string;
  /** Kills the process and keeps the data dir and ports, to `restart` later. */
  halt(): Promise<void>;
  /** Starts etcd again on the same ports and data dir and waits until it answers. */
  restart(): Promise<void>;
  /** Kills the process and removes the data dir. */
  stop(): Promise<void>;
}

/** Whether an `etcd` executable is on PATH. */
export function etcdInstalled(): boolean {
  return spawnSync("etcd", ["--version"], { stdio: "ignore" }).status === 0;
}

/**
 * For a `before` hook: skips the suite when etcd is missing on a developer
 * machine, with a message; with `CI` set, a missing etcd is an error.
 */
export function requireEtcd(context: Mocha.Context): void {
  if (etcdInstalled()) return;
  if (process.env["CI"]) throw new Error("etcd is not installed (CI installs the Debian package etcd-server in .ci/run)");
  console.warn("    etcd is not on PATH: skipping the etcd tests (apt-get install etcd-server to run them)");
  context.skip();
}


/** Starts etcd and waits until a status call answers. */
export async function startEtcd(): Promise<EtcdServer> {
  const [clientPort, peerPort] = [await freePort(), await freePort()];
  const dataDir = mkdtempSync(join(tmpdir(), "mmgate-etcd-"));
  const endpoint = `http://127.0.0.1:${clientPort}`;
  const peer = `http://127.0.0.1:${peerPort}`;
  const args = [
    "--name", "test",
    "--data-dir", dataDir,
    "--listen-client-urls", endpoint,
    "--advertise-client-urls", endpoint,
    "--listen-peer-urls", peer,
    "--initial-advertise-peer-urls", peer,
    "--initial-cluster", `test=${peer}`,
    // A short heartbeat lowers etcd's minimum lease TTL to 1 s.
    "--heartbeat-interval", "50",
    "--election-timeout", "500",
    "--log-level", "error",
  ];
  let child: ChildProcess | undefined;
  let output = "";

  const launch = async () => {
    output = "";
    const started = spawn("etcd", args, { stdio: ["ignore", "pipe", "pipe"] });
    started.stdout?.on("data", (chunk: Buffer) => (output += chunk.toString()));
    started.stderr?.on("data", (chunk: Buffer) => (output += chunk.toString()));
    child = started;
    // A fresh client each try, so no client-side backoff or circuit breaker delays the answer.
    await eventually(
      async () => {
        if (started.exitCode !== null) throw new Error(`etcd exited with ${started.exitCode}: ${output}`);
        const client = new Etcd3({ hosts: endpoint, dialTimeout: 1000 });
        try {
          await client.maintenance.status();
        } finally {
          client.close();
        }
      },
      { timeoutMs: 15000, intervalMs: 50 },
    );
  };
  const halt = async () => {
    const running = child;
    child = undefined;
    if (running === undefined) return;
    running.kill("SIGKILL");
    await exited(running);
  };

  try {
    await launch();
  } catch (error) {
    await halt();
    rmSync(dataDir, { recursive: true, force: true });
    throw error;
  }
  return {
    endpoint,
    dataDir,
    halt,
    restart: launch,
    async stop() {
      await halt();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}
