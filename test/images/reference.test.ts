import { expect } from "chai";
import sharp from "sharp";
import { imagesConfigSchema } from "../../src/images/config.js";
import { createImageRequest, type ImageRequestInit, type ProviderEvent } from "../../src/images/model.js";
import { validateCapabilities } from "../../src/images/core/capabilities.js";
import type { ImageError } from "../../src/images/core/errors.js";
import type { ProviderContext } from "../../src/images/core/provider.js";
import { outputOffsetOf, ReferenceProvider } from "../../src/images/providers/reference.js";

function provider(change: Record<string, unknown> = {}) {
  return new ReferenceProvider(imagesConfigSchema.parse({ reference: { latencyMs: 0, defaultSize: "64x64", ...change } }).reference);
}

function context(requestId = "r", events?: ProviderEvent[]): ProviderContext {
  return {
    requestId,
    deadline: Date.now() + 10_000,
    signal: new AbortController().signal,
    ...(events ? { events: async (e: ProviderEvent) => void events.push(e) } : {}),
  };
}

const request = (init: Partial<ImageRequestInit> = {}) => createImageRequest({ prompt: "a harbour at dawn", ...init });

describe("images: reference provider", () => {
  it("advertises consistent capabilities with its native count", async () => {
    const capabilities = await provider({ nativeCount: 3 }).capabilities();
    expect(() => validateCapabilities(capabilities)).to.not.throw();
    expect(capabilities.count).to.deep.equal({ min: 1, max: 3 });
    expect(capabilities.partialImages).to.deep.equal({ min: 0, max: 3 });
  });

  it("renders the requested size and format with real metadata", async () => {
    for (const [format, sharpFormat] of [["png", "png"], ["jpeg", "jpeg"], ["webp", "webp"]] as const) {
      const response = await provider().execute(request({ parameters: { size: "128x64", outputFormat: format } }), context());
      const image = response.data[0]!;
      const meta = await sharp(image.data!).metadata();
      expect([meta.format, meta.width, meta.height]).to.deep.equal([sharpFormat, 128, 64]);
      expect([image.format, image.width, image.height, image.bytes]).to.deep.equal([format, 128, 64, image.data!.byteLength]);
    }
  });

  it("renders 'auto' at the configured default size", async () => {
    const response = await provider().execute(request(), context());
    expect([response.data[0]!.width, response.data[0]!.height]).to.deep.equal([64, 64]);
  });

  it("is deterministic per prompt and global output index", async () => {
    const p = provider({ nativeCount: 2 });
    const a = await p.execute(request({ parameters: { n: 2 } }), context("x"));
    const b = await p.execute(request({ parameters: { n: 2 } }), context("y"));
    expect(a.data.map((d) => d.sha256)).to.deep.equal(b.data.map((d) => d.sha256));
    expect(a.data[0]!.sha256).to.not.equal(a.data[1]!.sha256);
    // The chunk at offset 1 of a fan-out renders output 1 as its first image.
    const chunk = await p.execute(request(), context("batch:output:1"));
    expect(chunk.data[0]!.sha256).to.equal(a.data[1]!.sha256);
    const other = await p.execute(request({ prompt: "something else" }), context("x"));
    expect(other.data[0]!.sha256).to.not.equal(a.data[0]!.sha256);
  });

  it("honours a transparent background with an alpha channel", async () => {
    const transparent = await provider().execute(request({ parameters: { background: "transparent" } }), context());
    const stats = await sharp(transparent.data[0]!.data!).stats();
    expect(stats.channels).to.have.length(4);
    expect(stats.channels[3]!.min).to.equal(0);
    const opaque = await provider().execute(request({ parameters: { background: "opaque" } }), context());
    expect((await sharp(opaque.data[0]!.data!).stats()).isOpaque).to.equal(true);
  });

  it("streams progressively finer previews per output", async () => {
    const events: ProviderEvent[] = [];
    await provider({ nativeCount: 2 }).execute(request({ parameters: { n: 2, partialImages: 3, quality: "high" } }), context("r", events));
    const partials = events.filter((e): e is Extract<ProviderEvent, { type: "partial_image" }> => e.type === "partial_image");
    expect(partials.map((p) => [p.index, p.partialIndex])).to.deep.equal([
      [0, 0], [1, 0], [0, 1], [1, 1], [0, 2], [1, 2],
    ]);
    // Distinct colours grow with each preview of output 0.
    const colours: number[] = [];
    for (const p of partials.filter((p) => p.index === 0)) {
      const raw = await sharp(p.image).removeAlpha().raw().toBuffer();
      const seen = new Set<string>();
      for (let i = 0; i < raw.length; i += 3) seen.add(`${raw[i]},${raw[i + 1]},${raw[i + 2]}`);
      colours.push(seen.size);
    }
    expect(colours[0]).to.be.lessThan(colours[1]!);
    expect(colours[1]).to.be.lessThan(colours[2]!);
    expect(events[0]!.type).to.equal("started");
    expect(events.at(-1)!.type).to.equal("completed");
  });

  it("injects failures by prompt and by output index", async () => {
    const byPrompt = provider({ failure: { promptContains: "boom", code: "safety_rejected", retryable: false } });
    try {
      await byPrompt.execute(request({ prompt: "a boom" }), context());
      expect.fail("expected a failure");
    } catch (error) {
      expect((error as ImageError).code).to.equal("safety_rejected");
    }
    const byIndex = provider({ failure: { outputIndices: [3] } });
    await byIndex.execute(request(), context("b:output:2"));
    try {
      await byIndex.execute(request(), context("b:output:3"));
      expect.fail("expected a failure");
    } catch (error) {
      expect((error as ImageError).code).to.equal("upstream");
    }
  });

  it("keeps persistent sessions and reports reuse", async () => {
    const p = provider();
    const first = await p.execute(request({ session: { mode: "persistent", key: "k1" } }), context());
    const second = await p.execute(request({ session: { mode: "persistent", key: "k1" } }), context());
    expect(first.session?.reused).to.equal(false);
    expect(second.session).to.deep.equal({ key: "k1", threadId: first.session!.threadId, reused: true });
    const other = await p.execute(request({ session: { mode: "persistent", key: "k2" } }), context());
    expect(other.session?.reused).to.equal(false);
    expect(other.session?.threadId).to.not.equal(first.session!.threadId);
  });

  it("stops when cancelled", async () => {
    const controller = new AbortController();
    const running = provider({ latencyMs: 5000 }).execute(request(), { ...context(), signal: controller.signal });
    setTimeout(() => controller.abort(), 10);
    try {
      await running;
      expect.fail("expected cancellation");
    } catch (error) {
      expect((error as ImageError).code).to.equal("cancelled");
    }
  });

  it("reads the output offset from both sub-request id forms", () => {
    expect(outputOffsetOf("abc")).to.equal(0);
    expect(outputOffsetOf("abc:output:7")).to.equal(7);
    expect(outputOffsetOf(`fanout:${"a".repeat(32)}:12`)).to.equal(12);
  });
});
