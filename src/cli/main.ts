import { Command } from "commander";
import { imagesCommand } from "../images/index.js";
import { mediaCommand } from "../media/cli.js";
import { version } from "../version.js";
import { healthCommand } from "./health.js";
import { serveCommand } from "./serve.js";

export function program(): Command {
  const root = new Command("mmgate")
    .description("gRPC services for the hops of a multimodal LLM and image serving stack")
    .version(version, "-V, --version")
    .showHelpAfterError()
    .enablePositionalOptions();
  root.addCommand(serveCommand());
  root.addCommand(healthCommand());
  root.addCommand(mediaCommand());
  root.addCommand(imagesCommand());
  root.addCommand(
    new Command("version").description("print the version").action(() => {
      process.stdout.write(`mmgate ${version} (node ${process.version})\n`);
    }),
  );
  return root;
}

try {
  await program().parseAsync(process.argv);
} catch (err) {
  // Usage errors raised inside an action (an unreadable --ca file, say): one line, no stack.
  process.stderr.write(`mmgate: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exitCode = 1;
}
