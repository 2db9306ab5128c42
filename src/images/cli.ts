import { constants } from "node:fs";
import { access, mkdir, mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Writable } from "node:stream";
import { create, toJson } from "@bufbuild/protobuf";
import { MultiBar, Presets, type SingleBar } from "cli-progress";
import { Command, InvalidArgumentError, Option } from "commander";
import { ConnectError, createClient } from "@connectrpc/connect";
import { clientTransport, CliError, connectionContext, type ConnectionOptions, EXIT, ioError, parseTimeout, reportError, reportWarning, snakeCodeName, tokenOption, usageError, withConnectionOptions, withExitCodes } from "../rpc/index.js";
import { ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import { ProviderCapabilitiesSchema, type ProviderCapabilities } from "../../gen/mmgate/images/v1/capabilities_pb.js";
import { ImageService, ListProvidersResponseSchema } from "../../gen/mmgate/images/v1/image_service_pb.js";
import * as pb from "../../gen/mmgate/images/v1/images_pb.js";
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
  count: number;
  /** The old spelling of --count. */
  n?: number;
  /** The old spelling of --timeout (the request's timeout_ms only). */
  timeoutMs?: number;
  json?: boolean;
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
  negative?: string;
}

/** The largest timeout_ms a server takes by default (images.limits.maxTimeoutMs). */
const MAX_REQUEST_TIMEOUT_MS = 1_800_000;

function imageRequest(prompt: string, o: GenerateOptions): pb.ImageRequest {
  return create(pb.ImageRequestSchema, {
    prompt,
    ...(o.negative !== undefined ? { negativePrompt: o.negative } : {}),
    operation: { case: "generate", value: {} },
    parameters: {
      n: o.count,
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
    // The server ends the work at the same deadline the call has (a longer one is the server's to bound).
    ...(o.timeout !== undefined && o.timeout > 0 && o.timeout <= MAX_REQUEST_TIMEOUT_MS ? { timeoutMs: BigInt(o.timeout) } : {}),
    responseFormat: pb.ResponseFormat.BYTES,
  });
}

/** Request fields as the CLI spells them. */
/** A table's own entry: names that come from a server's answer must not reach Object.prototype. */
function own(table: Readonly<Record<string, string>>, key: string): string | undefined {
  return Object.hasOwn(table, key) ? table[key] : undefined;
}

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
  timeout_ms: "--timeout",
  prompt: "<prompt>",
};

/** Server hints, said in CLI terms. */
const HINTS: Readonly<Record<string, string>> = {
  "Call GetCapabilities for the provider and adjust the request, or set policies.compatibility to normalize.":
    "Run `mmgate images capabilities` to see what the provider supports and change the option, or use --normalize to let the server adjust it (the change is printed).",
  "Fix the fields listed in details.issues and send the request again.": "Fix the options listed above and run the command again.",
  "Raise timeout_ms or reduce parameters.n; check the provider's latency.": "Raise --timeout or lower -n; check the provider's latency.",
};

