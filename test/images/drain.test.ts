import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { expect } from "chai";
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import * as pb from "../../gen/mmgate/images/v1/images_pb.js";
import { buildImageRuntime } from "../../src/images/build.js";
import { imagesConfigSchema } from "../../src/images/config.js";
import { defineImagesModule } from "../../src/images/index.js";
import { createImageRequest, type ImageRequestInit } from "../../src/images/model.js";
import { expectRejection, startServer } from "../support/index.js";
import { FakeProvider } from "./fake-provider.js";
import { rejection } from "./helpers.js";
import { ProbeProvider } from "./probe-provider.js";

function runtimeWith(provider: FakeProvider | ProbeProvider, config: Record<string, unknown> = {}) {
  return buildImageRuntime(
    imagesConfigSchema.parse({ reference: { enabled: false }, fanout: { maxOutputs: 4, maxParallelOutputs: 2 }, ...config }),
    { extraProviders: [provider] },
  );
}

const request = (init: Partial<ImageRequestInit> = {}) => createImageRequest({ prompt: "p", responseFormat: "metadata", ...init });
const options = (signal = new AbortController().signal) => ({ requestId: "rid", signal });

/** Records when the provider was shut down, relative to other events. */
function recordShutdown(provider: FakeProvider | ProbeProvider, log: string[]): void {
  provider.shutdown = async () => {
    log.push("provider shutdown");
  };
}

describe("images: runtime shutdown drains", function () {
  this.timeout(10_000);

  it("lets requests in flight finish before the provider shuts down, and only then resolves", async () => {
    const fake = new FakeProvider({ delayMs: 300 });
    const log: string[] = [];
    recordShutdown(fake, log);
    const runtime = runtimeWith(fake);
    const running = runtime.execute(request({ parameters: { n: 2 } }), options()).then((response) => {
      log.push("request answered");
      return response;
    });
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(fake.active).to.be.above(0);
    const first = runtime.shutdown().then((result) => {
      log.push("shutdown resolved");
      return result;
    });
    // A second, concurrent caller shares the first one's result.
    const second = runtime.shutdown();
    expect(second).to.equal(runtime.shutdown());
    const response = await running;
    expect(response.data).to.have.length(2);
    expect(await first).to.deep.equal({ drained: true, interrupted: 0 });
    expect(await second).to.deep.equal({ drained: true, interrupted: 0 });
    expect(log).to.deep.equal(["request answered", "provider shutdown", "shutdown resolved"]);
    expect(fake.aborted).to.equal(0);
  });

  it("refuses new requests once shutdown starts, while draining", async () => {
    const fake = new FakeProvider({ delayMs: 200 });
    const runtime = runtimeWith(fake);
    const running = runtime.execute(request(), options());
    await new Promise((resolve) => setTimeout(resolve, 20));
    const stopping = runtime.shutdown();
    const refused = await rejection(runtime.execute(request(), options()));
    expect([refused.code, refused.message]).to.deep.equal(["cancelled", "runtime is shutting down"]);
    expect(() => runtime.prepare(request())).to.throw("runtime is shutting down");
    await running;
    await stopping;
    expect(fake.calls).to.equal(1);
  });

  it("answers what is left after shutdownGraceMs with timeout, then shuts the provider down", async () => {
    const probe = new ProbeProvider("probe", 10_000);
    const log: string[] = [];
    recordShutdown(probe, log);
    const runtime = runtimeWith(probe, {
      shutdownGraceMs: 150,
      cancellationGraceMs: 50,
      admission: { perProvider: { maxConcurrent: 1, maxQueued: 4 } },
    });
    const dispatched = rejection(runtime.execute(request(), options()));
    await probe.whenStarted(1);
    // Waits at the provider's gate behind the first.
    const queued = rejection(runtime.execute(request(), options()));
    await new Promise((resolve) => setTimeout(resolve, 20));
    const started = Date.now();
    const result = await runtime.shutdown();
    expect(Date.now() - started).to.be.at.least(140);
    expect(result).to.deep.equal({ drained: false, interrupted: 2 });
    expect(log).to.deep.equal(["provider shutdown"]);

    // The provider may have produced images: timeout, but not blindly retryable.
    const inFlight = await dispatched;
    expect([inFlight.code, inFlight.retryable, inFlight.details["outcome"], inFlight.details["stage"]]).to.deep.equal([
      "timeout",
      false,
      "unknown",
      "shutdown",
    ]);
    expect(probe.aborted).to.equal(1);
    // Never sent: a plain retryable timeout.
    const waiting = await queued;
    expect([waiting.code, waiting.retryable, waiting.details["outcome"]]).to.deep.equal(["timeout", true, undefined]);
    expect(probe.started).to.equal(1);
    // Our own shutdown says nothing about the provider.
    expect(runtime.registry.resolve("probe").breaker.snapshot().consecutiveFailures).to.equal(0);
  });

  it("ends the grace early when the shutdown signal fires", async () => {
    const probe = new ProbeProvider("probe", 10_000);
    const runtime = runtimeWith(probe, { shutdownGraceMs: 60_000, cancellationGraceMs: 50 });
    const running = rejection(runtime.execute(request(), options()));
    await probe.whenStarted(1);
    const controller = new AbortController();
    const stopping = runtime.shutdown({ signal: controller.signal });
    const later = runtime.shutdown();
    setTimeout(() => controller.abort(), 50);
    expect(await stopping).to.deep.equal({ drained: false, interrupted: 1 });
    expect(await later).to.deep.equal({ drained: false, interrupted: 1 });
    expect((await running).code).to.equal("timeout");
  });

  it("defaults shutdownGraceMs to 10 s and bounds it to 5 min", () => {
    expect(imagesConfigSchema.parse({}).shutdownGraceMs).to.equal(10_000);
    expect(() => imagesConfigSchema.parse({ shutdownGraceMs: 0 })).to.throw();
    expect(() => imagesConfigSchema.parse({ shutdownGraceMs: 300_001 })).to.throw();
  });
});

