/**
 * `mmgate stack up`: the whole stack on one machine, started with one
 * command (`npm run stack`), until Ctrl-C. The library behind it is
 * startStack (stack.ts); this file is the terminal around it: options,
 * progress, the table, signals and exit codes.
 */
import { Command, InvalidArgumentError, Option } from "commander";
import { CliError, EXIT, reportError, reportWarning, withExitCodes } from "../rpc/index.js";
import { StackBusyError } from "./layout.js";
import { describeExit, MissingToolError, RoleStartError } from "./processes.js";
import { MAX_WORKERS, MIN_WORKERS, STACK_LOG_LEVELS, startStack, type Stack, type StackLogLevel, type StopReport } from "./stack.js";
import { shownPath, stackCommandsText, stackTable } from "./table.js";

export interface StackCliIo {
  readonly out: { write(text: string): unknown };
  readonly err: { write(text: string): unknown };
}

interface UpOptions {
  dir: string;
  workers: number;
  tls: boolean;
  logLevel: StackLogLevel;
}

const COMMAND = "stack up";

/** Exit code of a start interrupted by Ctrl-C, as a shell reports SIGINT. */
export const EXIT_INTERRUPTED = 130;

/** A second signal within this long of the first is the same Ctrl-C (npm forwards the terminal's SIGINT it also got). */
const SAME_SIGNAL_MS = 1000;

function parseWorkers(text: string): number {
  const n = Number(text);
  if (!/^[0-9]+$/.test(text) || n < MIN_WORKERS || n > MAX_WORKERS) throw new InvalidArgumentError(`--workers must be an integer from ${MIN_WORKERS} to ${MAX_WORKERS}`);
  return n;
}

/** A start failure as the one error line, with the failing role's log tail. */
export function startFailure(err: unknown): unknown {
  if (err instanceof MissingToolError) return new CliError("failed_precondition", err.message);
  if (err instanceof StackBusyError) return new CliError("failed_precondition", err.message);
  if (err instanceof RoleStartError) {
    const details = err.logTail.length > 0 ? [`last lines of ${shownPath(err.logFile)}:`, ...err.logTail.map((line) => `  ${line}`)] : [];
    return new CliError("unavailable", `could not start ${err.message}; everything started so far is stopped`, {
      details,
      hints: err.logFile !== "" ? [`the whole log: ${shownPath(err.logFile)}`] : [],
    });
  }
  return err;
}

function stopSummary(report: StopReport): string {
  const parts = report.roles.map((r) => `${r.name}${r.result === "killed" ? " (SIGKILL)" : ""}`);
  const slowest = Math.max(0, ...report.roles.map((r) => r.ms));
  return `stopped ${parts.join(", ")}; the slowest took ${(slowest / 1000).toFixed(1)} s\n`;
}

/** Runs `stack up` until a signal; resolves with the exit code. */
export async function stackUp(o: UpOptions, io: StackCliIo): Promise<number> {
  const abort = new AbortController();
  let stack: Stack | undefined;
  let firstSignalAt: number | undefined;
  let forced = false;
  let requestStop!: () => void;
  const stopRequested = new Promise<void>((resolve) => (requestStop = resolve));
  const onSignal = (signal: NodeJS.Signals) => {
    const now = Date.now();
    if (firstSignalAt === undefined) {
      firstSignalAt = now;
      io.err.write(`\nmmgate ${COMMAND}: ${signal}: draining and stopping in order (hop and images, router, token worker, Encode workers, relay, nats-server, etcd); Ctrl-C again kills everything at once\n`);
      abort.abort();
      requestStop();
      return;
    }
    if (now - firstSignalAt < SAME_SIGNAL_MS || forced) return;
    forced = true;
    io.err.write(`mmgate ${COMMAND}: ${signal} again: killing every process now\n`);
    void stack?.killAll();
  };
  // SIGHUP too: a closed terminal stops the stack in order rather than orphaning it.
  const signals: NodeJS.Signals[] = ["SIGINT", "SIGTERM", "SIGHUP"];
  for (const signal of signals) process.on(signal, onSignal);
  try {
    try {
      stack = await startStack({
        dir: o.dir,
        workers: o.workers,
        tls: o.tls,
        logLevel: o.logLevel,
        signal: abort.signal,
        onCreated: (created) => (stack = created),
        onProgress: (message) => io.err.write(`mmgate ${COMMAND}: ${message}\n`),
        onRoleExit: (role, status) =>
          reportWarning(io.err, COMMAND, `${role.name} (pid ${role.pid}) exited (${describeExit(status)}) while the stack runs; its log: ${shownPath(role.logFile)}`),
      });
    } catch (err) {
      if (abort.signal.aborted) {
        io.err.write(`mmgate ${COMMAND}: interrupted while starting; everything started so far is stopped\n`);
        return forced ? EXIT.failure : EXIT_INTERRUPTED;
      }
      return reportError(io.err, COMMAND, startFailure(err));
    }
    io.out.write(`\nmmgate stack: ${stack.roles.length} processes on 127.0.0.1, ${stack.tls ? "TLS with a fresh CA" : "cleartext (--no-tls)"}\n\n`);
    io.out.write(stackTable(stack));
    io.out.write(`\n${stackCommandsText(stack)}\nCtrl-C drains and stops everything in order (a second Ctrl-C kills it all at once).\n`);
    await stopRequested;
    const report = await stack.stop();
    io.err.write(`mmgate ${COMMAND}: ${stopSummary(report)}`);
    return forced || !report.clean ? EXIT.failure : EXIT.ok;
  } finally {
    for (const signal of signals) process.off(signal, onSignal);
  }
}

