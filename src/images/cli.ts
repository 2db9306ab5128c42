import { constants } from "node:fs";
import { access, mkdir, mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Writable } from "node:stream";
import { create, toJson } from "@bufbuild/protobuf";
import { MultiBar, Presets, type SingleBar } from "cli-progress";
import { Command, InvalidArgumentError, Option } from "commander";
import { ConnectError, createClient } from "@connectrpc/connect";
import { ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import { ProviderCapabilitiesSchema, type ProviderCapabilities } from "../../gen/mmgate/images/v1/capabilities_pb.js";
import { ImageService, ListProvidersResponseSchema } from "../../gen/mmgate/images/v1/image_service_pb.js";
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
  savePartials?: boolean;
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

/** Request fields as the CLI spells them. */
const FLAGS: Readonly<Record<string, string>> = {
  "parameters.n": "-n",
  "parameters.size": "--size",
  "parameters.output_format": "--format",
  "parameters.quality": "--quality",
  "parameters.background": "--background",
  "parameters.partial_images": "--partials",
  "parameters.failure_policy": "--best-effort",
  "policies.batch_execution": "--sequential",
  "policies.compatibility": "--normalize",
  "routing.provider": "--provider",
  "routing.model": "--model",
  negative_prompt: "--negative",
  timeout_ms: "--timeout-ms",
  prompt: "<prompt>",
};

/** Server hints, said in CLI terms. */
const HINTS: Readonly<Record<string, string>> = {
  "Call GetCapabilities for the provider and adjust the request, or set policies.compatibility to normalize.":
    "Run `mmgate images capabilities` to see what the provider supports and change the option, or use --normalize to let the server adjust it (the change is printed).",
  "Fix the fields listed in details.issues and send the request again.": "Fix the options listed above and run the command again.",
  "Raise timeout_ms or reduce parameters.n; check the provider's latency.": "Raise --timeout-ms or lower -n; check the provider's latency.",
};

/** A server hint in CLI terms: known hints rewritten, request field names replaced by flags. */
export function cliHint(hint: string): string {
  const known = HINTS[hint];
  if (known !== undefined) return known;
  return hint.replace(/\b(?:parameters|policies|routing)\.[a-z_]+\b|\btimeout_ms\b/g, (field) => FLAGS[field] ?? field);
}

/** The size rule of a provider in words, e.g. "auto, one of 256x256, …, or any WxH with both edges a multiple of 8 from 16 to 4096". */
export function sizeRule(caps: ProviderCapabilities | undefined): string | undefined {
  const sizes = caps?.sizes;
  if (!sizes) return undefined;
  const parts: string[] = [];
  if (sizes.auto) parts.push("auto");
  if (sizes.allowed.length > 0) parts.push(`one of ${sizes.allowed.join(", ")}`);
  if (sizes.arbitrary) {
    let rule = "any WxH";
    if (sizes.edgeMultiple !== undefined && sizes.edgeMultiple > 1) rule += ` with both edges a multiple of ${sizes.edgeMultiple}`;
    if (sizes.minEdge !== undefined && sizes.maxEdge !== undefined) rule += ` from ${sizes.minEdge} to ${sizes.maxEdge}`;
    else if (sizes.maxEdge !== undefined) rule += ` up to ${sizes.maxEdge}`;
    parts.push(rule);
  }
  if (parts.length === 0) return undefined;
  const last = parts.pop()!;
  return `--size for ${caps!.provider} must be ${parts.length > 0 ? `${parts.join(", ")} or ${last}` : last}`;
}

function valueText(value: Value | undefined): string {
  if (value === undefined) return "(none)";
  const json = toJson(ValueSchema, value);
  return typeof json === "string" ? json : JSON.stringify(json);
}

const NORMALIZATION_REASONS: Readonly<Record<string, string>> = {
  normalized_to_provider_size: "the provider does not offer that size",
  normalized_to_provider_value: "the provider does not offer that value",
  clamped_to_provider_range: "outside the provider's range",
  provider_does_not_support_hint: "the provider ignores this option",
  provider_uses_automatic_action: "the provider picks the action itself",
  effective_format_has_no_compression: "the format has no compression setting",
  negative_prompt_prompt_merge: "merged into the prompt",
};

/** "normalized --size: 100x100 -> auto (…)" lines, with the size rule and the size made. */
function normalizationLines(response: pb.ImageResponse, caps: ProviderCapabilities | undefined): string[] {
  return response.normalizations.map((n) => {
    const name = FLAGS[n.field] ?? n.field;
    let line = `normalized ${name}: ${valueText(n.requested)} -> ${valueText(n.effective)} (${NORMALIZATION_REASONS[n.reason] ?? n.reason})`;
    if (n.field === "parameters.size") {
      const rule = sizeRule(caps);
      if (rule) line += `; ${rule}`;
      const made = response.data[0];
      if (made) line += `; the images are ${made.width}x${made.height}`;
    }
    return line;
  });
}

/** A response warning in words, its code in brackets. */
function warningLine(warning: string, response: pb.ImageResponse, caps: ProviderCapabilities | undefined): string {
  const n = response.effective?.n ?? response.data.length + response.failures.length;
  if (warning === "emulated_multi_image_fanout") {
    const perCall = Math.max(1, caps?.batching?.nativeCount?.max ?? 1);
    const calls = Math.ceil(n / perCall);
    return (
      `the provider makes at most ${perCall} image(s) per call, so the ${n} images were made by ${calls} separate provider calls ` +
      `(each call is billed and may fail on its own; the images are not one batch) [${warning}]`
    );
  }
  if (warning === "sequential_multi_image_fanout") return `those provider calls ran one after another (--sequential) [${warning}]`;
  if (warning === "partial_output_failure") return `some images failed; the others were saved (--best-effort) [${warning}]`;
  return warning;
}

/** A command-line mistake found before any call: exit 2, nothing spent. */
class UsageError extends Error {}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * Creates `--out` (like `mkdir -p`) and checks that it is a writable directory,
 * before anything is paid for.
 */
async function prepareOutDir(dir: string): Promise<void> {
  const existing = await stat(dir).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENOENT") return undefined;
    if (error.code === "ENOTDIR") throw new UsageError(`--out ${dir}: a parent of it is a file, not a directory`);
    throw new UsageError(`--out ${dir}: ${describe(error)}`);
  });
  if (existing && !existing.isDirectory()) throw new UsageError(`--out ${dir}: exists and is not a directory`);
  if (!existing) {
    try {
      await mkdir(dir, { recursive: true });
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ENOTDIR" || code === "EEXIST") throw new UsageError(`--out ${dir}: a parent of it is a file, not a directory`);
      throw new UsageError(`--out ${dir}: cannot create the directory: ${describe(error)}`);
    }
  }
  try {
    await access(dir, constants.W_OK | constants.X_OK);
  } catch (error) {
    throw new UsageError(`--out ${dir}: the directory is not writable: ${describe(error)}`);
  }
}

