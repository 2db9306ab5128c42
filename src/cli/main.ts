/**
 * The mmgate executable. Each subcommand's module is imported only when that
 * subcommand runs, so `mmgate version`, `mmgate --help` and `mmgate health`
 * never load sharp, the image providers or the media decoder. The root help
 * lists every subcommand from the table below without importing it.
 */
import { Command, Help, type CommanderError } from "commander";
import type * as rpc from "../rpc/index.js";
import { version } from "../version.js";

/** A subcommand the root help lists, and how to build the real one. */
export interface LazySubcommand {
  readonly name: string;
  readonly description: string;
  /** The root help's term for it, as commander prints it for the real command ("serve [options]"). */
  readonly term: string;
  readonly load: () => Promise<Command>;
}

export const subcommands: readonly LazySubcommand[] = [
  {
    name: "serve",
    description: "serve the services of every configured module on one listener (embedded defaults without a config file)",
    term: "serve [options]",
    load: async () => (await import("./serve.js")).serveCommand(),
  },
  {
    name: "encode-worker",
    description: "serve an Encode worker (modules media and encodeWorker)",
    term: "encode-worker [options]",
    load: async () => {
      const { serveCommand, serveRoles } = await import("./serve.js");
      return serveCommand(serveRoles.find((r) => r.name === "encode-worker"));
    },
  },
  {
    name: "token-worker",
    description: "serve the demo token worker (module tokenWorker)",
    term: "token-worker [options]",
    load: async () => {
      const { serveCommand, serveRoles } = await import("./serve.js");
      return serveCommand(serveRoles.find((r) => r.name === "token-worker"));
    },
  },
  {
    name: "router",
    description: "serve KV overlap queries (mmgate.kvrouter.v1.OverlapService) over the pools of one or more KV relays (module router)",
    term: "router [options]",
    load: async () => {
      const { serveCommand, serveRoles } = await import("./serve.js");
      return serveCommand(serveRoles.find((r) => r.name === "router"));
    },
  },
  {
    name: "health",
    description: "check grpc.health.v1 on a server; exits 0 when SERVING",
    term: "health [options]",
    load: async () => (await import("./health.js")).healthCommand(),
  },
  {
    name: "admin",
    description: "inspect and steer a running server (mmgate.admin.v1.AdminService)",
    term: "admin",
    load: async () => (await import("./admin.js")).adminCommand(),
  },
  {
    name: "keys",
    description: "the keys file (auth.keysFile): add, list and remove named keys with scopes; a running server reloads it",
    term: "keys",
    load: async () => (await import("./keys.js")).keysCommand(),
  },
  {
    name: "media",
    description: "decode images and videos to tensors and compute canonical content hashes",
    term: "media",
    // src/media/index.ts does not export the media command, so it comes from its own file.
    load: async () => (await import("../media/index.js")).mediaCommand(),
  },
  {
    name: "hop",
    description: "call the multimodal Encode hop (mmgate.encode.v1.EncodeHopService)",
    term: "hop",
    load: async () => (await import("../encode/index.js")).hopCommand(),
  },
  {
    name: "kv",
    description: "KV routing by hand: block and sequence hashes, where a key sits in the Cuckoo filter, and replaying router events into a relay pool",
    term: "kv",
    load: async () => {
      const kv = (await import("../kv/index.js")).kvCommand();
      // Publishing needs a client and the ingest contract, which live with the relay.
      return kv.addCommand((await import("../relay/index.js")).kvPublishCommand());
    },
  },
  {
    name: "relay",
    description: "KV relays by hand: watch a relay's catalog and pool streams as a router would mirror them",
    term: "relay",
    load: async () => (await import("../relay/index.js")).relayCommand(),
  },
  {
    name: "cbi1",
    description: "the CBI1 relay frame codec by hand: encode deltas and snapshot chunks as hex, decode hex frames to JSON",
    term: "cbi1",
    load: async () => (await import("../relay/index.js")).cbi1Command(),
  },
  {
    name: "images",
    description: "generate images through mmgate.images.v1.ImageService",
    term: "images",
    load: async () => (await import("../images/index.js")).imagesCommand(),
  },
  {
    name: "stack",
    description: "the whole stack on one machine (etcd, nats-server, relay, router, Encode workers, token worker, hop, images), started with one command",
    term: "stack",
    load: async () => (await import("../stack/index.js")).stackCommand(),
  },
];

/** What both `mmgate version` and `mmgate --version` print (without the newline). */
export function versionLine(): string {
  return `mmgate ${version} (node ${process.version})`;
}

/**
 * The subcommand `argv` (without node and the script) runs, by commander's
 * rule for a root whose options take no values: the first operand, or the
 * one after `help`.
 */
export function selectedSubcommand(argv: readonly string[]): string | undefined {
  const operands = argv.filter((arg) => !arg.startsWith("-"));
  return operands[0] === "help" ? operands[1] : operands[0];
}

/**
 * The command tree for `argv`: the selected subcommand is loaded, every
 * other one is a stub that only carries its name and description for help.
 */
export async function program(argv: readonly string[]): Promise<Command> {
  const selected = selectedSubcommand(argv);
  const terms = new Map<Command, string>();
  const root = new Command("mmgate")
    .description("gRPC services for the hops of a multimodal LLM and image serving stack")
    .version(versionLine(), "-V, --version")
    .enablePositionalOptions()
    .configureHelp({ subcommandTerm: (cmd) => terms.get(cmd) ?? new Help().subcommandTerm(cmd) });
  for (const sub of subcommands) {
    if (sub.name === selected) {
      root.addCommand(await sub.load());
    } else {
      const stub = new Command(sub.name).description(sub.description);
      terms.set(stub, sub.term);
      root.addCommand(stub);
    }
  }
  root.addCommand(
    new Command("version").description("print the version").action(() => {
      process.stdout.write(`${versionLine()}\n`);
    }),
  );
  return root;
}

