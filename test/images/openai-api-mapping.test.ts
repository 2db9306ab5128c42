import * as http from "node:http";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { expect } from "chai";
import { ListProvidersResponseSchema } from "../../gen/mmgate/images/v1/image_service_pb.js";
import * as pb from "../../gen/mmgate/images/v1/images_pb.js";
import { ImageError } from "../../src/images/core/errors.js";
import { validationError } from "../../src/images/core/validation.js";
import {
  completedEvents,
  editParams,
  fromRpcError,
  generationParams,
  imagesResponseOf,
  OpenAiApiError,
  openAiParamOf,
  partialImageEvent,
  routeForModel,
  toImageRequest,
} from "../../src/images/openai-api/index.js";
import { toConnectError } from "../../src/images/proto-convert.js";
import { SseWriter } from "../../src/images/openai-api/sse.js";
import { delay } from "../../src/util/index.js";
import { expectThrown } from "../support/index.js";

/** The OpenAiApiError `work` throws. */
const apiError = (work: () => unknown): OpenAiApiError => expectThrown(work, { type: OpenAiApiError });

const summary = (e: OpenAiApiError) => ({ status: e.status, type: e.type, param: e.param, code: e.code });
const noAuth = { authorizationSent: false };

describe("openai-api: request parameters", () => {
  it("reads every generation parameter, JSON null meaning absent", () => {
    const params = generationParams({
      prompt: "a fox",
      model: "reference",
      n: 3,
      size: "1024x1024",
      quality: "high",
      output_format: "webp",
      output_compression: 80,
      background: "opaque",
      moderation: "low",
      response_format: "b64_json",
      user: "u-1",
      stream: true,
      partial_images: 2,
      style: null,
    });
    expect(params).to.deep.include({
      operation: "generate",
      prompt: "a fox",
      model: "reference",
      n: 3,
      size: "1024x1024",
      quality: "high",
      outputFormat: "webp",
      outputCompression: 80,
      background: "opaque",
      moderation: "low",
      responseFormat: "b64_json",
      user: "u-1",
      stream: true,
      partialImages: 2,
    });
    expect(generationParams({ prompt: "p" })).to.deep.equal({
      operation: "generate",
      prompt: "p",
      responseFormat: "b64_json",
      stream: false,
      partialImages: 0,
      images: [],
    });
  });

  it("names the parameter at fault, one problem at a time", () => {
    const cases: [unknown, string | null, string][] = [
      [[1], null, "invalid_type"],
      [{ prompt: "p", colour: "red" }, "colour", "unknown_parameter"],
      [JSON.parse('{"prompt":"p","constructor":1}'), "constructor", "unknown_parameter"],
      [JSON.parse('{"prompt":"p","toString":1}'), "toString", "unknown_parameter"],
      [{ prompt: "p", style: "vivid" }, "style", "unsupported_parameter"],
      [{ prompt: "p", input_fidelity: "high" }, "input_fidelity", "unknown_parameter"],
      [{ n: 1 }, "prompt", "missing_required_parameter"],
      [{ prompt: 7 }, "prompt", "invalid_type"],
      [{ prompt: "p", n: 0 }, "n", "invalid_value"],
      [{ prompt: "p", n: 2.5 }, "n", "invalid_type"],
      [{ prompt: "p", n: "2" }, "n", "invalid_type"],
      [{ prompt: "p", n: 256 }, "n", "invalid_value"],
      [{ prompt: "p", partial_images: 4 }, "partial_images", "invalid_value"],
      [{ prompt: "p", output_compression: 101 }, "output_compression", "invalid_value"],
      [{ prompt: "p", quality: "hd" }, "quality", "invalid_value"],
      [{ prompt: "p", output_format: "gif" }, "output_format", "invalid_value"],
      [{ prompt: "p", stream: "yes" }, "stream", "invalid_type"],
      [{ prompt: "p", stream: true, response_format: "url" }, "response_format", "invalid_value"],
    ];
    for (const [body, param, code] of cases) {
      const error = apiError(() => generationParams(body));
      expect({ param: error.param, code: error.code, status: error.status }, JSON.stringify(body)).to.deep.equal({ param, code, status: 400 });
    }
    expect(apiError(() => generationParams({ prompt: "p", quality: "hd" })).message).to.include("dall-e");
  });

  it("reads an edit form: text values parsed, image and image[] files in order, one mask", () => {
    const file = (field: string, text: string) => ({ field, data: Buffer.from(text), filename: `${text}.png`, mimeType: "image/png" });
    const params = editParams(
      [
        ["prompt", "edit it"],
        ["n", "2"],
        ["stream", "true"],
        ["input_fidelity", "high"],
      ],
      [file("image[]", "a"), file("image[]", "b"), file("mask", "m")],
    );
    expect(params).to.deep.include({ operation: "edit", prompt: "edit it", n: 2, stream: true, inputFidelity: "high" });
    expect(params.images.map((f) => f.data.toString())).to.deep.equal(["a", "b"]);
    expect(params.mask?.data.toString()).to.equal("m");

    const cases: [[string, string][], ReturnType<typeof file>[], string, string][] = [
      [[["prompt", "p"]], [], "image", "missing_required_parameter"],
      [[["prompt", "p"], ["n", "two"]], [file("image", "a")], "n", "invalid_type"],
      [[["prompt", "p"], ["n", "1"], ["n", "2"]], [file("image", "a")], "n", "invalid_value"],
      [[["prompt", "p"], ["image", "https://x"]], [file("image", "a")], "image", "invalid_type"],
      [[["prompt", "p"]], [file("image", "a"), file("photo", "b")], "photo", "unknown_parameter"],
      [[["prompt", "p"]], [file("image", "a"), file("mask", "b"), file("mask", "c")], "mask", "invalid_value"],
      [[["prompt", "p"], ["stream", "maybe"]], [file("image", "a")], "stream", "invalid_type"],
    ];
    for (const [fields, files, param, code] of cases) {
      const error = apiError(() => editParams(fields, files));
      expect({ param: error.param, code: error.code }, JSON.stringify(fields)).to.deep.equal({ param, code });
    }
  });

  it("builds the ImageRequest: enums, route, raw-bytes response, edit inputs with sniffable types", () => {
    const generate = toImageRequest(generationParams({ prompt: "p", n: 4, quality: "low", background: "transparent", user: "u" }), { provider: "reference" }, 2);
    expect(generate.operation).to.deep.equal({ case: "generate", value: {} });
    expect(generate.parameters).to.deep.include({ n: 4, quality: pb.Quality.LOW, background: pb.Background.TRANSPARENT, partialImages: 2, size: "" });
    expect(generate.routing).to.deep.equal({ provider: "reference", model: "" });
    expect([generate.user, generate.responseFormat]).to.deep.equal(["u", pb.ResponseFormat.BYTES]);

    const edit = toImageRequest(
      editParams([["prompt", "p"]], [
        { field: "image", data: Buffer.from([1, 2]), filename: "dir/a.png", mimeType: "application/octet-stream" },
        { field: "mask", data: Buffer.from([3]), filename: "m.PNG", mimeType: "IMAGE/PNG" },
      ]),
      {},
      0,
    );
    expect(edit.operation?.case).to.equal("edit");
    const value = edit.operation?.value as { images: { data: Uint8Array; mediaType: string; filename: string }[]; mask: { mediaType: string } };
    expect(value.images.map((i) => [Array.from(i.data), i.mediaType, i.filename])).to.deep.equal([[[1, 2], "", "a.png"]]);
    expect(value.mask.mediaType).to.equal("image/png");
  });
});

