import { Command, InvalidArgumentError, Option } from "commander";
import { stringify as toYaml } from "yaml";
import { builtinModules, modulesOf } from "../modules.js";
import { ConfigError, hostPort, loadConfig, parseScalar, redactedConfig, startHost, type ServiceModule } from "../server/index.js";
import { createLogger } from "./logger.js";
import { version } from "../version.js";
import { CliError, EXIT, reportError, reportWarning, withExitCodes } from "../rpc/index.js";
import { resolveTracingSettings, startTracing, TelemetryConfigError } from "../telemetry/index.js";

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
  /** The flag behind each key `overrides` sets, for config errors (`router.relays` → `--relay`). */
  readonly overrideFlags?: Readonly<Record<string, string>>;
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
    extraModules: async () => modulesOf("router"),
    options: [new Option("--relay <host:port>", "a KV relay to mirror (repeatable; else router.relays from the config or MMGATE_ROUTER__RELAYS)").argParser(collectRelay)],
    overrides: (opts) => (Array.isArray(opts.relay) ? { "router.relays": opts.relay } : {}),
    overrideFlags: { "router.relays": "--relay" },
  },
];

export function serveCommand(role?: ServeRole): Command {
  const name = role?.name ?? "serve";
  const command = new Command(name)
    .description(role?.description ?? "serve the services of every configured module on one listener (embedded defaults without a config file)")
    .addOption(new Option("-c, --config <file>", "JSON or YAML config file").env("MMGATE_CONFIG"))
    .option("--listen <host:port>", "gRPC listener (default 127.0.0.1:50051)")
    .option("--admin-listen <host:port>", 'admin HTTP listener for /metrics, /healthz, /readyz ("" turns it off; default 127.0.0.1:9464)');
  for (const option of role?.options ?? []) command.addOption(option);
  command
    .addOption(
      new Option("--modules <names>", `modules to run, as a,b or a JSON array (known: ${builtinModules.map((m) => m.name).join(", ") || "none"})`).hideHelp(
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
      // Config errors name the flag a value came from; --set KEY is the default.
      const overrideOrigins: Record<string, string> = {};
      const flag = (key: string, value: unknown, origin: string) => {
        if (value === undefined) return;
        overrides[key] = value;
        overrideOrigins[key] = origin;
      };
      flag("listen", opts.listen, "--listen");
      flag("adminListen", opts.adminListen, "--admin-listen");
      // A role's modules are the role: they beat the file, the environment and --modules.
      flag("modules", role ? [...role.modules] : opts.modules, role ? `mmgate ${role.name}` : "--modules");
      flag("services", opts.services, "--services");
      flag("log.level", opts.logLevel, "--log-level");
      for (const [key, value] of Object.entries(role?.overrides?.(opts as unknown as Record<string, unknown>) ?? {})) {
        const named = role?.overrideFlags !== undefined && Object.hasOwn(role.overrideFlags, key) ? role.overrideFlags[key] : undefined;
        flag(key, value, named ?? `--set ${key}`);
      }
      const warnings: string[] = [];
      let config;
      try {
        config = loadConfig({ file: opts.config, env: process.env, overrides, overrideOrigins, onWarning: (m) => warnings.push(m) }, modules);
      } catch (err) {
        // Nothing runs yet: main prints the error and sets the exit code.
        if (err instanceof ConfigError) throw new CliError("config", err.message, { exitCode: EXIT.usage });
        throw err;
      }
      if (opts.printConfig) {
        for (const w of warnings) reportWarning(process.stderr, name, w);
        const printed = redactedConfig(config);
        process.stdout.write(opts.format === "yaml" ? toYaml(printed) : `${JSON.stringify(printed, null, 2)}\n`);
        return;
      }
      let tracing;
      try {
        tracing = resolveTracingSettings(config.telemetry.tracing, process.env);
      } catch (err) {
        if (err instanceof TelemetryConfigError) throw new CliError("config", err.message, { exitCode: EXIT.usage });
        throw err;
      }
      // Log lines carry trace_id and span_id only while spans are made.
      const logger = await createLogger(config.log, undefined, { traceIds: tracing.enabled });
      for (const w of warnings) logger.warn(w);
      // Before the host: its interceptors and the modules' channels look once whether tracing is on. The host flushes it at shutdown.
      if (tracing.enabled) await startTracing(tracing, { logger, version });
      let host;
      try {
        host = await startHost({ config, modules, logger, version });
      } catch (err) {
        // Start-up failures an operator can fix: name them, no stack trace.
        const e = err as NodeJS.ErrnoException;
        if (err instanceof ConfigError || (typeof e.code === "string" && /^E[A-Z]+$/.test(e.code))) {
          const code = reportError(process.stderr, name, err instanceof ConfigError ? new CliError("config", err.message, { exitCode: EXIT.usage }) : err);
          logger.flush();
          process.exit(code);
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
  return withExitCodes(command, {
    [EXIT.ok]: "stopped by SIGTERM or SIGINT after the drain (with --print-config: printed)",
    [EXIT.failure]: "could not start (a port in use, an unreadable TLS file), or stopped after an uncaught exception",
    [EXIT.usage]: "usage error, or an invalid configuration (each field named, with where its value came from)",
  });
}
