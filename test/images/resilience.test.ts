import { expect } from "chai";
import { ImageError } from "../../src/images/core/errors.js";
import { AdmissionGate } from "../../src/images/runtime/admission.js";
import { CircuitBreaker, DEFAULT_CIRCUIT_BREAKER } from "../../src/images/runtime/circuit-breaker.js";
import { ProviderRegistry } from "../../src/images/runtime/registry.js";
import { rejection } from "./helpers.js";


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
  let now = 0;
  const clock = () => now;
  const breaker = (change = {}) => new CircuitBreaker("p", { ...DEFAULT_CIRCUIT_BREAKER, failureThreshold: 2, openDurationMs: 1000, ...change }, clock);
  beforeEach(() => {
    now = 1_000_000;
  });

  it("opens after consecutive failures and rejects with retry_after_ms", () => {
    const b = breaker();
    b.acquire().record("upstream");
    b.acquire().record("invalid_request"); // neutral: neither counts nor resets
    b.acquire().record("timeout");
    expect(b.snapshot().state).to.equal("open");
    now += 400;
    const error = thrown(() => b.acquire());
    expect(error.code).to.equal("overloaded");
    expect(error.retryable).to.equal(true);
    expect(error.details).to.deep.equal({ circuit_state: "open", retry_after_ms: 600 });
    expect(b.snapshot().rejectedCalls).to.equal(1);
  });

  it("resets the count on success", () => {
    const b = breaker();
    b.acquire().record("upstream");
    b.acquire().record(undefined);
    b.acquire().record("upstream");
    expect(b.snapshot()).to.deep.include({ state: "closed", consecutiveFailures: 1 });
  });

  it("probes half-open, closes on success and re-opens on anything else", () => {
    const b = breaker();
    b.acquire().record("upstream");
    b.acquire().record("upstream");
    now += 1000;
    const probe = b.acquire();
    expect(b.snapshot().state).to.equal("half_open");
    expect(thrown(() => b.acquire()).details["circuit_state"]).to.equal("half_open");
    probe.record(undefined);
    expect(b.snapshot().state).to.equal("closed");

    b.acquire().record("overloaded");
    b.acquire().record("rate_limited");
    now += 1000;
    b.acquire().record("cancelled"); // neutral in half-open re-opens
    expect(b.snapshot().state).to.equal("open");
  });

  it("ignores results from an earlier epoch and frees abandoned probes", () => {
    const b = breaker();
    const stale = b.acquire();
    b.acquire().record("upstream");
    b.acquire().record("upstream");
    now += 1000;
    stale.record(undefined); // issued while closed: ignored
    const probe = b.acquire();
    expect(b.snapshot().state).to.equal("half_open");
    probe.abandon();
    b.acquire().record(undefined);
    expect(b.snapshot().state).to.equal("closed");
    expect(b.snapshot().transitions).to.equal(3);
  });

  it("does nothing when disabled and validates its limits", () => {
    const b = breaker({ enabled: false });
    for (let i = 0; i < 10; i += 1) b.acquire().record("upstream");
    expect(b.snapshot().state).to.equal("closed");
    expect(() => breaker({ failureThreshold: 0 })).to.throw(ImageError);
  });
});

describe("images: provider registry", () => {
  const entry = (name: string) => ({
    name,
    provider: {} as never,
    gate: new AdmissionGate(`provider:${name}`, {}),
    breaker: new CircuitBreaker(name, DEFAULT_CIRCUIT_BREAKER),
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
