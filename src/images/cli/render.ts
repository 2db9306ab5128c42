/**
 * What `mmgate images` prints: a finished call's files, failures, warnings
 * and normalizations (text or `--json`), and a failed call's error with
 * the server's hints in CLI terms.
 */
import { join } from "node:path";
import { toJson } from "@bufbuild/protobuf";
import { ValueSchema, type Value } from "@bufbuild/protobuf/wkt";
import { ConnectError } from "@connectrpc/connect";
import type { ProviderCapabilities } from "../../../gen/mmgate/images/v1/capabilities_pb.js";
import * as pb from "../../../gen/mmgate/images/v1/images_pb.js";
import { CliError, EXIT, reportError, reportWarning, snakeCodeName } from "../../rpc/index.js";
import { errorCodeFromProto } from "../proto-convert.js";
import { COMMAND, type CliIo } from "./io.js";
import { EXTENSIONS, type SaveContext, type Saved } from "./output-dir.js";

/** A table's own entry: names that come from a server's answer must not reach Object.prototype. */
function own(table: Readonly<Record<string, string>>, key: string): string | undefined {
  return Object.hasOwn(table, key) ? table[key] : undefined;
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
export function printResult(response: pb.ImageResponse, saved: Saved, ctx: SaveContext, io: CliIo, json: boolean, caps?: ProviderCapabilities): number {
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

/**
 * A failed call as the images commands report it: the service's typed
 * error (its code, whether a retry may help, details, hints in CLI terms),
 * or the call's own failure.
 */
export function callError(error: unknown, caps?: ProviderCapabilities): unknown {
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