/** Output files are zero-padded to the width of the largest requested index (n = 12 → image-00 … image-11). */
function indexWidth(n: number): number {
  return String(Math.max(0, n - 1)).length;
}

function imageName(index: number, ext: string, width: number): string {
  return `image-${String(index).padStart(width, "0")}.${ext}`;
}

function partialName(index: number, partialIndex: number, ext: string, width: number): string {
  return `partial-${String(index).padStart(width, "0")}-${partialIndex}.${ext}`;
}

/** What the CLI names its files; any such file this run did not write is stale. */
const OUTPUT_NAME = /^(?:image-\d+|partial-\d+-\d+)\.(?:png|jpg|webp|bin)$/;

/** Previews carry no format field: tell it from the magic bytes. */
function sniffExtension(bytes: Uint8Array): string {
  if (bytes[0] === 0x89 && bytes[1] === 0x50 && bytes[2] === 0x4e && bytes[3] === 0x47) return "png";
  if (bytes[0] === 0xff && bytes[1] === 0xd8 && bytes[2] === 0xff) return "jpg";
  if (bytes.length >= 12 && Buffer.from(bytes.subarray(0, 4)).toString("latin1") === "RIFF" && Buffer.from(bytes.subarray(8, 12)).toString("latin1") === "WEBP") return "webp";
  return "bin";
}

