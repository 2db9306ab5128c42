/** What every part of `mmgate images` shares: where it writes, and how it names itself and a failure. */
import type { Writable } from "node:stream";

export interface CliIo {
  readonly out: Writable;
  readonly err: Writable;
  /** Whether progress bars are drawn (a terminal on stderr). */
  readonly progress: boolean;
}

/** The command errors and warnings of a generate call are reported under. */
export const COMMAND = "images generate";

export function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
