/**
 * Fan-out benchmark: n = 8 images from a provider that makes one image per
 * call, through the OutputFanoutProvider, against the `ai` package's
 * generateImage driving a model with the same behaviour (one image per call,
 * n = 8), measured in the same interleaved rounds.
 *
 * - Next tick: the inner call answers on the next turn of the event loop
 *   (setImmediate), so what is measured is the layers' own cost per batch.
 *   Also shown: the same 8 inner provider calls made directly (Promise.all),
 *   the floor under the fan-out layer. The ai model's calls are lighter than
 *   the provider's (they return bare images, not full ImageResponses), so
 *   the floor is not one under generateImage.
 * - 50 ms per call: fan-out at parallelism 8 and 2 against one call, and the
 *   peer; then the same batch through the gRPC ImageService (n = 8 against
 *   n = 1).
 *
 * Rounds alternate the order of the contenders (A B C, then C B A, ...);
 * ratios are taken within a round and reported as median (min–max).
 * Env: BENCH_ROUNDS (9; next-tick rounds are four times that), BENCH_BATCHES
 * (batches per next-tick sample, 200).
 * Run: node --import tsx bench/images.ts
 */
import { performance } from "node:perf_hooks";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { pino } from "pino";
import { ImageService } from "../gen/mmgate/images/v1/image_service_pb.js";
import { ResponseFormat } from "../gen/mmgate/images/v1/images_pb.js";
import {
  createImageRequest,
  defineImagesModule,
  DEFAULT_REQUEST_LIMITS,
  OutputFanoutProvider,
  zeroTimings,
  type ImageProvider,
  type ImageRequest,
  type ImageResponse,
  type ProviderCapabilities,
  type ProviderContext,
} from "../src/images/index.js";
import { resolveConfig, startHost } from "../src/server/index.js";
import { interleave, median, ratios, summary } from "./_stats.js";

const LATENCY_MS = 50;
const N = 8;
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 9);
const TICK_ROUNDS = 4 * ROUNDS;
const BATCHES = Number(process.env.BENCH_BATCHES ?? 200);
const PIXEL = new Uint8Array([137, 80, 78, 71]);


const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(new Error("aborted"));
    });
  });
const nextTick = () => new Promise<void>((resolve) => setImmediate(resolve));

/** How long an inner call takes: 50 ms, or until the next turn of the event loop. */
type Wait = (signal?: AbortSignal) => Promise<void>;
const latency: Wait = (signal) => sleep(LATENCY_MS, signal);

/** One image per call, after `wait`; no rendering. */
class BenchProvider implements ImageProvider {
  constructor(
    private readonly wait: Wait,
    readonly name = "bench",
  ) {}
  descriptor() {
    return { name: this.name, displayName: "bench", version: "1", experimental: false, models: ["bench-1"] };
  }
  async capabilities(): Promise<ProviderCapabilities> {
    const none = { support: "unsupported" as const, maxCount: 0, maxBytesEach: 0, maxBytesTotal: 0 };
    return {
      provider: this.name, implementationVersion: "1", model: "bench-1", experimental: false, generation: true, edits: false,
      count: { min: 1, max: 1 }, batching: { mode: "native", nativeCount: { min: 1, max: 1 }, maxParallelOutputs: 1 },
      sizes: { auto: true, allowed: [], arbitrary: false }, aspectRatio: "unsupported", resolution: "unsupported",
      transparentBackground: "unsupported", negativePrompt: "unsupported", revisedPrompt: "unsupported", userAttribution: "unsupported",
      qualities: ["auto"], outputFormats: ["png"], backgrounds: ["auto"], moderation: ["auto"], inputFidelities: [], actions: ["auto"],
      referenceImages: none, editImages: none, masks: none, partialImages: { min: 0, max: 0 }, persistentSessions: false, explicitThreads: false,
    };
  }
  async execute(request: ImageRequest, context: ProviderContext): Promise<ImageResponse> {
    await this.wait(context.signal);
    return {
      id: context.requestId, created: 0, provider: this.name, model: "bench-1",
      requested: { ...request.parameters }, effective: { ...request.parameters }, normalizations: [],
      data: [{ index: 0, format: "png", width: 1, height: 1, bytes: PIXEL.length, sha256: "0".repeat(64), data: PIXEL }],
      failures: [], timings: zeroTimings(), warnings: [],
    };
  }
  async checkReady() {}
  async getSession(): Promise<never> {
    throw new Error("no sessions");
  }
  async deleteSession() {}
  restartCount() {
    return undefined;
  }
  async shutdown() {}
}