describe("images: module drain hook", function () {
  this.timeout(20_000);

  const generate = (transport: Parameters<typeof createClient>[1], provider: string) =>
    createClient(ImageService, transport).generate({
      request: { prompt: "p", operation: { case: "generate", value: {} }, routing: { provider }, responseFormat: pb.ResponseFormat.METADATA },
    });

  it("finishes requests in flight during the host's drain and stops the provider after them", async () => {
    const fake = new FakeProvider({ delayMs: 600 });
    const log: string[] = [];
    recordShutdown(fake, log);
    const execute = fake.execute.bind(fake);
    fake.execute = (req, ctx) => execute(req, ctx).finally(() => log.push("request answered"));
    const server = await startServer({
      modules: [defineImagesModule({ extraProviders: [fake] })],
      config: { images: { reference: { enabled: false } } },
    });
    const call = generate(server.transport, "fanout-test");
    await new Promise((resolve) => setTimeout(resolve, 150));
    await server.close();
    expect((await call).response?.data).to.have.length(1);
    expect(log).to.deep.equal(["request answered", "provider shutdown"]);
  });

  it("answers what the host's grace leaves with the images timeout, not the host's UNAVAILABLE", async () => {
    const probe = new ProbeProvider("probe", 10_000);
    const server = await startServer({
      modules: [defineImagesModule({ extraProviders: [probe] })],
      config: { shutdown: { graceMs: 300 }, images: { reference: { enabled: false }, cancellationGraceMs: 50 } },
    });
    const call = generate(server.transport, "probe");
    await probe.whenStarted(1);
    const closing = server.close();
    const error = await expectRejection(call, { type: ConnectError });
    await closing;
    expect(error.code).to.equal(Code.DeadlineExceeded);
    const [detail] = error.findDetails(pb.ErrorDetailSchema);
    expect(detail?.code).to.equal(pb.ErrorCode.TIMEOUT);
    expect(detail?.details!["stage"]).to.equal("shutdown");
    expect(probe.aborted).to.equal(1);
  });
});
