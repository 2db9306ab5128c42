import { create, type JsonObject as PbJsonObject, type MessageInitShape } from "@bufbuild/protobuf";
import { TraceLinkSchema, type TraceLink } from "../../gen/mmgate/llm/v1/common_pb.js";
import {
  MediaDataDescriptorSchema,
  MultimodalDataSchema,
  type MediaDataDescriptor,
  type MultimodalData,
  type MultimodalDataList,
} from "../../gen/mmgate/llm/v1/media_pb.js";
import {
  PreprocessedRequestSchema,
  type GuidedDecoding,
  type GuidedDecodingSchema,
  type MmRoutingInfo,
  type MmRoutingInfoSchema,
  type OutputOptions,
  type OutputOptionsSchema,
  type PreprocessedRequest,
  type RoutingHints,
  type RoutingHintsSchema,
  type SamplingOptions,
  type SamplingOptionsSchema,
  type StopConditions,
  type StopConditionsSchema,
} from "../../gen/mmgate/llm/v1/request_pb.js";
import { DataType, type ImageMetadata, type VideoMetadata } from "../../gen/mmgate/media/v1/media_pb.js";
import { JsonError, childPath, newJsonObject, parseJson, DEFAULT_JSON_LIMITS, type JsonLimits, type JsonObject, type JsonValue } from "../util/index.js";
import * as r from "./read.js";

/** The reference's wire key of is_probe. */
export const PROBE_KEY = "_HEALTH_CHECK";

const HEX32 = /^[0-9a-fA-F]{32}$/;
const HEX16 = /^[0-9a-fA-F]{16}$/;
const CONTENT_HASH = /^[0-9a-f]{16}$/;
const MEM_TYPES = new Set(["Dram", "Vram", "Block", "Object", "File", "Unknown"]);

function hex(re: RegExp, digits: number) {
  return (v: JsonValue, path: string): string => {
    const s = r.string(v, path);
    if (!re.test(s)) throw new JsonError("FORMAT", path, `expected ${digits} hex digits`);
    return s;
  };
}

// ---- JSON → message ----------------------------------------------------

export function traceLinkFromJson(v: JsonValue, path: string): TraceLink {
  const o = r.object(v, path);
  return create(TraceLinkSchema, {
    traceId: r.req(o, "trace_id", path, hex(HEX32, 32)),
    spanId: r.req(o, "span_id", path, hex(HEX16, 16)),
  });
}

function u32List(v: JsonValue, path: string) {
  return { values: r.list(v, path, r.u32) };
}

function imageMetadataFromJson(v: JsonValue, path: string): ImageMetadata {
  const o = r.object(v, path);
  return {
    $typeName: "mmgate.media.v1.ImageMetadata",
    format: r.opt(o, "format", path, r.string) ?? "",
    colorType: r.req(o, "color_type", path, r.string),
    layout: r.req(o, "layout", path, r.string),
  };
}

function videoMetadataFromJson(v: JsonValue, path: string): VideoMetadata {
  const o = r.object(v, path);
  const frames = r.opt(o, "frames_indices", path, (x, p) => r.list(x, p, r.i64));
  const total = r.opt(o, "source_total_frames", path, r.i64);
  return {
    $typeName: "mmgate.media.v1.VideoMetadata",
    sourceFps: r.req(o, "source_fps", path, r.f64),
    sourceDuration: r.req(o, "source_duration", path, r.f64),
    sampledTimestamps: r.req(o, "sampled_timestamps", path, (x, p) => r.list(x, p, r.f64)),
    ...(total !== undefined ? { sourceTotalFrames: total } : {}),
    ...(frames !== undefined ? { framesIndices: { $typeName: "mmgate.media.v1.FrameIndices", values: frames } } : {}),
  };
}

