import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Writable } from "node:stream";
import { create, toJson } from "@bufbuild/protobuf";
import { MultiBar, Presets, type SingleBar } from "cli-progress";
import { Command, InvalidArgumentError, Option } from "commander";
import { ConnectError, createClient } from "@connectrpc/connect";
import { ProviderCapabilitiesSchema } from "../../gen/mmgate/images/v1/capabilities_pb.js";
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import * as pb from "../../gen/mmgate/images/v1/images_pb.js";
import { addrOption, caOption, clientTransport, tlsOption, tokenOption, type ConnectionOptions } from "../rpc/index.js";
import { errorCodeFromProto } from "./proto-convert.js";

export interface CliIo {
  readonly out: Writable;
  readonly err: Writable;
  /** Whether progress bars are drawn (a terminal on stderr). */
  readonly progress: boolean;
}

const DEFAULT_STREAM_PARTIALS = 2;

const EXTENSIONS: Record<number, string> = {
  [pb.OutputFormat.PNG]: "png",
  [pb.OutputFormat.JPEG]: "jpg",
  [pb.OutputFormat.WEBP]: "webp",
};

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

interface GenerateOptions extends ConnectionOptions {
  n: number;
  out: string;
  token?: string;
  provider?: string;
  model?: string;
  size?: string;
  format?: number;
  quality?: number;
  background?: number;
  partials?: number;
  bestEffort?: boolean;
  sequential?: boolean;
  normalize?: boolean;
  stream?: boolean;
  timeoutMs?: number;
  negative?: string;
}

function imageRequest(prompt: string, o: GenerateOptions): pb.ImageRequest {
  return create(pb.ImageRequestSchema, {
    prompt,
    ...(o.negative !== undefined ? { negativePrompt: o.negative } : {}),
    operation: { case: "generate", value: {} },
    parameters: {
      n: o.n,
      size: o.size ?? "",
      quality: o.quality ?? 0,
      outputFormat: o.format ?? 0,
      background: o.background ?? 0,
      partialImages: o.partials ?? 0,
      failurePolicy: o.bestEffort ? pb.FailurePolicy.BEST_EFFORT : pb.FailurePolicy.FAIL_FAST,
    },
    routing: { provider: o.provider ?? "", model: o.model ?? "" },
    policies: {
      compatibility: o.normalize ? pb.CompatibilityMode.NORMALIZE : pb.CompatibilityMode.STRICT,
      batchExecution: o.sequential ? pb.BatchExecution.SEQUENTIAL : pb.BatchExecution.AUTO,
    },
    ...(o.timeoutMs !== undefined ? { timeoutMs: BigInt(o.timeoutMs) } : {}),
    responseFormat: pb.ResponseFormat.BYTES,
  });
}

/** Writes each image as <out>/image-<index>.<ext> and prints one line per output. */
async function saveResponse(response: pb.ImageResponse, dir: string, io: CliIo): Promise<number> {
  await mkdir(dir, { recursive: true });
  const width = String(Math.max(1, response.data.length + response.failures.length - 1)).length;
  for (const image of response.data) {
    if (image.payload.case !== "image") continue;
    const name = `image-${String(image.index).padStart(width, "0")}.${EXTENSIONS[image.format] ?? "bin"}`;
    const path = join(dir, name);
    await writeFile(path, image.payload.value);
    io.out.write(`${image.index}\t${path}\t${image.width}x${image.height}\t${image.byteSize} bytes\tsha256:${image.sha256}\n`);
  }
  for (const failure of response.failures) {
    const code = failure.error ? errorCodeFromProto(failure.error.code) : "internal";
    io.out.write(`${failure.index}\tFAILED\t${code}: ${failure.error?.message ?? ""}\n`);
  }
  if (response.revisedPrompt) io.out.write(`revised prompt: ${response.revisedPrompt}\n`);
  for (const n of response.normalizations) io.err.write(`normalized ${n.field}: ${n.reason}\n`);
  for (const warning of response.warnings) io.err.write(`warning: ${warning}\n`);
  io.out.write(
    `${response.data.length} image(s) from ${response.provider}/${response.model} in ${response.timings?.totalMs ?? 0n} ms` +
      (response.failures.length > 0 ? `, ${response.failures.length} failed\n` : "\n"),
  );
  return response.failures.length > 0 ? 2 : 0;
}

function reportError(error: unknown, io: CliIo): void {
  const e = ConnectError.from(error);
  const [detail] = e.findDetails(pb.ErrorDetailSchema);
  if (!detail) {
    io.err.write(`error: ${e.message}\n`);
    return;
  }
  io.err.write(`error: ${errorCodeFromProto(detail.code)}: ${detail.message}${detail.retryable ? " (retryable)" : ""}\n`);
  if (detail.details && Object.keys(detail.details).length > 0) io.err.write(`details: ${JSON.stringify(detail.details)}\n`);
  for (const s of detail.suggestions) io.err.write(`hint: ${s}\n`);
}

/** One bar per output: a step per partial preview, and one for completion. */
class OutputProgress {
  private readonly multi: MultiBar | undefined;
  private readonly bars = new Map<number, SingleBar>();

