import { ConnectError, createClient } from "@connectrpc/connect";
import { expect } from "chai";
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import * as pb from "../../gen/mmgate/images/v1/images_pb.js";
import { buildImageRuntime } from "../../src/images/build.js";
import { imagesConfigSchema } from "../../src/images/config.js";
import { ImageError } from "../../src/images/core/errors.js";
import type { ImageProvider, ProviderContext } from "../../src/images/core/provider.js";
import { defineImagesModule } from "../../src/images/index.js";
import {
  createImageRequest,
  type ImageRequest,
  type ImageResponse,
  type ProviderCapabilities,
  type ProviderDescriptor,
  type ProviderEvent,
} from "../../src/images/model.js";
import { startServer, type InProcessServer } from "../support/index.js";
import { FakeProvider, fakeCapabilities } from "./fake-provider.js";

/** A plugged-in provider whose every call fails with what `fail` builds. */
class FailingProvider implements ImageProvider {
  constructor(
    readonly name: string,
    private readonly fail: () => Error,
  ) {}

  descriptor(): ProviderDescriptor {
    return { name: this.name, displayName: this.name, version: "test", experimental: false, models: [] };
  }

  async capabilities(): Promise<ProviderCapabilities> {
    return { ...fakeCapabilities(), provider: this.name };
  }

  async execute(_request: ImageRequest, _context: ProviderContext): Promise<ImageResponse> {
    throw this.fail();
  }

  async shutdown(): Promise<void> {}
}

/** The ErrorDetail a Connect client sees. */
async function detailOf(work: Promise<unknown>): Promise<pb.ErrorDetail> {
  try {
    await work;
  } catch (error) {
    const e = ConnectError.from(error);
    const [detail] = e.findDetails(pb.ErrorDetailSchema);
    expect(detail, "ErrorDetail").to.not.equal(undefined);
    return detail!;
  }
  return expect.fail("expected an error");
}

describe("images: error invariants for plugged-in providers", function () {
  this.timeout(20_000);
  let server: InProcessServer;

  before(async () => {
    server = await startServer({
      modules: [
        defineImagesModule({
          extraProviders: [
            // Claims the unchanged request may be retried although it cannot know what happened.
            new FailingProvider("unknown-outcome", () =>
              new ImageError("upstream", "lost track of the upstream call", { retryable: true, details: { outcome: "unknown" } }),
            ),
            // Refuses on safety grounds with no safety details and a retryable flag.
            new FailingProvider("bare-refusal", () => new ImageError("safety_rejected", "refused", { retryable: true })),
          ],
        }),
      ],
      config: { images: { reference: { enabled: false } } },
    });
  });
  after(async () => server?.close());

  it("never shows the client an unknown outcome as retryable", async () => {
    const images = createClient(ImageService, server.transport);
    const detail = await detailOf(
      images.generate({ request: { prompt: "p", operation: { case: "generate", value: {} }, routing: { provider: "unknown-outcome" } } }),
    );
    expect(detail.retryable).to.equal(false);
    expect(detail.details?.["outcome"]).to.equal("unknown");
  });

  it("shows the client a safety refusal with its four safety details, not retryable", async () => {
    const images = createClient(ImageService, server.transport);
    const detail = await detailOf(
      images.generate({ request: { prompt: "p", operation: { case: "generate", value: {} }, routing: { provider: "bare-refusal" } } }),
    );
    expect(detail.retryable).to.equal(false);
    expect(detail.details).to.deep.include({
      safety_category: "content_policy",
      recovery: "revise_prompt_or_inputs",
      retry_same_request: false,
      safety_controls_relaxed: false,
    });
  });
});

describe("images: partial previews are bounded by the request", () => {
  it("drops a plugged-in provider's previews outside n and partial_images", async () => {
    const capabilities = { ...fakeCapabilities(), partialImages: { min: 0, max: 3 } };
    const fake = new FakeProvider({ capabilities, extraEvents: true });
    // FakeProvider sends partial (n, 0) with extraEvents, then (0, 0); add an out-of-range preview index.
    const execute = fake.execute.bind(fake);
    fake.execute = async (request, context) => {
      await context.events?.({ type: "partial_image", index: 0, partialIndex: request.parameters.partialImages, image: new Uint8Array([7]) });
      await context.events?.({ type: "partial_image", index: 0, partialIndex: -1, image: new Uint8Array([7]) });
      return execute(request, context);
    };
    const runtime = buildImageRuntime(imagesConfigSchema.parse({ reference: { enabled: false } }), { extraProviders: [fake] });
    const events: ProviderEvent[] = [];
    await runtime.execute(
      createImageRequest({ prompt: "p", responseFormat: "metadata", routing: { provider: "fanout-test" }, parameters: { partialImages: 1 } }),
      { requestId: "rid", signal: new AbortController().signal, events: async (event) => void events.push(event) },
    );
    expect(events.filter((e) => e.type === "partial_image").map((e) => (e.type === "partial_image" ? [e.index, e.partialIndex] : []))).to.deep.equal([[0, 0]]);
    await runtime.shutdown();
  });
});