/** The reference's decoded-media descriptor JSON (tensor info flattened in). */
export function descriptorFromJson(v: JsonValue, path: string): MediaDataDescriptor {
  const o = r.object(v, path);
  const nixl = r.req(o, "nixl_descriptor", path, r.object);
  const nixlPath = childPath(path, "nixl_descriptor");
  const memType = r.req(nixl, "mem_type", nixlPath, r.string);
  if (!MEM_TYPES.has(memType)) throw new JsonError("UNKNOWN_VARIANT", childPath(nixlPath, "mem_type"), `unknown mem_type ${JSON.stringify(memType)}`);
  const dtype = r.req(o, "dtype", path, r.string);
  if (dtype !== "UINT8") throw new JsonError("UNKNOWN_VARIANT", childPath(path, "dtype"), `unknown dtype ${JSON.stringify(dtype)}`);
  const metaPath = childPath(path, "metadata");
  let metadata: MediaDataDescriptor["metadata"] = { case: undefined };
  const meta = o["metadata"];
  if (meta !== undefined && meta !== null) {
    const m = r.object(meta, metaPath);
    const keys = Object.keys(m);
    if (keys.length !== 1) throw new JsonError("UNKNOWN_VARIANT", metaPath, "expected {\"Image\": …} or {\"Video\": …}");
    if (keys[0] === "Image") metadata = { case: "image", value: imageMetadataFromJson(m["Image"] as JsonValue, childPath(metaPath, "Image")) };
    else if (keys[0] === "Video") metadata = { case: "video", value: videoMetadataFromJson(m["Video"] as JsonValue, childPath(metaPath, "Video")) };
    else throw new JsonError("UNKNOWN_VARIANT", metaPath, `unknown metadata variant ${JSON.stringify(keys[0])}`);
  }
  const hash = r.opt(o, "content_hash", path, r.string);
  if (hash !== undefined && !CONTENT_HASH.test(hash)) throw new JsonError("FORMAT", childPath(path, "content_hash"), "expected 16 lowercase hex digits");
  return create(MediaDataDescriptorSchema, {
    nixlMetadata: r.req(o, "nixl_metadata", path, r.string),
    nixlDescriptor: {
      addr: r.req(nixl, "addr", nixlPath, r.u64),
      size: r.req(nixl, "size", nixlPath, r.u64),
      memType,
      deviceId: r.req(nixl, "device_id", nixlPath, r.u64),
    },
    shape: r.req(o, "shape", path, (x, p) => r.list(x, p, r.u64)),
    dtype: DataType.UINT8,
    metadata,
    ...(hash !== undefined ? { contentHash: hash } : {}),
  });
}

/** One externally tagged MultimodalData item. */
export function multimodalDataFromJson(v: JsonValue, path: string): MultimodalData {
  const o = r.object(v, path);
  const keys = Object.keys(o);
  if (keys.length !== 1) throw new JsonError("UNKNOWN_VARIANT", path, 'expected one of {"Url": …}, {"RawUrl": …}, {"Decoded": …}');
  const tag = keys[0] as string;
  const p = childPath(path, tag);
  const inner = o[tag] as JsonValue;
  switch (tag) {
    case "Url":
      return create(MultimodalDataSchema, { data: { case: "url", value: r.string(inner, p) } });
    case "RawUrl":
      return create(MultimodalDataSchema, { data: { case: "rawUrl", value: r.string(inner, p) } });
    case "Decoded":
      return create(MultimodalDataSchema, { data: { case: "decoded", value: descriptorFromJson(inner, p) } });
    default:
      throw new JsonError("UNKNOWN_VARIANT", path, `unknown media variant ${JSON.stringify(tag)}`);
  }
}

function stopConditionsFromJson(v: JsonValue, path: string): MessageInitShape<typeof StopConditionsSchema> {
  const o = r.object(v, path);
  return defined({
    maxTokens: r.opt(o, "max_tokens", path, r.u32),
    stop: r.opt(o, "stop", path, (x, p) => ({ values: r.list(x, p, r.string) })),
    stopTokenIds: r.opt(o, "stop_token_ids", path, u32List),
    stopTokenIdsHidden: r.opt(o, "stop_token_ids_hidden", path, u32List),
    minTokens: r.opt(o, "min_tokens", path, r.u32),
    ignoreEos: r.opt(o, "ignore_eos", path, r.bool),
    maxThinkingTokens: r.opt(o, "max_thinking_tokens", path, r.u32),
  }) as MessageInitShape<typeof StopConditionsSchema>;
}

