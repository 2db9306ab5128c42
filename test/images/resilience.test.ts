import { Code, ConnectError, createClient } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import * as pb from "../../gen/mmgate/images/v1/images_pb.js";
import { breakerVerdictOf, ImageError, type ErrorCode } from "../../src/images/core/errors.js";
import { defineImagesModule } from "../../src/images/index.js";
import type { ImageRequest, ImageResponse } from "../../src/images/model.js";
import { AdmissionGate } from "../../src/images/runtime/admission.js";
import {
  CircuitBreaker,
  DEFAULT_CIRCUIT_BREAKER,
  type BreakerPermit,
  type ErrorClassifier,
} from "../../src/images/runtime/circuit-breaker.js";
import { ProviderRegistry } from "../../src/images/runtime/registry.js";
import { expectRejection, FakeClock, grpcServerStream, grpcUnary, startServer, type InProcessServer } from "../support/index.js";
import { rejection } from "./helpers.js";
import { ProbeProvider } from "./probe-provider.js";


function thrown(fn: () => unknown): ImageError {
  try {
    fn();
  } catch (error) {
    return error as ImageError;
  }
  throw new Error("expected an error");
}

describe("images: admission gate", () => {
  const far = () => Date.now() + 10_000;
  const signal = () => new AbortController().signal;

  it("admits up to max_concurrent at once and queues the rest", async () => {
    const gate = new AdmissionGate("provider:x", { maxConcurrent: 1, maxQueued: 1 });
    const first = await gate.acquire(signal(), far());
    const waiting = gate.acquire(signal(), far());
    expect(gate.queueDepth).to.equal(1);
    const refused = await rejection(gate.acquire(signal(), far()));
    expect(refused.code).to.equal("overloaded");
    expect(refused.retryable).to.equal(true);
    expect(refused.details["limit"]).to.equal("provider:x");
    first.release();
    (await waiting).release();
    expect(gate.queueDepth).to.equal(0);
    expect(gate.active).to.equal(0);
  });

  it("refuses at once with max_queued = 0", async () => {
    const gate = new AdmissionGate("global", { maxConcurrent: 1, maxQueued: 0 });
    const held = await gate.acquire(signal(), far());
    expect((await rejection(gate.acquire(signal(), far()))).code).to.equal("overloaded");
    held.release();
  });

  it("times out, cancels and closes waits", async () => {
    const gate = new AdmissionGate("global", { maxConcurrent: 1 });
    const held = await gate.acquire(signal(), far());
    const timedOut = await rejection(gate.acquire(signal(), Date.now() + 10));
    expect([timedOut.code, timedOut.retryable, timedOut.details["limit"]]).to.deep.equal(["timeout", true, "global"]);
    const controller = new AbortController();
    const cancelled = gate.acquire(controller.signal, far());
    controller.abort();
    expect((await rejection(cancelled)).code).to.equal("cancelled");
    const closing = gate.acquire(signal(), far());
    gate.close();
    expect((await rejection(closing)).message).to.equal("runtime is shutting down");
    expect((await rejection(gate.acquire(signal(), far()))).code).to.equal("cancelled");
    held.release();
  });

  it("is unlimited by default and rejects max_concurrent = 0", async () => {
    const gate = new AdmissionGate("global", {});
    await Promise.all(Array.from({ length: 100 }, () => gate.acquire(signal(), far())));
    expect(() => new AdmissionGate("global", { maxConcurrent: 0 })).to.throw(ImageError);
  });
});

