import { expect } from "chai";
import { createImageRequest, type ImageRequestInit, type ProviderEvent } from "../../src/images/model.js";
import { ImageError } from "../../src/images/core/errors.js";
import type { ProviderContext } from "../../src/images/core/provider.js";
import { DEFAULT_REQUEST_LIMITS } from "../../src/images/core/validation.js";
import { OutputFanoutProvider } from "../../src/images/fanout/provider.js";
import { planChunks, subrequestId } from "../../src/images/fanout/subrequest.js";
import { FakeProvider, fakeCapabilities, type FakeOptions } from "./fake-provider.js";
import { rejection } from "./helpers.js";

function decorate(options: FakeOptions = {}, config: Partial<{ maxOutputs: number; maxParallelOutputs: number; permitTimeoutMs: number; siblingGraceMs: number }> = {}) {
  const inner = new FakeProvider(options);
  const provider = new OutputFanoutProvider(inner, { maxOutputs: 4, maxParallelOutputs: 2, ...config }, DEFAULT_REQUEST_LIMITS);
  return { inner, provider };
}

function context(requestId = "batch", events?: ProviderEvent[], signal = new AbortController().signal): ProviderContext {
  return {
    requestId,
    deadline: Date.now() + 5000,
    signal,
    ...(events ? { events: async (event: ProviderEvent) => void events.push(event) } : {}),
  };
}

function request(init: Partial<ImageRequestInit> = {}) {
  return createImageRequest({ prompt: "a lighthouse", responseFormat: "metadata", ...init });
}


function partialIndices(events: ProviderEvent[]): number[] {
  return events.flatMap((event) => (event.type === "partial_image" ? [event.index] : [])).sort((a, b) => a - b);
}

describe("images: output fan-out (reference acceptance tests)", () => {
  it("advertises effective and native batch limits", async () => {
    const { provider } = decorate();
    const capabilities = await provider.capabilities();
    expect(capabilities.count).to.deep.equal({ min: 1, max: 4 });
    expect(capabilities.batching.mode).to.equal("fan_out");
    expect(capabilities.batching.nativeCount).to.deep.equal({ min: 1, max: 1 });
    expect(capabilities.batching.maxParallelOutputs).to.equal(2);
  });

  it("best effort preserves indices and maps partial events", async () => {
    const { inner, provider } = decorate({ failOffset: 1 });
    const events: ProviderEvent[] = [];
    const response = await provider.execute(
      request({ parameters: { n: 4, failurePolicy: "best_effort" } }),
      context("batch", events),
    );
    expect(response.data.map((image) => image.index)).to.deep.equal([0, 2, 3]);
    expect(response.failures.map((failure) => failure.index)).to.deep.equal([1]);
    expect(response.failures[0]!.error.code).to.equal("upstream");
    expect(response.failures[0]!.error.details["output_index"]).to.equal(1);
    expect(response.usage?.totalTokens).to.equal(3);
    expect(response.warnings).to.include("emulated_multi_image_fanout");
    expect(response.warnings).to.include("partial_output_failure");
    expect(inner.maxActive).to.equal(2);
    expect(partialIndices(events)).to.deep.equal([0, 2, 3]);
  });

  it("a fan-out of more chunks than Node's default listener limit warns of no leak", async () => {
    const warnings: Error[] = [];
    const onWarning = (warning: Error): void => void warnings.push(warning);
    process.on("warning", onWarning);
    try {
      const { provider } = decorate({}, { maxOutputs: 16, maxParallelOutputs: 16 });
      for (const failurePolicy of ["best_effort", "fail_fast"] as const) {
        const response = await provider.execute(request({ parameters: { n: 16, failurePolicy } }), context());
        expect(response.data).to.have.length(16);
      }
      // Warnings are emitted on the next tick.
      await new Promise((resolve) => setImmediate(resolve));
    } finally {
      process.off("warning", onWarning);
    }
    expect(warnings.filter((w) => w.name === "MaxListenersExceededWarning")).to.deep.equal([]);
  });

  it("fail fast stops unscheduled outputs and marks the batch ambiguous", async () => {
    const { inner, provider } = decorate({ failOffset: 0 });
    const error = await rejection(provider.execute(request({ parameters: { n: 4 } }), context()));
    expect(error.code).to.equal("upstream");
    expect(inner.calls).to.be.at.most(2);
    expect(error.retryable).to.equal(false);
    expect(error.details["outcome"]).to.equal("unknown");
    expect(error.details["retry_scope"]).to.equal("do_not_retry_full_batch");
    expect(error.details["output_index"]).to.equal(0);
    expect(error.details["generation_ms"]).to.be.a("number");
  });

  it("persistent sessions are serialized within a batch", async () => {
    const { inner, provider } = decorate();
    const response = await provider.execute(
      request({ parameters: { n: 3 }, session: { mode: "persistent", key: "campaign" } }),
      context(),
    );
    expect(response.data).to.have.length(3);
    expect(inner.maxActive).to.equal(1);
    expect(response.session?.key).to.equal("campaign");
  });

  it("isolated batches can explicitly run sequentially", async () => {
    const { inner, provider } = decorate();
    const response = await provider.execute(
      request({ parameters: { n: 3 }, policies: { batchExecution: "sequential" } }),
      context(),
    );
    expect(response.data).to.have.length(3);
    expect(inner.maxActive).to.equal(1);
    expect(response.warnings).to.include("sequential_multi_image_fanout");
  });

  it("provider-wide parallelism is shared across batches", async () => {
    const { inner, provider } = decorate();
    const [first, second] = await Promise.all([
      provider.execute(request({ parameters: { n: 4 } }), context("batch")),
      provider.execute(request({ parameters: { n: 4 } }), context("batch-two")),
    ]);
    expect(first.data).to.have.length(4);
    expect(second.data).to.have.length(4);
    expect(inner.maxActive).to.equal(2);
  });
});

