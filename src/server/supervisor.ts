import type { Logger } from "pino";
import { Counter, type Registry } from "prom-client";
import { backoffDelay, delay, registeredMetric, settleWithin } from "../util/index.js";

/** Restart policy of one supervised task. */
export interface TaskOptions {
  /** First wait before a restart (default 100 ms); doubles with each failure in a row. */
  readonly minBackoffMs?: number;
  /** Longest wait between restarts (default 30 s). */
  readonly maxBackoffMs?: number;
  /**
   * A run that lasted this long counts as healthy, and the next failure
   * starts again from `minBackoffMs` (default 60 s).
   */
  readonly resetAfterMs?: number;
}

const DEFAULT_TASK_OPTIONS: Required<TaskOptions> = { minBackoffMs: 100, maxBackoffMs: 30_000, resetAfterMs: 60_000 };

/**
 * The wait before restart number `failures` (1-based): the project's one
 * backoff (src/util's backoffDelay), from `minBackoffMs` up to
 * `maxBackoffMs`, jittered so that many processes restarting at once spread
 * out.
 */
export function restartBackoffMs(failures: number, options: Required<TaskOptions>, random: () => number = Math.random): number {
  return backoffDelay(failures - 1, { minMs: options.minBackoffMs, maxMs: options.maxBackoffMs }, random);
}

function taskMetrics(registry: Registry): Counter<"module" | "task"> {
  const name = "mmgate_task_restarts_total";
  return registeredMetric(
    registry,
    name,
    Counter<"module" | "task">,
    () =>
      new Counter({
        name,
        help: "Supervised background tasks restarted after they threw, by module and task",
        labelNames: ["module", "task"] as const,
        registers: [registry],
      }),
  );
}

interface RunningTask {
  readonly name: string;
  readonly done: Promise<void>;
}

/**
 * Runs a module's long-running tasks: logs each failure, restarts with a
 * bounded jittered backoff, and stops them all on `stop()`, which waits for
 * them to return. A task started after `stop()` never runs.
 */
export class Supervisor {
  private readonly controller = new AbortController();
  private readonly tasks = new Set<RunningTask>();
  private readonly restarts: Counter<"module" | "task">;

  constructor(
    private readonly module: string,
    private readonly logger: Logger,
    registry: Registry,
  ) {
    this.restarts = taskMetrics(registry);
  }

  get stopped(): boolean {
    return this.controller.signal.aborted;
  }

  /** Names of the tasks still running. */
  running(): string[] {
    return [...this.tasks].map((t) => t.name);
  }

  run(name: string, task: (signal: AbortSignal) => Promise<void>, options: TaskOptions = {}): void {
    if (this.stopped) {
      this.logger.warn({ task: name }, "task not started: the module is stopping");
      return;
    }
    const policy = { ...DEFAULT_TASK_OPTIONS, ...options };
    const entry: RunningTask = { name, done: this.loop(name, task, policy) };
    this.tasks.add(entry);
    void entry.done.finally(() => this.tasks.delete(entry));
  }

  private async loop(name: string, task: (signal: AbortSignal) => Promise<void>, policy: Required<TaskOptions>): Promise<void> {
    const signal = this.controller.signal;
    let failures = 0;
    while (!signal.aborted) {
      const started = performance.now();
      try {
        await task(signal);
        return;
      } catch (err) {
        if (signal.aborted) return;
        failures = performance.now() - started >= policy.resetAfterMs ? 1 : failures + 1;
        const waitMs = restartBackoffMs(failures, policy);
        this.logger.error({ err, task: name, failures, restartInMs: waitMs }, "task failed; restarting");
        this.restarts.inc({ module: this.module, task: name });
        try {
          await delay(waitMs, signal);
        } catch {
          return;
        }
      }
    }
  }

  /**
   * Fires every task's signal and waits for them to return, at most
   * `timeoutMs`; a task that ignores its signal is logged and left behind.
   */
  async stop(timeoutMs: number): Promise<void> {
    this.controller.abort();
    if (this.tasks.size === 0) return;
    const stopped = await settleWithin(Promise.allSettled([...this.tasks].map((t) => t.done)), timeoutMs);
    if (!stopped) this.logger.error({ tasks: this.running() }, "tasks ignored their stop signal");
  }
}