describe("images: circuit breaker", () => {
  let clock = new FakeClock();
  const breaker = (change = {}, classify: ErrorClassifier = breakerVerdictOf) =>
    new CircuitBreaker("p", { ...DEFAULT_CIRCUIT_BREAKER, failureThreshold: 2, openDurationMs: 1000, ...change }, classify, clock.now);
  /** A permit, failing the test when the circuit refuses. */
  const admitted = (b: CircuitBreaker): BreakerPermit => {
    const admission = b.admit();
    if (!admission.admitted) throw new Error(`refused while ${admission.state}`);
    return admission.permit;
  };
  const fail = (b: CircuitBreaker, code: ErrorCode) => admitted(b).failed(new ImageError(code, "m"));
  beforeEach(() => {
    clock = new FakeClock(1_000_000);
  });

  it("opens after consecutive failures and refuses with the time until it half-opens", () => {
    const b = breaker();
    fail(b, "upstream");
    fail(b, "invalid_request"); // neutral: neither counts nor resets
    fail(b, "timeout");
    expect(b.snapshot().state).to.equal("open");
    clock.advance(400);
    expect(b.admit()).to.deep.equal({ admitted: false, state: "open", retryAfterMs: 600 });
    expect(b.snapshot().rejectedCalls).to.equal(1);
  });

  it("resets the count on success", () => {
    const b = breaker();
    fail(b, "upstream");
    admitted(b).succeeded();
    fail(b, "upstream");
    expect(b.snapshot()).to.deep.include({ state: "closed", consecutiveFailures: 1 });
  });

  it("probes half-open, closes on success and re-opens on anything else", () => {
    const b = breaker();
    fail(b, "upstream");
    fail(b, "upstream");
    clock.advance(1000);
    const probe = admitted(b);
    expect(b.snapshot().state).to.equal("half_open");
    expect(b.admit()).to.deep.equal({ admitted: false, state: "half_open" });
    probe.succeeded();
    expect(b.snapshot().state).to.equal("closed");

    fail(b, "overloaded");
    fail(b, "rate_limited");
    clock.advance(1000);
    fail(b, "cancelled"); // neutral in half-open re-opens
    expect(b.snapshot().state).to.equal("open");
  });

  it("ignores results from an earlier epoch and frees abandoned probes", () => {
    const b = breaker();
    const stale = admitted(b);
    fail(b, "upstream");
    fail(b, "upstream");
    clock.advance(1000);
    stale.succeeded(); // issued while closed: ignored
    const probe = admitted(b);
    expect(b.snapshot().state).to.equal("half_open");
    probe.abandon();
    admitted(b).succeeded();
    expect(b.snapshot().state).to.equal("closed");
    expect(b.snapshot().transitions).to.equal(3);
  });

  it("counts failures by the classifier it is given, knowing no error type itself", () => {
    const plain = new Error("connection reset");
    const images = breaker();
    for (let i = 0; i < 3; i += 1) admitted(images).failed(plain);
    expect(images.snapshot()).to.deep.include({ state: "closed", consecutiveFailures: 0 });

    const strict = breaker({}, (error) => (error === plain ? "failure" : "neutral"));
    admitted(strict).failed(plain);
    admitted(strict).failed(new ImageError("upstream", "m")); // neutral for this classifier
    expect(strict.snapshot().consecutiveFailures).to.equal(1);
    admitted(strict).failed(plain);
    expect(strict.snapshot().state).to.equal("open");
  });

  it("counts a failure before the call only when it is a provider fault, and abandons the rest", () => {
    const b = breaker();
    admitted(b).failedBeforeCall(new ImageError("protocol", "capabilities name another provider"));
    admitted(b).failedBeforeCall(new ImageError("unsupported_capability", "m"));
    expect(b.snapshot()).to.deep.include({ state: "closed", consecutiveFailures: 1 });
    admitted(b).failedBeforeCall(new ImageError("protocol", "m"));
    expect(b.snapshot().state).to.equal("open");
    clock.advance(1000);
    // A request the provider never saw frees the probe instead of re-opening.
    admitted(b).failedBeforeCall(new ImageError("unsupported_capability", "m"));
    expect(b.snapshot().state).to.equal("half_open");
    admitted(b).succeeded();
    expect(b.snapshot().state).to.equal("closed");
  });

  it("does nothing when disabled and validates its limits", () => {
    const b = breaker({ enabled: false });
    for (let i = 0; i < 10; i += 1) fail(b, "upstream");
    expect(b.snapshot().state).to.equal("closed");
    expect(() => breaker({ failureThreshold: 0 })).to.throw(RangeError, /failureThreshold/);
  });
});