describe("images: output fan-out (guaranteed behaviour)", () => {
  it("rejects invalid fan-out limits with a configuration error", () => {
    for (const config of [
      { maxOutputs: 0, maxParallelOutputs: 1 },
      { maxOutputs: 4, maxParallelOutputs: 0 },
      { maxOutputs: 2, maxParallelOutputs: 3 },
      { maxOutputs: 17, maxParallelOutputs: 1 },
    ]) {
      expect(() => new OutputFanoutProvider(new FakeProvider(), config, DEFAULT_REQUEST_LIMITS))
        .to.throw(ImageError)
        .with.property("code", "configuration");
    }
  });

  it("passes capabilities through when the inner provider already covers max_outputs", async () => {
    const native = { ...fakeCapabilities(), count: { min: 1, max: 4 } };
    native.batching = { mode: "native", nativeCount: { min: 1, max: 4 }, maxParallelOutputs: 1 };
    const { provider } = decorate({ capabilities: native });
    const capabilities = await provider.capabilities();
    expect(capabilities.batching.mode).to.equal("native");
    expect(capabilities.count).to.deep.equal({ min: 1, max: 4 });
  });

  it("single-chunk fail fast keeps retryable and has no outcome", async () => {
    const { inner, provider } = decorate({ failOffset: 0 }, { maxParallelOutputs: 1 });
    const error = await rejection(provider.execute(request({ parameters: { n: 3 } }), context()));
    expect(inner.calls).to.equal(1);
    expect(error.retryable).to.equal(true);
    expect(error.details).to.not.have.property("outcome");
    expect(error.details["output_index"]).to.equal(0);
  });

  it("fail fast cancels running siblings and waits for them", async () => {
    const { inner, provider } = decorate({ failOffset: 0, delayByOffset: { 0: 5, 1: 2000 } });
    const error = await rejection(provider.execute(request({ parameters: { n: 4 } }), context()));
    expect(error.details["outcome"]).to.equal("unknown");
    expect(inner.calls).to.equal(2);
    expect(inner.aborted).to.equal(1);
    expect(inner.active).to.equal(0);
  });

  it("frees the permits of siblings still running after the grace, and counts them as abandoned", async () => {
    const inner = new FakeProvider();
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let stubborn = 0;
    inner.execute = async (_request, ctx) => {
      if (ctx.requestId.endsWith(":0")) {
        // Fails once its sibling is running.
        while (stubborn === 0) await new Promise((resolve) => setImmediate(resolve));
        throw new ImageError("upstream", "fake output failed", { retryable: true });
      }
      stubborn += 1;
      await gate; // ignores cancellation
      stubborn -= 1;
      throw new ImageError("cancelled", "finished late");
    };
    const provider = new OutputFanoutProvider(inner, { maxOutputs: 4, maxParallelOutputs: 2, siblingGraceMs: 10 }, DEFAULT_REQUEST_LIMITS);
    const error = await rejection(provider.execute(request({ parameters: { n: 2 } }), context()));
    expect(error.details["outcome"]).to.equal("unknown");
    expect(stubborn).to.equal(1);
    expect(provider.activeOperations, "permits held").to.equal(0);
    expect(provider.abandonedOperations).to.equal(1);

    release();
    while (provider.abandonedOperations > 0) await new Promise((resolve) => setImmediate(resolve));
    expect(stubborn).to.equal(0);
    // Its own late release leaves the count alone.
    expect(provider.activeOperations).to.equal(0);
  });

  describe("fail fast while chunks wait for a permit", () => {
    /** Holds `count` of the provider's permits until the returned function is called. */
    async function holdPermits(provider: OutputFanoutProvider, count: number): Promise<() => Promise<void>> {
      const holder = new AbortController();
      const held = Array.from({ length: count }, (_, i) =>
        provider.execute(request({ parameters: { n: 1 } }), context(`holder-${i}`, undefined, holder.signal)).catch(() => undefined),
      );
      while (provider.activeOperations < count) await new Promise((resolve) => setImmediate(resolve));
      return async () => {
        holder.abort();
        await Promise.all(held);
      };
    }

    it("answers a retryable timeout when the deadline passes before any chunk was dispatched", async () => {
      const { inner, provider } = decorate({ delayMs: 10_000 }, { maxParallelOutputs: 2 });
      const release = await holdPermits(provider, 2);
      try {
        const error = await rejection(provider.execute(request({ parameters: { n: 2 } }), { ...context(), deadline: Date.now() + 30 }));
        expect([error.code, error.retryable]).to.deep.equal(["timeout", true]);
        expect(error.details).to.not.have.property("outcome");
        expect(error.details).to.not.have.property("retry_scope");
        expect(error.details["stage"]).to.equal("capacity_wait");
        expect(inner.calls).to.equal(2);
      } finally {
        await release();
      }
    });

    it("answers cancelled, with no unknown outcome, when the caller cancels before any chunk was dispatched", async () => {
      const { inner, provider } = decorate({ delayMs: 10_000 }, { maxParallelOutputs: 2 });
      const release = await holdPermits(provider, 2);
      try {
        const caller = new AbortController();
        const batch = provider.execute(request({ parameters: { n: 2 } }), context("batch", undefined, caller.signal));
        while (inner.capabilityCalls < 3) await new Promise((resolve) => setImmediate(resolve));
        caller.abort();
        const error = await rejection(batch);
        expect(error.code).to.equal("cancelled");
        expect(error.details).to.not.have.property("outcome");
        expect(error.details["stage"]).to.equal("capacity_wait");
        expect(inner.calls).to.equal(2);
      } finally {
        await release();
      }
    });

    it("marks the batch ambiguous when a sibling was dispatched", async () => {
      const { inner, provider } = decorate({ delayMs: 10_000 }, { maxParallelOutputs: 2 });
      const release = await holdPermits(provider, 1);
      try {
        // Chunk 0 takes the last permit and runs; chunk 1 waits until the deadline.
        const error = await rejection(provider.execute(request({ parameters: { n: 2 } }), { ...context(), deadline: Date.now() + 30 }));
        expect(error.code).to.equal("timeout");
        expect(error.details["output_index"]).to.equal(1);
        expect(error.retryable).to.equal(false);
        expect(error.details["outcome"]).to.equal("unknown");
        expect(error.details["retry_scope"]).to.equal("do_not_retry_full_batch");
        expect(inner.calls).to.equal(2);
        expect(inner.aborted).to.equal(1);
      } finally {
        await release();
      }
    });
  });

  it("fails when every output fails under best effort", async () => {
    const { inner, provider } = decorate({ failAll: true }, { maxOutputs: 3, maxParallelOutputs: 2 });
    const error = await rejection(provider.execute(request({ parameters: { n: 3, failurePolicy: "best_effort" } }), context()));
    expect(inner.calls).to.equal(3);
    expect(error.code).to.equal("upstream");
    expect(error.details["all_outputs_failed"]).to.equal(true);
    expect(error.details["failed_outputs"]).to.equal(3);
    expect(error.details["output_index"]).to.equal(0);
  });

  it("fast path makes one inner call under a permit and adds no fan-out warning", async () => {
    const { inner, provider } = decorate();
    const response = await provider.execute(request({ parameters: { n: 1 } }), context());
    expect(inner.calls).to.equal(1);
    expect(inner.requestIds).to.deep.equal(["batch"]);
    expect(response.warnings).to.not.include("emulated_multi_image_fanout");
    expect(provider.activeOperations).to.equal(0);
  });

  it("fast path waits for a permit held by another batch", async () => {
    const { inner, provider } = decorate({}, { maxParallelOutputs: 1 });
    await Promise.all([
      provider.execute(request({ parameters: { n: 3 } }), context("a")),
      provider.execute(request({ parameters: { n: 1 } }), context("b")),
    ]);
    expect(inner.maxActive).to.equal(1);
    expect(inner.calls).to.equal(4);
  });

  it("rejects a chunk with a bad index set as protocol with output_offset", async () => {
    const { provider } = decorate({
      tamper: (response, offset) => {
        if (offset === 2) response.data[0]!.index = 1;
      },
    });
    const error = await rejection(provider.execute(request({ parameters: { n: 4 } }), context()));
    expect(error.code).to.equal("protocol");
    expect(error.message).to.equal("fan-out subrequest returned an invalid output set");
    expect(error.details["output_offset"]).to.equal(2);
  });

  it("rejects a provider identity change within a batch", async () => {
    const { provider } = decorate({
      tamper: (response, offset) => {
        if (offset === 3) response.model = "other-model";
      },
    });
    const error = await rejection(provider.execute(request({ parameters: { n: 4 } }), context()));
    expect(error.code).to.equal("protocol");
    expect(error.message).to.equal("fan-out provider identity changed within one batch");
  });

  it("drops the session when chunks disagree", async () => {
    const { provider } = decorate({
      tamper: (response, offset) => {
        if (offset === 1 && response.session) response.session.threadId = "another-thread";
      },
    });
    const response = await provider.execute(
      request({ parameters: { n: 3 }, session: { mode: "persistent", key: "campaign" } }),
      context(),
    );
    expect(response.data).to.have.length(3);
    expect(response.session).to.equal(undefined);
  });

  it("leaves usage absent when no chunk reports it and sums provider counters otherwise", async () => {
    const { provider } = decorate({ tamper: (response) => delete response.usage });
    const response = await provider.execute(request({ parameters: { n: 3 } }), context());
    expect(response.usage).to.equal(undefined);
    const counted = decorate({
      tamper: (response, offset) => {
        response.usage = offset === 0 ? { provider: { images: 1 } } : { inputTokens: 5, provider: { images: 2 } };
      },
    });
    const merged = await counted.provider.execute(request({ parameters: { n: 3 } }), context());
    expect(merged.usage).to.deep.equal({ inputTokens: 10, provider: { images: 5 } });
  });

  it("keeps the first revised prompt and sorts and de-duplicates warnings", async () => {
    const { provider } = decorate({
      tamper: (response, offset) => {
        response.revisedPrompt = offset === 0 ? "" : `revised ${offset}`;
        response.warnings = ["zeta_warning", "emulated_multi_image_fanout"];
      },
    });
    const response = await provider.execute(request({ parameters: { n: 3 } }), context());
    expect(response.revisedPrompt).to.equal("revised 1");
    expect(response.warnings).to.deep.equal(["emulated_multi_image_fanout", "zeta_warning"]);
  });

  it("uses the hashed sub-request id for long request ids", async () => {
    const long = "r".repeat(120);
    expect(subrequestId("batch", 3)).to.equal("batch:output:3");
    expect(subrequestId("x".repeat(119), 2)).to.equal(`${"x".repeat(119)}:output:2`);
    const hashed = subrequestId(long, 2);
    expect(hashed).to.match(/^fanout:[0-9a-f]{32}:2$/);
    const { inner, provider } = decorate();
    await provider.execute(request({ parameters: { n: 2 } }), context(long));
    expect(inner.requestIds.sort()).to.deep.equal([subrequestId(long, 0), subrequestId(long, 1)].sort());
    expect(inner.requestIds[0]).to.match(/^fanout:/);
  });

  it("plans chunks by the inner count.max", () => {
    expect(planChunks(4, 1)).to.deep.equal([
      { offset: 0, count: 1 },
      { offset: 1, count: 1 },
      { offset: 2, count: 1 },
      { offset: 3, count: 1 },
    ]);
    expect(planChunks(5, 2)).to.deep.equal([
      { offset: 0, count: 2 },
      { offset: 2, count: 2 },
      { offset: 4, count: 1 },
    ]);
  });

  it("times out a permit wait as retryable timeout", async () => {
    const { provider } = decorate({ delayMs: 300 }, { maxParallelOutputs: 1, permitTimeoutMs: 20 });
    const holder = provider.execute(request({ parameters: { n: 1 } }), context("holder"));
    const error = await rejection(provider.execute(request({ parameters: { n: 1 } }), context("waiter")));
    expect(error.code).to.equal("timeout");
    expect(error.retryable).to.equal(true);
    expect(error.message).to.equal("output fan-out timed out while waiting for capacity");
    await holder;
  });

  it("cancels a permit wait when the caller aborts", async () => {
    const { provider } = decorate({ delayMs: 300 }, { maxParallelOutputs: 1 });
    const holder = provider.execute(request({ parameters: { n: 1 } }), context("holder"));
    const controller = new AbortController();
    const waiting = provider.execute(request({ parameters: { n: 1 } }), context("waiter", undefined, controller.signal));
    setTimeout(() => controller.abort(), 10);
    const error = await rejection(waiting);
    expect(error.code).to.equal("cancelled");
    expect(error.message).to.equal("output fan-out was cancelled while waiting for capacity");
    await holder;
  });

  it("fails permit waits with cancelled when the provider shuts down", async () => {
    const { inner, provider } = decorate({ delayMs: 200 }, { maxParallelOutputs: 1 });
    const holder = provider.execute(request({ parameters: { n: 1 } }), context("holder"));
    const waiting = provider.execute(request({ parameters: { n: 1 } }), context("waiter"));
    await new Promise((resolve) => setTimeout(resolve, 10));
    await provider.shutdown();
    const error = await rejection(waiting);
    expect(error.code).to.equal("cancelled");
    expect(error.message).to.equal("output fan-out is shutting down");
    expect(inner.shutdowns).to.equal(1);
    await holder;
  });

  it("drops out-of-range partials and never forwards started or completed", async () => {
    const { provider } = decorate({ extraEvents: true });
    const events: ProviderEvent[] = [];
    await provider.execute(request({ parameters: { n: 3 } }), context("batch", events));
    expect(events.map((event) => event.type)).to.deep.equal(["partial_image", "partial_image", "partial_image"]);
    expect(partialIndices(events)).to.deep.equal([0, 1, 2]);
  });

  it("keeps running when the outer event sink fails", async () => {
    const { provider } = decorate();
    const response = await provider.execute(request({ parameters: { n: 2 } }), {
      ...context(),
      events: async () => {
        throw new Error("sink closed");
      },
    });
    expect(response.data).to.have.length(2);
  });

  it("rejects n above max_outputs in strict mode and clamps it in normalize mode", async () => {
    const { provider } = decorate();
    const error = await rejection(provider.execute(request({ parameters: { n: 6 } }), context()));
    expect(error.code).to.equal("unsupported_capability");
    expect(error.details["field"]).to.equal("parameters.n");

    const response = await provider.execute(
      request({ parameters: { n: 6 }, policies: { compatibility: "normalize" } }),
      context(),
    );
    expect(response.data).to.have.length(4);
    expect(response.requested.n).to.equal(6);
    expect(response.effective.n).to.equal(4);
    expect(response.normalizations).to.deep.equal([
      { field: "parameters.n", requested: 6, effective: 4, reason: "clamped_to_provider_range" },
    ]);
  });

  it("validates against the configured request limits, not a built-in set", async () => {
    const limits = { ...DEFAULT_REQUEST_LIMITS, maxOutputs: 32 };
    const provider = new OutputFanoutProvider(new FakeProvider({ delayMs: 1 }), { maxOutputs: 32, maxParallelOutputs: 8 }, limits);
    const response = await provider.execute(request({ parameters: { n: 20 } }), context());
    expect(response.data.map((image) => image.index)).to.deep.equal([...Array(20).keys()]);
    const error = await rejection(provider.execute(request({ parameters: { n: 33 } }), context()));
    expect(error.code).to.equal("invalid_request");
    expect((error.details["issues"] as { field: string }[])[0]!.field).to.equal("parameters.n");
  });

  it("fills generation_ms from the chunk and offsets inner failures", async () => {
    const native = { ...fakeCapabilities(), count: { min: 1, max: 2 } };
    native.batching = { mode: "native", nativeCount: { min: 1, max: 2 }, maxParallelOutputs: 1 };
    const { provider } = decorate({
      capabilities: native,
      tamper: (response, offset) => {
        if (offset === 2 && response.data.length === 2) {
          response.data.pop();
          response.failures.push({ index: 1, error: new ImageError("safety_rejected", "refused"), generationMs: 3 });
        }
      },
    });
    const response = await provider.execute(request({ parameters: { n: 4, failurePolicy: "best_effort" } }), context());
    expect(response.data.map((image) => image.index)).to.deep.equal([0, 1, 2]);
    expect(response.failures.map((failure) => failure.index)).to.deep.equal([3]);
    expect(response.data.every((image) => typeof image.generationMs === "number")).to.equal(true);

    const strict = decorate({
      capabilities: native,
      tamper: (response, offset) => {
        if (offset === 0) {
          response.data.pop();
          response.failures.push({ index: 1, error: new ImageError("upstream", "x"), generationMs: 1 });
        }
      },
    });
    const error = await rejection(strict.provider.execute(request({ parameters: { n: 4 } }), context()));
    expect(error.code).to.equal("protocol");
  });
});
