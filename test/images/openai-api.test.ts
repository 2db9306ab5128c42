/**
 * The OpenAI-shaped image routes end to end: the official `openai` SDK (and
 * plain fetch / HTTP/2 for the wire) against a started server whose
 * providers record every byte they produce.
 */
import { createHash, randomBytes } from "node:crypto";
import * as http from "node:http";
import * as http2 from "node:http2";
import { expect } from "chai";
import OpenAI, { APIError, toFile } from "openai";
import { defineImagesModule } from "../../src/images/index.js";
import { splitHostPort } from "../../src/server/index.js";
import type { ImageProvider, ProviderContext } from "../../src/images/core/provider.js";
import { ImageError } from "../../src/images/core/errors.js";
import { outputOffsetOf } from "../../src/images/providers/reference.js";
import { zeroTimings, type ImageRequest, type ImageResponse, type ProviderCapabilities } from "../../src/images/model.js";
import { delay } from "../../src/util/index.js";
import { eventually, expectRejection, startServer, type InProcessServer } from "../support/index.js";
import { fakeCapabilities } from "./fake-provider.js";

const TOKEN = "openai-api-test-token-0123456789";

/**
 * One image per call (so n > 1 fans out), up to two previews per image,
 * edits optional. Every image and preview it makes is kept by
 * `prompt#globalIndex` (and `#k` for previews), with random bytes so a
 * match proves the bytes travelled.
 */
class RecordingProvider implements ImageProvider {
  readonly produced = new Map<string, Buffer>();
  readonly previews = new Map<string, Buffer>();
  readonly requests: ImageRequest[] = [];
  aborted = 0;

  constructor(
    readonly name: string,
    private readonly options: { edits: boolean; delayMs?: number },
  ) {}

  descriptor() {
    return { name: this.name, displayName: this.name, version: "test", experimental: false, models: [`${this.name}-model`] };
  }

  async capabilities(): Promise<ProviderCapabilities> {
    const input = { support: "native" as const, maxCount: 4, maxBytesEach: 1 << 20, maxBytesTotal: 4 << 20 };
    return {
      ...fakeCapabilities(),
      provider: this.name,
      model: `${this.name}-model`,
      edits: this.options.edits,
      qualities: ["auto", "low", "medium", "high"],
      outputFormats: ["png", "jpeg", "webp"],
      backgrounds: ["auto", "opaque", "transparent"],
      moderation: ["auto", "low"],
      userAttribution: "native",
      transparentBackground: "native",
      editImages: this.options.edits ? input : fakeCapabilities().editImages,
      masks: this.options.edits ? { ...input, maxCount: 1 } : fakeCapabilities().masks,
      partialImages: { min: 0, max: 2 },
    };
  }

  async execute(request: ImageRequest, context: ProviderContext): Promise<ImageResponse> {
    this.requests.push(request);
    const offset = outputOffsetOf(context.requestId);
    const p = request.parameters;
    try {
      await delay(this.options.delayMs ?? 10, context.signal);
    } catch {
      this.aborted += 1;
      throw new ImageError("cancelled", "the operation was cancelled");
    }
    for (let k = 0; k < p.partialImages; k += 1) {
      for (let local = 0; local < p.n; local += 1) {
        const bytes = randomBytes(12);
        this.previews.set(`${request.prompt}#${offset + local}#${k}`, bytes);
        await context.events?.({ type: "partial_image", index: local, partialIndex: k, image: bytes });
      }
    }
    if (request.prompt.includes("fail after preview")) throw new ImageError("upstream", "the provider failed after its previews", { retryable: true });
    const data = Array.from({ length: p.n }, (_, local) => {
      const bytes = randomBytes(24);
      this.produced.set(`${request.prompt}#${offset + local}`, bytes);
      return {
        index: local,
        format: p.outputFormat,
        width: 8,
        height: 8,
        bytes: bytes.length,
        sha256: createHash("sha256").update(bytes).digest("hex"),
        data: bytes,
      };
    });
    return {
      id: context.requestId,
      created: Math.floor(Date.now() / 1000),
      provider: this.name,
      model: `${this.name}-model`,
      requested: { ...p },
      effective: { ...p },
      normalizations: [],
      data,
      failures: [],
      usage: { inputTokens: 3, outputTokens: 10 * p.n, totalTokens: 3 + 10 * p.n, provider: {} },
      timings: zeroTimings(),
      warnings: [],
    };
  }

