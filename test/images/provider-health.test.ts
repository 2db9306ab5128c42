import { expect } from "chai";
import { imagesConfigSchema } from "../../src/images/config.js";
import { createImageRequest } from "../../src/images/model.js";
import { buildImageRuntime } from "../../src/images/build.js";
import { providerHealthName } from "../../src/images/index.js";
import { publishProviderHealth } from "../../src/images/provider-health.js";
import { HealthRegistry, Readiness, ServingStatus } from "../../src/server/index.js";
import { eventually } from "../support/index.js";
import { FakeProvider } from "./fake-provider.js";

describe("images: provider health", () => {
  it("follows each provider's circuit: NOT_SERVING while open, SERVING again once it half-opens", async () => {
    const failing = new FakeProvider({ failAll: true, delayMs: 0 });
    const runtime = buildImageRuntime(
      // Open for 500 ms: long enough that a stalled machine still sees the open circuit below.
      imagesConfigSchema.parse({ circuitBreaker: { failureThreshold: 1, openDurationMs: 500 } }),
      { extraProviders: [failing] },
    );
    const health = new Readiness(new HealthRegistry()).forModule("images");
    const published = publishProviderHealth(runtime, health, "svc");
    const stop = new AbortController();
    const watching = published.watch(stop.signal);
    try {
      const name = providerHealthName("svc", "fanout-test");
      expect(health.get(name)).to.equal(ServingStatus.SERVING);
      expect(health.get(providerHealthName("svc", "reference"))).to.equal(ServingStatus.SERVING);
      await runtime
        .execute(createImageRequest({ prompt: "p", responseFormat: "metadata", routing: { provider: "fanout-test" } }), {
          requestId: "r",
          signal: new AbortController().signal,
        })
        .catch(() => undefined);
      published.refresh();
      expect(health.get(name)).to.equal(ServingStatus.NOT_SERVING);
      expect(health.get(providerHealthName("svc", "reference"))).to.equal(ServingStatus.SERVING);
      // The watch notices the time-based half-open transition by itself.
      await eventually(() => expect(health.get(name)).to.equal(ServingStatus.SERVING));
    } finally {
      stop.abort();
      await watching;
      await runtime.shutdown();
    }
  });
});
