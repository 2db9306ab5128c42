import { expect } from "chai";
import { createImageRequest, type ImageRequestInit, type ProviderCapabilities } from "../../src/images/model.js";
import { validateCapabilities } from "../../src/images/core/capabilities.js";
import { ImageError } from "../../src/images/core/errors.js";
import { negotiateRequest, NEGATIVE_PROMPT_MERGE_PREFIX } from "../../src/images/core/negotiation.js";
import { DEFAULT_REQUEST_LIMITS } from "../../src/images/core/validation.js";
import { OutputFanoutProvider } from "../../src/images/fanout/provider.js";
import { FakeProvider, fakeCapabilities } from "./fake-provider.js";
import { rejection } from "./helpers.js";

function capabilities(change: Partial<ProviderCapabilities> = {}): ProviderCapabilities {
  const base = fakeCapabilities();
  base.count = { min: 1, max: 2 };
  base.batching = { mode: "native", nativeCount: { min: 1, max: 2 }, maxParallelOutputs: 1 };
  base.sizes = { auto: true, allowed: ["1024x1024"], arbitrary: false };
  base.qualities = ["auto", "low"];
  base.outputFormats = ["png", "jpeg"];
  base.backgrounds = ["auto", "opaque"];
  base.partialImages = { min: 0, max: 2 };
  base.model = "test-image";
  return { ...base, ...change };
}

function rejectionOf(fn: () => unknown): ImageError {
  try {
    fn();
  } catch (error) {
    expect(error).to.be.instanceOf(ImageError);
    return error as ImageError;
  }
  throw new Error("expected an error");
}

function req(init: Partial<ImageRequestInit>) {
  return createImageRequest({ prompt: "p", ...init });
}

describe("images: capability validation", () => {
  const bad: [string, (c: ProviderCapabilities) => void][] = [
    ["count.min of zero", (c) => (c.count = { min: 0, max: 2 })],
    ["inverted count", (c) => (c.count = { min: 3, max: 2 })],
    ["native count beyond count", (c) => (c.batching.nativeCount = { min: 1, max: 3 })],
    ["max_parallel_outputs of zero", (c) => (c.batching.maxParallelOutputs = 0)],
    ["max_parallel_outputs above count", (c) => (c.batching.maxParallelOutputs = 3)],
    ["native mode with a smaller native count", (c) => (c.batching.nativeCount = { min: 1, max: 1 })],
    ["fan_out with native_count == count", (c) => (c.batching.mode = "fan_out")],
    ["inverted partial range", (c) => (c.partialImages = { min: 2, max: 1 })],
    ["transparent without native support", (c) => c.backgrounds.push("transparent")],
    ["native transparency without the background", (c) => (c.transparentBackground = "native")],
    ["emulated transparency without png or webp", (c) => (c.outputFormats = ["jpeg"])],
  ];
  for (const [name, mutate] of bad) {
    it(`rejects ${name} as protocol`, () => {
      const c = capabilities();
      mutate(c);
      expect(rejectionOf(() => validateCapabilities(c)).code).to.equal("protocol");
    });
  }

  it("makes malformed capabilities a protocol error in every compatibility mode, before any call", async () => {
    const inner = new FakeProvider({ capabilities: capabilities({ count: { min: 0, max: 1 } }) });
    const provider = new OutputFanoutProvider(inner, { maxOutputs: 4, maxParallelOutputs: 2 }, DEFAULT_REQUEST_LIMITS);
    const context = { requestId: "r", deadline: Date.now() + 5000, signal: new AbortController().signal };
    for (const compatibility of ["strict", "normalize", "best_effort"] as const) {
      const error = await rejection(provider.execute(req({ policies: { compatibility } }), context));
      expect(error.code).to.equal("protocol");
    }
    expect(inner.calls).to.equal(0);
  });
});

