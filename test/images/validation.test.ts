import { expect } from "chai";
import { createImageRequest, type ImageRequest, type ImageRequestInit } from "../../src/images/model.js";
import { ImageError } from "../../src/images/core/errors.js";
import {
  collectIssues,
  DEFAULT_REQUEST_LIMITS,
  MAX_ISSUES,
  validateRequest,
} from "../../src/images/core/validation.js";

const png = { data: new Uint8Array([0x89, 0x50]) };

function issuesOf(init: Partial<ImageRequestInit>, mutate?: (request: ImageRequest) => void): string[] {
  const request = createImageRequest({ prompt: "a cat", ...init });
  mutate?.(request);
  return collectIssues(request, DEFAULT_REQUEST_LIMITS).map((issue) => `${issue.field}/${issue.code}`);
}

describe("images: request validation", () => {
  it("accepts a minimal request", () => {
    expect(issuesOf({})).to.deep.equal([]);
  });

  const table: [string, Partial<ImageRequestInit>, string[], ((r: ImageRequest) => void)?][] = [
    ["unsupported version", { version: "2" }, ["version/unsupported_version"]],
    ["blank prompt", { prompt: "   " }, ["prompt/required"]],
    ["oversized prompt", { prompt: "x".repeat(131_073) }, ["prompt/too_large"]],
    ["blank negative prompt", { negativePrompt: " " }, ["negative_prompt/empty"]],
    ["oversized negative prompt", { negativePrompt: "x".repeat(65_537) }, ["negative_prompt/too_large"]],
    ["negative prompt under reject", { negativePrompt: "blur", policies: { negativePrompt: "reject" } }, ["policies.negative_prompt/rejected_by_policy"]],
    ["n of zero", { parameters: { n: 0 } }, ["parameters.n/out_of_range"]],
    ["n above the limit", { parameters: { n: 17 } }, ["parameters.n/out_of_range"]],
    ["n at the limit", { parameters: { n: 16 } }, []],
    ["malformed size", { parameters: { size: "0x10" } }, ["parameters.size/invalid_format"]],
    ["uppercase X size", { parameters: { size: "10X10" } }, ["parameters.size/invalid_format"]],
    ["leading zero size", { parameters: { size: "010x10" } }, ["parameters.size/invalid_format"]],
    ["edge above max", { parameters: { size: "16385x16" } }, ["parameters.size/out_of_range"]],
    ["size with aspect ratio", { parameters: { size: "1024x1024", aspectRatio: "1:1" } }, ["parameters.size/ambiguous"]],
    ["size with resolution", { parameters: { size: "1024x1024", resolution: "2k" } }, ["parameters.size/ambiguous"]],
    ["auto size with hints", { parameters: { aspectRatio: "16:9", resolution: "2k" } }, []],
    ["bad aspect ratio", { parameters: { aspectRatio: "16/9" } }, ["parameters.aspect_ratio/invalid_format"]],
    ["compression above 100", { parameters: { outputFormat: "jpeg", outputCompression: 101 } }, ["parameters.output_compression/out_of_range"]],
    ["compression with png", { parameters: { outputCompression: 50 } }, ["parameters.output_compression/incompatible"]],
    ["compression with webp", { parameters: { outputFormat: "webp", outputCompression: 50 } }, []],
    ["too many partial images", { parameters: { partialImages: 4 } }, ["parameters.partial_images/out_of_range"]],
    ["input fidelity without inputs", { parameters: { inputFidelity: "high" } }, ["parameters.input_fidelity/incompatible"]],
    ["input fidelity with a reference", { parameters: { inputFidelity: "high" }, referenceImages: [png] }, []],
    ["edit action on a plain generate", { parameters: { action: "edit" } }, ["parameters.action/incompatible"]],
    ["generate action on an edit", { parameters: { action: "generate" }, operation: { kind: "edit", images: [png] } }, ["parameters.action/incompatible"]],
    ["edit without images", { operation: { kind: "edit", images: [] } }, ["images/required"]],
    ["empty input", { operation: { kind: "edit", images: [{ data: new Uint8Array() }] } }, ["images[0]/empty"]],
    ["non-image media type", { referenceImages: [{ data: new Uint8Array([1]), mediaType: "text/plain" }] }, ["reference_images[0]/invalid"]],
    ["unsafe filename", { operation: { kind: "edit", images: [png], mask: { data: new Uint8Array([1]), filename: "../x.png" } } }, ["mask/invalid_filename"]],
    ["too many inputs", { referenceImages: Array.from({ length: 17 }, () => png) }, ["operation/too_many_inputs"]],
    ["blank provider", { routing: { provider: " " } }, ["routing.provider/empty"]],
    ["oversized model", { routing: { model: "m".repeat(257) } }, ["routing.model/too_large"]],
    ["control characters in user", { user: "a\u0001b" }, ["user/invalid"]],
    ["blank idempotency key", { idempotencyKey: "" }, ["idempotency_key/empty"]],
    ["persistent without key", { session: { mode: "persistent" } }, ["session.key/required"]],
    ["persistent with thread id", { session: { mode: "persistent", key: "k", threadId: "t" } }, ["session.thread_id/incompatible"]],
    ["thread without thread id", { session: { mode: "thread" } }, ["session.thread_id/required"]],
    ["thread with key", { session: { mode: "thread", threadId: "t", key: "k" } }, ["session.key/incompatible"]],
    ["isolated with key", { session: { mode: "isolated", key: "k" } }, ["session.key/incompatible"]],
    ["persistent with blank key", { session: { mode: "persistent", key: " " } }, ["session.key/empty"]],
    ["parallel with persistent", { session: { mode: "persistent", key: "k" }, policies: { batchExecution: "parallel" } }, ["policies.batch_execution/incompatible"]],
    ["zero timeout", { timeoutMs: 0 }, ["timeout_ms/out_of_range"]],
    ["timeout above max", { timeoutMs: 1_800_001 }, ["timeout_ms/out_of_range"]],
  ];
  for (const [name, init, expected, mutate] of table) {
    it(`reports ${name}`, () => {
      expect(issuesOf(init, mutate)).to.deep.equal(expected);
    });
  }

  it("collects every issue sorted by field then code", () => {
    expect(
      issuesOf({ prompt: "", version: "0", parameters: { n: 0, partialImages: 9, outputCompression: 200 } }),
    ).to.deep.equal([
      "parameters.n/out_of_range",
      "parameters.output_compression/incompatible",
      "parameters.output_compression/out_of_range",
      "parameters.partial_images/out_of_range",
      "prompt/required",
      "version/unsupported_version",
    ]);
  });

  it("caps the list at 64 with a too_many_issues marker", () => {
    const bad = Array.from({ length: 70 }, () => ({ data: new Uint8Array() }));
    const limits = { ...DEFAULT_REQUEST_LIMITS, maxInputs: 100 };
    const request = createImageRequest({ prompt: "", version: "9", referenceImages: bad });
    const issues = collectIssues(request, limits);
    // 64 inputs get per-input checks, plus the prompt and version issues.
    expect(issues).to.have.length(MAX_ISSUES);
    expect(issues[MAX_ISSUES - 1]).to.deep.equal({
      field: "$",
      code: "too_many_issues",
      message: "only the first 63 issues are reported",
    });
    expect(issues[0]).to.deep.include({ field: "prompt", code: "required" });
    expect(issues.filter((issue) => issue.code === "empty")).to.have.length(62);
  });

  it("throws invalid_request with details.issues", () => {
    try {
      validateRequest(createImageRequest({ prompt: "", parameters: { n: 99 } }), DEFAULT_REQUEST_LIMITS);
      expect.fail("expected an error");
    } catch (error) {
      expect(error).to.be.instanceOf(ImageError);
      const e = error as ImageError;
      expect(e.code).to.equal("invalid_request");
      expect(e.message).to.equal("request validation failed: parameters.n: must be between 1 and 16 (and 1 more)");
      expect(e.retryable).to.equal(false);
      expect(e.details["issues"]).to.deep.equal([
        { field: "parameters.n", code: "out_of_range", message: "must be between 1 and 16" },
        { field: "prompt", code: "required", message: "must not be blank" },
      ]);
    }
  });

  it("honours configured limits", () => {
    const request = createImageRequest({ prompt: "p", parameters: { n: 40 } });
    expect(collectIssues(request, DEFAULT_REQUEST_LIMITS)).to.have.length(1);
    expect(collectIssues(request, { ...DEFAULT_REQUEST_LIMITS, maxOutputs: 255 })).to.deep.equal([]);
  });
});
