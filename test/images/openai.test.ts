import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { expect } from "chai";
import sharp from "sharp";
import { imagesConfigSchema } from "../../src/images/config.js";
import { createImageRequest, type ImageRequestInit, type ProviderEvent } from "../../src/images/model.js";
import type { ProviderContext } from "../../src/images/core/provider.js";
import { DEFAULT_REQUEST_LIMITS } from "../../src/images/core/validation.js";
import { OutputFanoutProvider } from "../../src/images/fanout/provider.js";
import { OpenAiImageProvider, parseRetryAfter } from "../../src/images/providers/openai.js";
import { breakerVerdictOf } from "../../src/images/core/errors.js";
import { createClient } from "@connectrpc/connect";
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import { imagesModule } from "../../src/images/index.js";
import { eventually, startServer } from "../support/index.js";
import { rejection } from "./helpers.js";

const KEY = "sk-test-secret-key-123456";

interface Recorded {
  body: Record<string, unknown>;
  authorization: string | undefined;
}

type Handler = (req: IncomingMessage, res: ServerResponse, body: Record<string, unknown>) => void;

async function pngBase64(seed: number): Promise<string> {
  const data = await sharp({ create: { width: 8, height: 6, channels: 3, background: { r: seed, g: 0, b: 0 } } }).png().toBuffer();
  return data.toString("base64");
}

