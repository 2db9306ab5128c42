/**
 * Running the ffmpeg tools (ffprobe, ffmpeg) as child processes for the video
 * decoder: the encoded input staged where they can seek in it, stdout handed
 * over chunk by chunk, stderr kept up to a bound, the child killed when the
 * caller gives up.
 */
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, open, rm, type FileHandle } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { MediaError } from "./errors.js";

/** Most stderr bytes kept from one tool run (the head: ffmpeg's first errors are the telling ones). */
export const MAX_STDERR_BYTES = 8 * 1024;

/**
 * Encoded media written once to a private file so that both tools can open
 * and seek in it (an MP4 whose index sits at its end cannot be read from a
 * pipe). Where /proc is mounted the file is unlinked as soon as it is open:
 * the tools reopen it through the inherited descriptor (`/proc/self/fd/3`),
 * so nothing is left on disk even if this process dies mid-decode.
 */
export interface StagedInput {
  /** The path to hand to the tool. */
  readonly path: string;
  /** A descriptor the child must inherit as fd 3, when the path refers to it. */
  readonly fd: number | undefined;
  close(): Promise<void>;
}

const PROC_FD = process.platform === "linux" && existsSync("/proc/self/fd");

/** Writes `bytes` to a new private file under `dir` (the OS temp dir by default). */
export async function stageInput(bytes: Uint8Array, dir: string | null): Promise<StagedInput> {
  const parent = dir ?? tmpdir();
  // A server-side failure (missing dir, full disk), not the caller's; the
  // message names the config key and the errno, not server paths.
  const cannotStage = (error: unknown) =>
    new MediaError(
      "VIDEO_DECODER_UNAVAILABLE",
      `Video decoding is unavailable: cannot stage the input (${(error as NodeJS.ErrnoException).code ?? "error"}); check media.video.tempDir`,
    );
  let folder: string;
  try {
    folder = await mkdtemp(join(parent, "mmgate-video-"));
  } catch (error) {
    throw cannotStage(error);
  }
  const file = join(folder, "input");
  let handle: FileHandle | undefined;
  try {
    const opened = await open(file, "wx+", 0o600);
    handle = opened;
    await opened.writeFile(bytes);
    if (PROC_FD) {
      await rm(folder, { recursive: true, force: true });
      return { path: "/proc/self/fd/3", fd: opened.fd, close: () => opened.close() };
    }
    return {
      path: file,
      fd: undefined,
      async close() {
        await opened.close();
        await rm(folder, { recursive: true, force: true });
      },
    };
  } catch (error) {
    await handle?.close().catch(() => undefined);
    await rm(folder, { recursive: true, force: true });
    throw cannotStage(error);
  }
}

export interface ToolRun {
  /** Exit code, null when the child ended on a signal. */
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  /** The first MAX_STDERR_BYTES of stderr, as text. */
  readonly stderr: string;
}

export interface ToolOptions {
  /** "ffmpeg" or "ffprobe": names the tool (and its config key) in errors. */
  readonly tool: "ffmpeg" | "ffprobe";
  readonly input: StagedInput;
  /** Ends the run: the child is killed (SIGKILL) and the run rejects with the signal's reason once it has exited. */
  readonly signal?: AbortSignal | undefined;
  /**
   * Receives stdout as it arrives; the chunk is only valid during the call.
   * A throw kills the child and rejects the run with that error.
   */
  readonly onStdout: (chunk: Buffer) => void;
}

function unavailable(tool: string, path: string, error: NodeJS.ErrnoException): MediaError {
  const key = tool === "ffmpeg" ? "media.video.ffmpegPath" : "media.video.ffprobePath";
  const why = error.code === "ENOENT" ? "not found" : `cannot be run (${error.code ?? error.message})`;
  return new MediaError(
    "VIDEO_DECODER_UNAVAILABLE",
    `Video decoding is unavailable: ${tool} ${why} at '${path}'; install the Debian package ffmpeg or set ${key}`,
  );
}

/**
 * Runs one tool to its end. Resolves with its exit status and stderr head
 * (a non-zero exit is the caller's to judge); rejects when it cannot be
 * started (VIDEO_DECODER_UNAVAILABLE), when `onStdout` throws, or when the
 * signal fires. The promise settles only after the child has exited.
 */
export function runTool(path: string, args: readonly string[], options: ToolOptions): Promise<ToolRun> {
  return new Promise<ToolRun>((resolve, reject) => {
    const { signal, input } = options;
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const stdio: ("ignore" | "pipe" | number)[] = ["ignore", "pipe", "pipe"];
    if (input.fd !== undefined) stdio.push(input.fd);
    const child = spawn(path, args, { stdio, windowsHide: true });
    const stderr: Buffer[] = [];
    let stderrBytes = 0;
    let failure: { error: unknown } | undefined;

    const kill = (error: unknown) => {
      failure ??= { error };
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    };
    const onAbort = () => kill(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });

    child.stdout?.on("data", (chunk: Buffer) => {
      if (failure) return;
      try {
        options.onStdout(chunk);
      } catch (error) {
        kill(error);
      }
    });
    child.stderr?.on("data", (chunk: Buffer) => {
      if (stderrBytes >= MAX_STDERR_BYTES) return;
      const part = chunk.subarray(0, MAX_STDERR_BYTES - stderrBytes);
      stderr.push(part);
      stderrBytes += part.length;
    });
    child.once("error", (error: NodeJS.ErrnoException) => {
      // Failed to spawn (no 'close' follows when nothing was started) or to kill.
      if (child.pid === undefined) {
        signal?.removeEventListener("abort", onAbort);
        reject(error.code === "ENOENT" || error.code === "EACCES" ? unavailable(options.tool, path, error) : error);
      }
    });
    child.once("close", (code, exitSignal) => {
      signal?.removeEventListener("abort", onAbort);
      if (failure) reject(failure.error);
      else resolve({ code, signal: exitSignal, stderr: Buffer.concat(stderr).toString("utf8") });
    });
  });
}

/** The first meaningful line of a tool's stderr, for an error message (without the "[h264 @ 0x…]" context prefix). */
export function firstStderrLine(stderr: string): string {
  const lines = stderr
    .split("\n")
    .map((l) => l.replace(/^\[[^\]]*@ 0x[0-9a-f]+\]\s*/i, "").trim())
    .filter((l) => l.length > 0);
  return lines[0] ?? "";
}

/** "num/den" as the reference converts a rational: num / den in f64; 0 when malformed or den is 0. */
export function parseRational(value: unknown): number {
  if (typeof value !== "string") return 0;
  const m = /^(-?\d+)\/(-?\d+)$/.exec(value.trim());
  if (m === null) return 0;
  const num = Number(m[1]);
  const den = Number(m[2]);
  return den === 0 ? 0 : num / den;
}