describe("images: negotiation", () => {
  const hard: [string, Partial<ImageRequestInit>, string, Partial<ProviderCapabilities>?][] = [
    ["a different model", { routing: { model: "other" } }, "routing.model"],
    ["an unsupported operation", { operation: { kind: "edit", images: [{ data: new Uint8Array([1]) }] } }, "operation"],
    ["unsupported references", { referenceImages: [{ data: new Uint8Array([1]) }] }, "reference_images"],
    ["a persistent session", { session: { mode: "persistent", key: "k" } }, "session.mode", { persistentSessions: false }],
    ["a thread session", { session: { mode: "thread", threadId: "t" } }, "session.mode", { explicitThreads: false }],
    ["user attribution", { user: "u1" }, "user"],
    ["an unsupported input fidelity", { parameters: { inputFidelity: "low" }, referenceImages: [] }, "parameters.input_fidelity"],
  ];
  for (const [name, init, field, change] of hard) {
    it(`always rejects ${name}`, () => {
      for (const compatibility of ["strict", "normalize"] as const) {
        const request = req({ ...init, policies: { compatibility } });
        const error = rejectionOf(() => negotiateRequest(request, capabilities(change)));
        expect(error.code).to.equal("unsupported_capability");
        expect(error.details["field"]).to.equal(field);
        expect(error.details["model"]).to.equal("test-image");
      }
    });
  }

  const soft: [string, Partial<ImageRequestInit>, { field: string; requested?: unknown; effective?: unknown; reason: string }][] = [
    ["n above count", { parameters: { n: 3 } }, { field: "parameters.n", requested: 3, effective: 2, reason: "clamped_to_provider_range" }],
    ["an unsupported size", { parameters: { size: "512x512" } }, { field: "parameters.size", requested: "512x512", effective: "auto", reason: "normalized_to_provider_size" }],
    ["an aspect ratio hint", { parameters: { aspectRatio: "16:9" } }, { field: "parameters.aspect_ratio", requested: "16:9", reason: "provider_does_not_support_hint" }],
    ["a resolution hint", { parameters: { resolution: "2k" } }, { field: "parameters.resolution", requested: "2k", reason: "provider_does_not_support_hint" }],
    ["an unsupported quality", { parameters: { quality: "high" } }, { field: "parameters.quality", requested: "high", effective: "auto", reason: "normalized_to_provider_value" }],
    ["an unsupported format", { parameters: { outputFormat: "webp" } }, { field: "parameters.output_format", requested: "webp", effective: "png", reason: "normalized_to_provider_value" }],
    ["an unsupported background", { parameters: { background: "transparent" } }, { field: "parameters.background", requested: "transparent", effective: "auto", reason: "normalized_to_provider_value" }],
    ["an unsupported moderation", { parameters: { moderation: "low" } }, { field: "parameters.moderation", requested: "low", effective: "auto", reason: "normalized_to_provider_value" }],
    ["too many partial images", { parameters: { partialImages: 3 } }, { field: "parameters.partial_images", requested: 3, effective: 2, reason: "clamped_to_provider_range" }],
  ];
  for (const [name, init, normalization] of soft) {
    it(`rejects ${name} in strict mode and normalizes it otherwise`, () => {
      const strictError = rejectionOf(() => negotiateRequest(req(init), capabilities()));
      expect(strictError.code).to.equal("unsupported_capability");
      expect(strictError.details["field"]).to.equal(normalization.field);
      for (const compatibility of ["normalize", "best_effort"] as const) {
        const result = negotiateRequest(req({ ...init, policies: { compatibility } }), capabilities());
        expect(result.normalizations).to.deep.equal([normalization]);
      }
    });
  }

  it("reports every changed parameter in normalize mode", () => {
    const result = negotiateRequest(
      req({ parameters: { n: 3, quality: "high", size: "512x512" }, policies: { compatibility: "normalize" } }),
      capabilities(),
    );
    expect(result.normalizations.map((n) => n.field)).to.deep.equal(["parameters.n", "parameters.size", "parameters.quality"]);
    expect(result.requested).to.deep.include({ n: 3, quality: "high", size: "512x512" });
    expect(result.effectiveRequest.parameters).to.deep.include({ n: 2, quality: "auto", size: "auto" });
  });

  it("falls back to the first allowed size when auto is not offered", () => {
    const c = capabilities();
    c.sizes = { auto: false, allowed: ["1024x1024"], arbitrary: false };
    const result = negotiateRequest(req({ policies: { compatibility: "normalize" } }), c);
    expect(result.effectiveRequest.parameters.size).to.equal("1024x1024");
  });

  it("drops compression when the effective format has none", () => {
    const c = capabilities({ outputFormats: ["png"] });
    const result = negotiateRequest(
      req({ parameters: { outputFormat: "jpeg", outputCompression: 80 }, policies: { compatibility: "normalize" } }),
      c,
    );
    expect(result.normalizations.map((n) => n.reason)).to.deep.equal([
      "normalized_to_provider_value",
      "effective_format_has_no_compression",
    ]);
    expect(result.effectiveRequest.parameters.outputCompression).to.equal(undefined);
  });

  it("falls back to the automatic action even in strict mode", () => {
    const result = negotiateRequest(req({ parameters: { action: "edit" }, referenceImages: [] }), capabilities());
    expect(result.normalizations).to.deep.equal([
      { field: "parameters.action", requested: "edit", effective: "auto", reason: "provider_uses_automatic_action" },
    ]);
  });

  it("accepts arbitrary sizes within the provider's bounds", () => {
    const c = capabilities();
    c.sizes = { auto: false, allowed: [], arbitrary: true, minEdge: 64, maxEdge: 2048, edgeMultiple: 16, maxAspectRatio: 3 };
    expect(() => negotiateRequest(req({ parameters: { size: "512x256" } }), c)).to.not.throw();
    for (const size of ["32x64", "4096x64", "500x500", "2048x512"]) {
      expect(rejectionOf(() => negotiateRequest(req({ parameters: { size } }), c)).details["field"]).to.equal("parameters.size");
    }
  });

  describe("negative prompts", () => {
    const cases: [string, "auto" | "native" | "merge", ProviderCapabilities["negativePrompt"], "keep" | "merge" | "error"][] = [
      ["auto with native support keeps it", "auto", "native", "keep"],
      ["auto with emulated support merges", "auto", "emulated", "merge"],
      ["auto without support fails", "auto", "unsupported", "error"],
      ["native without native support fails", "native", "emulated", "error"],
      ["native with native support keeps it", "native", "native", "keep"],
      ["merge always merges", "merge", "native", "merge"],
    ];
    for (const [name, policy, support, outcome] of cases) {
      it(name, () => {
        const request = req({ negativePrompt: "blurry", policies: { negativePrompt: policy } });
        const c = capabilities({ negativePrompt: support });
        if (outcome === "error") {
          expect(rejectionOf(() => negotiateRequest(request, c)).details["field"]).to.equal("negative_prompt");
          return;
        }
        const result = negotiateRequest(request, c);
        if (outcome === "keep") {
          expect(result.effectiveRequest.negativePrompt).to.equal("blurry");
          expect(result.normalizations).to.deep.equal([]);
        } else {
          expect(result.effectiveRequest.negativePrompt).to.equal(undefined);
          expect(result.effectiveRequest.prompt).to.equal(`p\n\n${NEGATIVE_PROMPT_MERGE_PREFIX} blurry`);
          expect(result.normalizations).to.deep.equal([
            { field: "negative_prompt", requested: true, effective: "merged_into_prompt", reason: "negative_prompt_prompt_merge" },
          ]);
        }
      });
    }
  });

  it("fails revised_prompt require when the provider reports none", () => {
    const error = rejectionOf(() =>
      negotiateRequest(req({ policies: { revisedPrompt: "require" } }), capabilities({ revisedPrompt: "unsupported" })),
    );
    expect(error.details["field"]).to.equal("policies.revised_prompt");
  });

  it("never changes the caller's request", () => {
    const request = req({ parameters: { n: 3 }, policies: { compatibility: "normalize" } });
    negotiateRequest(request, capabilities());
    expect(request.parameters.n).to.equal(3);
  });
});