function guidedDecodingFromJson(v: JsonValue, path: string): MessageInitShape<typeof GuidedDecodingSchema> {
  const o = r.object(v, path);
  return defined({
    json: r.opt(o, "json", path, r.toValue),
    regex: r.opt(o, "regex", path, r.string),
    choice: r.opt(o, "choice", path, (x, p) => ({ values: r.list(x, p, r.string) })),
    grammar: r.opt(o, "grammar", path, r.string),
    backend: r.opt(o, "backend", path, r.string),
    whitespacePattern: r.opt(o, "whitespace_pattern", path, r.string),
    structuralTag: r.opt(o, "structural_tag", path, r.toValue),
  }) as MessageInitShape<typeof GuidedDecodingSchema>;
}

function samplingOptionsFromJson(v: JsonValue, path: string): MessageInitShape<typeof SamplingOptionsSchema> {
  const o = r.object(v, path);
  return defined({
    n: r.opt(o, "n", path, r.u8),
    bestOf: r.opt(o, "best_of", path, r.u8),
    presencePenalty: r.opt(o, "presence_penalty", path, r.f64),
    frequencyPenalty: r.opt(o, "frequency_penalty", path, r.f64),
    repetitionPenalty: r.opt(o, "repetition_penalty", path, r.f64),
    temperature: r.opt(o, "temperature", path, r.f64),
    topP: r.opt(o, "top_p", path, r.f64),
    topK: r.opt(o, "top_k", path, r.i32),
    minP: r.opt(o, "min_p", path, r.f64),
    useBeamSearch: r.opt(o, "use_beam_search", path, r.bool),
    lengthPenalty: r.opt(o, "length_penalty", path, r.f64),
    seed: r.opt(o, "seed", path, r.i64),
    includeStopStrInOutput: r.opt(o, "include_stop_str_in_output", path, r.bool),
    guidedDecoding: r.opt(o, "guided_decoding", path, guidedDecodingFromJson),
    detokenize: r.opt(o, "detokenize", path, r.bool),
    allowedTokenIds: r.opt(o, "allowed_token_ids", path, u32List),
    badWordsTokenIds: r.opt(o, "bad_words_token_ids", path, r.toValue),
  }) as MessageInitShape<typeof SamplingOptionsSchema>;
}

function outputOptionsFromJson(v: JsonValue, path: string): MessageInitShape<typeof OutputOptionsSchema> {
  const o = r.object(v, path);
  return defined({
    logprobs: r.opt(o, "logprobs", path, r.u32),
    promptLogprobs: r.opt(o, "prompt_logprobs", path, r.u32),
    skipSpecialTokens: r.opt(o, "skip_special_tokens", path, r.bool),
    formattedPrompt: r.opt(o, "formatted_prompt", path, r.bool),
    returnTokensAsTokenIds: r.opt(o, "return_tokens_as_token_ids", path, r.bool),
  }) as MessageInitShape<typeof OutputOptionsSchema>;
}

