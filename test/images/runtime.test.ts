import { expect } from "chai";
import { imagesConfigSchema } from "../../src/images/config.js";
import { createImageRequest, type ImageRequestInit } from "../../src/images/model.js";
import { breakerVerdictOf, ImageError } from "../../src/images/core/errors.js";
import { DEFAULT_REQUEST_LIMITS, type RequestLimits } from "../../src/images/core/validation.js";
import { buildImageRuntime } from "../../src/images/build.js";
import { OutputFanoutProvider } from "../../src/images/fanout/provider.js";
import { AdmissionGate } from "../../src/images/runtime/admission.js";
import { CircuitBreaker, DEFAULT_CIRCUIT_BREAKER } from "../../src/images/runtime/circuit-breaker.js";
import { ProviderRegistry } from "../../src/images/runtime/registry.js";
import { checkOutputSet, ImageRuntime } from "../../src/images/runtime/runtime.js";
import { FakeProvider, fakeCapabilities, type FakeOptions } from "./fake-provider.js";
import { ProbeProvider } from "./probe-provider.js";
import { rejection } from "./helpers.js";

function runtimeWith(fake: FakeProvider | ProbeProvider, config: Record<string, unknown> = {}) {
  return buildImageRuntime(imagesConfigSchema.parse({ reference: { enabled: false }, fanout: { maxOutputs: 4, maxParallelOutputs: 2 }, ...config }), {
    extraProviders: [fake],
  });
}

function request(init: Partial<ImageRequestInit> = {}) {
  return createImageRequest({ prompt: "p", responseFormat: "metadata", ...init });
}

const options = (signal = new AbortController().signal) => ({ requestId: "rid", signal });