  async shutdown(): Promise<void> {}
}

const b64 = (text: string | undefined) => Buffer.from(text ?? "", "base64");

/** A stream event with the `image_index` this server adds. */
type Indexed<T> = T & { image_index: number };

async function collect<T>(stream: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const event of stream) out.push(event);
  return out;
}

describe("images: OpenAI-compatible HTTP API (openai SDK)", function () {
  this.timeout(30_000);
  let server: InProcessServer;
  let main: RecordingProvider;
  let genOnly: RecordingProvider;
  let slow: RecordingProvider;
  let client: OpenAI;

  before(async () => {
    main = new RecordingProvider("bytes", { edits: true });
    genOnly = new RecordingProvider("gen-only", { edits: false });
    slow = new RecordingProvider("slow", { edits: false, delayMs: 5_000 });
    server = await startServer({
      modules: [defineImagesModule({ extraProviders: [main, genOnly, slow] })],
      config: {
        images: {
          defaultProvider: "bytes",
          reference: { latencyMs: 5, defaultSize: "64x64" },
          fanout: { maxOutputs: 4, maxParallelOutputs: 4 },
        },
      },
    });
    client = new OpenAI({ apiKey: "not-checked-here", baseURL: `http://${server.addr}/v1`, maxRetries: 0 });
  });
  after(async () => server?.close());

  it("generates n = 1 with the provider's bytes as b64_json", async () => {
    const answer = await client.images.generate({ prompt: "one fox" });
    expect(answer.data).to.have.length(1);
    expect(b64(answer.data![0]!.b64_json).equals(main.produced.get("one fox#0")!)).to.equal(true);
    expect(answer).to.deep.include({ output_format: "png", size: "8x8", usage: { input_tokens: 3, output_tokens: 10, total_tokens: 13 } });
    expect(answer.created).to.be.within(Date.now() / 1000 - 60, Date.now() / 1000 + 1);
    expect(answer._request_id).to.match(/^[0-9a-f-]{36}$/);
  });

  it("generates n = 4 in index order, each image the bytes the provider made for it", async () => {
    const answer = await client.images.generate({ prompt: "four foxes", n: 4, quality: "high", output_format: "webp", background: "opaque", user: "u-7" });
    expect(answer.data).to.have.length(4);
    answer.data!.forEach((image, index) => expect(b64(image.b64_json).equals(main.produced.get(`four foxes#${index}`)!), `image ${index}`).to.equal(true));
    expect(answer).to.deep.include({ output_format: "webp", quality: "high", background: "opaque", size: "8x8" });
    // Fan-out: four single-image calls, each with the parameters as sent.
    const calls = main.requests.filter((r) => r.prompt === "four foxes");
    expect(calls).to.have.length(4);
    expect(calls.map((r) => [r.parameters.n, r.parameters.quality, r.parameters.outputFormat, r.user])).to.deep.equal(Array(4).fill([1, "high", "webp", "u-7"]));
  });

  it("answers response_format url with data: URLs", async () => {
    const answer = await client.images.generate({ prompt: "url fox", response_format: "url", output_format: "jpeg" });
    const url = answer.data![0]!.url!;
    expect(url.startsWith("data:image/jpeg;base64,")).to.equal(true);
    expect(b64(url.slice(url.indexOf(",") + 1)).equals(main.produced.get("url fox#0")!)).to.equal(true);
    const fetched = Buffer.from(await (await fetch(url)).arrayBuffer());
    expect(fetched.equals(main.produced.get("url fox#0")!)).to.equal(true);
  });

  it("streams n = 1: partial images, then the completed image", async () => {
    const stream = await client.images.generate({ prompt: "streamed fox", stream: true, partial_images: 2, size: "auto" });
    const events = (await collect(stream)) as Indexed<OpenAI.Images.ImageGenStreamEvent>[];
    expect(events.map((e) => e.type)).to.deep.equal([
      "image_generation.partial_image",
      "image_generation.partial_image",
      "image_generation.completed",
    ]);
    const [p0, p1, done] = events as [Indexed<OpenAI.Images.ImageGenPartialImageEvent>, Indexed<OpenAI.Images.ImageGenPartialImageEvent>, Indexed<OpenAI.Images.ImageGenCompletedEvent>];
    expect([p0.partial_image_index, p1.partial_image_index, p0.image_index, done.image_index]).to.deep.equal([0, 1, 0, 0]);
    expect(b64(p0.b64_json).equals(main.previews.get("streamed fox#0#0")!)).to.equal(true);
    expect(b64(p1.b64_json).equals(main.previews.get("streamed fox#0#1")!)).to.equal(true);
    expect(b64(done.b64_json).equals(main.produced.get("streamed fox#0")!)).to.equal(true);
    expect(p0).to.deep.include({ size: "auto", quality: "auto", background: "auto", output_format: "png" });
    expect(done).to.deep.include({ size: "8x8", output_format: "png", usage: { input_tokens: 3, output_tokens: 10, total_tokens: 13 } });
    expect(done.created_at).to.be.a("number");
  });

  it("streams n = 4 (which OpenAI refuses): previews per image_index, one completed event per image", async () => {
    const stream = await client.images.generate({ prompt: "streamed foxes", n: 4, stream: true, partial_images: 2 });
    const events = (await collect(stream)) as Indexed<OpenAI.Images.ImageGenStreamEvent>[];
    const partials = events.filter((e): e is Indexed<OpenAI.Images.ImageGenPartialImageEvent> => e.type === "image_generation.partial_image");
    const completed = events.filter((e): e is Indexed<OpenAI.Images.ImageGenCompletedEvent> => e.type === "image_generation.completed");
    expect(partials).to.have.length(8);
    for (let index = 0; index < 4; index += 1) {
      const mine = partials.filter((e) => e.image_index === index);
      expect(mine.map((e) => e.partial_image_index), `previews of image ${index}`).to.deep.equal([0, 1]);
      mine.forEach((e) => expect(b64(e.b64_json).equals(main.previews.get(`streamed foxes#${index}#${e.partial_image_index}`)!)).to.equal(true));
    }
    expect(completed.map((e) => e.image_index)).to.deep.equal([0, 1, 2, 3]);
    completed.forEach((e) => expect(b64(e.b64_json).equals(main.produced.get(`streamed foxes#${e.image_index}`)!)).to.equal(true));
    // Every preview comes before the completed events; the usage (the whole request's, four calls summed) rides on the last one.
    expect(events.slice(-4)).to.deep.equal(completed);
    expect(completed.map((e) => e.usage)).to.deep.equal([undefined, undefined, undefined, { input_tokens: 12, output_tokens: 40, total_tokens: 52 }]);
  });

  it("ends a stream that fails after it began with an error event the SDK raises", async () => {
    const stream = await client.images.generate({ prompt: "fail after preview", stream: true, partial_images: 1 });
    const seen: string[] = [];
    const error = await expectRejection(
      (async () => {
        for await (const event of stream) seen.push(event.type);
      })(),
      { type: APIError },
    );
    expect(seen).to.deep.equal(["image_generation.partial_image"]);
    expect([error.type, error.code, error.message]).to.deep.equal(["server_error", "upstream_error", "the provider failed after its previews"]);
  });

  it("answers a stream the service refuses at once with an HTTP error status, not an event", async () => {
    const error = await expectRejection(client.images.generate({ prompt: "refused stream", size: "big", stream: true }), { type: OpenAI.BadRequestError });
    expect([error.status, error.param, error.code]).to.deep.equal([400, "size", "invalid_format"]);
  });

  it("passes Idempotency-Key on: a retry gets the first call's images, marked as a replay", async () => {
    const first = await client.images.generate({ prompt: "keyed", n: 2 }, { headers: { "Idempotency-Key": "key-1" } }).withResponse();
    const again = await client.images.generate({ prompt: "keyed", n: 2 }, { headers: { "Idempotency-Key": "key-1" } }).withResponse();
    expect(again.data.data).to.deep.equal(first.data.data);
    expect([first.response.headers.get("idempotency-replayed"), again.response.headers.get("idempotency-replayed")]).to.deep.equal([null, "true"]);
    expect(main.requests.filter((r) => r.prompt === "keyed")).to.have.length(2);
  });

  it("edits through images.edit: the uploaded files reach the provider, the answer carries its images", async () => {
    const source = randomBytes(64);
    const answer = await client.images.edit({ image: await toFile(source, "source.png", { type: "image/png" }), prompt: "edit one", n: 2 });
    expect(answer.data!.map((d, i) => b64(d.b64_json).equals(main.produced.get(`edit one#${i}`)!))).to.deep.equal([true, true]);
    const seen = main.requests.filter((r) => r.prompt === "edit one");
    expect(seen).to.have.length(2);
    for (const request of seen) {
      expect(request.operation.kind).to.equal("edit");
      if (request.operation.kind !== "edit") continue;
      expect(request.operation.images).to.have.length(1);
      expect(Buffer.from(request.operation.images[0]!.data).equals(source)).to.equal(true);
      expect([request.operation.images[0]!.mediaType, request.operation.images[0]!.filename]).to.deep.equal(["image/png", "source.png"]);
    }
  });

  it("edits with several images (image[]) and a mask, streamed as image_edit events", async () => {
    const [a, b, mask] = [randomBytes(16), randomBytes(16), randomBytes(8)];
    const stream = await client.images.edit({
      image: [await toFile(a, "a.png"), await toFile(b, "b.webp", { type: "image/webp" })],
      mask: await toFile(mask, "mask.png", { type: "image/png" }),
      prompt: "edit many",
      input_fidelity: "high",
      stream: true,
      partial_images: 1,
    });
    const events = (await collect(stream)) as Indexed<OpenAI.Images.ImageEditStreamEvent>[];
    expect(events.map((e) => [e.type, e.image_index])).to.deep.equal([
      ["image_edit.partial_image", 0],
      ["image_edit.completed", 0],
    ]);
    expect(b64(events[1]!.b64_json).equals(main.produced.get("edit many#0")!)).to.equal(true);
    const request = main.requests.find((r) => r.prompt === "edit many")!;
    expect(request.operation.kind).to.equal("edit");
    if (request.operation.kind !== "edit") return;
    expect(request.operation.images.map((i) => Buffer.from(i.data))).to.deep.equal([a, b]);
    expect(Buffer.from(request.operation.mask!.data)).to.deep.equal(mask);
    expect(request.parameters.inputFidelity).to.equal("high");
  });

  it("refuses an edit on a model whose provider does not edit", async () => {
    const error = await expectRejection(
      client.images.edit({ image: await toFile(randomBytes(8), "x.png"), prompt: "no edits", model: "gen-only" }),
      { type: APIError },
    );
    expect([error.status, error.type, error.param, error.code]).to.deep.equal([400, "invalid_request_error", "model", "unsupported_operation"]);
    expect(genOnly.requests).to.have.length(0);
  });

  it("routes by model: a provider name, a model it lists, provider/model; 404 otherwise", async () => {
    const reference = await client.images.generate({ prompt: "routed", model: "reference" });
    expect(reference.size).to.equal("64x64");
    const listed = await client.images.generate({ prompt: "routed listed", model: "gen-only-model" });
    expect(b64(listed.data![0]!.b64_json).equals(genOnly.produced.get("routed listed#0")!)).to.equal(true);
    const both = await client.images.generate({ prompt: "routed both", model: "reference/reference-image-1" });
    expect(both.size).to.equal("64x64");
    const error = await expectRejection(client.images.generate({ prompt: "routed", model: "gpt-image-1" }), { type: OpenAI.NotFoundError });
    expect([error.status, error.param, error.code]).to.deep.equal([404, "model", "model_not_found"]);
  });

  it("answers invalid requests with 400 naming the parameter: ours, and the service's own validation", async () => {
    const bad = async (body: Record<string, unknown>) => {
      const error = await expectRejection(client.images.generate(body as never), { type: OpenAI.BadRequestError });
      return [error.status, error.type, error.param, error.code];
    };
    expect(await bad({ prompt: "p", colour: "red" })).to.deep.equal([400, "invalid_request_error", "colour", "unknown_parameter"]);
    expect(await bad({ prompt: "p", n: 0 })).to.deep.equal([400, "invalid_request_error", "n", "invalid_value"]);
    expect(await bad({ prompt: "p", n: 1.5 })).to.deep.equal([400, "invalid_request_error", "n", "invalid_type"]);
    // Above the provider's advertised count.max (fanout.maxOutputs: 4).
    const above = await expectRejection(client.images.generate({ prompt: "p", n: 5 }), { type: OpenAI.BadRequestError });
    expect([above.param, above.message]).to.deep.equal(["n", "400 n must be between 1 and 4 for bytes (bytes-model), not 5"]);
    // The service's validation, mapped: a malformed size, a blank prompt, compression on png.
    expect(await bad({ prompt: "p", size: "big" })).to.deep.equal([400, "invalid_request_error", "size", "invalid_format"]);
    expect(await bad({ prompt: "  " })).to.deep.equal([400, "invalid_request_error", "prompt", "required"]);
    expect(await bad({ prompt: "p", output_compression: 50 })).to.deep.equal([400, "invalid_request_error", "output_compression", "incompatible"]);
    expect(main.requests.filter((r) => r.prompt === "p")).to.have.length(0);
  });

  it("takes a file part sent without a filename (the provider sniffs its type)", async () => {
    const boundary = "mmgate-test-boundary";
    const body = Buffer.concat([
      Buffer.from(`--${boundary}\r\ncontent-disposition: form-data; name="prompt"\r\n\r\nno filename\r\n`),
      Buffer.from(`--${boundary}\r\ncontent-disposition: form-data; name="image"\r\ncontent-type: application/octet-stream\r\n\r\n`),
      randomBytes(32),
      Buffer.from(`\r\n--${boundary}--\r\n`),
    ]);
    const answer = await fetch(`http://${server.addr}/v1/images/edits`, {
      method: "POST",
      headers: { "content-type": `multipart/form-data; boundary=${boundary}` },
      body,
    });
    expect(answer.status, await answer.clone().text()).to.equal(200);
    const seen = main.requests.filter((r) => r.prompt === "no filename");
    expect(seen).to.have.length(1);
    if (seen[0]!.operation.kind === "edit") expect(seen[0]!.operation.images[0]!.filename ?? "").to.equal("");
  });

  it("answers 415 for another content type, 400 for bad JSON, 405 for GET", async () => {
    const url = `http://${server.addr}/v1/images/generations`;
    const form = await fetch(url, { method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" }, body: "prompt=p" });
    expect([form.status, ((await form.json()) as { error: { code: string } }).error.code]).to.deep.equal([415, "unsupported_media_type"]);
    const broken = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: "{prompt:" });
    expect([broken.status, ((await broken.json()) as { error: { code: string } }).error.code]).to.deep.equal([400, "invalid_json"]);
    const json = await fetch(`http://${server.addr}/v1/images/edits`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(json.status).to.equal(415);
    expect((await fetch(url)).status).to.equal(405);
  });

  it("serves the raw SSE wire: event names equal to each data's type, x-request-id echoed", async () => {
    const response = await fetch(`http://${server.addr}/v1/images/generations`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-request-id": "wire-test-1" },
      body: JSON.stringify({ prompt: "wire", n: 2, stream: true, partial_images: 1 }),
    });
    expect(response.status).to.equal(200);
    expect(response.headers.get("content-type")).to.equal("text/event-stream; charset=utf-8");
    expect(response.headers.get("cache-control")).to.equal("no-cache");
    expect(response.headers.get("x-request-id")).to.equal("wire-test-1");
    const text = await response.text();
    expect(text.endsWith("\n\n")).to.equal(true);
    const blocks = text.slice(0, -2).split("\n\n");
    const parsed = blocks.map((block) => {
      const lines = block.split("\n");
      expect(lines).to.have.length(2);
      expect(lines[0]!.startsWith("event: ")).to.equal(true);
      expect(lines[1]!.startsWith("data: ")).to.equal(true);
      const data = JSON.parse(lines[1]!.slice("data: ".length)) as { type: string; image_index: number; partial_image_index?: number };
      expect(data.type).to.equal(lines[0]!.slice("event: ".length));
      return data;
    });
    const partials = parsed.filter((d) => d.type === "image_generation.partial_image").map((d) => [d.image_index, d.partial_image_index]);
    expect(partials.sort()).to.deep.equal([
      [0, 0],
      [1, 0],
    ]);
    expect(parsed.slice(-2).map((d) => [d.type, d.image_index])).to.deep.equal([
      ["image_generation.completed", 0],
      ["image_generation.completed", 1],
    ]);
  });

  it("serves HTTP/2 clients too (h2c)", async () => {
    const session = http2.connect(`http://${server.addr}`);
    try {
      const answer = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        const stream = session.request({ ":method": "POST", ":path": "/v1/images/generations", "content-type": "application/json" });
        let status = 0;
        const chunks: Buffer[] = [];
        stream.on("response", (headers) => (status = Number(headers[":status"])));
        stream.on("data", (chunk: Buffer) => chunks.push(chunk));
        stream.on("end", () => resolve({ status, body: Buffer.concat(chunks).toString() }));
        stream.on("error", reject);
        stream.end(JSON.stringify({ prompt: "over h2", n: 2 }));
      });
      expect(answer.status).to.equal(200);
      const body = JSON.parse(answer.body) as OpenAI.Images.ImagesResponse;
      expect(body.data!.map((d, i) => b64(d.b64_json).equals(main.produced.get(`over h2#${i}`)!))).to.deep.equal([true, true]);
    } finally {
      session.close();
    }
  });

  it("reaches the provider with the client's disconnect", async () => {
    // A connection of its own (the SDK's pool may keep a spare socket open, which would hold the server's drain).
    const { host, port } = splitHostPort(server.addr);
    const request = http.request({ host, port, method: "POST", path: "/v1/images/generations", agent: false, headers: { "content-type": "application/json" } });
    request.on("error", () => undefined);
    request.end(JSON.stringify({ prompt: "abandoned", model: "slow" }));
    await eventually(() => expect(slow.requests).to.have.length(1));
    request.destroy();
    await eventually(() => expect(slow.aborted).to.equal(1));
  });
});