function routingHintsFromJson(v: JsonValue, path: string): MessageInitShape<typeof RoutingHintsSchema> {
  const o = r.object(v, path);
  return defined({
    backendInstanceId: r.opt(o, "backend_instance_id", path, r.u64),
    prefillWorkerId: r.opt(o, "prefill_worker_id", path, r.u64),
    decodeWorkerId: r.opt(o, "decode_worker_id", path, r.u64),
    dpRank: r.opt(o, "dp_rank", path, r.u32),
    prefillDpRank: r.opt(o, "prefill_dp_rank", path, r.u32),
    expectedOutputTokens: r.opt(o, "expected_output_tokens", path, r.u32),
    loraName: r.opt(o, "lora_name", path, r.string),
    cacheSalt: r.opt(o, "cache_salt", path, r.string),
    priorityJump: r.opt(o, "priority_jump", path, r.f64),
    strictPriority: r.opt(o, "strict_priority", path, r.u32),
    priority: r.opt(o, "priority", path, r.i32),
    allowedWorkerIds: r.opt(o, "allowed_worker_ids", path, (x, p) => ({ values: r.list(x, p, r.u64) })),
    routingConstraints: r.opt(o, "routing_constraints", path, (x, p) => {
      const c = r.object(x, p);
      const preferred = r.opt(c, "preferred_taints", p, r.object) ?? newJsonObject();
      const pp = childPath(p, "preferred_taints");
      const preferredTaints: Record<string, number> = {};
      for (const key of Object.keys(preferred)) preferredTaints[key] = r.f64(preferred[key], childPath(pp, key));
      return { requiredTaints: r.opt(c, "required_taints", p, (y, q) => r.list(y, q, r.string)) ?? [], preferredTaints };
    }),
  }) as MessageInitShape<typeof RoutingHintsSchema>;
}

function mmRoutingInfoFromJson(v: JsonValue, path: string): MessageInitShape<typeof MmRoutingInfoSchema> {
  const o = r.object(v, path);
  return {
    routingTokenIds: r.req(o, "routing_token_ids", path, (x, p) => r.list(x, p, r.u32)),
    blockMmInfos: r.req(o, "block_mm_infos", path, (x, p) =>
      r.list(x, p, (y, q) => (y === null ? {} : { info: r.toStruct(y, q) })),
    ),
    expandedPromptLen: r.opt(o, "expanded_prompt_len", path, r.u64) ?? 0n,
  };
}

function multiModalDataFromJson(v: JsonValue, path: string): Record<string, MultimodalDataList> {
  const o = r.object(v, path);
  const out: Record<string, MultimodalDataList> = {};
  for (const key of Object.keys(o)) {
    const p = childPath(path, key);
    out[key] = { $typeName: "mmgate.llm.v1.MultimodalDataList", items: r.list(o[key], p, multimodalDataFromJson) };
  }
  return out;
}

/** encoder_result: the reference rejects anything but an object. */
export function encoderResultFromJson(v: JsonValue, path: string): PbJsonObject {
  if (typeof v !== "object" || v === null || Array.isArray(v)) {
    throw new JsonError("TYPE", path, "encoder_result must be a JSON object");
  }
  return r.toStruct(v, path);
}

/** Drops undefined properties (exactOptionalPropertyTypes-safe init objects). */
function defined<T extends object>(o: T): T {
  for (const key of Object.keys(o) as (keyof T)[]) if (o[key] === undefined) delete o[key];
  return o;
}