describe("images: provider registry", () => {
  const entry = (name: string) => ({
    name,
    provider: {} as never,
    gate: new AdmissionGate(`provider:${name}`, {}),
    breaker: new CircuitBreaker(name, DEFAULT_CIRCUIT_BREAKER, breakerVerdictOf),
  });

  it("orders providers by name and resolves the default", () => {
    const registry = new ProviderRegistry([entry("zeta"), entry("alpha")], "zeta");
    expect(registry.list().map((e) => e.name)).to.deep.equal(["alpha", "zeta"]);
    expect(registry.resolve().name).to.equal("zeta");
    expect(registry.resolve("alpha").name).to.equal("alpha");
    const error = thrown(() => registry.resolve("nope"));
    expect(error.code).to.equal("configuration");
    expect(error.message).to.equal("requested provider is not registered");
    expect(error.details["provider"]).to.equal("nope");
  });

  it("rejects bad names, duplicates and a missing default", () => {
    for (const [entries, fallback] of [
      [[entry("Bad")], "Bad"],
      [[entry("a"), entry("a")], "a"],
      [[entry("a")], "b"],
      [[entry("a".repeat(65))], "a".repeat(65)],
    ] as const) {
      expect(() => new ProviderRegistry([...entries], fallback)).to.throw(ImageError).with.property("code", "configuration");
    }
  });
});

/** Fails every call with the error its prompt names (`code[:retryable][:retry_after_ms]`). */
class ScriptedFailures extends ProbeProvider {
  override async execute(request: ImageRequest): Promise<ImageResponse> {
    const [code, retryable, retryAfterMs] = request.prompt.split(":");
    throw new ImageError(code as ErrorCode, "scripted failure", {
      retryable: retryable === "retryable",
      ...(retryAfterMs ? { details: { retry_after_ms: Number(retryAfterMs) } } : {}),
    });
  }
}

describe("images: retry-after on every RESOURCE_EXHAUSTED and UNAVAILABLE answer (gRPC)", function () {
  this.timeout(20_000);
  let server: InProcessServer;
  const PROTO = "mmgate/images/v1/image_service.proto";
  const SERVICE = "mmgate.images.v1.ImageService";
  const body = (prompt: string) => ({ request: { prompt, generate: {}, routing: { provider: "scripted" } } });

  before(async () => {
    server = await startServer({
      modules: [defineImagesModule({ extraProviders: [new ScriptedFailures("scripted")] })],
      config: { images: { reference: { enabled: false }, circuitBreaker: { enabled: false } } },
    });
  });
  after(async () => server?.close());

  const cases: [string, grpc.status, string][] = [
    ["upstream:retryable", grpc.status.UNAVAILABLE, "1"],
    ["upstream:final", grpc.status.UNAVAILABLE, "1"],
    ["overloaded:final", grpc.status.UNAVAILABLE, "1"],
    ["rate_limited:final", grpc.status.RESOURCE_EXHAUSTED, "1"],
    ["rate_limited:retryable:180001", grpc.status.RESOURCE_EXHAUSTED, "181"],
    ["overloaded:retryable:1", grpc.status.UNAVAILABLE, "1"],
  ];
  for (const [prompt, status, seconds] of cases) {
    it(`${prompt}: retry-after ${seconds} (unary and stream)`, async () => {
      const client = server.grpcClient(PROTO, SERVICE);
      const unary = await expectRejection<grpc.ServiceError>(grpcUnary(client, "Generate", body(prompt)));
      expect(unary.code).to.equal(status);
      expect(unary.metadata.get("retry-after")).to.deep.equal([seconds]);
      const stream = await expectRejection<grpc.ServiceError>(grpcServerStream(client, "GenerateStream", body(prompt)));
      expect(stream.code).to.equal(status);
      expect(stream.metadata.get("retry-after")).to.deep.equal([seconds]);
    });
  }

  it("sends none with other statuses", async () => {
    const client = server.grpcClient(PROTO, SERVICE);
    const error = await expectRejection<grpc.ServiceError>(grpcUnary(client, "Generate", body("protocol:final")));
    expect(error.code).to.equal(grpc.status.INTERNAL);
    expect(error.metadata.get("retry-after")).to.deep.equal([]);
  });

  it("reaches connect clients too", async () => {
    const images = createClient(ImageService, server.transport);
    const error = await expectRejection(
      images.generate({ request: { prompt: "upstream:final", operation: { case: "generate", value: {} }, routing: { provider: "scripted" } } }),
      { type: ConnectError, code: Code.Unavailable },
    );
    expect(error.metadata.get("retry-after")).to.equal("1");
    expect(error.findDetails(pb.ErrorDetailSchema)[0]?.code).to.equal(pb.ErrorCode.UPSTREAM);
  });
});
