import { Command, InvalidArgumentError, Option } from "commander";
import { pino } from "pino";
import { stringify as toYaml } from "yaml";
import { builtinModules } from "../modules.js";
import { ConfigError, hostPort, loadConfig, parseScalar, redactedConfig, startHost, type ServiceModule } from "../server/index.js";
import { version } from "../version.js";

interface ServeOptions {
  config?: string;
  listen?: string;
  adminListen?: string;
  modules?: string;
  services?: string;
  logLevel?: string;
  set: Record<string, unknown>;
  printConfig?: boolean;
  format: "json" | "yaml";
}

function collectSet(value: string, previous: Record<string, unknown>): Record<string, unknown> {
  const eq = value.indexOf("=");
  if (eq <= 0) throw new InvalidArgumentError("expected KEY=VALUE, e.g. limits.maxConcurrentStreams=200");
  return { ...previous, [value.slice(0, eq)]: parseScalar(value.slice(eq + 1)) };
}

/** A role that serves a fixed set of modules, e.g. `mmgate encode-worker`. */
export interface ServeRole {
  readonly name: string;
  readonly description: string;
  readonly modules: readonly string[];
  /**
   * Loads the modules this role runs that are not builtin: `serve` does not
   * know them, so they never run there (the router, which needs relays to
   * mirror).
   */
  readonly extraModules?: () => Promise<readonly ServiceModule[]>;
  /** The role's own options, e.g. the router's --relay. */
  readonly options?: readonly Option[];
  /** Config overrides from the role's own options (over --set). */
  readonly overrides?: (opts: Record<string, unknown>) => Record<string, unknown>;
}

function collectRelay(value: string, previous: readonly string[] | undefined): string[] {
  const parsed = hostPort.safeParse(value);
  if (!parsed.success) throw new InvalidArgumentError(parsed.error.issues[0]?.message ?? "expected HOST:PORT");
  return [...(previous ?? []), value];
}

/** The roles a deployment spreads over machines; `serve` runs every builtin module at once. */
export const serveRoles: readonly ServeRole[] = [
  { name: "encode-worker", description: "serve an Encode worker (modules media and encodeWorker)", modules: ["media", "encodeWorker"] },
  { name: "token-worker", description: "serve the demo token worker (module tokenWorker)", modules: ["tokenWorker"] },
  {
    name: "router",
    description: "serve KV overlap queries (mmgate.kvrouter.v1.OverlapService) over the pools of one or more KV relays (module router)",
    modules: ["router"],
    extraModules: async () => [(await import("../relay/router/index.js")).routerModule],
    options: [new Option("--relay <host:port>", "a KV relay to mirror (repeatable; else router.relays from the config or MMGATE_ROUTER__RELAYS)").argParser(collectRelay)],
    overrides: (opts) => (Array.isArray(opts.relay) ? { "router.relays": opts.relay } : {}),
  },
];

export function serveCommand(role?: ServeRole): Command {
  const command = new Command(role?.name ?? "serve")
    .description(role?.description ?? "serve the services of every configured module on one listener (embedded defaults without a config file)")
    .addOption(new Option("-c, --config <file>", "JSON or YAML config file").env("MMGATE_CONFIG"))
    .option("--listen <host:port>", "gRPC listener (default 127.0.0.1:50051)")
    .option("--admin-listen <host:port>", 'admin HTTP listener for /metrics, /healthz, /readyz ("" turns it off; default 127.0.0.1:9464)');
  for (const option of role?.options ?? []) command.addOption(option);
  command
    .addOption(
      new Option("--modules <names>", `comma-separated modules to run (known: ${builtinModules.map((m) => m.name).join(", ") || "none"})`).hideHelp(
        role !== undefined,
      ),
    )
    .addOption(new Option("--services <names>", "old name of --modules").hideHelp())
    .option("--log-level <level>", "fatal, error, warn, info, debug, trace or silent")
    .option("--set <key=value>", "set any config key, e.g. --set shutdown.graceMs=2000 (repeatable)", collectSet, {})
    .option("--print-config", "print the effective config (secrets redacted) and exit")
    .addOption(new Option("--format <format>", "--print-config output format").choices(["json", "yaml"]).default("json"))
    .action(async (opts: ServeOptions) => {
      const modules: readonly ServiceModule[] = [...builtinModules, ...((await role?.extraModules?.()) ?? [])];
      const overrides: Record<string, unknown> = { ...opts.set };
      // A role's modules are the role: they beat the file, the environment and --modules.
      if (role) opts.modules = role.modules.join(",");
      if (opts.listen !== undefined) overrides.listen = opts.listen;
      if (opts.adminListen !== undefined) overrides.adminListen = opts.adminListen;
      if (opts.modules !== undefined) overrides.modules = opts.modules;
      if (opts.services !== undefined) overrides.services = opts.services;
      if (opts.logLevel !== undefined) overrides["log.level"] = opts.logLevel;
      if (role?.overrides) Object.assign(overrides, role.overrides(opts as unknown as Record<string, unknown>));
      const warnings: string[] = [];
      let config;
      try {
        config = loadConfig({ file: opts.config, env: process.env, overrides, onWarning: (m) => warnings.push(m) }, modules);
      } catch (err) {
        if (err instanceof ConfigError) {
          process.stderr.write(`mmgate: ${err.message}\n`);
          process.exit(2);
        }
        throw err;
      }
      if (opts.printConfig) {
        for (const w of warnings) process.stderr.write(`mmgate: warning: ${w}\n`);
        const printed = redactedConfig(config);
        process.stdout.write(opts.format === "yaml" ? toYaml(printed) : `${JSON.stringify(printed, null, 2)}\n`);
        return;
      }
      const logger = pino({ level: config.log.level, base: { pid: process.pid }, timestamp: pino.stdTimeFunctions.isoTime });
      for (const w of warnings) logger.warn(w);
      let host;
      try {
        host = await startHost({ config, modules, logger, version });
      } catch (err) {
        // Start-up failures an operator can fix: name them, no stack trace.
        const e = err as NodeJS.ErrnoException;
        if (err instanceof ConfigError || (typeof e.code === "string" && /^E[A-Z]+$/.test(e.code))) {
          process.stderr.write(`mmgate: ${e.message}\n`);
          logger.flush();
          process.exit(err instanceof ConfigError ? 2 : 1);
        }
        throw err;
      }
      let stopping = false;
      let exitCode = 0;
      const stop = (reason: string) => {
        if (stopping) {
          logger.warn({ reason }, "shutdown already in progress; it ends within the grace period");
          return;
        }
        stopping = true;
        logger.info({ reason }, "shutdown requested");
        void host.shutdown();
      };
      process.on("SIGTERM", () => stop("SIGTERM"));
      process.on("SIGINT", () => stop("SIGINT"));
      // A stray rejection is a bug to log, not a reason to drop every call in flight.
      process.on("unhandledRejection", (err) => logger.error({ err }, "unhandled promise rejection"));
      // After an uncaught exception the process state is unknown: drain what is in
      // flight within the grace, then exit 1 so a supervisor restarts it.
      process.on("uncaughtException", (err) => {
        logger.fatal({ err }, "uncaught exception");
        exitCode = 1;
        stop("uncaughtException");
      });
      await host.closed;
      logger.flush();
      process.exit(exitCode);
    });
  return command;
}
