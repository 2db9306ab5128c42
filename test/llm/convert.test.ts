import { readFileSync } from "node:fs";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { expect } from "chai";
import { AnnotatedOutputSchema, FinishReason_Kind } from "../../gen/mmgate/llm/v1/output_pb.js";
import { PreprocessedRequestSchema } from "../../gen/mmgate/llm/v1/request_pb.js";
import {
  annotatedError,
  annotatedFromJsonValue,
  annotatedToJsonValue,
  encodeTerminal,
  formatFinishReason,
  llmEngineOutputToJsonValue,
  preprocessedRequestFromJson,
  preprocessedRequestFromJsonValue,
  preprocessedRequestToJsonValue,
  shouldEncode,
} from "../../src/llm/index.js";
import { JsonError, parseJson, stringifyJson, type JsonValue } from "../../src/util/index.js";

const fixture = (name: string) => readFileSync(new URL(`./fixtures/${name}`, import.meta.url), "utf8");

/** JSON text with keys sorted at every level, bigint-exact. */
function canonical(v: JsonValue): string {
  const sort = (x: JsonValue): JsonValue => {
    if (Array.isArray(x)) return x.map(sort);
    if (x === null || typeof x !== "object") return x;
    const out: Record<string, JsonValue> = Object.create(null);
    for (const key of Object.keys(x).sort()) out[key] = sort(x[key] as JsonValue);
    return out;
  };
  return stringifyJson(sort(v));
}

function errorOf(f: () => unknown): { code: string; path: string } {
  try {
    f();
  } catch (e) {
    expect(e).to.be.instanceOf(JsonError);
    return { code: (e as JsonError).code, path: (e as JsonError).path };
  }
  throw new Error("expected an JsonError");
}

const REQUESTS = ["request-text.json", "request-multimodal-url.json", "request-multimodal-decoded.json", "request-probe.json", "request-encoded.json"];