describe("openai-api: models", () => {
  const list = create(ListProvidersResponseSchema, {
    defaultProvider: "beta",
    providers: [
      { name: "alpha", models: ["shared-1", "alpha-1"] },
      { name: "beta", models: ["shared-1", "org/beta-1"], default: true },
    ],
  });

  it("takes a provider name, a listed model (the default provider first), or provider/model", () => {
    expect(routeForModel("alpha", list)).to.deep.equal({ provider: "alpha" });
    expect(routeForModel("shared-1", list)).to.deep.equal({ provider: "beta", model: "shared-1" });
    expect(routeForModel("alpha-1", list)).to.deep.equal({ provider: "alpha", model: "alpha-1" });
    expect(routeForModel("org/beta-1", list)).to.deep.equal({ provider: "beta", model: "org/beta-1" });
    expect(routeForModel("alpha/shared-1", list)).to.deep.equal({ provider: "alpha", model: "shared-1" });
  });

  it("answers 404 model_not_found naming what is served", () => {
    for (const model of ["gpt-image-1", "alpha/beta-1", "nobody/shared-1"]) {
      const error = apiError(() => routeForModel(model, list));
      expect(summary(error)).to.deep.equal({ status: 404, type: "not_found_error", param: "model", code: "model_not_found" });
      expect(error.message).to.include("alpha-1");
    }
  });
});

