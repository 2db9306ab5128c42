import { create } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import { expect } from "chai";
import * as pb from "../../gen/mmgate/images/v1/images_pb.js";
import { ERROR_CODES, ImageError } from "../../src/images/core/errors.js";
import { DEFAULT_REQUEST_LIMITS } from "../../src/images/core/validation.js";
import { GRPC_STATUS, errorToProto, reduceAspectRatio, requestFromProto, toConnectError } from "../../src/images/proto-convert.js";

describe("images: protobuf conversion", () => {
  it("fills every default from an almost empty request", () => {
    const request = requestFromProto(create(pb.ImageRequestSchema, { prompt: "p", operation: { case: "generate", value: {} } }));
    expect(request).to.deep.include({ version: "1", prompt: "p", responseFormat: "bytes" });
    expect(request.parameters).to.deep.equal({
      n: 1, size: "auto", quality: "auto", outputFormat: "png", background: "auto", moderation: "auto",
      partialImages: 0, failurePolicy: "fail_fast", action: "auto",
    });
    expect(request.session).to.deep.equal({ mode: "isolated" });
    expect(request.policies).to.deep.equal({ compatibility: "strict", negativePrompt: "auto", revisedPrompt: "include", batchExecution: "auto" });
  });

  it("maps enums by name and keeps explicit zeros", () => {
    const request = requestFromProto(
      create(pb.ImageRequestSchema, {
        prompt: "p",
        operation: { case: "edit", value: { images: [{ data: new Uint8Array([1]), mediaType: "image/png" }] } },
        parameters: { n: 0, outputCompression: 0, failurePolicy: pb.FailurePolicy.BEST_EFFORT, resolution: pb.Resolution.RESOLUTION_2K, aspectRatio: "1920:1080", inputFidelity: pb.InputFidelity.HIGH },
        session: { mode: pb.SessionMode.PERSISTENT, key: "k" },
        policies: { batchExecution: pb.BatchExecution.SEQUENTIAL },
        timeoutMs: 5000n,
      }),
    );
    expect(request.parameters).to.deep.include({ n: 0, outputCompression: 0, failurePolicy: "best_effort", resolution: "2k", aspectRatio: "16:9", inputFidelity: "high" });
    expect(request.operation.kind).to.equal("edit");
    expect(request.session).to.deep.equal({ mode: "persistent", key: "k" });
    expect(request.policies.batchExecution).to.equal("sequential");
    expect(request.timeoutMs).to.equal(5000);
  });

  it("reports unknown enum numbers as issues, the first one in the message", () => {
    try {
      requestFromProto(create(pb.ImageRequestSchema, { prompt: "p", parameters: { quality: 42 as pb.Quality, background: 43 as pb.Background } }));
      expect.fail("expected an error");
    } catch (error) {
      const e = error as ImageError;
      expect(e.code).to.equal("invalid_request");
      expect(e.message).to.equal("request validation failed: parameters.quality: unknown value 42 (and 1 more)");
      expect((e.details["issues"] as { field: string; code: string }[]).map((i) => `${i.field}/${i.code}`)).to.deep.equal([
        "parameters.quality/invalid_enum",
        "parameters.background/invalid_enum",
      ]);
    }
  });

  it("defaults a request without an operation to generate", () => {
    const request = requestFromProto(create(pb.ImageRequestSchema, { prompt: "p" }), DEFAULT_REQUEST_LIMITS);
    expect(request.operation).to.deep.equal({ kind: "generate" });
  });

  it("with the limits, lists wire issues together with every validation issue, sorted", () => {
    try {
      requestFromProto(create(pb.ImageRequestSchema, { prompt: "  ", parameters: { n: 0, quality: 42 as pb.Quality } }), DEFAULT_REQUEST_LIMITS);
      expect.fail("expected an error");
    } catch (error) {
      const issues = ((error as ImageError).details["issues"] as { field: string; code: string }[]).map((i) => `${i.field}/${i.code}`);
      expect(issues).to.include.members(["parameters.quality/invalid_enum", "prompt/required"]);
      expect(issues).to.not.include("operation/required");
      expect(issues.some((i) => i.startsWith("parameters.n/"))).to.equal(true);
      expect(issues).to.deep.equal([...issues].sort());
    }
  });

  it("reduces aspect ratios", () => {
    expect(reduceAspectRatio("1920:1080")).to.equal("16:9");
    expect(reduceAspectRatio("3:2")).to.equal("3:2");
    expect(reduceAspectRatio("x")).to.equal("x");
  });

  it("maps every error code to a status and carries the error in the detail", () => {
    for (const code of ERROR_CODES) {
      expect(GRPC_STATUS[code], code).to.be.a("number");
      const error = new ImageError(code, "m", { retryable: true, provider: "p", details: { field: "x", n: 1 } });
      const detail = errorToProto(error);
      expect(pb.ErrorCode[detail.code]?.toLowerCase()).to.equal(code);
      // A safety refusal is never retryable and always carries its safety details (core/errors.ts).
      expect(detail).to.deep.include({ message: "m", retryable: code !== "safety_rejected", provider: "p" });
      expect(detail.details).to.deep.include({ field: "x", n: 1 });
      expect(detail.suggestions).to.deep.equal(error.suggestions);
    }
    expect(GRPC_STATUS.invalid_request).to.equal(Code.InvalidArgument);
    expect(GRPC_STATUS.rate_limited).to.equal(Code.ResourceExhausted);
    expect(GRPC_STATUS.timeout).to.equal(Code.DeadlineExceeded);
  });

  it("sends retry-after in whole seconds, at least 1", () => {
    const at = (ms: number | undefined) =>
      toConnectError(new ImageError("rate_limited", "m", { retryable: true, details: ms === undefined ? {} : { retry_after_ms: ms } })).metadata.get("retry-after");
    expect(at(180_001)).to.equal("181");
    expect(at(10)).to.equal("1");
    expect(at(undefined)).to.equal("1");
    // Every UNAVAILABLE / RESOURCE_EXHAUSTED answer carries it, retryable or not; other statuses never do.
    expect(toConnectError(new ImageError("upstream", "m")).metadata.get("retry-after")).to.equal("1");
    expect(toConnectError(new ImageError("timeout", "m", { retryable: true })).metadata.get("retry-after")).to.equal(null);
  });
});
