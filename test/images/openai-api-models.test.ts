/**
 * `GET /v1/models` and `GET /v1/models/{model}` end to end: the official
 * `openai` SDK (and fetch for the wire) against a started server, checked
 * against what the image routes accept as `model`.
 */
import { expect } from "chai";
import OpenAI from "openai";
import { defineImagesModule } from "../../src/images/index.js";
import type { ImageProvider, ProviderContext } from "../../src/images/core/provider.js";
import { zeroTimings, type ImageRequest, type ImageResponse, type ProviderCapabilities } from "../../src/images/model.js";
import { expectRejection, startServer, type InProcessServer } from "../support/index.js";
import { fakeCapabilities } from "./fake-provider.js";

const TOKEN = "openai-models-test-token-0123456789";

/** Serves any of its models at once with one 1x1 image, and keeps the prompts it was asked for. */
class ListedProvider implements ImageProvider {
  readonly prompts: string[] = [];

  constructor(
    readonly name: string,
    private readonly models: string[],
  ) {}

  descriptor() {
    return { name: this.name, displayName: this.name, version: "test", experimental: false, models: this.models };
  }

  async capabilities(model?: string): Promise<ProviderCapabilities> {
    return { ...fakeCapabilities(), provider: this.name, model: model ?? this.models[0] ?? "" };
  }

  async execute(request: ImageRequest, context: ProviderContext): Promise<ImageResponse> {
    this.prompts.push(request.prompt);
    return {
      id: context.requestId,
      created: Math.floor(Date.now() / 1000),
      provider: this.name,
      model: request.routing.model ?? this.models[0] ?? "",
      requested: { ...request.parameters },
      effective: { ...request.parameters },
      normalizations: [],
      data: [{ index: 0, format: "png", width: 1, height: 1, bytes: 1, sha256: "0".repeat(64), data: new Uint8Array([1]) }],
      failures: [],
      usage: { provider: {} },
      timings: zeroTimings(),
      warnings: [],
    };
  }

  async shutdown(): Promise<void> {}
}

interface ErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

async function handled(server: InProcessServer, method: string): Promise<number> {
  const metric = await server.host.metrics.registry.getSingleMetric("grpc_client_handled_total")?.get();
  return (metric?.values ?? []).filter((v) => v.labels["grpc_method"] === method).reduce((sum, v) => sum + v.value, 0);
}