/** Removes earlier runs' `image-*` / `partial-*` files in `dir` that this run did not write. */
async function removeStale(dir: string, written: ReadonlySet<string>, io: CliIo): Promise<void> {
  const stale: string[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    if (entry.isFile() && OUTPUT_NAME.test(entry.name) && !written.has(entry.name)) stale.push(entry.name);
  }
  for (const name of stale) await rm(join(dir, name), { force: true });
  if (stale.length > 0) io.err.write(`removed ${stale.length} file(s) from an earlier run: ${stale.sort().join(", ")}\n`);
}

interface SaveContext {
  readonly out: string;
  readonly width: number;
  /** Preview files this run wrote into `out`. */
  readonly partials: Set<string>;
}

type Encoded = { readonly image: pb.GeneratedImage; readonly bytes: Uint8Array; readonly name: string };

async function writeAll(dir: string, images: readonly Encoded[]): Promise<void> {
  for (const { bytes, name } of images) {
    const path = join(dir, name);
    try {
      await writeFile(path, bytes);
    } catch (error) {
      throw new Error(`could not write ${path}: ${describe(error)}`, { cause: error });
    }
  }
}

/**
 * Writes each image as <out>/image-<index>.<ext> and prints one line per output.
 * If the images cannot be written there, they are kept in a fresh temporary
 * directory instead (named on stderr, exit 1): paid images are never dropped.
 */
async function saveResponse(response: pb.ImageResponse, ctx: SaveContext, io: CliIo, caps?: ProviderCapabilities): Promise<number> {
  const images: Encoded[] = [];
  for (const image of response.data) {
    if (image.payload.case !== "image") continue;
    images.push({ image, bytes: image.payload.value, name: imageName(image.index, EXTENSIONS[image.format] ?? "bin", ctx.width) });
  }
  let dir = ctx.out;
  let status = response.failures.length > 0 ? 2 : 0;
  try {
    await writeAll(dir, images);
    await removeStale(dir, new Set([...images.map((i) => i.name), ...ctx.partials]), io).catch((error: unknown) => {
      io.err.write(`warning: could not remove earlier files in ${dir}: ${describe(error)}\n`);
    });
  } catch (error) {
    io.err.write(`error: ${describe(error)}\n`);
    dir = await mkdtemp(join(tmpdir(), "mmgate-images-"));
    await writeAll(dir, images);
    io.err.write(`kept the ${images.length} image(s) in ${dir}\n`);
    status = 1;
  }
  for (const { image, name } of images) {
    io.out.write(`${image.index}\t${join(dir, name)}\t${image.width}x${image.height}\t${image.byteSize} bytes\tsha256:${image.sha256}\n`);
  }
  for (const failure of response.failures) {
    const code = failure.error ? errorCodeFromProto(failure.error.code) : "internal";
    io.out.write(`${failure.index}\tFAILED\t${code}: ${failure.error?.message ?? ""}\n`);
  }
  if (response.revisedPrompt) io.out.write(`revised prompt: ${response.revisedPrompt}\n`);
  for (const line of normalizationLines(response, caps)) io.err.write(`${line}\n`);
  for (const warning of response.warnings) io.err.write(`warning: ${warningLine(warning, response, caps)}\n`);
  io.out.write(
    `${response.data.length} image(s) from ${response.provider}/${response.model} in ${response.timings?.totalMs ?? 0n} ms` +
      (response.failures.length > 0 ? `, ${response.failures.length} failed\n` : "\n"),
  );
  return status;
}