describe("images: runtime", () => {
  it("sets id, provider, timings and fan-out results", async () => {
    const runtime = runtimeWith(new FakeProvider());
    const response = await runtime.execute(request({ parameters: { n: 3 } }), options());
    expect(response.id).to.equal("rid");
    expect(response.provider).to.equal("fanout-test");
    expect(response.data.map((d) => d.index)).to.deep.equal([0, 1, 2]);
    expect(response.timings.totalMs).to.be.at.least(response.timings.providerMs);
    expect(response.revisedPrompt).to.equal("p");
  });

  it("omits the revised prompt when asked", async () => {
    const runtime = runtimeWith(new FakeProvider());
    const response = await runtime.execute(request({ policies: { revisedPrompt: "omit" } }), options());
    expect(response.revisedPrompt).to.equal(undefined);
  });

  it("validates against the configured limits before touching a provider", async () => {
    const fake = new FakeProvider();
    const runtime = runtimeWith(fake, { limits: { maxOutputs: 2 }, fanout: { maxOutputs: 2, maxParallelOutputs: 2 } });
    const error = await rejection(runtime.execute(request({ parameters: { n: 3 } }), options()));
    expect(error.code).to.equal("invalid_request");
    expect(fake.calls).to.equal(0);
  });

  it("rejects capabilities that name another provider", async () => {
    const fake = new FakeProvider({ capabilities: { ...fakeCapabilities(), provider: "someone-else" } });
    const error = await rejection(runtimeWith(fake).execute(request(), options()));
    expect(error.code).to.equal("protocol");
    expect(error.details).to.deep.include({ expected: "fanout-test", actual: "someone-else" });
  });

  it("rejects a response for another model than advertised", async () => {
    const fake = new FakeProvider({ capabilities: { ...fakeCapabilities(), model: "declared" } });
    const error = await rejection(runtimeWith(fake).execute(request(), options()));
    expect(error.code).to.equal("protocol");
    expect(error.message).to.equal("provider answered with a different model");
  });

  it("checks the output set of fast-path responses", async () => {
    const tamper: FakeOptions["tamper"] = (response) => {
      response.data[0]!.index = 5;
    };
    const error = await rejection(runtimeWith(new FakeProvider({ tamper })).execute(request(), options()));
    expect(error.code).to.equal("protocol");
  });

  const sets: [string, number[], number[], "fail_fast" | "best_effort", boolean][] = [
    ["complete", [0, 1, 2], [], "fail_fast", true],
    ["best effort with a failure", [0, 2], [1], "best_effort", true],
    ["failures under fail fast", [0, 2], [1], "fail_fast", false],
    ["duplicates", [0, 0, 2], [], "fail_fast", false],
    ["descending", [1, 0, 2], [], "fail_fast", false],
    ["too few", [0, 1], [], "fail_fast", false],
  ];
  for (const [name, data, failures, policy, ok] of sets) {
    it(`output set: ${name} is ${ok ? "accepted" : "rejected"}`, () => {
      const req = request({ parameters: { n: 3, failurePolicy: policy } });
      const response = {
        data: data.map((index) => ({ index })),
        failures: failures.map((index) => ({ index })),
      } as unknown as Parameters<typeof checkOutputSet>[1];
      if (ok) expect(() => checkOutputSet(req.parameters, response)).to.not.throw();
      else expect(() => checkOutputSet(req.parameters, response)).to.throw(ImageError).with.property("code", "protocol");
    });
  }

  it("refuses at once when the provider gate has no queue room", async () => {
    const probe = new ProbeProvider("probe", 2000);
    const runtime = runtimeWith(probe, { admission: { perProvider: { maxConcurrent: 1, maxQueued: 0 } } });
    const controller = new AbortController();
    const first = runtime.execute(request(), options(controller.signal));
    await probe.whenStarted(1);
    const error = await rejection(runtime.execute(request(), options()));
    expect(error.code).to.equal("overloaded");
    expect(error.details["limit"]).to.equal("provider:probe");
    controller.abort();
    expect((await rejection(first)).code).to.equal("cancelled");
    // Neither our own full queue nor a caller that left counts against the provider.
    expect(runtime.registry.resolve("probe").breaker.snapshot().consecutiveFailures).to.equal(0);
  });

  for (const [where, config] of [
    ["the global gate", { admission: { global: { maxConcurrent: 1, maxQueued: 4 } } }],
    ["the provider gate", { admission: { perProvider: { maxConcurrent: 1, maxQueued: 4 } } }],
    ["the fan-out permits", { fanout: { maxOutputs: 4, maxParallelOutputs: 1 } }],
  ] as const) {
    it(`reports a deadline reached while waiting at ${where} as a retryable timeout`, async () => {
      const probe = new ProbeProvider("probe", 2000);
      const runtime = runtimeWith(probe, config);
      const controller = new AbortController();
      const first = runtime.execute(request(), options(controller.signal));
      await probe.whenStarted(1);
      for (let i = 0; i < 3; i++) {
        const error = await rejection(runtime.execute(request({ timeoutMs: 50 }), options()));
        expect([error.code, error.retryable], error.message).to.deep.equal(["timeout", true]);
      }
      controller.abort();
      await rejection(first);
      expect(runtime.registry.resolve("probe").breaker.snapshot().consecutiveFailures).to.equal(0);
      await runtime.shutdown();
    });
  }

  it("answers a retryable timeout when no chunk of a batch got a fan-out permit before the deadline", async () => {
    const probe = new ProbeProvider("probe", 2000);
    const runtime = runtimeWith(probe);
    const controller = new AbortController();
    const first = runtime.execute(request({ parameters: { n: 2 } }), options(controller.signal));
    await probe.whenStarted(2);
    for (let i = 0; i < 3; i++) {
      const error = await rejection(runtime.execute(request({ parameters: { n: 2 }, timeoutMs: 50 }), options()));
      expect([error.code, error.retryable], error.message).to.deep.equal(["timeout", true]);
      expect(error.details).to.not.have.property("outcome");
    }
    expect(probe.started).to.equal(2);
    controller.abort();
    await rejection(first);
    expect(runtime.registry.resolve("probe").breaker.snapshot().consecutiveFailures).to.equal(0);
    await runtime.shutdown();
  });

  it("validates a request and fetches the provider's capabilities once", async () => {
    let validations = 0;
    const limits: RequestLimits = {
      ...DEFAULT_REQUEST_LIMITS,
      // Read once by every validation of a request with a prompt.
      get maxPromptBytes() {
        validations += 1;
        return DEFAULT_REQUEST_LIMITS.maxPromptBytes;
      },
    };
    const fake = new FakeProvider({ delayMs: 1 });
    const entry = {
      name: "fanout-test",
      provider: new OutputFanoutProvider(fake, { maxOutputs: 4, maxParallelOutputs: 2 }, limits),
      gate: new AdmissionGate("provider:fanout-test", {}),
      breaker: new CircuitBreaker("fanout-test", DEFAULT_CIRCUIT_BREAKER, breakerVerdictOf),
    };
    const runtime = new ImageRuntime(new ProviderRegistry([entry], "fanout-test"), {
      limits,
      defaultTimeoutMs: 5000,
      cancellationGraceMs: 100,
      globalAdmission: {},
    });
    for (const n of [1, 3]) {
      validations = 0;
      fake.capabilityCalls = 0;
      await runtime.execute(request({ parameters: { n } }), options());
      expect([validations, fake.capabilityCalls], `n=${n}`).to.deep.equal([1, 1]);
    }
    // The streaming path: prepared before the stream starts, then run.
    validations = 0;
    fake.capabilityCalls = 0;
    await runtime.run(runtime.prepare(request({ parameters: { n: 3 } })), options());
    expect([validations, fake.capabilityCalls]).to.deep.equal([1, 1]);
  });

  it("rejects a model the reference provider does not serve, without tripping its breaker", async () => {
    const runtime = buildImageRuntime(imagesConfigSchema.parse({ reference: { latencyMs: 0, defaultSize: "64x64" } }));
    for (let i = 0; i < 8; i++) {
      const error = await rejection(runtime.execute(request({ routing: { model: "no-such-model" } }), options()));
      expect(error.code).to.equal("unsupported_capability");
      expect(error.details["field"]).to.equal("routing.model");
    }
    expect(runtime.registry.resolve("reference").breaker.snapshot().consecutiveFailures).to.equal(0);
    const ok = await runtime.execute(request({ routing: { model: "reference-image-1" } }), options());
    expect(ok.data).to.have.length(1);
    await runtime.shutdown();
  });

  it("aborts work still in flight after the shutdown grace and refuses new work", async () => {
    const probe = new ProbeProvider("probe", 5000);
    const runtime = runtimeWith(probe, { shutdownGraceMs: 50 });
    const running = runtime.execute(request(), options());
    await probe.whenStarted(1);
    await runtime.shutdown();
    const error = await rejection(running);
    expect(error.code).to.equal("timeout");
    expect(error.details["outcome"]).to.equal("unknown");
    expect(probe.aborted).to.equal(1);
    expect((await rejection(runtime.execute(request(), options()))).message).to.equal("runtime is shutting down");
  });

  it("gives up on a provider that ignores cancellation after the grace", async () => {
    const stubborn = new FakeProvider({ delayMs: 3000 });
    const original = stubborn.execute.bind(stubborn);
    stubborn.execute = (req, ctx) => original(req, { ...ctx, signal: new AbortController().signal });
    const runtime = runtimeWith(stubborn, { cancellationGraceMs: 20 });
    const error = await rejection(runtime.execute(request({ timeoutMs: 30 }), options()));
    expect(error.code).to.equal("timeout");
    expect(error.retryable).to.equal(false);
    expect(error.details["outcome"]).to.equal("unknown");
  });

  it("opens the circuit of a provider whose capabilities name another provider", async () => {
    const fake = new FakeProvider({ capabilities: { ...fakeCapabilities(), provider: "someone-else" } });
    const runtime = runtimeWith(fake, { circuitBreaker: { failureThreshold: 3 } });
    for (let i = 0; i < 3; i++) expect((await rejection(runtime.execute(request(), options()))).code).to.equal("protocol");
    expect(runtime.registry.resolve("fanout-test").breaker.snapshot().state).to.equal("open");
    const refused = await rejection(runtime.execute(request(), options()));
    expect([refused.code, refused.details["circuit_state"]]).to.deep.equal(["overloaded", "open"]);
    expect(fake.calls).to.equal(0);
  });

  it("opens the circuit on protocol errors from capability discovery, but not on a request it cannot honour", async () => {
    const fake = new FakeProvider();
    fake.capabilities = () => Promise.reject(new ImageError("protocol", "capabilities do not parse"));
    const runtime = runtimeWith(fake, { circuitBreaker: { failureThreshold: 2 } });
    for (let i = 0; i < 2; i++) expect((await rejection(runtime.execute(request(), options()))).code).to.equal("protocol");
    expect(runtime.registry.resolve("fanout-test").breaker.snapshot().state).to.equal("open");

    const strict = runtimeWith(new FakeProvider(), { circuitBreaker: { failureThreshold: 2 } });
    for (let i = 0; i < 3; i++) {
      const error = await rejection(strict.execute(request({ parameters: { quality: "high" }, policies: { compatibility: "strict" } }), options()));
      expect(error.code).to.equal("unsupported_capability");
    }
    expect(strict.registry.resolve("fanout-test").breaker.snapshot()).to.deep.include({ state: "closed", consecutiveFailures: 0 });
  });

  it("counts the wait at the global gate in queue_ms", async () => {
    const runtime = runtimeWith(new FakeProvider({ delayMs: 200 }), { admission: { global: { maxConcurrent: 1 } } });
    const first = runtime.execute(request(), options());
    const second = await runtime.execute(request(), options());
    await first;
    expect(second.timings.queueMs).to.be.at.least(150);
    // Each figure is rounded on its own: the parts may add up to a millisecond or two more than the whole.
    expect(second.timings.totalMs).to.be.at.least(second.timings.queueMs + second.timings.providerMs - 2);
  });

  it("fails to build with an unknown default provider or none at all", () => {
    expect(() => buildImageRuntime(imagesConfigSchema.parse({ defaultProvider: "nope" }))).to.throw(ImageError);
    expect(() => buildImageRuntime(imagesConfigSchema.parse({ reference: { enabled: false } }))).to.throw(ImageError);
  });
});