function context(): ProviderContext {
  return { requestId: "bench", deadline: Date.now() + 60_000, signal: new AbortController().signal };
}

/** One n = 8 batch through the fan-out layer over a provider that waits `wait` per call. */
function fanoutBatch(wait: Wait, parallel: number): () => Promise<void> {
  const provider = new OutputFanoutProvider(new BenchProvider(wait), { maxOutputs: 16, maxParallelOutputs: parallel }, DEFAULT_REQUEST_LIMITS);
  const request = createImageRequest({ prompt: "bench", parameters: { n: N } });
  return async () => {
    const response = await provider.execute(request, context());
    if (response.data.length !== N) throw new Error("missing images");
  };
}

/** Loaded lazily so a missing dev dependency only skips the peer. */
const loadAi = () => import("ai");
let ai: Awaited<ReturnType<typeof loadAi>> | undefined;
let aiMissing = "";
try {
  ai = await loadAi();
} catch (error) {
  aiMissing = `the ai package could not be loaded (${(error as Error).message})`;
}

/** One n = 8 generateImage call over an image model that makes one image per call after `wait`. */
function peerBatch(wait: Wait): (() => Promise<void>) | undefined {
  if (!ai) return undefined;
  const generateImage = ai.generateImage ?? ai.experimental_generateImage;
  const model = {
    specificationVersion: "v3" as const,
    provider: "bench",
    modelId: "bench-1",
    maxImagesPerCall: 1,
    async doGenerate(options: { n: number; abortSignal?: AbortSignal }) {
      await wait(options.abortSignal);
      return {
        images: Array.from({ length: options.n }, () => PIXEL),
        warnings: [],
        response: { timestamp: new Date(), modelId: "bench-1", headers: undefined },
      };
    },
  };
  return async () => {
    const result = await generateImage({ model, prompt: "bench", n: N, maxRetries: 0 });
    if (result.images.length !== N) throw new Error("missing images");
  };
}

/** `batch` run `times` times back to back. */
const repeated = (batch: () => Promise<void>, times: number) => async () => {
  for (let i = 0; i < times; i++) await batch();
};

const started = performance.now();

// --- next tick: the layers' own cost -------------------------------------
{
  const inner = new BenchProvider(nextTick);
  const innerRequest = createImageRequest({ prompt: "bench" });
  const direct = async () => {
    await Promise.all(Array.from({ length: N }, () => inner.execute(innerRequest, context())));
  };
  const peer = peerBatch(nextTick);
  const contenders = [repeated(fanoutBatch(nextTick, 8), BATCHES), repeated(direct, BATCHES)];
  if (peer) contenders.push(repeated(peer, BATCHES));
  const [fanMs, directMs, peerMs] = await interleave(contenders, TICK_ROUNDS);
  const us = (ms: number[]) => ms.map((t) => (1000 * t) / BATCHES);
  console.log(`images, next-tick provider (setImmediate per call): n=${N}, one image per call, parallelism 8;`);
  console.log(`  µs per batch, median (min–max) over ${TICK_ROUNDS} interleaved rounds of ${BATCHES} batches`);
  console.log(`  fan-out layer (OutputFanoutProvider)        ${summary(us(fanMs!), 0)} µs`);
  if (peerMs) {
    console.log(`  peer: ai generateImage, maxImagesPerCall 1  ${summary(us(peerMs), 0)} µs`);
    const r = ratios(fanMs!, peerMs);
    console.log(`  fan-out / generateImage                     ${summary(r, 2)}x   target <= 2x: ${median(r) <= 2 ? "met" : "NOT met"}`);
  } else {
    console.log(`  peer: ai generateImage not measured: ${aiMissing}`);
  }
  console.log(`  ${`floor: the ${N} provider calls, Promise.all`.padEnd(43)} ${summary(us(directMs!), 0)} µs`);
  const own = us(fanMs!).map((t, i) => t - us(directMs!)[i]!);
  console.log(`  ${"fan-out minus floor (the layer's own cost)".padEnd(43)} ${summary(own, 0)} µs`);
}

