import { create, type JsonObject as PbJsonObject, type MessageInitShape } from "@bufbuild/protobuf";
import {
  AnnotatedOutputSchema,
  FinishReasonSchema,
  FinishReason_Kind,
  LLMEngineOutputSchema,
  OutputType,
  type AnnotatedOutput,
  type FinishReason,
  type LLMEngineOutput,
} from "../../gen/mmgate/llm/v1/output_pb.js";
import { JsonError, childPath, parseJson, DEFAULT_JSON_LIMITS, type JsonLimits, type JsonObject, type JsonValue } from "../util/index.js";
import * as r from "./read.js";
import { encoderResultFromJson, obj, traceLinkFromJson, traceLinkToJson } from "./request.js";

const FINISH_NAMES: ReadonlyMap<string, FinishReason_Kind> = new Map([
  ["eos", FinishReason_Kind.EOS],
  ["length", FinishReason_Kind.LENGTH],
  ["stop", FinishReason_Kind.STOP],
  ["cancelled", FinishReason_Kind.CANCELLED],
  ["abort", FinishReason_Kind.CANCELLED],
  ["content_filter", FinishReason_Kind.CONTENT_FILTER],
]);

const OUTPUT_TYPES: ReadonlyMap<string, OutputType> = new Map([
  ["text", OutputType.TEXT],
  ["image", OutputType.IMAGE],
  ["video", OutputType.VIDEO],
  ["audio", OutputType.AUDIO],
]);

/** A FinishReason: "eos", "length", "stop", "cancelled" (or "abort"), "content_filter", {"error": msg}. */
export function finishReasonFromJson(v: JsonValue, path: string): FinishReason {
  if (typeof v === "string") {
    const kind = FINISH_NAMES.get(v);
    if (kind === undefined) throw new JsonError("UNKNOWN_VARIANT", path, `unknown finish_reason ${JSON.stringify(v)}`);
    return create(FinishReasonSchema, { kind });
  }
  const o = r.object(v, path);
  const keys = Object.keys(o);
  if (keys.length !== 1 || keys[0] !== "error") throw new JsonError("UNKNOWN_VARIANT", path, 'expected a finish_reason string or {"error": …}');
  return create(FinishReasonSchema, { kind: FinishReason_Kind.ERROR, errorMessage: r.string(o["error"], childPath(path, "error")) });
}

export function finishReasonToJson(f: FinishReason): JsonValue {
  switch (f.kind) {
    case FinishReason_Kind.EOS:
      return "eos";
    case FinishReason_Kind.LENGTH:
      return "length";
    case FinishReason_Kind.STOP:
      return "stop";
    case FinishReason_Kind.CANCELLED:
      return "cancelled";
    case FinishReason_Kind.CONTENT_FILTER:
      return "content_filter";
    case FinishReason_Kind.ERROR:
      return obj([["error", f.errorMessage]]);
    default:
      throw new JsonError("MISSING", "$.finish_reason", "FinishReason has no kind");
  }
}

/** The reference's Display form: "stop", "error: <msg>". */
export function formatFinishReason(f: FinishReason): string {
  const json = finishReasonToJson(f);
  return typeof json === "string" ? json : `error: ${f.errorMessage}`;
}

type OutputInit = MessageInitShape<typeof LLMEngineOutputSchema>;

export function llmEngineOutputFromJsonValue(v: JsonValue, path = "$"): LLMEngineOutput {
  const o = r.object(v, path);
  const init: OutputInit = {
    tokenIds: r.opt(o, "token_ids", path, (x, p) => r.list(x, p, r.u32)) ?? [],
    outputType: r.opt(o, "output_type", path, (x, p) => {
      const t = OUTPUT_TYPES.get(r.string(x, p));
      if (t === undefined) throw new JsonError("UNKNOWN_VARIANT", p, `unknown output_type ${JSON.stringify(x)}`);
      return t;
    }) ?? OutputType.TEXT,
  };
  const tokens = r.opt(o, "tokens", path, (x, p) => r.list(x, p, (y, q) => (y === null ? {} : { value: r.string(y, q) })));
  if (tokens !== undefined) init.tokens = { values: tokens };
  const text = r.opt(o, "text", path, r.string);
  if (text !== undefined) init.text = text;
  const cum = r.opt(o, "cum_log_probs", path, r.f64);
  if (cum !== undefined) init.cumLogProbs = cum;
  const logProbs = r.opt(o, "log_probs", path, (x, p) => r.list(x, p, r.f64));
  if (logProbs !== undefined) init.logProbs = { values: logProbs };
  const finish = r.opt(o, "finish_reason", path, finishReasonFromJson);
  if (finish !== undefined) init.finishReason = finish;
  const index = r.opt(o, "index", path, r.u32);
  if (index !== undefined) init.index = index;
  const encoderResult = r.opt(o, "encoder_result", path, encoderResultFromJson);
  if (encoderResult !== undefined) init.encoderResult = encoderResult;
  const link = r.opt(o, "worker_trace_link", path, traceLinkFromJson);
  if (link !== undefined) init.workerTraceLink = link;
  for (const [key, field] of ANY_FIELDS) {
    const value = r.opt(o, key, path, r.toValue);
    if (value !== undefined) init[field] = value;
  }
  return create(LLMEngineOutputSchema, init);
}