  constructor(io: CliIo, outputs: number, private readonly steps: number) {
    if (!io.progress) return;
    this.multi = new MultiBar(
      { format: "output {index} [{bar}] {stage}", hideCursor: true, clearOnComplete: false, stream: io.err, noTTYOutput: true },
      Presets.shades_classic,
    );
    for (let index = 0; index < outputs; index += 1) {
      this.bars.set(index, this.multi.create(steps, 0, { index: String(index).padStart(2), stage: "queued" }));
    }
  }

  stage(index: number, stage: string): void {
    this.bars.get(index)?.update({ stage });
  }

  partial(index: number, partialIndex: number): void {
    this.bars.get(index)?.update(Math.min(partialIndex + 1, this.steps - 1), { stage: `preview ${partialIndex + 1}` });
  }

  finish(response: pb.ImageResponse | undefined): void {
    if (response) {
      for (const image of response.data) this.bars.get(image.index)?.update(this.steps, { stage: "done" });
      for (const failure of response.failures) this.bars.get(failure.index)?.update({ stage: "failed" });
    }
    this.multi?.stop();
  }
}

async function generate(prompt: string, o: GenerateOptions, io: CliIo): Promise<number> {
  const client = createClient(ImageService, clientTransport(o));
  const headers = o.token ? { authorization: `Bearer ${o.token}` } : undefined;
  try {
    let partials = o.partials;
    if (partials === undefined && o.stream) {
      // Two previews by default, within what the provider offers.
      const caps = await client.getCapabilities({ provider: o.provider ?? "", model: o.model ?? "" });
      partials = Math.min(DEFAULT_STREAM_PARTIALS, caps.capabilities?.partialImages?.max ?? 0);
    }
    const request = imageRequest(prompt, { ...o, ...(partials !== undefined ? { partials } : {}) });
    if (!o.stream) {
      const result = await client.generate({ request }, headers ? { headers } : {});
      return await saveResponse(result.response!, o.out, io);
    }
    const steps = (request.parameters?.partialImages ?? 0) + 1;
    const progress = new OutputProgress(io, o.n, steps);
    let completed: pb.ImageResponse | undefined;
    try {
      for await (const message of client.generateStream({ request }, headers ? { headers } : {})) {
        const event = message.event;
        if (event.case === "progress") progress.stage(event.value.index, event.value.stage);
        else if (event.case === "partialImage") progress.partial(event.value.index, event.value.partialIndex);
        else if (event.case === "completed") completed = event.value.response;
      }
    } finally {
      progress.finish(completed);
    }
    if (!completed) throw new Error("the stream ended without a result");
    return await saveResponse(completed, o.out, io);
  } catch (error) {
    reportError(error, io);
    return 1;
  }
}

/** `mmgate images …`: generate images and inspect providers. */
export function imagesCommand(io: CliIo = { out: process.stdout, err: process.stderr, progress: process.stderr.isTTY === true }): Command {
  const images = new Command("images").description("generate images through mmgate.images.v1.ImageService");
  images
    .command("generate")
    .description("generate images and write them to a directory")
    .argument("<prompt>", "what to draw")
    .addOption(new Option("-n, --n <count>", "number of images").default(1).argParser(intIn(1, 255)))
    .requiredOption("--out <dir>", "directory to write the images to")
    .addOption(addrOption())
    .addOption(tlsOption())
    .addOption(caOption())
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
    .option("--normalize", "let the provider adjust unsupported parameters instead of failing")
    .option("--stream", "stream progress and partial previews")
    .addOption(new Option("--timeout-ms <ms>", "request timeout").argParser(intIn(1, 1_800_000)))
    .action(async (prompt: string, options: GenerateOptions) => {
      process.exitCode = await generate(prompt, options, io);
    });

  images
    .command("providers")
    .description("list the registered providers")
    .addOption(addrOption())
    .addOption(tlsOption())
    .addOption(caOption())
    .action(async (options: ConnectionOptions) => {
      const client = createClient(ImageService, clientTransport(options));
      try {
        const response = await client.listProviders({});
        for (const p of response.providers) {
          io.out.write(`${p.name}${p.default ? " (default)" : ""}\t${p.displayName}\t${p.version}\tmodels: ${p.models.join(",")}\tcircuit: ${p.circuitState}\n`);
        }
      } catch (error) {
        reportError(error, io);
        process.exitCode = 1;
      }
    });

  images
    .command("capabilities")
    .description("print a provider's effective capabilities as JSON")
    .option("--provider <name>", "provider (default: the server's default)")
    .option("--model <name>", "model")
    .addOption(addrOption())
    .addOption(tlsOption())
    .addOption(caOption())
    .action(async (options: ConnectionOptions & { provider?: string; model?: string }) => {
      const client = createClient(ImageService, clientTransport(options));
      try {
        const response = await client.getCapabilities({ provider: options.provider ?? "", model: options.model ?? "" });
        const capabilities = response.capabilities ?? create(ProviderCapabilitiesSchema);
        io.out.write(`${JSON.stringify(toJson(ProviderCapabilitiesSchema, capabilities), null, 2)}\n`);
      } catch (error) {
        reportError(error, io);
        process.exitCode = 1;
      }
    });
  return images;
}
