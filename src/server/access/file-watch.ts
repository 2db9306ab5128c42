/**
 * Tells when one file may have changed: `fs.watch` on its directory (which
 * sees a file replaced by a rename, as atomic writers and Kubernetes'
 * mounted Secrets and ConfigMaps do, where a watch on the file itself would
 * go on watching the old inode), and a periodic stat as a fallback for
 * file systems where watching says nothing (network mounts, some
 * containers). Bursts of events become one call, after they settle.
 */
import { watch, type FSWatcher } from "node:fs";
import { stat } from "node:fs/promises";
import { basename, dirname } from "node:path";

export interface FileWatchOptions {
  /** Quiet time after the last event before `onChange` runs. */
  readonly debounceMs: number;
  /** How often the file is stat'ed for a change the watch missed; 0: never. */
  readonly pollMs: number;
  readonly onChange: () => void;
  /** The directory watch failed (it goes on polling). */
  readonly onWatchError?: (err: Error) => void;
}

/** What a stat says of a file, enough to see it replaced or rewritten; "missing" when it is gone. */
async function signature(file: string): Promise<string> {
  try {
    const s = await stat(file);
    return `${s.ino}:${s.size}:${s.mtimeMs}:${s.ctimeMs}`;
  } catch {
    return "missing";
  }
}

export class FileWatch {
  private watcher: FSWatcher | undefined = undefined;
  private poller: NodeJS.Timeout | undefined = undefined;
  private pending: NodeJS.Timeout | undefined = undefined;
  private last: string | undefined = undefined;
  private closed = false;

  constructor(
    private readonly file: string,
    private readonly options: FileWatchOptions,
  ) {}

  /** Starts watching; nothing keeps the process alive for it. */
  async start(): Promise<void> {
    this.last = await signature(this.file);
    if (this.closed) return;
    const name = basename(this.file);
    try {
      this.watcher = watch(dirname(this.file), { persistent: false }, (_event, changed) => {
        // Some platforms give no name: any change in the directory may be this file's.
        if (changed === null || changed.toString() === name) this.schedule();
      });
      this.watcher.on("error", (err) => {
        this.options.onWatchError?.(err);
        this.watcher?.close();
        this.watcher = undefined;
      });
    } catch (err) {
      this.options.onWatchError?.(err as Error);
    }
    if (this.options.pollMs > 0) {
      this.poller = setInterval(() => void this.poll(), this.options.pollMs);
      this.poller.unref();
    }
  }

  /** Stops watching and polling; a change already scheduled is dropped. */
  close(): void {
    this.closed = true;
    this.watcher?.close();
    this.watcher = undefined;
    clearInterval(this.poller);
    clearTimeout(this.pending);
  }

  private async poll(): Promise<void> {
    const now = await signature(this.file);
    if (now !== this.last) this.schedule();
  }

  private schedule(): void {
    if (this.closed) return;
    clearTimeout(this.pending);
    this.pending = setTimeout(() => {
      void signature(this.file).then((now) => {
        this.last = now;
        if (!this.closed) this.options.onChange();
      });
    }, this.options.debounceMs);
    this.pending.unref();
  }
}