// Fields that hold any JSON value, by wire key.
const ANY_FIELDS = [
  ["content_parts", "contentParts"],
  ["top_logprobs", "topLogprobs"],
  ["stop_reason", "stopReason"],
  ["disaggregated_params", "disaggregatedParams"],
  ["extra_args", "extraArgs"],
  ["completion_usage", "completionUsage"],
  ["engine_data", "engineData"],
  ["routing_data", "routingData"],
] as const;

export function llmEngineOutputFromJson(text: string, limits: JsonLimits = DEFAULT_JSON_LIMITS): LLMEngineOutput {
  return llmEngineOutputFromJsonValue(parseJson(text, limits));
}

const OUTPUT_TYPE_NAMES: Record<OutputType, string> = {
  [OutputType.UNSPECIFIED]: "text",
  [OutputType.TEXT]: "text",
  [OutputType.IMAGE]: "image",
  [OutputType.VIDEO]: "video",
  [OutputType.AUDIO]: "audio",
};

/**
 * An LLMEngineOutput as the reference's JSON: the Options it does not skip
 * (tokens, text, cum_log_probs, log_probs, top_logprobs, finish_reason,
 * index) are written as null when unset, the others are omitted.
 */
export function llmEngineOutputToJsonValue(m: LLMEngineOutput): JsonObject {
  const any = (v: LLMEngineOutput[(typeof ANY_FIELDS)[number][1]]) => (v === undefined ? undefined : r.fromValue(v));
  return obj([
    ["token_ids", [...m.tokenIds]],
    ["tokens", m.tokens === undefined ? null : m.tokens.values.map((t) => t.value ?? null)],
    ["text", m.text ?? null],
    ["output_type", OUTPUT_TYPE_NAMES[m.outputType] ?? "text"],
    ["content_parts", any(m.contentParts)],
    ["cum_log_probs", m.cumLogProbs ?? null],
    ["log_probs", m.logProbs === undefined ? null : [...m.logProbs.values]],
    ["top_logprobs", any(m.topLogprobs) ?? null],
    ["finish_reason", m.finishReason === undefined ? null : finishReasonToJson(m.finishReason)],
    ["stop_reason", any(m.stopReason)],
    ["index", m.index ?? null],
    ["disaggregated_params", any(m.disaggregatedParams)],
    ["encoder_result", m.encoderResult === undefined ? undefined : r.fromStruct(m.encoderResult)],
    ["worker_trace_link", m.workerTraceLink === undefined ? undefined : traceLinkToJson(m.workerTraceLink)],
    ["extra_args", any(m.extraArgs)],
    ["completion_usage", any(m.completionUsage)],
    ["engine_data", any(m.engineData)],
    ["routing_data", any(m.routingData)],
  ]);
}

/**
 * The Encode worker's terminal chunk (the reference's encode_terminal):
 * finish_reason stop, index 0, encoder_result the given object.
 */
export function encodeTerminal(encoderResult: PbJsonObject): LLMEngineOutput {
  return create(LLMEngineOutputSchema, {
    outputType: OutputType.TEXT,
    finishReason: { kind: FinishReason_Kind.STOP },
    index: 0,
    encoderResult,
  });
}

/** An Annotated<LLMEngineOutput> from its JSON: {data?, id?, event?, comment?, error?}. */
export function annotatedFromJsonValue(v: JsonValue, path = "$"): AnnotatedOutput {
  const o = r.object(v, path);
  const init: MessageInitShape<typeof AnnotatedOutputSchema> = {
    comment: r.opt(o, "comment", path, (x, p) => r.list(x, p, r.string)) ?? [],
  };
  const data = r.opt(o, "data", path, llmEngineOutputFromJsonValue);
  if (data !== undefined) init.data = data;
  const id = r.opt(o, "id", path, r.string);
  if (id !== undefined) init.id = id;
  const event = r.opt(o, "event", path, r.string);
  if (event !== undefined) init.event = event;
  const error = r.opt(o, "error", path, r.toValue);
  if (error !== undefined) init.error = error;
  return create(AnnotatedOutputSchema, init);
}

export function annotatedFromJson(text: string, limits: JsonLimits = DEFAULT_JSON_LIMITS): AnnotatedOutput {
  return annotatedFromJsonValue(parseJson(text, limits));
}

export function annotatedToJsonValue(m: AnnotatedOutput): JsonObject {
  return obj([
    ["data", m.data === undefined ? undefined : llmEngineOutputToJsonValue(m.data)],
    ["id", m.id],
    ["event", m.event],
    ["comment", m.comment.length === 0 ? undefined : [...m.comment]],
    ["error", m.error === undefined ? undefined : r.fromValue(m.error)],
  ]);
}

/**
 * The error an item carries, if any: an error event or error field (the
 * Annotated error), or finish_reason error. Mirrors the reference's checks
 * on an Encode stream item.
 */
export function annotatedError(m: AnnotatedOutput): string | undefined {
  if (m.event === "error" || m.error !== undefined) {
    return m.comment.join("; ") || (m.error === undefined ? "error" : JSON.stringify(r.fromValue(m.error)));
  }
  if (m.data?.finishReason?.kind === FinishReason_Kind.ERROR) return m.data.finishReason.errorMessage;
  return undefined;
}