describe("images: OpenAI-compatible provider against a local fake upstream", function () {
  this.timeout(20_000);
  let server: Server;
  let baseUrl: string;
  let handler: Handler;
  const recorded: Recorded[] = [];

  before(async () => {
    server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const body = JSON.parse(Buffer.concat(chunks).toString("utf8") || "{}") as Record<string, unknown>;
        recorded.push({ body, authorization: req.headers.authorization });
        if (req.url !== "/v1/images/generations" || req.method !== "POST") {
          res.writeHead(404).end();
          return;
        }
        handler(req, res, body);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(() => new Promise<void>((resolve) => server.close(() => resolve())));
  beforeEach(() => {
    recorded.length = 0;
  });

  function provider(change: Record<string, unknown> = {}, env: Record<string, string> = { TEST_KEY: KEY }) {
    const config = imagesConfigSchema.parse({ openai: [{ name: "oai", baseUrl, apiKeyEnv: "TEST_KEY", nativeCount: 2, ...change }] }).openai[0]!;
    return new OpenAiImageProvider(config, env);
  }

  function context(events?: ProviderEvent[], signal = new AbortController().signal): ProviderContext {
    return { requestId: "req-1", deadline: Date.now() + 10_000, signal, ...(events ? { events: async (e: ProviderEvent) => void events.push(e) } : {}) };
  }

  function request(init: Partial<ImageRequestInit> = {}) {
    return createImageRequest({ prompt: "a lighthouse", ...init });
  }


  function json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}) {
    res.writeHead(status, { "content-type": "application/json", ...headers }).end(JSON.stringify(body));
  }

  it("posts the parameters with the bearer key and decodes b64 images", async () => {
    handler = async (_req, res, body) => {
      const n = body["n"] as number;
      const data = await Promise.all(Array.from({ length: n }, async (_, i) => ({ b64_json: await pngBase64(i * 40), revised_prompt: "revised" })));
      json(res, 200, { created: 1, data, usage: { input_tokens: 5, output_tokens: 7, total_tokens: 12 } });
    };
    const response = await provider().execute(
      request({ parameters: { n: 2, size: "1024x1024", quality: "high", outputFormat: "jpeg", outputCompression: 80 }, user: "u1" }),
      context(),
    );
    expect(recorded[0]!.authorization).to.equal(`Bearer ${KEY}`);
    expect(recorded[0]!.body).to.deep.equal({
      model: "gpt-image-1",
      prompt: "a lighthouse",
      n: 2,
      size: "1024x1024",
      quality: "high",
      output_format: "jpeg",
      output_compression: 80,
      background: "auto",
      moderation: "auto",
      user: "u1",
    });
    expect(response.data.map((d) => [d.index, d.width, d.height, d.format])).to.deep.equal([
      [0, 8, 6, "png"],
      [1, 8, 6, "png"],
    ]);
    expect(response.data[0]!.sha256).to.match(/^[0-9a-f]{64}$/);
    expect(response.revisedPrompt).to.equal("revised");
    expect(response.usage).to.deep.equal({ inputTokens: 5, outputTokens: 7, totalTokens: 12, provider: {} });
  });

  it("fans out above its native count", async () => {
    handler = async (_req, res, body) => {
      const data = await Promise.all(Array.from({ length: body["n"] as number }, async () => ({ b64_json: await pngBase64(1) })));
      json(res, 200, { data, usage: { total_tokens: 1 } });
    };
    const fanout = new OutputFanoutProvider(provider(), { maxOutputs: 5, maxParallelOutputs: 2 }, DEFAULT_REQUEST_LIMITS);
    const response = await fanout.execute(request({ parameters: { n: 5 } }), context());
    expect(recorded.map((r) => r.body["n"]).sort()).to.deep.equal([1, 2, 2]);
    expect(response.data.map((d) => d.index)).to.deep.equal([0, 1, 2, 3, 4]);
    expect(response.usage?.totalTokens).to.equal(3);
  });

  it("streams partial images over SSE when n = 1", async () => {
    const partial = await pngBase64(9);
    const final = await pngBase64(200);
    handler = (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      const send = (event: string, data: unknown) => res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
      send("image_generation.partial_image", { type: "image_generation.partial_image", b64_json: partial, partial_image_index: 0 });
      // Split an event across writes.
      const second = `event: image_generation.partial_image\ndata: ${JSON.stringify({ type: "image_generation.partial_image", b64_json: partial, partial_image_index: 1 })}\n\n`;
      res.write(second.slice(0, 17));
      res.write(second.slice(17));
      send("image_generation.completed", { type: "image_generation.completed", b64_json: final, usage: { total_tokens: 3 } });
      res.end();
    };
    const events: ProviderEvent[] = [];
    const response = await provider().execute(request({ parameters: { partialImages: 2 } }), context(events));
    expect(recorded[0]!.body).to.deep.include({ stream: true, partial_images: 2, n: 1 });
    expect(events.map((e) => (e.type === "partial_image" ? [e.index, e.partialIndex] : e.type))).to.deep.equal([
      [0, 0],
      [0, 1],
    ]);
    expect(response.data).to.have.length(1);
    expect(response.usage?.totalTokens).to.equal(3);
  });

  it("does not stream when n > 1 and says so", async () => {
    handler = async (_req, res, body) => {
      const data = await Promise.all(Array.from({ length: body["n"] as number }, async () => ({ b64_json: await pngBase64(3) })));
      json(res, 200, { data });
    };
    const response = await provider().execute(request({ parameters: { n: 2, partialImages: 1 } }), context([]));
    expect(recorded[0]!.body).to.not.have.property("stream");
    expect(response.warnings).to.deep.equal(["partial_images_not_streamed"]);
  });

  const errors: [string, number, unknown, Record<string, string>, string, boolean, Record<string, unknown>][] = [
    ["429 with Retry-After", 429, { error: { message: "slow down", code: "rate_limit_exceeded" } }, { "retry-after": "2" }, "rate_limited", true, { retry_after_ms: 2000 }],
    ["429 out of quota", 429, { error: { message: "quota", code: "insufficient_quota" } }, {}, "rate_limited", false, {}],
    ["moderation", 400, { error: { message: "blocked", type: "image_generation_user_error", code: "moderation_blocked" } }, {}, "safety_rejected", false, { safety_category: "content_policy" }],
    ["content policy", 400, { error: { message: "nope", code: "content_policy_violation" } }, {}, "safety_rejected", false, {}],
    ["500", 500, { error: { message: "boom" } }, {}, "upstream", true, { http_status: 500 }],
    ["502 without a body", 502, "", {}, "upstream", true, {}],
    ["401", 401, { error: { message: "bad key" } }, {}, "authentication", false, {}],
    ["403", 403, {}, {}, "permission_denied", false, {}],
    ["400 bad parameter", 400, { error: { message: "bad size", param: "size" } }, {}, "invalid_request", false, { field: "size" }],
    ["504", 504, {}, {}, "timeout", true, {}],
  ];
  for (const [name, status, body, headers, code, retryable, details] of errors) {
    it(`maps ${name} to ${code}`, async () => {
      handler = (_req, res) => json(res, status, body, { "x-request-id": "up-1", ...headers });
      const error = await rejection(provider().execute(request(), context()));
      expect(error.code).to.equal(code);
      expect(error.retryable).to.equal(retryable);
      expect(error.provider).to.equal("oai");
      expect(error.upstreamRequestId).to.equal("up-1");
      expect(error.details).to.deep.include(details);
      expect(JSON.stringify(error.toJSON())).to.not.include(KEY);
    });
  }

  // One classifier for both paths: the same upstream error object, as an HTTP body or as an SSE `error`
  // event, gives the same code. Safety is decided by the upstream code, never by the error type.
  const SAFETY = { safety_category: "content_policy", recovery: "revise_prompt_or_inputs", retry_same_request: false, safety_controls_relaxed: false };
  const shared: [string, number, Record<string, unknown>, string, boolean, Record<string, unknown>][] = [
    ["moderation_blocked", 400, { type: "image_generation_user_error", code: "moderation_blocked", message: "blocked" }, "safety_rejected", false, SAFETY],
    ["content_policy_violation", 400, { type: "invalid_request_error", code: "content_policy_violation", message: "nope" }, "safety_rejected", false, SAFETY],
    ["Azure content_filter", 400, { code: "content_filter", message: "filtered" }, "safety_rejected", false, SAFETY],
    ["a user error that is not a refusal", 400, { type: "image_generation_user_error", code: "invalid_value", message: "bad size" }, "invalid_request", false, {}],
    ["a user error without a code", 400, { type: "image_generation_user_error", message: "bad" }, "invalid_request", false, {}],
    ["an exhausted quota", 429, { type: "insufficient_quota", code: "insufficient_quota", message: "quota" }, "rate_limited", false, {}],
    ["a rate limit", 429, { type: "rate_limit_error", code: "rate_limit_exceeded", message: "slow" }, "rate_limited", true, {}],
    ["a bad key", 401, { type: "invalid_request_error", code: "invalid_api_key", message: "key" }, "authentication", false, {}],
    ["a server error", 500, { type: "server_error", code: "server_error", message: "boom" }, "upstream", true, {}],
  ];
  for (const [name, status, upstream, code, retryable, details] of shared) {
    it(`maps ${name} to ${code} over HTTP and inside a stream alike`, async () => {
      handler = (_req, res) => json(res, status, { error: upstream }, { "x-request-id": "up-2" });
      const http = await rejection(provider().execute(request(), context()));
      handler = (_req, res) => {
        res.writeHead(200, { "content-type": "text/event-stream", "x-request-id": "up-2" });
        res.write(`event: error\ndata: ${JSON.stringify({ type: "error", error: upstream })}\n\n`);
        res.end();
      };
      const stream = await rejection(provider().execute(request({ parameters: { partialImages: 1 } }), context([])));
      for (const error of [http, stream]) {
        expect([error.code, error.retryable, error.provider, error.upstreamRequestId]).to.deep.equal([code, retryable, "oai", "up-2"]);
        expect(error.details).to.deep.include({ ...details, upstream_message: upstream["message"] });
        if (upstream["code"] === undefined) expect(error.details).to.not.have.property("upstream_code");
        else expect(error.details["upstream_code"]).to.equal(upstream["code"]);
        expect(error.message).to.include(upstream["message"] as string);
        expect(breakerVerdictOf(error)).to.equal(code === "rate_limited" || code === "upstream" ? "failure" : "neutral");
      }
    });
  }

  it("maps a safety refusal after partial previews to safety_rejected, with the upstream code and message", async () => {
    const partial = await pngBase64(9);
    handler = (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(`event: image_generation.partial_image\ndata: ${JSON.stringify({ type: "image_generation.partial_image", b64_json: partial, partial_image_index: 0 })}\n\n`);
      // The flat shape some compatible servers send: code and message at the top level.
      res.write(`event: error\ndata: ${JSON.stringify({ type: "error", code: "moderation_blocked", message: "Your request was rejected by the safety system." })}\n\n`);
      res.end();
    };
    const events: ProviderEvent[] = [];
    const error = await rejection(provider().execute(request({ parameters: { partialImages: 2 } }), context(events)));
    expect(events).to.have.length(1);
    expect([error.code, error.retryable]).to.deep.equal(["safety_rejected", false]);
    expect(error.details).to.deep.include({ ...SAFETY, upstream_code: "moderation_blocked", upstream_message: "Your request was rejected by the safety system." });
    expect(error.details).to.not.have.property("upstream_type");
    expect(breakerVerdictOf(error)).to.equal("neutral");
  });

  it("forwards only the partial previews the request asked for", async () => {
    const partial = await pngBase64(9);
    const final = await pngBase64(200);
    handler = (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      for (const index of [0, 1, 2, 7, -1]) {
        res.write(`event: image_generation.partial_image\ndata: ${JSON.stringify({ type: "image_generation.partial_image", b64_json: partial, partial_image_index: index })}\n\n`);
      }
      res.write(`event: image_generation.completed\ndata: ${JSON.stringify({ type: "image_generation.completed", b64_json: final })}\n\n`);
      res.end();
    };
    const events: ProviderEvent[] = [];
    const response = await provider().execute(request({ parameters: { partialImages: 2 } }), context(events));
    expect(events.map((e) => (e.type === "partial_image" ? [e.index, e.partialIndex] : e.type))).to.deep.equal([
      [0, 0],
      [0, 1],
    ]);
    expect(response.data).to.have.length(1);
  });

  it("parses Retry-After as seconds or a date", () => {
    expect(parseRetryAfter("3")).to.equal(3000);
    expect(parseRetryAfter(new Date(10_000).toUTCString(), 4000)).to.equal(6000);
    expect(parseRetryAfter(null)).to.equal(undefined);
  });

  it("fails with authentication when the key variable is unset, without calling upstream", async () => {
    const error = await rejection(provider({}, {}).execute(request(), context()));
    expect(error.code).to.equal("authentication");
    expect(error.message).to.include("TEST_KEY");
    expect(recorded).to.have.length(0);
  });

  it("rejects oversized, malformed and short responses as protocol", async () => {
    handler = (_req, res) => json(res, 200, { data: [{ b64_json: "A".repeat(4096) }] });
    expect((await rejection(provider({ maxResponseBytes: 1024 }).execute(request(), context()))).code).to.equal("protocol");
    handler = (_req, res) => res.writeHead(200, { "content-type": "application/json" }).end("{not json");
    expect((await rejection(provider().execute(request(), context()))).message).to.include("not valid JSON");
    handler = (_req, res) => json(res, 200, { data: [] });
    expect((await rejection(provider().execute(request(), context()))).details).to.deep.include({ expected: 1, actual: 0 });
    handler = (_req, res) => json(res, 200, { data: [{ b64_json: Buffer.from("not an image").toString("base64") }] });
    expect((await rejection(provider().execute(request(), context()))).message).to.include("undecodable");
  });

  it("aborts the upstream call on cancellation", async () => {
    let closed = false;
    const controller = new AbortController();
    // The upstream has the request (and never answers): cancel now.
    handler = (req) => {
      req.socket.on("close", () => {
        closed = true;
      });
      controller.abort();
    };
    const error = await rejection(provider().execute(request(), context(undefined, controller.signal)));
    expect(error.code).to.equal("cancelled");
    await eventually(() => expect(closed).to.equal(true));
  });

  it("reports unreachable upstreams as retryable upstream errors", async () => {
    const config = imagesConfigSchema.parse({ openai: [{ name: "gone", baseUrl: "http://127.0.0.1:1", apiKeyEnv: "TEST_KEY" }] }).openai[0]!;
    const error = await rejection(new OpenAiImageProvider(config, { TEST_KEY: KEY }).execute(request(), context()));
    expect([error.code, error.retryable]).to.deep.equal(["upstream", true]);
  });

  it("serves GenerateStream through ImageService with the upstream's partials", async () => {
    const partial = await pngBase64(9);
    const final = await pngBase64(200);
    handler = (_req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(`event: image_generation.partial_image\ndata: ${JSON.stringify({ type: "image_generation.partial_image", b64_json: partial, partial_image_index: 0 })}\n\n`);
      res.write(`event: image_generation.completed\ndata: ${JSON.stringify({ type: "image_generation.completed", b64_json: final })}\n\n`);
      res.end();
    };
    process.env["MMGATE_TEST_IMAGES_KEY"] = KEY;
    const server = await startServer({
      modules: [imagesModule],
      config: { images: { defaultProvider: "oai", openai: [{ name: "oai", baseUrl, apiKeyEnv: "MMGATE_TEST_IMAGES_KEY" }] } },
    });
    try {
      const events: string[] = [];
      for await (const message of createClient(ImageService, server.transport).generateStream({
        request: { prompt: "p", operation: { case: "generate", value: {} }, parameters: { partialImages: 1 } },
      })) {
        events.push(message.event.case ?? "none");
        if (message.event.case === "completed") {
          expect(message.event.value.response!.provider).to.equal("oai");
          expect(message.event.value.response!.data[0]!.width).to.equal(8);
        }
      }
      expect(events).to.deep.equal(["started", "partialImage", "completed"]);
      expect(recorded[0]!.authorization).to.equal(`Bearer ${KEY}`);
    } finally {
      delete process.env["MMGATE_TEST_IMAGES_KEY"];
      await server.close();
    }
  });
});
