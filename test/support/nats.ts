/**
 * A real NATS server for the relay's NATS source tests: one nats-server on
 * 127.0.0.1 with a free port. CI installs it (the Debian package
 * nats-server, whose binary is /usr/sbin/nats-server, not always on a
 * user's PATH); a developer machine without it skips, but CI never does.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { eventually } from "./eventually.js";
import { natsGreets } from "../../src/stack/index.js";
import { exited, freePort } from "./process.js";

export interface NatsServer {
  readonly port: number;
  /** `nats://127.0.0.1:PORT`. */
  readonly url: string;
  /** Kills the process and keeps the port, to `restart` later. */
  halt(): Promise<void>;
  /** Starts nats-server again on the same port and waits until it accepts clients. */
  restart(): Promise<void>;
  /** Kills the process and removes its config file (and its JetStream store). */
  stop(): Promise<void>;
}

export interface NatsServerOptions {
  /** A token every client must present (`--auth`). */
  readonly token?: string;
  /** A configuration file's text (users, permissions), written to a temporary file. */
  readonly config?: string;
  /** The port to listen on (another server's, after it halted); a free one by default. */
  readonly port?: number;
  /**
   * JetStream on (`-js`), its store in a temporary directory that outlives
   * `halt` / `restart` (streams survive a server restart) and `stop` removes.
   */
  readonly jetstream?: boolean;
}

/** The nats-server executable: on PATH, or where Debian installs it; undefined when there is none. */
function natsServerCommand(): string | undefined {
  for (const command of ["nats-server", "/usr/sbin/nats-server"]) {
    if (command.startsWith("/") && !existsSync(command)) continue;
    if (spawnSync(command, ["--version"], { stdio: "ignore" }).status === 0) return command;
  }
  return undefined;
}

/** Whether a nats-server executable is installed. */
export function natsInstalled(): boolean {
  return natsServerCommand() !== undefined;
}

/**
 * For a `before` hook: skips the suite when nats-server is missing on a
 * developer machine, with a message; with `CI` set, a missing nats-server is
 * an error.
 */
export function requireNats(context: Mocha.Context): void {
  if (natsInstalled()) return;
  if (process.env["CI"]) throw new Error("nats-server is not installed (scripts/ensure-tools.mjs installs the Debian package nats-server)");
  console.warn("    nats-server is not installed: skipping the NATS tests (apt-get install nats-server to run them)");
  context.skip();
}



/** Starts nats-server and waits until it greets a client. */
export async function startNats(options: NatsServerOptions = {}): Promise<NatsServer> {
  const command = natsServerCommand();
  if (command === undefined) throw new Error("nats-server is not installed");
  const port = options.port ?? (await freePort());
  let configDir: string | undefined;
  let storeDir: string | undefined;
  const args = ["--addr", "127.0.0.1", "--port", String(port)];
  // No monitoring port; JetStream only when asked for: core NATS is all the core source uses.
  if (options.jetstream === true) {
    storeDir = mkdtempSync(join(tmpdir(), "mmgate-nats-js-"));
    args.push("--jetstream", "--store_dir", storeDir);
  }
  if (options.token !== undefined) args.push("--auth", options.token);
  if (options.config !== undefined) {
    configDir = mkdtempSync(join(tmpdir(), "mmgate-nats-"));
    const file = join(configDir, "nats.conf");
    writeFileSync(file, options.config);
    args.push("--config", file);
  }
  const removeConfig = () => {
    if (configDir !== undefined) rmSync(configDir, { recursive: true, force: true });
    if (storeDir !== undefined) rmSync(storeDir, { recursive: true, force: true });
  };
  let child: ChildProcess | undefined;
  let output = "";

  const launch = async () => {
    output = "";
    const started = spawn(command, args, { stdio: ["ignore", "pipe", "pipe"] });
    started.stdout?.on("data", (chunk: Buffer) => (output += chunk.toString()));
    started.stderr?.on("data", (chunk: Buffer) => (output += chunk.toString()));
    child = started;
    await eventually(
      async () => {
        if (started.exitCode !== null) throw new Error(`nats-server exited with ${started.exitCode}: ${output}`);
        await natsGreets(port);
      },
      { timeoutMs: 15000, intervalMs: 20 },
    );
  };
  const halt = async () => {
    const running = child;
    child = undefined;
    if (running === undefined) return;
    running.kill("SIGKILL");
    await exited(running);
  };

  const stop = async () => {
    await halt();
    removeConfig();
  };
  try {
    await launch();
  } catch (error) {
    await stop();
    throw error;
  }
  return { port, url: `nats://127.0.0.1:${port}`, halt, restart: launch, stop };
}