function reportError(error: unknown, io: CliIo, caps?: ProviderCapabilities): void {
  const e = ConnectError.from(error);
  const [detail] = e.findDetails(pb.ErrorDetailSchema);
  if (!detail) {
    io.err.write(`error: ${e.message}\n`);
    return;
  }
  io.err.write(`error: ${errorCodeFromProto(detail.code)}: ${detail.message}${detail.retryable ? " (retryable)" : ""}\n`);
  if (detail.details && Object.keys(detail.details).length > 0) io.err.write(`details: ${JSON.stringify(detail.details)}\n`);
  for (const s of detail.suggestions) io.err.write(`hint: ${cliHint(s)}\n`);
  if (detail.details?.["field"] === "parameters.size") {
    const rule = sizeRule(caps);
    if (rule) io.err.write(`hint: ${rule}\n`);
  }
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
  try {
    if (o.savePartials && !o.stream) throw new UsageError("--save-partials needs --stream");
    await prepareOutDir(o.out);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    io.err.write(`error: ${error.message}\n`);
    return 2;
  }
  const ctx: SaveContext = { out: o.out, width: indexWidth(o.n), partials: new Set() };
  let partialWriteFailed = false;
  const client = createClient(ImageService, clientTransport(o));
  const headers = o.token ? { authorization: `Bearer ${o.token}` } : undefined;
  let caps: ProviderCapabilities | undefined;
  try {
    caps = (await client.getCapabilities({ provider: o.provider ?? "", model: o.model ?? "" }, headers ? { headers } : {})).capabilities;
  } catch (error) {
    reportError(error, io);
    return 1;
  }
  const limit = caps?.count?.max;
  if (limit !== undefined && limit > 0 && o.n > limit) {
    io.err.write(`error: -n ${o.n} is above the limit of ${caps!.provider}: at most ${limit} image(s) per request\n`);
    return 2;
  }
  try {
    let partials = o.partials;
    if (partials === undefined && o.stream) {
      // Two previews by default, within what the provider offers.
      partials = Math.min(DEFAULT_STREAM_PARTIALS, caps?.partialImages?.max ?? 0);
    }
    const request = imageRequest(prompt, { ...o, ...(partials !== undefined ? { partials } : {}) });
    if (!o.stream) {
      const result = await client.generate({ request }, headers ? { headers } : {});
      return await saveResponse(result.response!, ctx, io, caps);
    }
    const steps = (request.parameters?.partialImages ?? 0) + 1;
    const progress = new OutputProgress(io, o.n, steps);
    let completed: pb.ImageResponse | undefined;
    try {
      for await (const message of client.generateStream({ request }, headers ? { headers } : {})) {
        const event = message.event;
        if (event.case === "progress") progress.stage(event.value.index, event.value.stage);
        else if (event.case === "partialImage") {
          progress.partial(event.value.index, event.value.partialIndex);
          if (o.savePartials && !partialWriteFailed) {
            const name = partialName(event.value.index, event.value.partialIndex, sniffExtension(event.value.image), ctx.width);
            try {
              await writeFile(join(o.out, name), event.value.image);
              ctx.partials.add(name);
            } catch (error) {
              partialWriteFailed = true;
              io.err.write(`warning: could not save previews: ${describe(error)}\n`);
            }
          }
        }
        else if (event.case === "completed") completed = event.value.response;
      }
    } finally {
      progress.finish(completed);
    }
    if (!completed) throw new Error("the stream ended without a result");
    return await saveResponse(completed, ctx, io, caps);
  } catch (error) {
    reportError(error, io, caps);
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
    .addOption(new Option("-n, --n <count>", "number of images, up to the provider's limit (see capabilities: count.max)").default(1).argParser(intIn(1, 0xffff_ffff)))
    .requiredOption("--out <dir>", "directory to write the images to (created if missing)")
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
    .option("--normalize", "let the server adjust options the provider does not support (e.g. a --size that is no multiple of 8) instead of failing; each change is printed")
    .option("--stream", "stream progress and partial previews")
    .option("--save-partials", "with --stream, also write the previews as partial-<index>-<k>.<ext>")
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
    .option("--json", "print the ListProviders answer as one JSON object (proto3 JSON)")
    .action(async (options: ConnectionOptions & { json?: boolean }) => {
      const client = createClient(ImageService, clientTransport(options));
      try {
        const response = await client.listProviders({});
        if (options.json) {
          io.out.write(`${JSON.stringify(toJson(ListProvidersResponseSchema, response))}\n`);
          return;
        }
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
