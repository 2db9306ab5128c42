import { create } from "@bufbuild/protobuf";
import { expect } from "chai";
import * as pb from "../../gen/mmgate/images/v1/images_pb.js";
import { requestFromProto, responseToProto } from "../../src/images/proto-convert.js";
import { imagesConfigSchema } from "../../src/images/config.js";
import { buildImageRuntime } from "../../src/images/build.js";
import { ImageError } from "../../src/images/core/errors.js";
import type { ProviderContext } from "../../src/images/core/provider.js";
import { createImageRequest, type ImageRequest, type ImageRequestInit, type ProviderEvent } from "../../src/images/model.js";
import { prepareRoutes, runRoutes, shouldFallback } from "../../src/images/runtime/fallback.js";
import type { ImageRuntime } from "../../src/images/runtime/runtime.js";
import { FakeProvider, fakeCapabilities, type FakeOptions } from "./fake-provider.js";
import { expectThrow, rejection } from "./helpers.js";

/** A FakeProvider under its own name that may fail with a given error (after an optional progress event). */
class RouteProvider extends FakeProvider {
  failures = 0;
  constructor(
    readonly name: string,
    private readonly route: FakeOptions & { error?: () => ImageError; progressFirst?: boolean } = {},
  ) {
    super(route);
  }
  override descriptor() {
    return { ...super.descriptor(), name: this.name };
  }
  override async capabilities() {
    return { ...(await super.capabilities()), provider: this.name };
  }
  override async execute(request: ImageRequest, context: ProviderContext) {
    if (this.route.error) {
      this.failures += 1;
      if (this.route.progressFirst && context.events) await context.events({ type: "progress", stage: "rendering" });
      throw this.route.error();
    }
    return super.execute(request, context);
  }
}

function runtimeWith(providers: RouteProvider[], config: Record<string, unknown> = {}): ImageRuntime {
  return buildImageRuntime(imagesConfigSchema.parse({ reference: { enabled: false }, defaultProvider: providers[0]!.name, ...config }), {
    extraProviders: providers,
  });
}

const request = (init: Partial<ImageRequestInit> = {}) => createImageRequest({ prompt: "p", responseFormat: "metadata", ...init });
const options = (events?: (event: ProviderEvent) => Promise<void>) => ({
  requestId: "rid",
  signal: new AbortController().signal,
  ...(events ? { events } : {}),
});

async function generate(runtime: ImageRuntime, req: ImageRequest, events?: (event: ProviderEvent) => Promise<void>) {
  return runRoutes(runtime, prepareRoutes(runtime, req), req.routing.fallbackPolicy ?? "on_unavailable", options(events));
}

function issuesOf(error: ImageError): { field: string; code: string }[] {
  return (error.details["issues"] as { field: string; code: string }[]).map(({ field, code }) => ({ field, code }));
}

