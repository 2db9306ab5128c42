/**
 * Running the mmgate executable from tests: as a child process where the
 * process boundary is what a test is about (exit codes, what reaches stderr,
 * signals), in this process otherwise, which is a hundred times cheaper.
 */
import { execFile } from "node:child_process";
import { main } from "../../src/cli/main.js";
import { repoRoot } from "./server.js";

export interface CliResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

export interface SpawnOptions {
  /** Added to this process's environment. */
  readonly env?: Readonly<Record<string, string>>;
  /** Node options before the script, e.g. `--import` of a fixture. */
  readonly nodeArgs?: readonly string[];
}

/** Runs `node [nodeArgs] bin/mmgate.js ...args`; resolves with its exit code and output, never rejects. */
export function spawnMmgate(args: readonly string[], options: SpawnOptions = {}): Promise<CliResult> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [...(options.nodeArgs ?? []), `${repoRoot}bin/mmgate.js`, ...args],
      { cwd: repoRoot, env: { ...process.env, ...options.env } },
      (err, stdout, stderr) => {
        const code = err ? (typeof err.code === "number" ? err.code : -1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

/**
 * Runs `mmgate ...args` in this process and captures what it writes to
 * stdout and stderr and its exit code. Commander's exits become the exit
 * code; `serve` (which ends its process) is not for this.
 */
export async function runMmgate(args: readonly string[], options: CaptureOptions = {}): Promise<CliResult> {
  return captureOutput(() => main(args, { exitOverride: true }), options);
}

export interface CaptureOptions {
  /** Told about each stdout write as it happens (the result only has the output once `fn` is done). */
  readonly onStdout?: (text: string) => void;
}

/**
 * Runs `fn` with process.stdout and process.stderr writes captured, and
 * process.exitCode reset before and restored after; returns the code `fn` set.
 */
export async function captureOutput(fn: () => Promise<unknown>, options: CaptureOptions = {}): Promise<CliResult> {
  const out: string[] = [];
  const err: string[] = [];
  const writeOut = process.stdout.write;
  const writeErr = process.stderr.write;
  const exitCodeBefore = process.exitCode;
  const capture = (into: string[], onWrite?: (text: string) => void) =>
    ((chunk: string | Uint8Array, ...rest: unknown[]) => {
      const text = typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("utf8");
      into.push(text);
      onWrite?.(text);
      const done = rest.find((r) => typeof r === "function") as (() => void) | undefined;
      done?.();
      return true;
    }) as typeof process.stdout.write;
  process.exitCode = undefined;
  process.stdout.write = capture(out, options.onStdout);
  process.stderr.write = capture(err);
  let code: number;
  try {
    await fn();
  } finally {
    code = Number(process.exitCode ?? 0);
    process.stdout.write = writeOut;
    process.stderr.write = writeErr;
    process.exitCode = exitCodeBefore;
  }
  return { code, stdout: out.join(""), stderr: err.join("") };
}
