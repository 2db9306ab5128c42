import { expect } from "chai";
import { create } from "@bufbuild/protobuf";
import type { HandlerContext } from "@connectrpc/connect";
import { ReadTensorRequestSchema } from "../../gen/mmgate/media/v1/media_pb.js";
import { mediaConfigSchema } from "../../src/media/config.js";
import { createMediaPipeline } from "../../src/media/pipeline.js";
import { createMediaService } from "../../src/media/service.js";
import { TensorStore } from "../../src/media/tensor-store.js";

function fakeContext(signal: AbortSignal): HandlerContext {
  return { signal } as unknown as HandlerContext;
}

describe("ReadTensor stream ending", () => {
  const config = mediaConfigSchema.parse({ readChunkBytes: 4096 });
  const store = new TensorStore({ maxBytes: 1 << 20, ttlMs: 60_000 });
  // Stored when the tests run, not when the file loads: the TTL counts from here.
  let handle = 0n;
  before(() => {
    handle = store.put(new Uint8Array(10 * 4096), { shape: [10 * 4096], dtype: "UINT8", metadata: null }, null);
  });

  async function collect(client: AbortController, stopAfter: number) {
    const service = createMediaService({ config, pipeline: createMediaPipeline({ config, tensors: store, nixlMetadata: "b64:" }) });
    const chunks: number[] = [];
    for await (const msg of service.readTensor(create(ReadTensorRequestSchema, { handle }), fakeContext(client.signal))) {
      chunks.push(msg.data?.length ?? 0);
      if (chunks.length === stopAfter) client.abort();
    }
    return chunks;
  }

  it("stops when the client goes away", async () => {
    expect(await collect(new AbortController(), 2)).to.have.length(2);
  });

  it("streams every chunk otherwise", async () => {
    expect(await collect(new AbortController(), -1)).to.deep.equal(Array(10).fill(4096));
  });
});

describe("config and decode slots", () => {
  it("parses {} to the documented defaults", () => {
    const c = mediaConfigSchema.parse({});
    expect(c.decoder).to.deep.equal({ maxImageWidth: null, maxImageHeight: null, maxAlloc: 134217728, maxConcurrentDecodes: 4, maxQueuedDecodes: 16, threadsPerDecode: 0 });
    expect(c.fetch).to.deep.equal({
      allowDirectIp: false,
      allowDirectPort: false,
      allowPrivateIps: false,
      allowedIpNetworks: [],
      allowedMediaDomains: null,
      timeoutMs: 30_000,
      maxBodyBytes: 64 * 1024 * 1024,
      maxRedirects: 3,
      maxConcurrentFetches: 16,
      maxQueuedFetches: 64,
      userAgent: "mmgate-media-fetcher",
      mixedAddresses: "refuse",
    });
    expect(c.decodedCache).to.deep.equal({ maxBytes: 0 });
    expect(c.store).to.deep.equal({ maxBytes: 1024 ** 3, ttlMs: 120_000 });
    expect(c.maxInlinePixelBytes).to.equal(4 * 1024 * 1024);
    expect(c.readChunkBytes).to.equal(1024 * 1024);
    expect(() => mediaConfigSchema.parse({ fetch: { allowedIpNetworks: ["nope"] } })).to.throw();
    expect(() => mediaConfigSchema.parse({ unknownKey: 1 })).to.throw();
  });
});
