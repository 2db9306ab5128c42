import { expect } from "chai";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import type * as grpc from "@grpc/grpc-js";
import { ErrorDetailSchema, MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import { createMediaModule, mediaModule, peakMemoryBytes, type MediaStage } from "../../src/media/index.js";
import { mediaConfigSchema } from "../../src/media/config.js";
import { MediaError } from "../../src/media/errors.js";
import { createMediaPipeline } from "../../src/media/pipeline.js";
import { TensorStore } from "../../src/media/tensor-store.js";
import { Semaphore, type Permit } from "../../src/util/index.js";
import { eventually, expectRejection, grpcUnary, startServer, type InProcessServer } from "../support/index.js";
import { encodeRaw, pattern } from "./fixtures.js";

const PROTO = "mmgate/media/v1/media.proto";
const SERVICE = "mmgate.media.v1.MediaService";
const MiB = 1024 * 1024;
// Bounds a call only if it wrongly waits, so that such a failure ends; never a claim about speed.
const FAILSAFE_MS = 15_000;

function detail(error: ConnectError) {
  return error.findDetails(ErrorDetailSchema)[0];
}

async function scrape(server: InProcessServer): Promise<string> {
  return (await fetch(`http://${server.adminAddr}/metrics`)).text();
}

/** The ErrorDetail code inside grpc-js's grpc-status-details-bin, found as text. */
function grpcDetailText(error: grpc.ServiceError): string {
  const bin = error.metadata.get("grpc-status-details-bin")[0];
  return Buffer.isBuffer(bin) ? bin.toString("latin1") : "";
}

describe("media admission config", () => {
  it("bounds both queues by default and accepts 0 (no waiting)", () => {
    const defaults = mediaConfigSchema.parse({});
    expect(defaults.decoder.maxQueuedDecodes).to.equal(16);
    expect(defaults.fetch.maxQueuedFetches).to.equal(64);
    const none = mediaConfigSchema.parse({ decoder: { maxQueuedDecodes: 0 }, fetch: { maxQueuedFetches: 0 } });
    expect(none.decoder.maxQueuedDecodes).to.equal(0);
    expect(none.fetch.maxQueuedFetches).to.equal(0);
    expect(mediaConfigSchema.safeParse({ decoder: { maxQueuedDecodes: -1 } }).success).to.equal(false);
    expect(mediaConfigSchema.safeParse({ fetch: { maxQueuedFetches: 1.5 } }).success).to.equal(false);
  });

  it("peak memory is the store budget plus a full tensor per decode in flight", () => {
    // A decode slot may hold a video (video.maxAlloc, 512 MiB) or an image (decoder.maxAlloc, 128 MiB).
    expect(peakMemoryBytes(mediaConfigSchema.parse({}))).to.equal(1024 * MiB + 4 * 512 * MiB);
    const small = mediaConfigSchema.parse({
      store: { maxBytes: 64 * MiB },
      decoder: { maxAlloc: 16 * MiB, maxConcurrentDecodes: 2 },
      video: { maxAlloc: 8 * MiB },
    });
    expect(peakMemoryBytes(small)).to.equal(96 * MiB);
  });
});

describe("media pipeline admission", function () {
  this.timeout(30_000);
  let png: Buffer;
  before(async () => {
    png = await encodeRaw(pattern(8 * 8 * 3), 8, 8, 3, "png");
  });

  function pipelineWith(decoder: Record<string, number>) {
    const config = mediaConfigSchema.parse({ decoder });
    const slots = new Semaphore(config.decoder.maxConcurrentDecodes);
    const rejected: MediaStage[] = [];
    const pipeline = createMediaPipeline({
      config,
      tensors: new TensorStore({ maxBytes: MiB, ttlMs: 60_000 }),
      nixlMetadata: "b64:",
      decodeSlots: slots,
      onRejected: (stage) => rejected.push(stage),
    });
    return { pipeline, slots, rejected };
  }

  it("queues up to maxQueuedDecodes and refuses the next call at once with OVERLOADED", async () => {
    const { pipeline, slots, rejected } = pipelineWith({ maxConcurrentDecodes: 1, maxQueuedDecodes: 1 });
    const held = await slots.acquire();
    const queued = pipeline.decode({ data: png }, {}, new AbortController().signal);
    await eventually(() => expect(pipeline.load.decode.queued).to.equal(1));
    expect(pipeline.load.decode.inFlight).to.equal(1);

    const refused = await expectRejection(pipeline.decode({ data: png }, {}, AbortSignal.timeout(FAILSAFE_MS)), { type: MediaError });
    expect(refused.code).to.equal("OVERLOADED");
    expect(refused.status).to.equal(Code.ResourceExhausted);
    expect(refused.limit).to.equal(1n);
    expect(refused.actual).to.equal(2n);
    expect(refused.message).to.include("decode");
    expect(rejected).to.deep.equal(["decode"]);
    expect(pipeline.load.decode.queued).to.equal(1);

    held.release();
    const decoded = await queued;
    expect(decoded.tensorInfo.shape).to.deep.equal([8, 8, 3]);
    expect(pipeline.load.decode).to.include({ queued: 0, inFlight: 0 });
  });

  it("with maxQueuedDecodes 0 refuses as soon as every slot is busy", async () => {
    const { pipeline, slots, rejected } = pipelineWith({ maxConcurrentDecodes: 1, maxQueuedDecodes: 0 });
    const held = await slots.acquire();
    const refused = await expectRejection(pipeline.decode({ data: png }, {}, AbortSignal.timeout(FAILSAFE_MS)), { type: MediaError });
    expect(refused.code).to.equal("OVERLOADED");
    expect([refused.limit, refused.actual]).to.deep.equal([0n, 1n]);
    expect(rejected).to.deep.equal(["decode"]);
    held.release();
    expect((await pipeline.decode({ data: png }, {}, new AbortController().signal)).tensorInfo.shape).to.deep.equal([8, 8, 3]);
  });

  it("a waiter still ends on cancellation or its deadline, and frees its place in the queue", async () => {
    const { pipeline, slots, rejected } = pipelineWith({ maxConcurrentDecodes: 1, maxQueuedDecodes: 1 });
    const held = await slots.acquire();
    for (const reason of [new DOMException("the caller went away", "AbortError"), new DOMException("the deadline passed", "TimeoutError")]) {
      const caller = new AbortController();
      const waiting = pipeline.decode({ data: png }, {}, caller.signal);
      await eventually(() => expect(pipeline.load.decode.queued).to.equal(1));
      caller.abort(reason);
      expect(await expectRejection(waiting)).to.equal(reason);
      expect(pipeline.load.decode.queued).to.equal(0);
    }
    expect(rejected).to.deep.equal([]);
    held.release();
  });
});

describe("MediaService under overload", function () {
  this.timeout(60_000);
  let png: Buffer;
  before(async () => {
    png = await encodeRaw(pattern(8 * 8 * 3), 8, 8, 3, "png");
  });

  describe("decode queue", () => {
    let server: InProcessServer;
    let client: Client<typeof MediaService>;
    const slots = new Semaphore(1);
    const logLines: string[] = [];

    before(async () => {
      server = await startServer({
        modules: [createMediaModule({ decodeSlots: slots })],
        config: { media: { decoder: { maxConcurrentDecodes: 1, maxQueuedDecodes: 1 } } },
        logLines,
      });
      client = createClient(MediaService, server.transport);
    });
    after(async () => {
      await server?.close();
    });

    it("refuses a call beyond the full queue with RESOURCE_EXHAUSTED and retry-after, over connect and grpc-js", async () => {
      let held: Permit | undefined = await slots.acquire();
      try {
        const queued = client.decode({ source: { case: "data", value: png }, options: { skipStore: true } });
        await eventually(() => expect(slots.waiting).to.equal(1));

        const refused = await expectRejection(
          client.decode({ source: { case: "data", value: png }, options: { skipStore: true } }, { timeoutMs: FAILSAFE_MS }),
          { type: ConnectError },
        );
        expect(refused.code).to.equal(Code.ResourceExhausted);
        expect(detail(refused)).to.include({ code: "OVERLOADED", limit: 1n, actual: 2n });
        expect(refused.metadata.get("retry-after")).to.equal("1");

        const grpcClient = server.grpcClient(PROTO, SERVICE);
        const deadline = new Date(Date.now() + FAILSAFE_MS);
        const viaGrpc = await expectRejection<grpc.ServiceError>(grpcUnary(grpcClient, "Decode", { data: png }, { deadline }), {
          code: 8, // RESOURCE_EXHAUSTED
        });
        expect(viaGrpc.metadata.get("retry-after")).to.deep.equal(["1"]);
        expect(grpcDetailText(viaGrpc)).to.include("OVERLOADED");

        const metrics = await scrape(server);
        expect(metrics).to.include('mmgate_media_admission_rejected_total{stage="decode"} 2');
        expect(metrics).to.include('mmgate_media_admission_rejected_total{stage="fetch"} 0');
        expect(metrics).to.include('mmgate_media_admission_queued{stage="decode"} 1');
        expect(metrics).to.include('mmgate_media_admission_in_flight{stage="decode"} 1');

        held.release();
        held = undefined;
        expect((await queued).tensorInfo?.shape).to.deep.equal([8n, 8n, 3n]);
        expect(await scrape(server)).to.include('mmgate_media_admission_queued{stage="decode"} 0');
      } finally {
        held?.release();
      }
    });

    it("logs the peak memory figure at start-up", () => {
      const ready = logLines.map((l) => JSON.parse(l) as Record<string, unknown>).find((e) => e["msg"] === "media tensor store ready");
      expect(ready?.["peakMemoryBytes"]).to.equal(1024 * MiB + 1 * 512 * MiB);
    });
  });

  describe("fetch queue", () => {
    let server: InProcessServer;
    let client: Client<typeof MediaService>;
    let media: http.Server;
    let port = 0;
    const pending: http.ServerResponse[] = [];

    before(async () => {
      // Holds every response until the test lets it go.
      media = http.createServer((_req, res) => void pending.push(res));
      await new Promise<void>((resolve) => media.listen(0, "127.0.0.1", resolve));
      port = (media.address() as AddressInfo).port;
      server = await startServer({
        modules: [mediaModule],
        config: {
          media: {
            fetch: {
              maxConcurrentFetches: 1,
              maxQueuedFetches: 1,
              // Loopback opened for this suite's local media server only.
              allowDirectIp: true,
              allowDirectPort: true,
              allowedIpNetworks: ["127.0.0.1/32"],
            },
          },
        },
      });
      client = createClient(MediaService, server.transport);
    });
    after(async () => {
      for (const res of pending.splice(0)) res.destroy();
      await server?.close();
      media?.closeAllConnections();
      await new Promise((resolve) => media?.close(resolve));
    });

    it("refuses a fetch beyond the full queue at once and counts it", async () => {
      const url = `http://127.0.0.1:${port}/img.png`;
      const first = client.decode({ source: { case: "url", value: url }, options: { skipStore: true } });
      await eventually(() => expect(pending).to.have.length(1));
      const second = client.decode({ source: { case: "url", value: url }, options: { skipStore: true } });
      await eventually(async () => expect(await scrape(server)).to.include('mmgate_media_admission_queued{stage="fetch"} 1'));

      const refused = await expectRejection(client.decode({ source: { case: "url", value: url } }, { timeoutMs: FAILSAFE_MS }), {
        type: ConnectError,
      });
      expect(refused.code).to.equal(Code.ResourceExhausted);
      expect(detail(refused)).to.include({ code: "OVERLOADED", limit: 1n, actual: 2n });
      expect(refused.metadata.get("retry-after")).to.equal("1");
      const viaGrpc = await expectRejection<grpc.ServiceError>(
        grpcUnary(server.grpcClient(PROTO, SERVICE), "Decode", { url }, { deadline: new Date(Date.now() + FAILSAFE_MS) }),
        { code: 8 },
      );
      expect(viaGrpc.metadata.get("retry-after")).to.deep.equal(["1"]);
      // Data sources need no fetch slot: they still decode.
      expect((await client.decode({ source: { case: "data", value: png }, options: { skipStore: true } })).tensorInfo?.shape).to.deep.equal([8n, 8n, 3n]);

      const metrics = await scrape(server);
      expect(metrics).to.include('mmgate_media_admission_rejected_total{stage="fetch"} 2');
      expect(metrics).to.include('mmgate_media_admission_rejected_total{stage="decode"} 0');
      expect(metrics).to.include('mmgate_media_admission_in_flight{stage="fetch"} 1');

      pending.shift()!.end(png);
      expect((await first).tensorInfo?.shape).to.deep.equal([8n, 8n, 3n]);
      await eventually(() => expect(pending).to.have.length(1));
      pending.shift()!.end(png);
      expect((await second).tensorInfo?.shape).to.deep.equal([8n, 8n, 3n]);
    });
  });
});