/** A PreprocessedRequest from its reference JSON, already parsed. */
export function preprocessedRequestFromJsonValue(v: JsonValue, path = "$"): PreprocessedRequest {
  const o = r.object(v, path);
  const empty = newJsonObject();
  return create(
    PreprocessedRequestSchema,
    defined({
      model: r.opt(o, "model", path, r.string) ?? "",
      tokenIds: r.req(o, "token_ids", path, (x, p) => r.list(x, p, r.u32)),
      generateRequest: r.opt(o, "generate_request", path, r.toStruct),
      promptEmbeds: r.opt(o, "prompt_embeds", path, r.string),
      multiModalData: r.opt(o, "multi_modal_data", path, multiModalDataFromJson) ?? {},
      mmRoutingInfo: r.opt(o, "mm_routing_info", path, mmRoutingInfoFromJson),
      stopConditions: stopConditionsFromJson(o["stop_conditions"] ?? empty, childPath(path, "stop_conditions")),
      samplingOptions: samplingOptionsFromJson(o["sampling_options"] ?? empty, childPath(path, "sampling_options")),
      outputOptions: outputOptionsFromJson(o["output_options"] ?? empty, childPath(path, "output_options")),
      eosTokenIds: r.opt(o, "eos_token_ids", path, (x, p) => r.list(x, p, r.u32)) ?? [],
      mdcSum: r.opt(o, "mdc_sum", path, r.string),
      annotations: r.opt(o, "annotations", path, (x, p) => r.list(x, p, r.string)) ?? [],
      routing: r.opt(o, "routing", path, routingHintsFromJson),
      routerConfigOverride: r.opt(o, "router_config_override", path, r.toStruct),
      prefillResult: r.opt(o, "prefill_result", path, (x, p) => {
        const pr = r.object(x, p);
        return defined({
          disaggregatedParams: r.toValue(pr["disaggregated_params"] ?? null, childPath(p, "disaggregated_params")),
          promptTokensDetails: r.opt(pr, "prompt_tokens_details", p, r.toStruct),
        });
      }),
      encoderResult: r.opt(o, "encoder_result", path, encoderResultFromJson),
      migrationLink: r.opt(o, "migration_link", path, traceLinkFromJson),
      bootstrapInfo: r.opt(o, "bootstrap_info", path, (x, p) => {
        const b = r.object(x, p);
        return defined({
          bootstrapHost: r.req(b, "bootstrap_host", p, r.string),
          bootstrapPort: r.req(b, "bootstrap_port", p, r.u16),
          bootstrapRoom: r.req(b, "bootstrap_room", p, r.u64),
          handoffId: r.opt(b, "handoff_id", p, r.string),
        });
      }),
      extraArgs: r.opt(o, "extra_args", path, r.toValue),
      requireReasoning: r.opt(o, "require_reasoning", path, r.bool) ?? false,
      router: r.opt(o, "router", path, r.toStruct),
      agentContext: r.opt(o, "agent_context", path, r.toStruct),
      mmProcessorKwargs: r.opt(o, "mm_processor_kwargs", path, r.toValue),
      requestTimestampMs: r.opt(o, "request_timestamp_ms", path, r.f64),
      isProbe: r.opt(o, PROBE_KEY, path, r.bool) ?? false,
    }),
  );
}

/** A PreprocessedRequest from its reference JSON text, within `limits`. */
export function preprocessedRequestFromJson(text: string, limits: JsonLimits = DEFAULT_JSON_LIMITS): PreprocessedRequest {
  return preprocessedRequestFromJsonValue(parseJson(text, limits));
}

// ---- message → JSON ----------------------------------------------------
//
// Keys in the reference's declaration order. A key the reference skips when
// None is omitted; an Option it does not skip is written as null.

export function traceLinkToJson(t: TraceLink): JsonObject {
  return obj([["trace_id", t.traceId], ["span_id", t.spanId]]);
}

/** Builds an object from [key, value] pairs, leaving out undefined values. */
export function obj(entries: [string, JsonValue | undefined][]): JsonObject {
  const out = newJsonObject();
  for (const [key, value] of entries) if (value !== undefined) out[key] = value;
  return out;
}

const orNull = <T>(v: T | undefined, f: (v: T) => JsonValue = (x) => x as JsonValue): JsonValue => (v === undefined ? null : f(v));
const skip = <T>(v: T | undefined, f: (v: T) => JsonValue = (x) => x as JsonValue): JsonValue | undefined => (v === undefined ? undefined : f(v));
const values = (l: { values: readonly JsonValue[] }): JsonValue => [...l.values];

export function descriptorToJsonValue(d: MediaDataDescriptor): JsonObject {
  const n = d.nixlDescriptor;
  let metadata: JsonValue = null;
  if (d.metadata.case === "image") {
    const m = d.metadata.value;
    metadata = obj([["Image", obj([["format", m.format === "" ? null : m.format], ["color_type", m.colorType], ["layout", m.layout]])]]);
  } else if (d.metadata.case === "video") {
    const m = d.metadata.value;
    metadata = obj([
      [
        "Video",
        obj([
          ["source_fps", m.sourceFps],
          ["source_duration", m.sourceDuration],
          ["sampled_timestamps", [...m.sampledTimestamps]],
          ["source_total_frames", m.sourceTotalFrames],
          ["frames_indices", skip(m.framesIndices, (f) => [...f.values])],
        ]),
      ],
    ]);
  }
  return obj([
    ["nixl_metadata", d.nixlMetadata],
    ["nixl_descriptor", obj([["addr", n?.addr ?? 0n], ["size", n?.size ?? 0n], ["mem_type", n?.memType ?? "Dram"], ["device_id", n?.deviceId ?? 0n]])],
    ["shape", [...d.shape]],
    ["dtype", "UINT8"],
    ["metadata", metadata],
    ["content_hash", d.contentHash],
  ]);
}

