import { expect } from "chai";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { createClient } from "@connectrpc/connect";
import { Registry } from "prom-client";
import { MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import { ConfigError, loadConfig } from "../../src/server/config/index.js";
import { mediaConfigSchema, peakMemoryBytes, type MediaConfig } from "../../src/media/config.js";
import { DecodedMediaCache, decodedCacheKey, type DecodedCacheEvent } from "../../src/media/decoded-cache.js";
import { MediaError } from "../../src/media/errors.js";
import { mediaModule } from "../../src/media/index.js";
import { MediaMetrics } from "../../src/media/metrics.js";
import { createMediaPipeline, type MediaPipeline } from "../../src/media/pipeline.js";
import { TensorStore } from "../../src/media/tensor-store.js";
import type { DecodedMedia } from "../../src/media/tensor.js";
import { expectRejection, startServer } from "../support/index.js";
import { encodeRaw, pattern } from "./fixtures.js";

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;
const never = () => new AbortController().signal;

function tensor(bytes: number, fill = 1): DecodedMedia {
  return {
    data: new Uint8Array(bytes).fill(fill),
    tensorInfo: { shape: [1, bytes, 1], dtype: "UINT8", metadata: { Image: { format: "Png", color_type: "L8", layout: "HWC" } } },
    contentHash: BigInt(fill),
  };
}

/** A production the test settles by hand. */
function deferred() {
  let resolve!: (value: DecodedMedia) => void;
  let reject!: (error: Error) => void;
  const promise = new Promise<DecodedMedia>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

function counting() {
  const events: Record<DecodedCacheEvent, number> = { hit: 0, miss: 0, eviction: 0 };
  return { events, onEvent: (event: DecodedCacheEvent) => void events[event]++ };
}

describe("decoded-media cache", () => {
  it("is off at 0 bytes: every call produces, nothing is counted", async () => {
    const { events, onEvent } = counting();
    const cache = new DecodedMediaCache({ maxBytes: 0, onEvent });
    let produced = 0;
    for (let i = 0; i < 3; i++) await cache.get("k", never(), async () => (produced++, tensor(4)));
    expect([cache.enabled, produced, cache.count, cache.bytes]).to.deep.equal([false, 3, 0, 0]);
    expect(events).to.deep.equal({ hit: 0, miss: 0, eviction: 0 });
  });

  it("counts hits and misses and evicts the least recently used beyond its byte budget", async () => {
    const { events, onEvent } = counting();
    const cache = new DecodedMediaCache({ maxBytes: 100, onEvent });
    const a = await cache.get("a", never(), async () => tensor(40, 1));
    await cache.get("b", never(), async () => tensor(40, 2));
    expect(await cache.get("a", never(), async () => tensor(40, 9))).to.equal(a); // a is now the most recent
    expect(events).to.deep.equal({ hit: 1, miss: 2, eviction: 0 });
    expect([cache.count, cache.bytes]).to.deep.equal([2, 80]);

    await cache.get("c", never(), async () => tensor(40, 3));
    expect(events).to.deep.equal({ hit: 1, miss: 3, eviction: 1 });
    expect(cache.peek("b")).to.equal(undefined);
    expect(cache.peek("a")).to.equal(a);
    expect([cache.count, cache.bytes]).to.deep.equal([2, 80]);
  });

  it("an entry larger than the whole budget is returned, counted as an eviction and not kept; the others stay", async () => {
    const { events, onEvent } = counting();
    const cache = new DecodedMediaCache({ maxBytes: 100, onEvent });
    await cache.get("small", never(), async () => tensor(60));
    const big = await cache.get("big", never(), async () => tensor(101));
    expect(big.data.length).to.equal(101);
    expect(events).to.deep.equal({ hit: 0, miss: 2, eviction: 1 });
    expect([cache.count, cache.bytes]).to.deep.equal([1, 60]);
    expect(cache.peek("big")).to.equal(undefined);
    await cache.get("big", never(), async () => tensor(101));
    expect(events).to.deep.equal({ hit: 0, miss: 3, eviction: 2 });
    // Exactly the budget fits.
    await cache.get("full", never(), async () => tensor(100));
    expect([cache.count, cache.bytes]).to.deep.equal([1, 100]);
  });

  it("does not cache a failure: the next call tries again", async () => {
    const { events, onEvent } = counting();
    const cache = new DecodedMediaCache({ maxBytes: 100, onEvent });
    const failure = new MediaError("FETCH_HTTP_STATUS", "Fetching media failed with HTTP status 503");
    const error = await expectRejection(cache.get("k", never(), () => Promise.reject(failure)), { type: MediaError });
    expect(error).to.equal(failure);
    expect([cache.count, cache.inFlight]).to.deep.equal([0, 0]);
    await expectRejection(
      cache.get("k", never(), () => {
        throw failure; // a synchronous throw is a failure like any other
      }),
      { type: MediaError },
    );
    const ok = await cache.get("k", never(), async () => tensor(10));
    expect(ok.data.length).to.equal(10);
    expect(events).to.deep.equal({ hit: 0, miss: 3, eviction: 0 });
    expect(cache.count).to.equal(1);
  });

  it("runs one production for concurrent calls of a key; every waiter gets its result, or its error", async () => {
    const { events, onEvent } = counting();
    const cache = new DecodedMediaCache({ maxBytes: 1000, onEvent });
    let produced = 0;
    const work = deferred();
    const calls = Array.from({ length: 5 }, () => cache.get("k", never(), () => (produced++, work.promise)));
    expect([produced, cache.inFlight]).to.deep.equal([1, 1]);
    const result = tensor(8);
    work.resolve(result);
    const got = await Promise.all(calls);
    for (const g of got) expect(g).to.equal(result);
    expect(events).to.deep.equal({ hit: 4, miss: 1, eviction: 0 });
    expect(cache.inFlight).to.equal(0);

    const failing = deferred();
    const failed = Array.from({ length: 3 }, () => cache.get("f", never(), () => (produced++, failing.promise)));
    failing.reject(new MediaError("FETCH_FAILED", "boom"));
    for (const f of failed) expect((await expectRejection(f, { type: MediaError })).message).to.equal("boom");
    expect([produced, cache.count, cache.inFlight]).to.deep.equal([2, 1, 0]);
  });

  it("a waiter's abort or deadline ends only its own wait while others remain", async () => {
    const cache = new DecodedMediaCache({ maxBytes: 1000 });
    const work = deferred();
    let shared: AbortSignal | undefined;
    const leaving = new AbortController();
    const first = cache.get("k", leaving.signal, (signal) => ((shared = signal), work.promise));
    const timed = cache.get("k", AbortSignal.timeout(20), () => expect.fail("joins the flight"));
    const staying = cache.get("k", never(), () => expect.fail("joins the flight"));
    const reason = new Error("client went away");
    leaving.abort(reason);
    expect(await expectRejection(first)).to.equal(reason);
    expect((await expectRejection(timed)).name).to.equal("TimeoutError");
    expect(shared?.aborted).to.equal(false);
    work.resolve(tensor(8));
    expect((await staying).data.length).to.equal(8);
    expect(cache.count).to.equal(1);
  });

  it("aborts the shared work when every waiter has left, and the next call starts afresh", async () => {
    const { events, onEvent } = counting();
    const cache = new DecodedMediaCache({ maxBytes: 1000, onEvent });
    const callers = [new AbortController(), new AbortController()];
    let shared: AbortSignal | undefined;
    const abandoned = deferred();
    const waits = callers.map((c) => cache.get("k", c.signal, (signal) => ((shared = signal), abandoned.promise)));
    callers[0]!.abort();
    expect(shared?.aborted).to.equal(false);
    callers[1]!.abort();
    expect(shared?.aborted).to.equal(true);
    for (const w of waits) await expectRejection(w);
    expect(cache.inFlight).to.equal(0);
    // The abandoned production's failure reaches nobody (no unhandled rejection).
    abandoned.reject(new Error("aborted"));

    const fresh = await cache.get("k", never(), async () => tensor(4));
    expect(fresh.data.length).to.equal(4);
    expect(events).to.deep.equal({ hit: 1, miss: 2, eviction: 0 });
  });

  it("keeps images only: a video result is shared with its waiters, then dropped", async () => {
    const { events, onEvent } = counting();
    const cache = new DecodedMediaCache({ maxBytes: 1000, onEvent });
    const video: DecodedMedia = {
      data: new Uint8Array(12),
      tensorInfo: { shape: [2, 1, 2, 3], dtype: "UINT8", metadata: { Video: { source_fps: 24, source_duration: 1, sampled_timestamps: [0, 0.5] } } },
      contentHash: null,
    };
    const work = deferred();
    const both = [cache.get("v", never(), () => work.promise), cache.get("v", never(), () => expect.fail("joins the flight"))];
    work.resolve(video);
    for (const got of await Promise.all(both)) expect(got).to.equal(video);
    expect([cache.count, cache.bytes]).to.deep.equal([0, 0]);
    expect(events).to.deep.equal({ hit: 1, miss: 1, eviction: 0 });
  });

  it("a call whose signal already fired produces nothing", async () => {
    const cache = new DecodedMediaCache({ maxBytes: 1000 });
    const controller = new AbortController();
    controller.abort(new Error("gone"));
    expect((await expectRejection(cache.get("k", controller.signal, () => expect.fail("not produced")))).message).to.equal("gone");
    expect(cache.inFlight).to.equal(0);
  });

  it("hands out frozen tensor info (the bytes are read-only by contract)", async () => {
    const cache = new DecodedMediaCache({ maxBytes: 1000 });
    const got = await cache.get("k", never(), async () => tensor(4));
    expect(Object.isFrozen(got)).to.equal(true);
    expect(Object.isFrozen(got.tensorInfo)).to.equal(true);
    expect(Object.isFrozen(got.tensorInfo.shape)).to.equal(true);
    expect(() => (got.tensorInfo.shape as number[]).push(1)).to.throw(TypeError);
  });

  it("keys by URL and by the decode options that change the tensor", () => {
    const url = "https://cdn.example.com/a.png";
    const keys = [
      decodedCacheKey(url, { forceRgb: false, applyExifOrientation: false }),
      decodedCacheKey(url, { forceRgb: true, applyExifOrientation: false }),
      decodedCacheKey(url, { forceRgb: false, applyExifOrientation: true }),
      decodedCacheKey(url, { forceRgb: true, applyExifOrientation: true }),
      decodedCacheKey(`${url}?v=2`, { forceRgb: false, applyExifOrientation: false }),
    ];
    expect(new Set(keys).size).to.equal(5);
    expect(decodedCacheKey(url, { forceRgb: true, applyExifOrientation: false })).to.equal(keys[1]);
  });
});

describe("decoded-media cache config", () => {
  const mediaOf = (env: Record<string, string>) => loadConfig({ env }, [mediaModule]).sections.media as MediaConfig;

  it("is off by default", () => {
    expect(mediaConfigSchema.parse({}).decodedCache).to.deep.equal({ maxBytes: 0 });
    expect(mediaOf({}).decodedCache.maxBytes).to.equal(0);
  });

  it("honours DYN_MULTIMODAL_LOADER_CACHE_GB as float GiB", () => {
    const table: [string, number][] = [
      ["8", 8 * GiB],
      ["8.0", 8 * GiB],
      ["0.5", 512 * MiB],
      ["1e-3", Math.floor(0.001 * GiB)],
      ["0", 0],
    ];
    for (const [value, bytes] of table) expect(mediaOf({ DYN_MULTIMODAL_LOADER_CACHE_GB: value }).decodedCache.maxBytes, value).to.equal(bytes);
  });

  it("MMGATE_MEDIA__DECODED_CACHE__MAX_BYTES (maxBytes) wins over the GiB variable", () => {
    const both = mediaOf({ DYN_MULTIMODAL_LOADER_CACHE_GB: "8", MMGATE_MEDIA__DECODED_CACHE__MAX_BYTES: "1048576" });
    expect(both.decodedCache).to.deep.equal({ maxBytes: MiB });
    expect(mediaConfigSchema.parse({ decodedCache: { gib: 1, maxBytes: 0 } }).decodedCache.maxBytes).to.equal(0);
  });

  it("refuses a value that is not a GiB amount, naming the variable", () => {
    for (const value of ["lots", "-1", "8GiB", "2048"]) {
      expect(() => mediaOf({ DYN_MULTIMODAL_LOADER_CACHE_GB: value }), value).to.throw(ConfigError, /DYN_MULTIMODAL_LOADER_CACHE_GB/);
    }
  });

  it("counts toward the peak memory figure", () => {
    const withCache = mediaConfigSchema.parse({ decodedCache: { maxBytes: 256 * MiB } });
    expect(peakMemoryBytes(withCache) - peakMemoryBytes(mediaConfigSchema.parse({}))).to.equal(256 * MiB);
  });
});

describe("decoded-media cache in the pipeline, against a local HTTP server", function () {
  this.timeout(30_000);
  const W = 16;
  const H = 12;
  const RGBA = pattern(W * H * 4);
  let png: Buffer;
  let server: http.Server;
  let port = 0;
  const requests = new Map<string, number>();
  let flakyFailures = 0;
  let held: (() => void)[] = [];

  before(async () => {
    png = await encodeRaw(RGBA, W, H, 4, "png");
    server = http.createServer((req, res) => {
      const path = req.url ?? "/";
      requests.set(path, (requests.get(path) ?? 0) + 1);
      if (path.startsWith("/img.png")) return void res.end(png);
      if (path === "/flaky.png") return void (flakyFailures-- > 0 ? res.writeHead(503).end() : res.end(png));
      if (path.startsWith("/held.png")) return void held.push(() => res.end(png));
      res.writeHead(404).end();
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    port = (server.address() as AddressInfo).port;
  });

  beforeEach(() => {
    requests.clear();
    held = [];
  });

  after(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  const url = (path: string) => `http://127.0.0.1:${port}${path}`;

  function pipelineWith(maxBytes: number): { pipeline: MediaPipeline; registry: Registry; events: Record<DecodedCacheEvent, number> } {
    const config = mediaConfigSchema.parse({
      decodedCache: { maxBytes },
      // Loopback opened for this suite's local media server only.
      fetch: { allowDirectIp: true, allowDirectPort: true, allowedIpNetworks: ["127.0.0.1/32"], timeoutMs: 10_000 },
    });
    const registry = new Registry();
    const tensors = new TensorStore({ maxBytes: 16 * MiB, ttlMs: 60_000 });
    const { events, onEvent } = counting();
    const metrics: MediaMetrics = new MediaMetrics(registry, tensors, () => pipeline.load, () => pipeline.decodedCache);
    const pipeline = createMediaPipeline({
      config,
      tensors,
      nixlMetadata: "b64:",
      onDecodedCache: (event) => {
        onEvent(event);
        metrics.decodedCache[event].inc();
      },
    });
    return { pipeline, registry, events };
  }

  async function metric(registry: Registry, name: string): Promise<number> {
    const values = (await registry.getSingleMetric(name)!.get()).values;
    return values[0]?.value ?? 0;
  }

  it("N concurrent decodes of one URL make one fetch and one decode; later ones are hits", async () => {
    const { pipeline, registry, events } = pipelineWith(MiB);
    const results = await Promise.all(Array.from({ length: 8 }, () => pipeline.decode({ url: url("/img.png") }, {}, never())));
    expect(requests.get("/img.png")).to.equal(1);
    for (const r of results) expect(r).to.equal(results[0]);
    expect(results[0]!.tensorInfo.shape).to.deep.equal([H, W, 4]);
    expect(Buffer.from(results[0]!.data).equals(Buffer.from(RGBA))).to.equal(true);

    expect(await pipeline.decode({ url: url("/img.png") }, {}, never())).to.equal(results[0]);
    expect(requests.get("/img.png")).to.equal(1);
    expect(events).to.deep.equal({ hit: 8, miss: 1, eviction: 0 });
    expect(await metric(registry, "mmgate_media_decoded_cache_hits_total")).to.equal(8);
    expect(await metric(registry, "mmgate_media_decoded_cache_misses_total")).to.equal(1);
    expect(await metric(registry, "mmgate_media_decoded_cache_evictions_total")).to.equal(0);
    expect(await metric(registry, "mmgate_media_decoded_cache_bytes")).to.equal(W * H * 4);
    expect(await metric(registry, "mmgate_media_decoded_cache_entries")).to.equal(1);
    // A hit takes no fetch or decode slot.
    expect(pipeline.load.fetch).to.include({ inFlight: 0, queued: 0 });
  });

  it("keys by the decode options: forceRgb is another tensor and another fetch", async () => {
    const { pipeline } = pipelineWith(MiB);
    const source = await pipeline.decode({ url: url("/img.png?opts") }, {}, never());
    const rgb = await pipeline.decode({ url: url("/img.png?opts") }, { forceRgb: true }, never());
    const exif = await pipeline.decode({ url: url("/img.png?opts") }, { applyExifOrientation: true }, never());
    expect(source.tensorInfo.shape).to.deep.equal([H, W, 4]);
    expect(rgb.tensorInfo.shape).to.deep.equal([H, W, 3]);
    expect(exif).to.not.equal(source);
    expect(requests.get("/img.png?opts")).to.equal(3);
    expect(await pipeline.decode({ url: url("/img.png?opts") }, { forceRgb: true }, never())).to.equal(rgb);
    expect(await pipeline.decode({ url: url("/img.png?opts") }, { forceRgb: false, applyExifOrientation: false }, never())).to.equal(source);
    expect(requests.get("/img.png?opts")).to.equal(3);
    expect(pipeline.decodedCache.count).to.equal(3);
  });

  it("never caches data: URLs or bytes", async () => {
    const { pipeline, events } = pipelineWith(MiB);
    const dataUrl = `data:image/png;base64,${png.toString("base64")}`;
    const a = await pipeline.decode({ url: dataUrl }, {}, never());
    const b = await pipeline.decode({ url: dataUrl }, {}, never());
    const c = await pipeline.decode({ data: png }, {}, never());
    const d = await pipeline.decode({ data: png }, {}, never());
    expect(new Set([a, b, c, d]).size).to.equal(4);
    expect(a.contentHash).to.equal(d.contentHash);
    expect(events).to.deep.equal({ hit: 0, miss: 0, eviction: 0 });
    expect(pipeline.decodedCache.count).to.equal(0);
  });

  it("does not cache a failed fetch", async () => {
    const { pipeline, events } = pipelineWith(MiB);
    flakyFailures = 1;
    const error = await expectRejection(pipeline.decode({ url: url("/flaky.png") }, {}, never()), { type: MediaError });
    expect(error.code).to.equal("FETCH_HTTP_STATUS");
    const ok = await pipeline.decode({ url: url("/flaky.png") }, {}, never());
    expect(ok.tensorInfo.shape).to.deep.equal([H, W, 4]);
    expect(requests.get("/flaky.png")).to.equal(2);
    expect(events).to.deep.equal({ hit: 0, miss: 2, eviction: 0 });
  });

  it("an image larger than the budget is decoded, counted as an eviction and fetched again next time", async () => {
    const { pipeline, registry, events } = pipelineWith(W * H * 4 - 1);
    await pipeline.decode({ url: url("/img.png?big") }, {}, never());
    await pipeline.decode({ url: url("/img.png?big") }, {}, never());
    expect(requests.get("/img.png?big")).to.equal(2);
    expect(events).to.deep.equal({ hit: 0, miss: 2, eviction: 2 });
    expect(await metric(registry, "mmgate_media_decoded_cache_evictions_total")).to.equal(2);
    expect(pipeline.decodedCache.count).to.equal(0);
  });

  it("with the cache off, every decode fetches", async () => {
    const { pipeline, events } = pipelineWith(0);
    await pipeline.decode({ url: url("/img.png?off") }, {}, never());
    await pipeline.decode({ url: url("/img.png?off") }, {}, never());
    expect(requests.get("/img.png?off")).to.equal(2);
    expect(events).to.deep.equal({ hit: 0, miss: 0, eviction: 0 });
  });

  it("a waiter that leaves does not cancel the fetch others wait for; when all leave, the next call fetches again", async () => {
    const { pipeline } = pipelineWith(MiB);
    const leaving = new AbortController();
    const first = pipeline.decode({ url: url("/held.png") }, {}, leaving.signal);
    const second = pipeline.decode({ url: url("/held.png") }, {}, never());
    while (held.length === 0) await new Promise((resolve) => setTimeout(resolve, 5));
    leaving.abort(new Error("first caller left"));
    expect((await expectRejection(first)).message).to.equal("first caller left");
    held.shift()!();
    expect((await second).tensorInfo.shape).to.deep.equal([H, W, 4]);
    expect(requests.get("/held.png")).to.equal(1);

    const gone = [new AbortController(), new AbortController()];
    const both = gone.map((c) => pipeline.decode({ url: url("/held.png?2") }, {}, c.signal));
    while (held.length === 0) await new Promise((resolve) => setTimeout(resolve, 5));
    for (const c of gone) c.abort();
    for (const p of both) await expectRejection(p);
    const again = pipeline.decode({ url: url("/held.png?2") }, {}, never());
    while (held.length < 2) await new Promise((resolve) => setTimeout(resolve, 5));
    for (const release of held.splice(0)) release();
    expect((await again).tensorInfo.shape).to.deep.equal([H, W, 4]);
    expect(requests.get("/held.png?2")).to.equal(2);
  });

  it("a cached tensor stored twice gets two handles over the same unchanged bytes", async () => {
    const { pipeline } = pipelineWith(MiB);
    const decoded = await pipeline.decode({ url: url("/img.png?store") }, {}, never());
    const again = await pipeline.decode({ url: url("/img.png?store") }, {}, never());
    expect(again).to.equal(decoded);
    const one = pipeline.store(decoded);
    const two = pipeline.store(again);
    expect(one.handle).to.not.equal(two.handle);
    expect(pipeline.tensors.release(one.handle)).to.equal(true);
    const kept = pipeline.tensors.get(two.handle);
    expect(kept && Buffer.from(kept.data).equals(Buffer.from(RGBA))).to.equal(true);
    expect(Buffer.from(decoded.data).equals(Buffer.from(RGBA))).to.equal(true);
    expect((await pipeline.decode({ url: url("/img.png?store") }, {}, never())).data).to.equal(decoded.data);
  });
});

describe("decoded-media cache through the media module", function () {
  this.timeout(30_000);

  it("serves a repeated Decode of a URL from the cache and reports it on /metrics", async () => {
    const png = await encodeRaw(pattern(8 * 8 * 3), 8, 8, 3, "png");
    let fetched = 0;
    const media = http.createServer((_req, res) => void (fetched++, res.end(png)));
    await new Promise<void>((resolve) => media.listen(0, "127.0.0.1", resolve));
    const port = (media.address() as AddressInfo).port;
    const server = await startServer({
      modules: [mediaModule],
      config: {
        media: {
          decodedCache: { maxBytes: MiB },
          fetch: { allowDirectIp: true, allowDirectPort: true, allowedIpNetworks: ["127.0.0.1/32"], timeoutMs: 10_000 },
        },
      },
    });
    try {
      const client = createClient(MediaService, server.transport);
      const source = { case: "url" as const, value: `http://127.0.0.1:${port}/a.png` };
      const first = await client.decode({ source });
      const second = await client.decode({ source });
      expect(fetched).to.equal(1);
      expect(second.contentHashKey).to.equal(first.contentHashKey);
      // Each Decode stores its own handle, over the shared bytes.
      expect(second.handle).to.not.equal(first.handle);
      const text = await (await fetch(`http://${server.adminAddr}/metrics`)).text();
      expect(text).to.match(/^mmgate_media_decoded_cache_hits_total 1$/m);
      expect(text).to.match(/^mmgate_media_decoded_cache_misses_total 1$/m);
      expect(text).to.match(/^mmgate_media_decoded_cache_evictions_total 0$/m);
      expect(text).to.match(/^mmgate_media_decoded_cache_bytes 192$/m);
    } finally {
      await server.close();
      media.closeAllConnections();
      await new Promise((resolve) => media.close(resolve));
    }
  });
});