describe("images: OpenAI-compatible HTTP API, /v1/models (openai SDK)", function () {
  this.timeout(30_000);
  let server: InProcessServer;
  let alpha: ListedProvider;
  let beta: ListedProvider;
  let gamma: ListedProvider;
  let client: OpenAI;

  // ListProviders orders providers by name: alpha, beta, gamma, reference.
  const expected: [id: string, owner: string][] = [
    ["alpha", "alpha"],
    ["alpha-model", "alpha"],
    // Listed by alpha and beta, and the default provider does not list it: the first by name serves it.
    ["shared-model", "alpha"],
    ["alpha/alpha-model", "alpha"],
    ["alpha/shared-model", "alpha"],
    ["beta", "beta"],
    ["beta/shared-model", "beta"],
    ["gamma", "gamma"],
    ["org/model", "gamma"],
    ["gamma/org/model", "gamma"],
    ["reference", "reference"],
    ["reference-image-1", "reference"],
    ["reference/reference-image-1", "reference"],
  ];

  before(async () => {
    alpha = new ListedProvider("alpha", ["alpha-model", "shared-model"]);
    beta = new ListedProvider("beta", ["shared-model"]);
    gamma = new ListedProvider("gamma", ["org/model"]);
    server = await startServer({
      modules: [defineImagesModule({ extraProviders: [alpha, beta, gamma] })],
      config: { images: { defaultProvider: "reference", reference: { latencyMs: 1, defaultSize: "64x64" } } },
    });
    client = new OpenAI({ apiKey: "not-checked-here", baseURL: `http://${server.addr}/v1`, maxRetries: 0 });
  });
  after(async () => server?.close());

  it("lists every model value the image routes accept, in OpenAI's shape, owned by the provider each routes to", async () => {
    const page = await client.models.list();
    expect(page.data.map((m) => [m.id, m.owned_by])).to.deep.equal(expected);
    for (const model of page.data) expect(model).to.deep.equal({ id: model.id, object: "model", created: 0, owned_by: model.owned_by });
    // The wire: OpenAI's list object, the request id echoed.
    const raw = await fetch(`http://${server.addr}/v1/models?ignored=1`, { headers: { "x-request-id": "models-list-1" } });
    expect([raw.status, raw.headers.get("content-type"), raw.headers.get("x-request-id")]).to.deep.equal([200, "application/json", "models-list-1"]);
    const body = (await raw.json()) as { object: string; data: unknown[] };
    expect(body.object).to.equal("list");
    expect(body.data).to.deep.equal(page.data);
  });

  it("generates with every listed id, on the provider that owns it", async () => {
    const page = await client.models.list();
    const providers: Record<string, ListedProvider> = { alpha, beta, gamma };
    for (const model of page.data) {
      const prompt = `listed ${model.id}`;
      const answer = await client.images.generate({ prompt, model: model.id });
      expect(answer.data, model.id).to.have.length(1);
      // The reference draws the configured default size; the others record the prompt.
      if (model.owned_by === "reference") expect(answer.size, model.id).to.equal("64x64");
      else expect(providers[model.owned_by]!.prompts, model.id).to.include(prompt);
    }
  });

  it("refuses on both routes what it does not list", async () => {
    for (const id of ["gpt-image-1", "beta/alpha-model", "reference/", "alpha-model/alpha", "org", "Reference"]) {
      const generation = await expectRejection(client.images.generate({ prompt: "unlisted", model: id }), { type: OpenAI.NotFoundError });
      const retrieval = await expectRejection(client.models.retrieve(id), { type: OpenAI.NotFoundError });
      for (const error of [generation, retrieval]) expect([error.status, error.param, error.code], id).to.deep.equal([404, "model", "model_not_found"]);
    }
  });

  it("retrieves a model by id, with \"/\" in it percent-encoded (as the SDK sends it) or not", async () => {
    expect(await client.models.retrieve("reference/reference-image-1")).to.deep.include({
      id: "reference/reference-image-1",
      object: "model",
      created: 0,
      owned_by: "reference",
    });
    expect(await client.models.retrieve("gamma/org/model")).to.deep.include({ id: "gamma/org/model", owned_by: "gamma" });
    expect(await client.models.retrieve("shared-model")).to.deep.include({ id: "shared-model", owned_by: "alpha" });
    const raw = await fetch(`http://${server.addr}/v1/models/gamma/org/model`);
    expect([raw.status, await raw.json()]).to.deep.equal([200, { id: "gamma/org/model", object: "model", created: 0, owned_by: "gamma" }]);
  });

  it("answers an unknown model with 404 model_not_found, which the SDK raises as NotFoundError", async () => {
    const error = await expectRejection(client.models.retrieve("gpt-image-1"), { type: OpenAI.NotFoundError });
    expect([error.status, error.type, error.param, error.code]).to.deep.equal([404, "not_found_error", "model", "model_not_found"]);
    expect(error.message).to.contain('"gpt-image-1"');
    const malformed = await fetch(`http://${server.addr}/v1/models/%E0%A4%A`);
    expect([malformed.status, ((await malformed.json()) as ErrorBody).error.code]).to.deep.equal([404, "model_not_found"]);
  });

  it("answers 405 for HEAD and POST (and DELETE) on /v1/models and under it", async () => {
    const url = `http://${server.addr}/v1/models`;
    for (const [method, path] of [
      ["HEAD", ""],
      ["POST", ""],
      ["POST", "/reference"],
      ["HEAD", "/reference"],
      ["DELETE", "/reference"],
    ] as const) {
      const answer = await fetch(url + path, { method, ...(method === "POST" ? { headers: { "content-type": "application/json" }, body: "{}" } : {}) });
      expect([answer.status, answer.headers.get("allow")], `${method} ${path}`).to.deep.equal([405, "GET"]);
      if (method !== "HEAD") expect(((await answer.json()) as ErrorBody).error.code).to.equal("method_not_allowed");
    }
  });

  it("reads the providers from the catalog the image routes share: one ListProviders for a burst of lookups", async () => {
    const before = await handled(server, "ListProviders");
    await Promise.all([client.models.list(), client.models.retrieve("alpha"), client.images.generate({ prompt: "shared catalog", model: "beta" })]);
    const after = await handled(server, "ListProviders");
    expect(after).to.be.above(0);
    expect(after - before).to.be.at.most(1);
  });
});

describe("images: OpenAI-compatible HTTP API, /v1/models with auth.token", function () {
  this.timeout(30_000);
  let server: InProcessServer;

  before(async () => {
    server = await startServer({ modules: [defineImagesModule()], config: { auth: { token: TOKEN } } });
  });
  after(async () => server?.close());

  it("is as public as ListProviders: listed with or without the token, while generating needs it", async () => {
    const sdk = (apiKey: string) => new OpenAI({ apiKey, baseURL: `http://${server.addr}/v1`, maxRetries: 0 });
    const ids = ["reference", "reference-image-1", "reference/reference-image-1"];
    expect((await sdk(TOKEN).models.list()).data.map((m) => m.id)).to.deep.equal(ids);
    const anonymous = await fetch(`http://${server.addr}/v1/models`);
    expect(((await anonymous.json()) as { data: { id: string }[] }).data.map((m) => m.id)).to.deep.equal(ids);
    await expectRejection(sdk("wrong-token-0123456789").images.generate({ prompt: "p", model: ids[2]! }), { type: OpenAI.AuthenticationError });
    expect((await sdk(TOKEN).images.generate({ prompt: "p", model: ids[2]! })).data).to.have.length(1);
  });
});