/** One MultimodalData item; RawUrl is written as {"Url": …}, as the reference does. */
export function multimodalDataToJson(m: MultimodalData): JsonObject {
  switch (m.data.case) {
    case "url":
    case "rawUrl":
      return obj([["Url", m.data.value]]);
    case "decoded":
      return obj([["Decoded", descriptorToJsonValue(m.data.value)]]);
    default:
      throw new JsonError("MISSING", "$", "MultimodalData has no variant set");
  }
}

function stopConditionsToJson(s: StopConditions | undefined): JsonObject {
  return obj([
    ["max_tokens", orNull(s?.maxTokens)],
    ["stop", orNull(s?.stop, values)],
    ["stop_token_ids", orNull(s?.stopTokenIds, values)],
    ["stop_token_ids_hidden", orNull(s?.stopTokenIdsHidden, values)],
    ["min_tokens", orNull(s?.minTokens)],
    ["ignore_eos", orNull(s?.ignoreEos)],
    ["max_thinking_tokens", orNull(s?.maxThinkingTokens)],
  ]);
}

function guidedDecodingToJson(g: GuidedDecoding): JsonObject {
  return obj([
    ["json", orNull(g.json, r.fromValue)],
    ["regex", orNull(g.regex)],
    ["choice", orNull(g.choice, values)],
    ["grammar", orNull(g.grammar)],
    ["backend", orNull(g.backend)],
    ["whitespace_pattern", orNull(g.whitespacePattern)],
    ["structural_tag", orNull(g.structuralTag, r.fromValue)],
  ]);
}

function samplingOptionsToJson(s: SamplingOptions | undefined): JsonObject {
  return obj([
    ["n", orNull(s?.n)],
    ["best_of", orNull(s?.bestOf)],
    ["presence_penalty", orNull(s?.presencePenalty)],
    ["frequency_penalty", orNull(s?.frequencyPenalty)],
    ["repetition_penalty", orNull(s?.repetitionPenalty)],
    ["temperature", orNull(s?.temperature)],
    ["top_p", orNull(s?.topP)],
    ["top_k", orNull(s?.topK)],
    ["min_p", orNull(s?.minP)],
    ["use_beam_search", orNull(s?.useBeamSearch)],
    ["length_penalty", orNull(s?.lengthPenalty)],
    ["seed", orNull(s?.seed)],
    ["include_stop_str_in_output", orNull(s?.includeStopStrInOutput)],
    ["guided_decoding", orNull(s?.guidedDecoding, guidedDecodingToJson)],
    ["detokenize", skip(s?.detokenize)],
    ["allowed_token_ids", skip(s?.allowedTokenIds, values)],
    ["bad_words_token_ids", skip(s?.badWordsTokenIds, r.fromValue)],
  ]);
}

function outputOptionsToJson(s: OutputOptions | undefined): JsonObject {
  return obj([
    ["logprobs", orNull(s?.logprobs)],
    ["prompt_logprobs", orNull(s?.promptLogprobs)],
    ["skip_special_tokens", orNull(s?.skipSpecialTokens)],
    ["formatted_prompt", orNull(s?.formattedPrompt)],
    ["return_tokens_as_token_ids", orNull(s?.returnTokensAsTokenIds)],
  ]);
}