const STACK_HELP = `
The whole stack on one machine, each part its own process on 127.0.0.1:

  etcd, nats-server   the host's (Debian packages etcd-server, nats-server), data under DIR;
                      nats-server with JetStream on (-js -sd DIR/nats)
  relay               KV relay (module relay), one pool "default", also fed from NATS
                      JetStream (stream MMGATE_KV_EVENTS on subject kv.events.default,
                      durable consumer mmgate-relay-default)
  router              mirrors the relay's pools (mmgate router, OverlapService)
  encoder-1..N        Encode workers (modules media, encodeWorker), registered in etcd
                      under /mmgate/stack/encoder/encode/encoder-<i>
  token-worker        the demo token worker (module tokenWorker)
  hop                 the encode hop (module encodeHop): Encode workers from etcd,
                      downstream the token worker
  images              the image API (module images) with the reference provider

'mmgate stack up' writes, under DIR: a fresh CA and server certificate (tls/, made with
openssl; SAN IP:127.0.0.1, DNS:localhost), a token (token; both 0600), each role's
config file (<role>.yaml, run as 'node bin/mmgate.js serve -c DIR/<role>.yaml'; the
router as 'mmgate router -c'), each process's log (logs/<role>.log, JSON), a sample
multimodal request (request.json), router events (events.jsonl) and the pid file
(stack.pid). Every role listens on a port the kernel picks, requires the token for
mutating and admin methods and serves TLS (cleartext h2c with --no-tls); roles start in
dependency order, each serving before the next that needs it, and the hop has admitted
every Encode worker before the stack counts as up. It then prints what runs where
(addresses, pids, logs, the token, the CA) and commands to try, and runs until SIGINT,
SIGTERM or SIGHUP: Ctrl-C drains and stops every process in order (hop and images,
router, token worker, Encode workers, relay, nats-server, etcd; SIGTERM, SIGKILL after a
grace), and nothing is left running. A second Ctrl-C (a second or more later) kills
everything at once.

A DIR whose stack still runs (its stack.pid names a live process) is refused; an
earlier stack's leftovers in it (processes, the files above) are removed first, nothing
else. The roles get this environment without its MMGATE_* variables.
`;

const STACK_UP_SUMMARY = `
mmgate stack up [--dir DIR] [--workers N] [--no-tls] [--log-level L]
  --dir DIR          state directory (default .mmgate-stack in the current directory)
  --workers N        Encode workers, ${MIN_WORKERS}..${MAX_WORKERS} (default 3)
  --no-tls           cleartext h2c: no CA, no certificates
  --log-level L      ${STACK_LOG_LEVELS.join(", ")} (default info)
Exit codes of 'mmgate stack up': 0 stopped cleanly, 1 failed to start (everything started so
far is stopped, the failing role's log tail printed) or not stopped cleanly, 2 usage,
130 interrupted while starting. npm run stack is 'node bin/mmgate.js stack up'.
`;

export function stackCommand(io: StackCliIo = { out: process.stdout, err: process.stderr }): Command {
  const stack = new Command("stack")
    .description("the whole stack on one machine (etcd, nats-server, relay, router, Encode workers, token worker, hop, images), started with one command")
    .addHelpText("after", STACK_HELP + STACK_UP_SUMMARY);
  const up = stack
    .command("up")
    .description("start the whole stack on 127.0.0.1, print what runs where and commands to try, and run until Ctrl-C (then stop everything in order)")
    .addOption(new Option("--dir <dir>", "state directory: certificates, token, config files, logs, data").default(".mmgate-stack"))
    .addOption(new Option("--workers <n>", `Encode workers (${MIN_WORKERS}..${MAX_WORKERS})`).default(3).argParser(parseWorkers))
    .option("--no-tls", "serve cleartext h2c: no CA, no certificates")
    .addOption(
      new Option("--log-level <level>", "the roles' log level (the stack reads each role's \"mmgate serving\" line, logged at info)").choices([...STACK_LOG_LEVELS]).default("info"),
    )
    .action(async (o: UpOptions) => {
      process.exitCode = await stackUp(o, io);
    });
  up.addHelpText("after", STACK_HELP);
  withExitCodes(up, {
    [EXIT.ok]: "stopped cleanly by SIGINT or SIGTERM: every process exited on SIGTERM",
    [EXIT.failure]:
      "failed to start (a tool missing, DIR in use by a running stack, a role not serving: everything started so far is stopped, the failing role's log tail printed); or a process needed SIGKILL to stop, or a second Ctrl-C killed everything",
    [EXIT_INTERRUPTED]: "interrupted by Ctrl-C while starting; everything started so far is stopped",
  });
  return stack;
}
