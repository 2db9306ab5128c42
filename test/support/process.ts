// Helpers for tests that run a real server process (etcd, nats-server).
import type { ChildProcess } from "node:child_process";

/** A TCP port on 127.0.0.1 that was free a moment ago (the stack's own helper). */
export { freePort } from "../../src/stack/index.js";

/** Resolves when `child` has exited (at once if it has). */
export async function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  await new Promise<void>((resolve) => child.once("exit", () => resolve()));
}