function routingHintsToJson(h: RoutingHints): JsonObject {
  return obj([
    ["backend_instance_id", h.backendInstanceId],
    ["prefill_worker_id", h.prefillWorkerId],
    ["decode_worker_id", h.decodeWorkerId],
    ["dp_rank", h.dpRank],
    ["prefill_dp_rank", h.prefillDpRank],
    ["expected_output_tokens", h.expectedOutputTokens],
    ["lora_name", h.loraName],
    ["cache_salt", h.cacheSalt],
    ["priority_jump", h.priorityJump],
    ["strict_priority", h.strictPriority],
    ["priority", h.priority],
    ["allowed_worker_ids", skip(h.allowedWorkerIds, values)],
    [
      "routing_constraints",
      skip(h.routingConstraints, (c) => {
        const preferred = newJsonObject();
        for (const key of Object.keys(c.preferredTaints).sort()) preferred[key] = c.preferredTaints[key] as number;
        return obj([["required_taints", [...c.requiredTaints]], ["preferred_taints", preferred]]);
      }),
    ],
  ]);
}

function mmRoutingInfoToJson(m: MmRoutingInfo): JsonObject {
  return obj([
    ["routing_token_ids", [...m.routingTokenIds]],
    ["block_mm_infos", m.blockMmInfos.map((b) => (b.info === undefined ? null : r.fromStruct(b.info)))],
    ["expanded_prompt_len", m.expandedPromptLen],
  ]);
}

/** A PreprocessedRequest as the reference's JSON value. */
export function preprocessedRequestToJsonValue(m: PreprocessedRequest): JsonObject {
  const modalities = Object.keys(m.multiModalData);
  let mmd: JsonObject | undefined;
  if (modalities.length > 0) {
    mmd = newJsonObject();
    for (const key of modalities) mmd[key] = (m.multiModalData[key] as MultimodalDataList).items.map(multimodalDataToJson);
  }
  return obj([
    ["model", m.model],
    ["token_ids", [...m.tokenIds]],
    ["generate_request", skip(m.generateRequest, r.fromStruct)],
    ["prompt_embeds", m.promptEmbeds],
    ["multi_modal_data", mmd],
    ["mm_routing_info", skip(m.mmRoutingInfo, mmRoutingInfoToJson)],
    ["stop_conditions", stopConditionsToJson(m.stopConditions)],
    ["sampling_options", samplingOptionsToJson(m.samplingOptions)],
    ["output_options", outputOptionsToJson(m.outputOptions)],
    ["eos_token_ids", [...m.eosTokenIds]],
    ["mdc_sum", orNull(m.mdcSum)],
    ["annotations", [...m.annotations]],
    ["routing", skip(m.routing, routingHintsToJson)],
    ["router_config_override", orNull(m.routerConfigOverride, r.fromStruct)],
    [
      "prefill_result",
      skip(m.prefillResult, (p) =>
        obj([
          ["disaggregated_params", orNull(p.disaggregatedParams, r.fromValue)],
          ["prompt_tokens_details", skip(p.promptTokensDetails, r.fromStruct)],
        ]),
      ),
    ],
    ["encoder_result", skip(m.encoderResult, r.fromStruct)],
    ["migration_link", skip(m.migrationLink, traceLinkToJson)],
    [
      "bootstrap_info",
      skip(m.bootstrapInfo, (b) =>
        obj([
          ["bootstrap_host", b.bootstrapHost],
          ["bootstrap_port", b.bootstrapPort],
          ["bootstrap_room", b.bootstrapRoom],
          ["handoff_id", b.handoffId],
        ]),
      ),
    ],
    ["extra_args", skip(m.extraArgs, r.fromValue)],
    ["require_reasoning", m.requireReasoning ? true : undefined],
    ["router", skip(m.router, r.fromStruct)],
    ["agent_context", skip(m.agentContext, r.fromStruct)],
    ["mm_processor_kwargs", skip(m.mmProcessorKwargs, r.fromValue)],
    ["request_timestamp_ms", m.requestTimestampMs],
    [PROBE_KEY, m.isProbe ? true : undefined],
  ]);
}