describe("openai-api: errors", () => {
  it("maps service field paths to OpenAI parameter names", () => {
    expect(["parameters.n", "parameters.size", "prompt", "images[2]", "mask", "routing.model", "session.key", "parameters.failure_policy"].map(openAiParamOf)).to.deep.equal([
      "n",
      "size",
      "prompt",
      "image[2]",
      "mask",
      "model",
      null,
      null,
    ]);
  });

  it("turns a validation failure into a 400 naming the first issue's parameter", () => {
    const error = fromRpcError(
      toConnectError(
        validationError([
          { field: "parameters.n", code: "out_of_range", message: "must be between 1 and 16" },
          { field: "prompt", code: "required", message: "must not be blank" },
        ]),
      ),
      noAuth,
    );
    expect(summary(error)).to.deep.equal({ status: 400, type: "invalid_request_error", param: "n", code: "out_of_range" });
    expect(error.message).to.equal("n: must be between 1 and 16 (and 1 more)");
  });

  it("maps each image error code to its status, and retry-after to a header", () => {
    const cases: [ImageError, number, string, string | null][] = [
      [new ImageError("unsupported_capability", "no", { details: { field: "parameters.quality" } }), 400, "unsupported_value", "quality"],
      [new ImageError("input", "bad image", { details: { field: "images[0]" } }), 400, "invalid_image", "image[0]"],
      [new ImageError("safety_rejected", "refused"), 400, "moderation_blocked", null],
      [new ImageError("configuration", "unknown", { details: { field: "routing.provider" } }), 404, "model_not_found", "model"],
      [new ImageError("configuration", "not configured"), 500, "configuration", null],
      [new ImageError("authentication", "provider key"), 502, "provider_authentication", null],
      [new ImageError("permission_denied", "no"), 403, "permission_denied", null],
      [new ImageError("rate_limited", "slow down", { retryable: true, details: { retry_after_ms: 2500 } }), 429, "rate_limit_exceeded", null],
      [new ImageError("overloaded", "queue full", { retryable: true, details: { limit: "provider:x" } }), 429, "overloaded", null],
      [new ImageError("overloaded", "circuit open", { retryable: true, details: { circuit_state: "open" } }), 503, "provider_unavailable", null],
      [new ImageError("timeout", "late"), 504, "timeout", null],
      [new ImageError("cancelled", "runtime is shutting down", { retryable: true }), 503, "unavailable", null],
      [new ImageError("upstream", "failed"), 502, "upstream_error", null],
      [new ImageError("protocol", "broke"), 502, "upstream_protocol_error", null],
      [new ImageError("idempotency_conflict", "other request"), 409, "idempotency_conflict", null],
      [new ImageError("internal", "bug"), 500, "internal", null],
    ];
    for (const [image, status, code, param] of cases) {
      const error = fromRpcError(toConnectError(image), noAuth);
      expect({ status: error.status, code: error.code, param: error.param }, image.code).to.deep.equal({ status, code, param });
      expect(error.message).to.equal(image.message);
    }
    expect(fromRpcError(toConnectError(cases[7]![0]), noAuth).headers).to.deep.equal({ "retry-after": "3" });
  });

  it("maps the host's own statuses: auth, draining, deadline, internal", () => {
    const host = (code: Code, sent = false) => summary(fromRpcError(new ConnectError("m", code), { authorizationSent: sent }));
    expect(host(Code.Unauthenticated)).to.deep.equal({ status: 401, type: "authentication_error", param: null, code: "missing_api_key" });
    expect(host(Code.Unauthenticated, true).code).to.equal("invalid_api_key");
    expect(host(Code.Unavailable)).to.deep.include({ status: 503, type: "server_error" });
    expect(fromRpcError(new ConnectError("m", Code.Unavailable), noAuth).headers).to.deep.equal({ "retry-after": "1" });
    expect(host(Code.DeadlineExceeded).status).to.equal(504);
    expect(host(Code.ResourceExhausted).status).to.equal(429);
    expect(host(Code.Internal)).to.deep.include({ status: 500, type: "server_error" });
  });
});

