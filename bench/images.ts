/**
 * Fan-out benchmark: n = 8 images from a provider that makes one image per
 * call with 50 ms latency. Measures the OutputFanoutProvider at provider-wide
 * parallelism 8 and 2 against one call, the same batch through the gRPC
 * ImageService, and the peer: the `ai` package's generateImage driving an
 * in-process image model with the same latency and one image per call.
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
  createImagesInstance,
  DEFAULT_REQUEST_LIMITS,
  imagesConfigSchema,
  OutputFanoutProvider,
  zeroTimings,
  type ImageProvider,
  type ImageRequest,
  type ImageResponse,
  type ProviderCapabilities,
  type ProviderContext,
} from "../src/images/index.js";
import { defineModule, resolveConfig, startHost } from "../src/server/index.js";

const LATENCY_MS = 50;
const N = 8;
const REPS = Number(process.env.BENCH_REPS ?? 9);
const PIXEL = new Uint8Array([137, 80, 78, 71]);

function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

async function timeAsync(fn: () => Promise<unknown>, reps = REPS, warmup = 2): Promise<number> {
  for (let i = 0; i < warmup; i++) await fn();
  const times: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    await fn();
    times.push(performance.now() - t0);
  }
  return median(times);
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(new Error("aborted"));
    });
  });

/** One image per call, LATENCY_MS per call, no rendering. */
class LatencyProvider implements ImageProvider {
  constructor(readonly name = "bench") {}
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
    await sleep(LATENCY_MS, context.signal);
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

async function fanoutFigures(parallel: number): Promise<number> {
  const provider = new OutputFanoutProvider(new LatencyProvider(), { maxOutputs: 16, maxParallelOutputs: parallel }, DEFAULT_REQUEST_LIMITS);
  const request = createImageRequest({ prompt: "bench", parameters: { n: N } });
  return timeAsync(async () => {
    const response = await provider.execute(request, context());
    if (response.data.length !== N) throw new Error("missing images");
  });
}

/** Loaded lazily so a missing dev dependency only skips the peer. */
const loadAi = () => import("ai");

async function peerFigure(): Promise<number | string> {
  let ai: Awaited<ReturnType<typeof loadAi>>;
  try {
    ai = await loadAi();
  } catch (error) {
    return `the ai package could not be loaded (${(error as Error).message})`;
  }
  const generateImage = ai.generateImage ?? ai.experimental_generateImage;
  const model = {
    specificationVersion: "v3" as const,
    provider: "bench",
    modelId: "bench-1",
    maxImagesPerCall: 1,
    async doGenerate(options: { n: number; abortSignal?: AbortSignal }) {
      await sleep(LATENCY_MS, options.abortSignal);
      return {
        images: Array.from({ length: options.n }, () => PIXEL),
        warnings: [],
        response: { timestamp: new Date(), modelId: "bench-1", headers: undefined },
      };
    },
  };
  try {
    return await timeAsync(async () => {
      const result = await generateImage({ model, prompt: "bench", n: N, maxRetries: 0 });
      if (result.images.length !== N) throw new Error("missing images");
    });
  } catch (error) {
    return `generateImage failed (${(error as Error).message})`;
  }
}

async function serviceFigure(): Promise<{ batch: number; single: number }> {
  const module = defineModule({
    name: "images",
    description: "bench",
    configSchema: imagesConfigSchema,
    create: (ctx) => createImagesInstance(ctx, { extraProviders: [new LatencyProvider()] }),
  });
  const config = resolveConfig(
    {
      listen: "127.0.0.1:0",
      adminListen: "",
      services: ["images"],
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
    return { single: await timeAsync(call(1)), batch: await timeAsync(call(N)) };
  } finally {
    await host.shutdown();
  }
}

const fmt = (ms: number) => `${ms.toFixed(1)} ms`;
const started = performance.now();

const singleProvider = new OutputFanoutProvider(new LatencyProvider(), { maxOutputs: 16, maxParallelOutputs: 8 }, DEFAULT_REQUEST_LIMITS);
const single = await timeAsync(() => singleProvider.execute(createImageRequest({ prompt: "bench" }), context()));
const p8 = await fanoutFigures(8);
const p2 = await fanoutFigures(2);
const peer = await peerFigure();
const service = await serviceFigure();

console.log(`images fan-out: n=${N}, native count 1, ${LATENCY_MS} ms per call, median of ${REPS} runs`);
console.log(`  one call (n=1, fast path)                 ${fmt(single)}`);
console.log(`  fan-out n=${N}, parallelism 8              ${fmt(p8)}   ratio to one call ${(p8 / single).toFixed(2)}x (target <= 1.15x)`);
console.log(`  fan-out n=${N}, parallelism 2              ${fmt(p2)}   ratio to one call ${(p2 / single).toFixed(2)}x (target 4x +/- 10%)`);
if (typeof peer === "number") {
  console.log(`  peer: ai generateImage n=${N}, 1 per call  ${fmt(peer)}   ratio to one call ${(peer / single).toFixed(2)}x; fan-out p8 / peer ${(p8 / peer).toFixed(2)}x`);
} else {
  console.log(`  peer: ai generateImage not measured: ${peer}`);
}
console.log(`  ImageService over gRPC: n=1 ${fmt(service.single)}, n=${N} (parallelism 8) ${fmt(service.batch)}, ratio ${(service.batch / service.single).toFixed(2)}x`);
const ok8 = p8 / single <= 1.15;
const ok2 = Math.abs(p2 / single - 4) <= 0.4;
console.log(`  checks: parallelism 8 ${ok8 ? "PASS" : "MISS"}, parallelism 2 ${ok2 ? "PASS" : "MISS"} (${((performance.now() - started) / 1000).toFixed(1)} s total)`);