describe("images: provider fallback", () => {
  describe("validation (routing.fallbacks)", () => {
    const runtime = runtimeWith([new RouteProvider("alpha"), new RouteProvider("beta")]);
    const prepare = (init: Partial<ImageRequestInit>) => () => prepareRoutes(runtime, request(init));

    it("allows at most 4 fallbacks", () => {
      const fallbacks = ["m1", "m2", "m3", "m4", "m5"].map((model) => ({ provider: "beta", model }));
      const error = expectThrow(prepare({ routing: { fallbacks } }));
      expect(issuesOf(error)).to.deep.include({ field: "routing.fallbacks", code: "too_many" });
    });

    it("rejects a repeated fallback and one equal to the explicit primary route", () => {
      const error = expectThrow(
        prepare({ routing: { provider: "alpha", fallbacks: [{ provider: "alpha" }, { provider: "beta" }, { provider: "beta" }] } }),
      );
      expect(issuesOf(error)).to.deep.equal([
        { field: "routing.fallbacks[0]", code: "duplicate" },
        { field: "routing.fallbacks[2]", code: "duplicate" },
      ]);
    });

    it("treats another model of the same provider as another route", () => {
      const routed = prepareRoutes(runtime, request({ routing: { provider: "alpha", fallbacks: [{ provider: "alpha", model: "m2" }] } }));
      expect(routed.routes).to.deep.equal([{ provider: "alpha" }, { provider: "alpha", model: "m2" }]);
    });

    it("rejects a fallback that resolves to the implicit default provider", () => {
      const error = expectThrow(prepare({ routing: { fallbacks: [{ provider: "alpha" }] } }));
      expect(error.code).to.equal("invalid_request");
      expect(issuesOf(error)).to.deep.equal([{ field: "routing.fallbacks[0]", code: "duplicate" }]);
    });

    it("needs an isolated session", () => {
      const error = expectThrow(prepare({ session: { mode: "persistent", key: "k" }, routing: { fallbacks: [{ provider: "beta" }] } }));
      expect(issuesOf(error)).to.deep.include({ field: "routing.fallbacks", code: "incompatible" });
    });

    it("checks identifiers", () => {
      const error = expectThrow(prepare({ routing: { fallbacks: [{ provider: " " }] } }));
      expect(issuesOf(error)).to.deep.include({ field: "routing.fallbacks[0].provider", code: "empty" });
    });

    it("rejects an unregistered fallback before anything runs: configuration, naming the field", () => {
      const error = expectThrow(prepare({ routing: { fallbacks: [{ provider: "beta" }, { provider: "gamma" }] } }));
      expect(error.code).to.equal("configuration");
      expect(error.details).to.deep.include({ field: "routing.fallbacks[1].provider", provider: "gamma" });
    });
  });

  it("falls back when the primary's circuit is open, and records the route that served", async () => {
    const alpha = new RouteProvider("alpha", { error: () => new ImageError("upstream", "down", { retryable: true }) });
    const beta = new RouteProvider("beta");
    const runtime = runtimeWith([alpha, beta], { circuitBreaker: { failureThreshold: 1 } });
    const req = request({ routing: { fallbacks: [{ provider: "beta" }] } });

    // upstream is not a fallback reason under on_unavailable; it opens alpha's circuit.
    const first = await rejection(generate(runtime, req));
    expect(first.code).to.equal("upstream");
    expect(first.details["attempts"]).to.deep.equal([{ provider: "alpha", outcome: "failed", error_code: "upstream", duration_ms: (first.details["attempts"] as { duration_ms: number }[])[0]!.duration_ms }]);
    expect(beta.calls).to.equal(0);

    const response = await generate(runtime, req);
    expect(alpha.failures).to.equal(1);
    expect(beta.calls).to.equal(1);
    expect(response.provider).to.equal("beta");
    expect(response.model).to.equal("test-image");
    expect(response.normalizations).to.deep.include({ field: "routing.provider", requested: "alpha", effective: "beta", reason: "provider_fallback" });
    expect(response.warnings).to.include("provider_fallback_used");
    expect(response.attempts!.map(({ provider, outcome, errorCode }) => ({ provider, outcome, errorCode }))).to.deep.equal([
      { provider: "alpha", outcome: "failed", errorCode: "overloaded" },
      { provider: "beta", outcome: "succeeded", errorCode: undefined },
    ]);
  });

  it("tries fallbacks in order and reports every attempt on the final error", async () => {
    const refuse = () => new ImageError("rate_limited", "slow down", { retryable: true });
    const alpha = new RouteProvider("alpha", { error: refuse });
    const beta = new RouteProvider("beta", { error: refuse });
    const gamma = new RouteProvider("gamma", { error: () => new ImageError("safety_rejected", "no") });
    const delta = new RouteProvider("delta");
    const runtime = runtimeWith([alpha, beta, gamma, delta]);
    const error = await rejection(
      generate(runtime, request({ routing: { fallbacks: [{ provider: "beta" }, { provider: "gamma" }, { provider: "delta" }] } })),
    );
    expect(error.code).to.equal("safety_rejected");
    expect((error.details["attempts"] as { provider: string }[]).map((a) => a.provider)).to.deep.equal(["alpha", "beta", "gamma"]);
    expect(delta.calls).to.equal(0);
  });

  it("falls back after a definite provider failure only under on_error", async () => {
    const alpha = new RouteProvider("alpha", { error: () => new ImageError("upstream", "500", { retryable: true }) });
    const beta = new RouteProvider("beta");
    const runtime = runtimeWith([alpha, beta]);
    const response = await generate(runtime, request({ routing: { fallbacks: [{ provider: "beta" }], fallbackPolicy: "on_error" } }));
    expect(response.provider).to.equal("beta");
  });

  it("never falls back after an unknown outcome, whatever the code and policy", async () => {
    const alpha = new RouteProvider("alpha", {
      error: () => new ImageError("overloaded", "ambiguous", { details: { outcome: "unknown" } }),
    });
    const beta = new RouteProvider("beta");
    const runtime = runtimeWith([alpha, beta]);
    const error = await rejection(generate(runtime, request({ routing: { fallbacks: [{ provider: "beta" }], fallbackPolicy: "on_error" } })));
    expect(error.details["outcome"]).to.equal("unknown");
    expect(beta.calls).to.equal(0);
  });

  it("never falls back once the route streamed an event to the caller", async () => {
    const alpha = new RouteProvider("alpha", { error: () => new ImageError("rate_limited", "late", { retryable: true }), progressFirst: true });
    const beta = new RouteProvider("beta");
    const runtime = runtimeWith([alpha, beta]);
    const seen: ProviderEvent[] = [];
    const error = await rejection(
      generate(runtime, request({ routing: { fallbacks: [{ provider: "beta" }] } }), async (event) => void seen.push(event)),
    );
    expect(error.code).to.equal("rate_limited");
    expect(seen).to.have.length(1);
    expect(beta.calls).to.equal(0);
  });

  it("falls back when the primary cannot honour the request (unsupported_capability)", async () => {
    const alpha = new RouteProvider("alpha", { capabilities: { ...fakeCapabilities(), model: "m1" } });
    const beta = new RouteProvider("beta");
    const runtime = runtimeWith([alpha, beta]);
    // routing.model differs from what alpha's capabilities declare: never dispatched.
    const response = await generate(
      runtime,
      request({ routing: { provider: "alpha", model: "other", fallbacks: [{ provider: "beta" }] } }),
    );
    expect(alpha.calls).to.equal(0);
    expect(response.provider).to.equal("beta");
  });

  it("eligibility follows the reference table", () => {
    const e = (code: ImageError["code"], details = {}) => new ImageError(code, "x", { details });
    for (const code of ["configuration", "authentication", "unsupported_capability", "rate_limited", "overloaded"] as const) {
      expect(shouldFallback(e(code), "on_unavailable"), code).to.equal(true);
    }
    for (const code of ["upstream", "protocol", "input", "artifact", "internal"] as const) {
      expect(shouldFallback(e(code), "on_unavailable"), code).to.equal(false);
      expect(shouldFallback(e(code), "on_error"), code).to.equal(true);
    }
    for (const code of ["invalid_request", "permission_denied", "safety_rejected", "cancelled", "session", "idempotency_conflict", "timeout"] as const) {
      expect(shouldFallback(e(code), "on_error"), code).to.equal(false);
    }
    expect(shouldFallback(e("overloaded", { outcome: "unknown" }), "on_error")).to.equal(false);
  });

  it("carries fallbacks and attempts through the protobuf messages", async () => {
    const wire = create(pb.ImageRequestSchema, {
      prompt: "p",
      operation: { case: "generate", value: {} },
      routing: { fallbacks: [{ provider: "beta" }, { provider: "beta", model: "m2" }], fallbackPolicy: pb.FallbackPolicy.ON_ERROR },
    });
    const read = requestFromProto(wire);
    expect(read.routing).to.deep.equal({ fallbacks: [{ provider: "beta" }, { provider: "beta", model: "m2" }], fallbackPolicy: "on_error" });
    const alpha = new RouteProvider("alpha", { error: () => new ImageError("overloaded", "busy", { retryable: true }) });
    const runtime = runtimeWith([alpha, new RouteProvider("beta")]);
    const out = responseToProto(await generate(runtime, { ...read, responseFormat: "metadata" }), "metadata");
    expect(out.provider).to.equal("beta");
    expect(out.attempts.map((a) => [a.provider, a.outcome, a.errorCode])).to.deep.equal([
      ["alpha", pb.ProviderAttemptOutcome.FAILED, pb.ErrorCode.OVERLOADED],
      ["beta", pb.ProviderAttemptOutcome.SUCCEEDED, undefined],
    ]);
  });

  it("answers without attempts when the request names no fallbacks", async () => {
    const runtime = runtimeWith([new RouteProvider("alpha")]);
    const response = await generate(runtime, request());
    expect(response.attempts).to.equal(undefined);
  });
});