describe("llm: PreprocessedRequest reference JSON", () => {
  for (const name of REQUESTS) {
    it(`round-trips ${name} through the message and its binary form`, () => {
      const input = parseJson(fixture(name));
      const message = preprocessedRequestFromJsonValue(input);
      const wire = fromBinary(PreprocessedRequestSchema, toBinary(PreprocessedRequestSchema, message));
      expect(canonical(preprocessedRequestToJsonValue(wire))).to.equal(canonical(input));
    });
  }

  it("keeps u64 and i64 values above 2^53 exact", () => {
    const m = preprocessedRequestFromJson(fixture("request-text.json"));
    expect(m.routing?.backendInstanceId).to.equal(18446744073709551615n);
    expect(m.routing?.decodeWorkerId).to.equal(9007199254740993n);
    expect(m.routing?.allowedWorkerIds?.values).to.deep.equal([1n, 18446744073709551614n]);
    expect(m.bootstrapInfo?.bootstrapRoom).to.equal(18446744073709551615n);
    expect(m.samplingOptions?.seed).to.equal(-9223372036854775808n);
    expect(m.tokenIds.at(-1)).to.equal(4294967295);
    const json = stringifyJson(preprocessedRequestToJsonValue(m));
    expect(json).to.contain('"backend_instance_id":18446744073709551615');
    expect(json).to.contain('"bootstrap_room":18446744073709551615');
    const decoded = preprocessedRequestFromJson(fixture("request-multimodal-decoded.json"));
    const item = decoded.multiModalData["image"]?.items[0]?.data;
    expect(item?.case).to.equal("decoded");
    if (item?.case === "decoded") expect(item.value.nixlDescriptor?.addr).to.equal(18446744073709551615n);
  });

  it("reads _HEALTH_CHECK as is_probe and writes it only when set", () => {
    expect(preprocessedRequestFromJson(fixture("request-probe.json")).isProbe).to.equal(true);
    const plain = preprocessedRequestToJsonValue(preprocessedRequestFromJson(fixture("request-text.json")));
    expect(Object.keys(plain)).not.to.include("_HEALTH_CHECK");
  });

  it("reads RawUrl and writes it as Url, as the reference serializes it", () => {
    const m = preprocessedRequestFromJson('{"token_ids":[1],"multi_modal_data":{"image":[{"RawUrl":"data:image/png;base64,cGF5bG9hZA=="}]}}');
    expect(m.multiModalData["image"]?.items[0]?.data).to.deep.equal({ case: "rawUrl", value: "data:image/png;base64,cGF5bG9hZA==" });
    const json = preprocessedRequestToJsonValue(m) as Record<string, JsonValue>;
    expect(json["multi_modal_data"]).to.deep.equal({ image: [{ Url: "data:image/png;base64,cGF5bG9hZA==" }] });
  });

  it("fills the reference's defaults for a minimal request and writes its always-present keys", () => {
    const json = preprocessedRequestToJsonValue(preprocessedRequestFromJson('{"token_ids":[]}'));
    expect(Object.keys(json)).to.deep.equal([
      "model", "token_ids", "stop_conditions", "sampling_options", "output_options",
      "eos_token_ids", "mdc_sum", "annotations", "router_config_override",
    ]);
    expect(json["mdc_sum"]).to.equal(null);
  });

  it("decides should_encode as the reference does", () => {
    const of = (name: string) => shouldEncode(preprocessedRequestFromJson(fixture(name)));
    expect(of("request-multimodal-url.json")).to.equal(true);
    expect(of("request-multimodal-decoded.json")).to.equal(true);
    expect(of("request-text.json")).to.equal(false);
    expect(of("request-probe.json")).to.equal(false);
    expect(of("request-encoded.json")).to.equal(false);
    expect(shouldEncode(preprocessedRequestFromJson('{"token_ids":[],"multi_modal_data":{"image":[]}}'))).to.equal(false);
    expect(shouldEncode(create(PreprocessedRequestSchema, { isProbe: true, multiModalData: { image: { items: [{ data: { case: "url", value: "u" } }] } } }))).to.equal(false);
  });

  const bad: [string, string, string, string][] = [
    ["missing token_ids", "{}", "MISSING", "$.token_ids"],
    ["a token id above u32", '{"token_ids":[4294967296]}', "RANGE", "$.token_ids[0]"],
    ["a negative token id", '{"token_ids":[-1]}', "RANGE", "$.token_ids[0]"],
    ["a fractional token id", '{"token_ids":[1.5]}', "RANGE", "$.token_ids[0]"],
    ["a non-object request", "[]", "TYPE", "$"],
    ["an array encoder_result", '{"token_ids":[],"encoder_result":[1]}', "TYPE", "$.encoder_result"],
    ["a string encoder_result", '{"token_ids":[],"encoder_result":"x"}', "TYPE", "$.encoder_result"],
    ["an unknown media variant", '{"token_ids":[],"multi_modal_data":{"image":[{"Blob":"x"}]}}', "UNKNOWN_VARIANT", "$.multi_modal_data.image[0]"],
    ["two media tags", '{"token_ids":[],"multi_modal_data":{"image":[{"Url":"a","RawUrl":"b"}]}}', "UNKNOWN_VARIANT", "$.multi_modal_data.image[0]"],
    ["a non-string Url", '{"token_ids":[],"multi_modal_data":{"image":[{"Url":1}]}}', "TYPE", "$.multi_modal_data.image[0].Url"],
    ["a u64 above 2^64-1", '{"token_ids":[],"routing":{"backend_instance_id":18446744073709551616}}', "RANGE", "$.routing.backend_instance_id"],
    ["a bootstrap port above u16", '{"token_ids":[],"bootstrap_info":{"bootstrap_host":"h","bootstrap_port":65536,"bootstrap_room":1}}', "RANGE", "$.bootstrap_info.bootstrap_port"],
    ["n above u8", '{"token_ids":[],"sampling_options":{"n":256}}', "RANGE", "$.sampling_options.n"],
    ["a short trace id", '{"token_ids":[],"migration_link":{"trace_id":"abc","span_id":"00f067aa0ba902b7"}}', "FORMAT", "$.migration_link.trace_id"],
    ["a bad descriptor dtype", '{"token_ids":[],"multi_modal_data":{"image":[{"Decoded":{"nixl_metadata":"b64:","nixl_descriptor":{"addr":1,"size":1,"mem_type":"Dram","device_id":0},"shape":[1],"dtype":"F32","metadata":null}}]}}', "UNKNOWN_VARIANT", "$.multi_modal_data.image[0].Decoded.dtype"],
    ["a bad mem_type", '{"token_ids":[],"multi_modal_data":{"image":[{"Decoded":{"nixl_metadata":"b64:","nixl_descriptor":{"addr":1,"size":1,"mem_type":"Disk","device_id":0},"shape":[1],"dtype":"UINT8","metadata":null}}]}}', "UNKNOWN_VARIANT", "$.multi_modal_data.image[0].Decoded.nixl_descriptor.mem_type"],
    ["a big integer in free-form JSON", '{"token_ids":[],"extra_args":{"id":18446744073709551615}}', "LOSSY_NUMBER", "$.extra_args.id"],
    ["a non-boolean probe flag", '{"token_ids":[],"_HEALTH_CHECK":1}', "TYPE", "$._HEALTH_CHECK"],
    ["a key that needs quoting", '{"token_ids":[],"multi_modal_data":{"my image":[1]}}', "TYPE", '$.multi_modal_data["my image"][0]'],
  ];
  for (const [what, text, code, path] of bad) {
    it(`rejects ${what} with ${code} at ${path}`, () => {
      expect(errorOf(() => preprocessedRequestFromJson(text))).to.deep.equal({ code, path });
    });
  }

  it("applies the size and depth limits to request input", () => {
    expect(errorOf(() => preprocessedRequestFromJson('{"token_ids":[1,2,3]}', { maxBytes: 10, maxDepth: 8 })).code).to.equal("TOO_LARGE");
    expect(errorOf(() => preprocessedRequestFromJson('{"token_ids":[],"extra_args":[[[[1]]]]}', { maxBytes: 1000, maxDepth: 4 })).code).to.equal("TOO_DEEP");
  });
});

