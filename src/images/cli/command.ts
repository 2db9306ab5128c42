/** `mmgate images`: its subcommands and options (generate, providers, capabilities). */
import { create, toJson } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { Command, InvalidArgumentError, Option } from "commander";
import { ProviderCapabilitiesSchema } from "../../../gen/mmgate/images/v1/capabilities_pb.js";
import { ImageService, ListProvidersResponseSchema } from "../../../gen/mmgate/images/v1/image_service_pb.js";
import * as pb from "../../../gen/mmgate/images/v1/images_pb.js";
import { clientTransport, connectionContext, type ConnectionOptions, EXIT, parseTimeout, reportError, tokenOption, withConnectionOptions, withExitCodes } from "../../rpc/index.js";
import { generate, type GenerateOptions } from "./generate.js";
import type { CliIo } from "./io.js";
import { callError } from "./render.js";

function intIn(min: number, max: number) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min || n > max) throw new InvalidArgumentError(`expected an integer from ${min} to ${max}`);
    return n;
  };
}

function enumOf<E extends Record<string, string | number>>(values: E, label: string) {
  return (value: string): number => {
    const found = values[value.toUpperCase()];
    if (typeof found !== "number" || found === 0) {
      const names = Object.keys(values).filter((k) => Number.isNaN(Number(k)) && k !== "UNSPECIFIED");
      throw new InvalidArgumentError(`${label} must be one of ${names.map((n) => n.toLowerCase()).join(", ")}`);
    }
    return found;
  };
}

/** `mmgate images …`: generate images and inspect providers. */
export function imagesCommand(io: CliIo = { out: process.stdout, err: process.stderr, progress: process.stderr.isTTY === true }): Command {
  const images = new Command("images").description("generate images through mmgate.images.v1.ImageService");
  const generateCommand = withConnectionOptions(
    images
      .command("generate")
      .description("generate images and write them to a directory")
      .argument("<prompt>", "what to draw")
      .addOption(new Option("-n, --count <count>", "number of images, up to the provider's limit (see capabilities: count.max)").default(1).argParser(intIn(1, 0xffff_ffff)))
      .addOption(new Option("--n <count>", "old name of --count").argParser(intIn(1, 0xffff_ffff)).hideHelp())
      .requiredOption("--out <dir>", "directory to write the images to (created if missing)"),
  )
    .addOption(tokenOption())
    .option("--provider <name>", "provider (default: the server's default)")
    .option("--model <name>", "model (default: the provider's default)")
    .option("--size <WxH>", "image size, or auto")
    .addOption(new Option("--format <format>", "png, jpeg or webp").argParser(enumOf(pb.OutputFormat, "format")))
    .addOption(new Option("--quality <quality>", "auto, low, medium or high").argParser(enumOf(pb.Quality, "quality")))
    .addOption(new Option("--background <background>", "auto, opaque or transparent").argParser(enumOf(pb.Background, "background")))
    .addOption(new Option("--partials <count>", "partial previews per output (0-3; 2 with --stream)").argParser(intIn(0, 3)))
    .option("--negative <text>", "negative prompt")
    .option("--best-effort", "return the images that succeeded when some fail")
    .option("--sequential", "generate one output at a time")
    .option("--normalize", "let the server adjust options the provider does not support (e.g. a --size that is no multiple of 8) instead of failing; each change is printed")
    .option("--stream", "stream progress and partial previews")
    .option("--save-partials", "with --stream, also write the previews as partial-<index>-<k>.<ext>")
    .option("--json", "print one JSON object: the files written, each image's size, format and sha256, failures, warnings and normalizations")
    .addOption(new Option("--timeout-ms <ms>", "old name of --timeout").argParser(parseTimeout).hideHelp())
    .action(async (prompt: string, options: GenerateOptions) => {
      process.exitCode = await generate(prompt, options, io);
    });
  withExitCodes(generateCommand, {
    [EXIT.failure]: "the call failed (nothing saved), or the images could not be written to --out (they are kept in a temporary directory, named)",
    [EXIT.usage]: "usage error: a bad option, an --out that is no directory, -n above the provider's limit; nothing was generated",
    [EXIT.partial]: "some images failed (--best-effort); the others were saved",
  });

  withConnectionOptions(images.command("providers").description("list the registered providers"))
    .option("--json", "print the ListProviders answer as one JSON object (protobuf JSON)")
    .action(async (options: ConnectionOptions & { json?: boolean }) => {
      try {
        const response = await createClient(ImageService, clientTransport(options)).listProviders({});
        if (options.json) {
          io.out.write(`${JSON.stringify(toJson(ListProvidersResponseSchema, response))}\n`);
          return;
        }
        for (const p of response.providers) {
          io.out.write(`${p.name}${p.default ? " (default)" : ""}\t${p.displayName}\t${p.version}\tmodels: ${p.models.join(",")}\tcircuit: ${p.circuitState}\n`);
        }
      } catch (error) {
        process.exitCode = reportError(io.err, "images providers", callError(error), connectionContext(options));
      }
    });

  withConnectionOptions(
    images
      .command("capabilities")
      .description("print a provider's effective capabilities as JSON")
      .option("--provider <name>", "provider (default: the server's default)")
      .option("--model <name>", "model"),
  ).action(async (options: ConnectionOptions & { provider?: string; model?: string }) => {
    try {
      const response = await createClient(ImageService, clientTransport(options)).getCapabilities({ provider: options.provider ?? "", model: options.model ?? "" });
      const capabilities = response.capabilities ?? create(ProviderCapabilitiesSchema);
      io.out.write(`${JSON.stringify(toJson(ProviderCapabilitiesSchema, capabilities), null, 2)}\n`);
    } catch (error) {
      process.exitCode = reportError(io.err, "images capabilities", callError(error), connectionContext(options));
    }
  });
  return images;
}