// --- 50 ms per call ----------------------------------------------------------
{
  const slow = new OutputFanoutProvider(new BenchProvider(latency), { maxOutputs: 16, maxParallelOutputs: 8 }, DEFAULT_REQUEST_LIMITS);
  const one = async () => void (await slow.execute(createImageRequest({ prompt: "bench" }), context()));
  const peer = peerBatch(latency);
  const contenders = [one, fanoutBatch(latency, 8), fanoutBatch(latency, 2)];
  if (peer) contenders.push(peer);
  const [singleMs, p8Ms, p2Ms, peerMs] = await interleave(contenders, ROUNDS);
  const p8 = ratios(p8Ms!, singleMs!);
  const p2 = ratios(p2Ms!, singleMs!);
  console.log(`\nimages, ${LATENCY_MS} ms per call: n=${N}, one image per call; ms and ratios to one call, median (min–max) over ${ROUNDS} interleaved rounds`);
  console.log(`  one call (n=1, fast path)               ${summary(singleMs!, 1)} ms`);
  console.log(`  fan-out n=${N}, parallelism 8            ${summary(p8Ms!, 1)} ms   ${summary(p8, 2)}x   target <= 1.15x: ${median(p8) <= 1.15 ? "met" : "NOT met"}`);
  console.log(`  fan-out n=${N}, parallelism 2            ${summary(p2Ms!, 1)} ms   ${summary(p2, 2)}x   target 4x +/- 10%: ${Math.abs(median(p2) - 4) <= 0.4 ? "met" : "NOT met"}`);
  if (peerMs) {
    console.log(`  peer: ai generateImage n=${N}             ${summary(peerMs, 1)} ms   ${summary(ratios(peerMs, singleMs!), 2)}x`);
    console.log(`  fan-out p8 / generateImage              ${summary(ratios(p8Ms!, peerMs), 2)}x`);
  } else {
    console.log(`  peer: ai generateImage not measured: ${aiMissing}`);
  }
}

// --- the same over gRPC ------------------------------------------------------
{
  const module = defineImagesModule({ extraProviders: [new BenchProvider(latency)] });
  const config = resolveConfig(
    {
      listen: "127.0.0.1:0",
      adminListen: "",
      modules: ["images"],
      images: { defaultProvider: "bench", reference: { enabled: false }, fanout: { maxOutputs: 16, maxParallelOutputs: 8 } },
    },
    [module],
  );
  const host = await startHost({ config, modules: [module], logger: pino({ level: "silent" }), version: "bench" });
  try {
    const client = createClient(ImageService, createGrpcTransport({ baseUrl: `http://${host.address}` }));
    const call = (n: number) => async () => {
      const result = await client.generate({
        request: { prompt: "bench", operation: { case: "generate", value: {} }, parameters: { n }, responseFormat: ResponseFormat.METADATA },
      });
      if (result.response?.data.length !== n) throw new Error("missing images");
    };
    const [singleMs, batchMs] = await interleave([call(1), call(N)], ROUNDS);
    console.log(
      `  ImageService over gRPC (in process): n=1 ${summary(singleMs!, 1)} ms, n=${N} ${summary(batchMs!, 1)} ms, n=${N}/n=1 ${summary(ratios(batchMs!, singleMs!), 2)}x`,
    );
  } finally {
    await host.shutdown();
  }
}
console.log(`\n(${((performance.now() - started) / 1000).toFixed(1)} s)`);