describe("llm: LLMEngineOutput and Annotated reference JSON", () => {
  const items = parseJson(fixture("outputs.json")) as JsonValue[];
  items.forEach((item, i) => {
    it(`round-trips output item ${i} through the message and its binary form`, () => {
      const message = annotatedFromJsonValue(item);
      const wire = fromBinary(AnnotatedOutputSchema, toBinary(AnnotatedOutputSchema, message));
      expect(canonical(annotatedToJsonValue(wire))).to.equal(canonical(item));
    });
  });

  it("covers every finish reason", () => {
    const kinds = new Set(items.map((item) => annotatedFromJsonValue(item).data?.finishReason?.kind).filter((k) => k !== undefined));
    expect([...kinds].sort()).to.deep.equal(
      [FinishReason_Kind.EOS, FinishReason_Kind.LENGTH, FinishReason_Kind.STOP, FinishReason_Kind.ERROR, FinishReason_Kind.CANCELLED, FinishReason_Kind.CONTENT_FILTER].sort(),
    );
  });

  it('reads "abort" as cancelled and writes "cancelled"', () => {
    const m = annotatedFromJsonValue(parseJson('{"data":{"token_ids":[],"finish_reason":"abort"}}'));
    expect(m.data?.finishReason?.kind).to.equal(FinishReason_Kind.CANCELLED);
    expect((annotatedToJsonValue(m)["data"] as Record<string, JsonValue>)["finish_reason"]).to.equal("cancelled");
  });

  it("formats finish reasons as the reference's Display does", () => {
    const reason = (json: string) => annotatedFromJsonValue(parseJson(`{"data":{"token_ids":[],"finish_reason":${json}}}`)).data!.finishReason!;
    expect(formatFinishReason(reason('"eos"'))).to.equal("eos");
    expect(formatFinishReason(reason('{"error":"boom"}'))).to.equal("error: boom");
  });

  it("writes encode_terminal as the components-side terminal chunk", () => {
    expect(canonical(llmEngineOutputToJsonValue(encodeTerminal({ schema_version: 1 })))).to.equal(
      canonical(parseJson(
        '{"token_ids":[],"tokens":null,"text":null,"output_type":"text","cum_log_probs":null,"log_probs":null,"top_logprobs":null,"finish_reason":"stop","index":0,"encoder_result":{"schema_version":1}}',
      )),
    );
  });

  it("reports errors of an error event, an error field and finish_reason error", () => {
    expect(annotatedError(annotatedFromJsonValue(parseJson('{"event":"error","comment":["down"]}')))).to.equal("down");
    expect(annotatedError(annotatedFromJsonValue(parseJson('{"error":{"message":"x"}}')))).to.equal('{"message":"x"}');
    expect(annotatedError(annotatedFromJsonValue(parseJson('{"data":{"token_ids":[],"finish_reason":{"error":"boom"}}}')))).to.equal("boom");
    expect(annotatedError(annotatedFromJsonValue(parseJson('{"data":{"token_ids":[],"finish_reason":"stop"}}')))).to.equal(undefined);
  });

  const bad: [string, string, string, string][] = [
    ["an unknown finish reason", '{"data":{"finish_reason":"done"}}', "UNKNOWN_VARIANT", "$.data.finish_reason"],
    ["an error finish reason without a string", '{"data":{"finish_reason":{"error":1}}}', "TYPE", "$.data.finish_reason.error"],
    ["an unknown output type", '{"data":{"output_type":"smell"}}', "UNKNOWN_VARIANT", "$.data.output_type"],
    ["a non-object encoder_result", '{"data":{"encoder_result":[]}}', "TYPE", "$.data.encoder_result"],
    ["a non-string comment", '{"comment":[1]}', "TYPE", "$.comment[0]"],
  ];
  for (const [what, text, code, path] of bad) {
    it(`rejects ${what} with ${code} at ${path}`, () => {
      expect(errorOf(() => annotatedFromJsonValue(parseJson(text)))).to.deep.equal({ code, path });
    });
  }
});