/** A server hint in CLI terms: known hints rewritten, request field names replaced by flags. */
export function cliHint(hint: string): string {
  const known = HINTS[hint];
  if (known !== undefined) return known;
  return hint.replace(/\b(?:parameters|policies|routing)\.[a-z_]+\b|\btimeout_ms\b/g, (field) => own(FLAGS, field) ?? field);
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

/** An option the server changed (--normalize), as --json reports it. */
interface NormalizationJson {
  readonly field: string;
  readonly flag: string;
  readonly requested: unknown;
  readonly effective: unknown;
  readonly reason: string;
  /** The line the text output prints. */
  readonly message: string;
}

function normalizationsJson(response: pb.ImageResponse, caps: ProviderCapabilities | undefined): NormalizationJson[] {
  const lines = normalizationLines(response, caps);
  return response.normalizations.map((n, i) => ({
    field: n.field,
    flag: own(FLAGS, n.field) ?? n.field,
    requested: n.requested === undefined ? null : toJson(ValueSchema, n.requested),
    effective: n.effective === undefined ? null : toJson(ValueSchema, n.effective),
    reason: n.reason,
    message: lines[i]!,
  }));
}

/** "normalized --size: 100x100 -> auto (…)" lines, with the size rule and the size made. */
function normalizationLines(response: pb.ImageResponse, caps: ProviderCapabilities | undefined): string[] {
  return response.normalizations.map((n) => {
    const name = own(FLAGS, n.field) ?? n.field;
    let line = `normalized ${name}: ${valueText(n.requested)} -> ${valueText(n.effective)} (${own(NORMALIZATION_REASONS, n.reason) ?? n.reason})`;
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

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/**
 * Creates `--out` (like `mkdir -p`) and checks that it is a writable directory,
 * before anything is paid for.
 */
async function prepareOutDir(dir: string): Promise<void> {
  // Any --out that cannot take the images is a usage error: found before anything is paid for.
  const existing = await stat(dir).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENOENT") return undefined;
    if (error.code === "ENOTDIR") throw usageError(`--out ${dir}: a parent of it is a file, not a directory`);
    throw usageError(`--out ${dir}: ${describe(error)}`);
  });
  if (existing && !existing.isDirectory()) throw usageError(`--out ${dir}: exists and is not a directory`);
  if (!existing) {
    try {
      await mkdir(dir, { recursive: true });
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ENOTDIR" || code === "EEXIST") throw usageError(`--out ${dir}: a parent of it is a file, not a directory`);
      throw usageError(`--out ${dir}: cannot create the directory: ${describe(error)}`);
    }
  }
  try {
    await access(dir, constants.W_OK | constants.X_OK);
  } catch (error) {
    throw usageError(`--out ${dir}: the directory is not writable: ${describe(error)}`);
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

/** Removes earlier runs' `image-*` / `partial-*` files in `dir` that this run did not write; returns their names. */
async function removeStale(dir: string, written: ReadonlySet<string>): Promise<string[]> {
  const stale: string[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    if (entry.isFile() && OUTPUT_NAME.test(entry.name) && !written.has(entry.name)) stale.push(entry.name);
  }
  for (const name of stale) await rm(join(dir, name), { force: true });
  return stale.sort();
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

/** What a finished generate call left behind. */
interface Saved {
  /** Where the images are: --out, or a temporary directory when writing there failed. */
  readonly dir: string;
  readonly images: readonly Encoded[];
  /** Earlier runs' files removed from --out. */
  readonly removed: readonly string[];
  /** Why the images are not in --out, if they are not. */
  readonly writeError?: CliError;
  /** Why earlier files could not be removed, if they could not. */
  readonly cleanupError?: string;
}

/**
 * Writes each image as <out>/image-<index>.<ext>. If the images cannot be
 * written there, they are kept in a fresh temporary directory instead
 * (named on stderr, exit 1): paid images are never dropped.
 */
async function saveImages(response: pb.ImageResponse, ctx: SaveContext): Promise<Saved> {
  const images: Encoded[] = [];
  for (const image of response.data) {
    if (image.payload.case !== "image") continue;
    images.push({ image, bytes: image.payload.value, name: imageName(image.index, EXTENSIONS[image.format] ?? "bin", ctx.width) });
  }
  try {
    await writeAll(ctx.out, images);
  } catch (error) {
    const dir = await mkdtemp(join(tmpdir(), "mmgate-images-"));
    await writeAll(dir, images);
    return { dir, images, removed: [], writeError: ioError(describe(error), error) };
  }
  try {
    return { dir: ctx.out, images, removed: await removeStale(ctx.out, new Set([...images.map((i) => i.name), ...ctx.partials])) };
  } catch (error) {
    return { dir: ctx.out, images, removed: [], cleanupError: `could not remove earlier files in ${ctx.out}: ${describe(error)}` };
  }
}

/** `--json`: everything the text output says, as one object (camelCase, like the protobuf JSON of `images providers --json`). */
function resultJson(response: pb.ImageResponse, saved: Saved, ctx: SaveContext, caps: ProviderCapabilities | undefined): Record<string, unknown> {
  const images = saved.images.map(({ image, name }) => ({
    index: image.index,
    file: join(saved.dir, name),
    width: image.width,
    height: image.height,
    format: EXTENSIONS[image.format] ?? "bin",
    byteSize: Number(image.byteSize),
    sha256: image.sha256,
  }));
  const partials = [...ctx.partials].sort().map((name) => join(ctx.out, name));
  return {
    provider: response.provider,
    model: response.model,
    // `dir` is where the images are: `out`, or a temporary directory when writing to `out` failed (`writeError`, exit 1).
    out: ctx.out,
    dir: saved.dir,
    ...(saved.writeError ? { writeError: { code: saved.writeError.code, message: saved.writeError.message } } : {}),
    files: [...images.map((i) => i.file), ...partials],
    images,
    partials,
    failures: response.failures.map((f) => ({
      index: f.index,
      code: f.error ? errorCodeFromProto(f.error.code) : "internal",
      message: f.error?.message ?? "",
      retryable: f.error?.retryable ?? false,
      ...(f.error?.details && Object.keys(f.error.details).length > 0 ? { details: f.error.details } : {}),
    })),
    warnings: response.warnings.map((code) => ({ code, message: warningLine(code, response, caps) })),
    normalizations: normalizationsJson(response, caps),
    ...(response.revisedPrompt ? { revisedPrompt: response.revisedPrompt } : {}),
    removed: saved.removed,
    totalMs: Number(response.timings?.totalMs ?? 0n),
  };
}

/** Prints what a finished call produced (a line per output on stdout, notes on stderr, or one JSON object) and returns the exit code. */
function printResult(response: pb.ImageResponse, saved: Saved, ctx: SaveContext, io: CliIo, json: boolean, caps?: ProviderCapabilities): number {
  if (saved.writeError) {
    const kept = `kept the ${saved.images.length} image(s) in ${saved.dir}`;
    reportError(io.err, COMMAND, new CliError(saved.writeError.code, saved.writeError.message, { details: [kept] }));
  }
  if (saved.cleanupError) reportWarning(io.err, COMMAND, saved.cleanupError);
  const status = saved.writeError ? EXIT.failure : response.failures.length > 0 ? EXIT.partial : EXIT.ok;
  if (json) {
    io.out.write(`${JSON.stringify(resultJson(response, saved, ctx, caps))}\n`);
    return status;
  }
  if (saved.removed.length > 0) io.err.write(`removed ${saved.removed.length} file(s) from an earlier run: ${saved.removed.join(", ")}\n`);
  for (const { image, name } of saved.images) {
    io.out.write(`${image.index}\t${join(saved.dir, name)}\t${image.width}x${image.height}\t${image.byteSize} bytes\tsha256:${image.sha256}\n`);
  }
  for (const failure of response.failures) {
    const code = failure.error ? errorCodeFromProto(failure.error.code) : "internal";
    io.out.write(`${failure.index}\tFAILED\t${code}: ${failure.error?.message ?? ""}\n`);
  }
  if (response.revisedPrompt) io.out.write(`revised prompt: ${response.revisedPrompt}\n`);
  for (const line of normalizationLines(response, caps)) io.err.write(`${line}\n`);
  for (const warning of response.warnings) reportWarning(io.err, COMMAND, warningLine(warning, response, caps));
  io.out.write(
    `${response.data.length} image(s) from ${response.provider}/${response.model} in ${response.timings?.totalMs ?? 0n} ms` +
      (response.failures.length > 0 ? `, ${response.failures.length} failed\n` : "\n"),
  );
  return status;
}

const COMMAND = "images generate";

/**
 * A failed call as the images commands report it: the service's typed
 * error (its code, whether a retry may help, details, hints in CLI terms),
 * or the call's own failure.
 */
function callError(error: unknown, caps?: ProviderCapabilities): unknown {
  if (!(error instanceof Error)) return error;
  const e = ConnectError.from(error);
  const [detail] = e.findDetails(pb.ErrorDetailSchema);
  if (!detail) return error;
  const hints = detail.suggestions.map(cliHint);
  if (detail.details?.["field"] === "parameters.size") {
    const rule = sizeRule(caps);
    if (rule) hints.push(rule);
  }
  const details = detail.details && Object.keys(detail.details).length > 0 ? [`details: ${JSON.stringify(detail.details)}`] : [];
  return new CliError(snakeCodeName(e.code), `${errorCodeFromProto(detail.code)}: ${detail.message}${detail.retryable ? " (retryable)" : ""}`, { details, hints, cause: error });
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
  const context = connectionContext(o);
  const fail = (error: unknown, caps?: ProviderCapabilities) => reportError(io.err, COMMAND, callError(error, caps), context);
  // The old spellings, kept working: --n for --count, --timeout-ms for --timeout.
  if (o.n !== undefined) o.count = o.n;
  if (o.timeoutMs !== undefined && !(o.timeout !== undefined && o.timeout > 0)) o.timeout = o.timeoutMs;
  try {
    if (o.savePartials && !o.stream) throw usageError("--save-partials needs --stream");
    await prepareOutDir(o.out);
  } catch (error) {
    return fail(error);
  }
  const ctx: SaveContext = { out: o.out, width: indexWidth(o.count), partials: new Set() };
  let partialWriteFailed = false;
  let caps: ProviderCapabilities | undefined;
  let client;
  try {
    client = createClient(ImageService, clientTransport(o));
  } catch (error) {
    return fail(error);
  }
  const headers = o.token ? { authorization: `Bearer ${o.token}` } : undefined;
  try {
    caps = (await client.getCapabilities({ provider: o.provider ?? "", model: o.model ?? "" }, headers ? { headers } : {})).capabilities;
  } catch (error) {
    return fail(error);
  }
  const limit = caps?.count?.max;
  if (limit !== undefined && limit > 0 && o.count > limit) {
    return fail(usageError(`-n ${o.count} is above the limit of ${caps!.provider}: at most ${limit} image(s) per request`));
  }
  try {
    let partials = o.partials;
    if (partials === undefined && o.stream) {
      // Two previews by default, within what the provider offers.
      partials = Math.min(DEFAULT_STREAM_PARTIALS, caps?.partialImages?.max ?? 0);
    }
    const request = imageRequest(prompt, { ...o, ...(partials !== undefined ? { partials } : {}) });
    let completed: pb.ImageResponse | undefined;
    if (!o.stream) {
      completed = (await client.generate({ request }, headers ? { headers } : {})).response;
    } else {
      const steps = (request.parameters?.partialImages ?? 0) + 1;
      const progress = new OutputProgress(io, o.count, steps);
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
                reportWarning(io.err, COMMAND, `could not save previews: ${describe(error)}`);
              }
            }
          } else if (event.case === "completed") completed = event.value.response;
        }
      } finally {
        progress.finish(completed);
      }
    }
    if (!completed) throw new CliError("internal", "the server's answer has no result");
    const saved = await saveImages(completed, ctx);
    return printResult(completed, saved, ctx, io, o.json === true, caps);
  } catch (error) {
    return fail(error, caps);
  }
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