describe("openai-api: responses", () => {
  const response = create(pb.ImageResponseSchema, {
    created: 1_700_000_000n,
    effective: { background: pb.Background.AUTO, quality: pb.Quality.HIGH, outputFormat: pb.OutputFormat.JPEG, size: "auto" },
    revisedPrompt: "a revised fox",
    usage: { inputTokens: 5n, outputTokens: 20n },
    data: [
      { index: 1, format: pb.OutputFormat.JPEG, width: 32, height: 16, payload: { case: "image", value: new Uint8Array([4, 5]) } },
      { index: 0, format: pb.OutputFormat.JPEG, width: 32, height: 16, payload: { case: "image", value: new Uint8Array([1, 2, 3]) } },
    ],
  });

  it("answers OpenAI's images response, in index order", () => {
    expect(imagesResponseOf(response, "b64_json")).to.deep.equal({
      created: 1_700_000_000,
      data: [
        { b64_json: "AQID", revised_prompt: "a revised fox" },
        { b64_json: "BAU=", revised_prompt: "a revised fox" },
      ],
      usage: { input_tokens: 5, output_tokens: 20, total_tokens: 25 },
      output_format: "jpeg",
      quality: "high",
      size: "32x16",
    });
    expect(imagesResponseOf(response, "url").data[0]).to.deep.equal({ url: "data:image/jpeg;base64,AQID", revised_prompt: "a revised fox" });
  });

  it("streams one completed event per image, usage on the last, and partial images with both indexes", () => {
    const events = completedEvents("generate", response);
    expect(events.map((e) => [e.type, e.image_index, e.b64_json, e.size, e.quality, e.background, e.output_format, e.usage])).to.deep.equal([
      ["image_generation.completed", 0, "AQID", "32x16", "high", "auto", "jpeg", undefined],
      ["image_generation.completed", 1, "BAU=", "32x16", "high", "auto", "jpeg", { input_tokens: 5, output_tokens: 20, total_tokens: 25 }],
    ]);
    expect(completedEvents("edit", response)[0]!.type).to.equal("image_edit.completed");
    const settings = { size: "auto", quality: "auto", background: "auto", output_format: "png" };
    expect(partialImageEvent("generate", settings, { index: 3, partialIndex: 1, bytes: new Uint8Array([255]) }, 7)).to.deep.equal({
      type: "image_generation.partial_image",
      b64_json: "/w==",
      created_at: 7,
      ...settings,
      partial_image_index: 1,
      image_index: 3,
    });
  });
});

describe("openai-api: SSE writer", () => {
  it("frames events and errors, and sends keep-alive comments while quiet", async () => {
    const server = http.createServer((req, res) => {
      const gone = new AbortController();
      res.once("close", () => gone.abort());
      const sse = new SseWriter(res, gone.signal, { heartbeatMs: 20 });
      void (async () => {
        sse.open({ "x-request-id": "r1" });
        await delay(70);
        await sse.event("image_generation.partial_image", { type: "image_generation.partial_image", n: 1 });
        await sse.error(new OpenAiApiError(502, "provider failed", "server_error", null, "upstream_error"));
        sse.end();
        sse.end();
      })();
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    try {
      const { port } = server.address() as { port: number };
      const response = await fetch(`http://127.0.0.1:${port}/`);
      expect([response.status, response.headers.get("content-type"), response.headers.get("x-request-id")]).to.deep.equal([200, "text/event-stream; charset=utf-8", "r1"]);
      const text = await response.text();
      expect(text.startsWith(": keep-alive\n\n")).to.equal(true);
      expect(text.replaceAll(": keep-alive\n\n", "")).to.equal(
        'event: image_generation.partial_image\ndata: {"type":"image_generation.partial_image","n":1}\n\n' +
          'event: error\ndata: {"type":"error","error":{"message":"provider failed","type":"server_error","param":null,"code":"upstream_error"}}\n\n',
      );
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });
});