describe("images: OpenAI-compatible HTTP API, auth, limits and draining", function () {
  this.timeout(30_000);
  let server: InProcessServer;
  let provider: RecordingProvider;
  const LIMIT = 64 * 1024;

  before(async () => {
    provider = new RecordingProvider("bytes", { edits: true });
    server = await startServer({
      modules: [defineImagesModule({ extraProviders: [provider] })],
      config: {
        auth: { token: TOKEN },
        limits: { maxReceiveMessageBytes: LIMIT },
        images: { reference: { enabled: false }, limits: { maxInputs: 3 } },
      },
    });
  });
  after(async () => server?.close());

  const sdk = (apiKey: string, fetchImpl?: typeof fetch) =>
    new OpenAI({ apiKey, baseURL: `http://${server.addr}/v1`, maxRetries: 0, ...(fetchImpl ? { fetch: fetchImpl } : {}) });

  it("checks the bearer token the SDK sends: right, wrong, missing", async () => {
    const ok = await sdk(TOKEN).images.generate({ prompt: "authorized" });
    expect(ok.data).to.have.length(1);
    const wrong = await expectRejection(sdk("wrong-token-0123456789").images.generate({ prompt: "p" }), { type: OpenAI.AuthenticationError });
    expect([wrong.status, wrong.type, wrong.code]).to.deep.equal([401, "authentication_error", "invalid_api_key"]);
    const missing = await fetch(`http://${server.addr}/v1/images/generations`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "p" }),
    });
    expect(missing.status).to.equal(401);
    expect(((await missing.json()) as { error: unknown }).error).to.deep.include({ type: "authentication_error", code: "missing_api_key" });
    expect(provider.requests.filter((r) => r.prompt === "p")).to.have.length(0);
  });

  it("answers 413 for a body over the limit and 400 for more files than the service takes", async () => {
    const big = await expectRejection(sdk(TOKEN).images.edit({ image: await toFile(randomBytes(LIMIT + 1), "big.png"), prompt: "big" }), {
      type: APIError,
    });
    expect([big.status, big.code]).to.deep.equal([413, "request_too_large"]);
    const json = await fetch(`http://${server.addr}/v1/images/generations`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${TOKEN}` },
      body: JSON.stringify({ prompt: "x".repeat(LIMIT) }),
    });
    expect(json.status).to.equal(413);
    const files = await Promise.all([1, 2, 3, 4].map((i) => toFile(randomBytes(8), `${i}.png`)));
    const many = await expectRejection(sdk(TOKEN).images.edit({ image: files, prompt: "many" }), { type: OpenAI.BadRequestError });
    expect([many.param, many.code]).to.deep.equal(["image", "too_many_files"]);
    expect(provider.requests.filter((r) => ["big", "many"].includes(r.prompt))).to.have.length(0);
  });

  it("answers 503 once the server drains", async () => {
    // The request's headers arrive before the drain, its body after: the call is refused as the server shuts down.
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let bodyStarted!: () => void;
    const started = new Promise<void>((resolve) => (bodyStarted = resolve));
    const heldBody: typeof fetch = (input, init) => {
      const text = String(init?.body ?? "");
      const body = new ReadableStream<Uint8Array>({
        async start(controller) {
          controller.enqueue(new TextEncoder().encode(text.slice(0, 1)));
          bodyStarted();
          await gate;
          controller.enqueue(new TextEncoder().encode(text.slice(1)));
          controller.close();
        },
      });
      const headers = new Headers(init?.headers);
      headers.delete("content-length");
      return fetch(input, { ...init, headers, body, duplex: "half" } as RequestInit);
    };
    const call = sdk(TOKEN, heldBody).images.generate({ prompt: "during drain" });
    await started;
    await delay(100);
    const closing = server.close();
    await delay(50);
    release();
    const error = await expectRejection(call, { type: OpenAI.InternalServerError });
    expect([error.status, error.type]).to.deep.equal([503, "server_error"]);
    expect(error.headers?.get("retry-after")).to.equal("1");
    await closing;
    expect(provider.requests.filter((r) => r.prompt === "during drain")).to.have.length(0);
  });
});