export interface MainOptions {
  /**
   * Report commander's exits (help, version, usage errors) through
   * `process.exitCode` instead of ending the process, so that the
   * executable can run inside another process.
   */
  readonly exitOverride?: boolean;
}

/** The shared CLI helpers (error format, exit codes); they load connect, which takes a few hundred ms. */
type CliHelpers = typeof rpc;

function loadHelpers(): Promise<CliHelpers> {
  return import("../rpc/index.js");
}

/** Commander asked to exit; `usage` is the error it had to say, not yet printed. */
class ExitRequest {
  constructor(
    readonly exitCode: number,
    readonly usage?: { readonly path: string; readonly text: string },
  ) {}
}

/** Exit codes of commander's own exits (EXIT in src/rpc, without loading it for `mmgate version`). */
const OK = 0;
const USAGE = 2;

/** `images generate` for that command, "" for the root. */
function commandPath(command: Command): string {
  const names: string[] = [];
  for (let at: Command | null = command; at?.parent; at = at.parent) names.unshift(at.name());
  return names.join(" ");
}

/** The exit code of one of commander's exits: help and version are fine, everything else is a usage error. */
function commanderExitCode(err: CommanderError): number {
  if (err.code === "commander.helpDisplayed" || err.code === "commander.version") return OK;
  // Help shown because a command needs a subcommand (`mmgate images`) is a usage error; `mmgate help x` is not.
  if (err.code === "commander.help") return err.exitCode === 0 ? OK : USAGE;
  return USAGE;
}

/**
 * Commander's error text (`error: unknown option '--x'\n(Did you mean --y?)`)
 * in the one error format, with a pointer to the command's help.
 */
function formatUsageError(helpers: CliHelpers, path: string, text: string): string {
  const [first = "", ...rest] = text.replace(/^error: /, "").trimEnd().split("\n");
  const hints = rest.map((line) => line.replace(/^\(Did you mean (.*)\)$/, "did you mean $1"));
  hints.push(`see 'mmgate${path === "" ? "" : ` ${path}`} --help'`);
  return helpers.formatError(path, { code: "usage", message: first, details: [], hints });
}

/** Every command below `command`, itself first. */
function commandTree(command: Command): Command[] {
  return [command, ...command.commands.flatMap((c) => commandTree(c))];
}

/**
 * Gives every command of the tree the shared behaviour: usage errors in the
 * one format with exit 2, required options marked in help, and (with the
 * helpers loaded) the exit codes in the help of each command that runs
 * something.
 */
function configureTree(root: Command, helpers: CliHelpers | undefined): void {
  let usage: ExitRequest["usage"];
  for (const command of commandTree(root)) {
    const path = commandPath(command);
    // Kept for main to print: the format lives with the helpers, which may not be loaded yet.
    command.configureOutput({ ...command.configureOutput(), outputError: (text) => void (usage = { path, text }) });
    command.exitOverride((err) => {
      const code = commanderExitCode(err);
      // `mmgate images` alone: commander printed the help; say what was missing, in the one format.
      if (err.code === "commander.help" && code === USAGE && usage === undefined) {
        const names = command.commands.map((c) => c.name()).filter((name) => name !== "help");
        usage = { path, text: `missing command: one of ${names.join(", ")}` };
      }
      const request = new ExitRequest(code, usage);
      usage = undefined;
      throw request;
    });
    for (const option of command.options) {
      // commander checks required options but its help does not say which they are.
      if (option.mandatory && !option.description.includes("(required)")) option.description = `${option.description} (required)`;
    }
    const runs = command.commands.length === 0 && command !== root && command.name() !== "version";
    if (helpers && runs && !helpers.hasExitCodesHelp(command)) command.addHelpText("after", helpers.exitCodesHelp());
  }
  if (helpers) {
    root.addHelpText("after", `${helpers.exitCodesHelp({ [helpers.EXIT.partial]: "partly done (a command's help says when)" })}\nRun 'mmgate <command> --help' for a command's options.\n`);
  }
}

/** Whether argv only asks for the version, the one run that never needs the shared helpers. */
function versionOnly(argv: readonly string[]): boolean {
  return argv.length === 1 && (argv[0] === "version" || argv[0] === "--version" || argv[0] === "-V");
}

/** Runs the executable on `argv` (without node and the script). */
export async function main(argv: readonly string[] = process.argv.slice(2), options: MainOptions = {}): Promise<void> {
  // A subcommand module that fails to load is a bug: its stack trace is worth seeing.
  const root = await program(argv);
  configureTree(root, versionOnly(argv) ? undefined : await loadHelpers());
  let running = "";
  root.hook("preAction", (_root, action) => {
    running = commandPath(action);
  });
  try {
    await root.parseAsync([...argv], { from: "user" });
  } catch (err) {
    if (err instanceof ExitRequest) {
      if (err.usage !== undefined) process.stderr.write(formatUsageError(await loadHelpers(), err.usage.path, err.usage.text));
      process.exitCode = err.exitCode;
      // Without the override the process ends here, as commander would end it.
      if (!options.exitOverride) process.exit(err.exitCode);
      return;
    }
    // Failures an action did not report itself: one line, no stack.
    process.exitCode = (await loadHelpers()).reportError(process.stderr, running, err);
  }
}
