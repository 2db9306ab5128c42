import { create, fromBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { BinaryReader } from "@bufbuild/protobuf/wire";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import sharp from "sharp";
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import * as pb from "../../gen/mmgate/images/v1/images_pb.js";
import { ImageError } from "../../src/images/core/errors.js";
import { defineImagesModule, imagesModule } from "../../src/images/index.js";
import { eventually, expectRejection, grpcServerStream, grpcUnary, startServer, type GrpcClient, type InProcessServer } from "../support/index.js";
import { ProbeProvider } from "./probe-provider.js";

const PROTO = "mmgate/images/v1/image_service.proto";
const SERVICE = "mmgate.images.v1.ImageService";

/** The ErrorDetail inside grpc-status-details-bin (a google.rpc.Status). */
function errorDetailOf(error: grpc.ServiceError): pb.ErrorDetail {
  const [raw] = error.metadata.get("grpc-status-details-bin");
  expect(raw, "grpc-status-details-bin").to.be.instanceOf(Buffer);
  const reader = new BinaryReader(raw as Buffer);
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field !== 3) {
      reader.skip(wireType);
      continue;
    }
    const any = new BinaryReader(reader.bytes());
    let typeUrl = "";
    let value: Uint8Array = new Uint8Array();
    while (any.pos < any.len) {
      const [f, w] = any.tag();
      if (f === 1) typeUrl = any.string();
      else if (f === 2) value = any.bytes();
      else any.skip(w);
    }
    if (typeUrl.endsWith("/mmgate.images.v1.ErrorDetail")) return fromBinary(pb.ErrorDetailSchema, value);
  }
  throw new Error("no ErrorDetail in the status");
}

const grpcError = (promise: Promise<unknown>) => expectRejection<grpc.ServiceError>(promise);

describe("images: ImageService over gRPC (reference provider)", function () {
  this.timeout(30_000);
  let server: InProcessServer;
  let client: GrpcClient;

  before(async () => {
    server = await startServer({
      modules: [imagesModule],
      config: {
        images: {
          reference: { latencyMs: 20, defaultSize: "64x64", failure: { promptContains: "FAIL-ME", outputIndices: [6] } },
          fanout: { maxOutputs: 8, maxParallelOutputs: 4 },
        },
      },
    });
    client = server.grpcClient(PROTO, SERVICE);
  });
  after(async () => server?.close());

  it("lists the providers with the default marked", async () => {
    const response = await grpcUnary<{ providers: { name: string; default: boolean; circuitState: string }[]; defaultProvider: string }>(
      client,
      "ListProviders",
      {},
    );
    expect(response.defaultProvider).to.equal("reference");
    expect(response.providers).to.have.length(1);
    expect(response.providers[0]).to.deep.include({ name: "reference", default: true, circuitState: "closed" });
  });

  it("advertises fan-out capabilities with the native count visible", async () => {
    const response = await grpcUnary<{ capabilities: Record<string, unknown> }>(client, "GetCapabilities", { provider: "reference" });
    const c = response.capabilities as { count: unknown; batching: unknown; provider: string };
    expect(c.provider).to.equal("reference");
    expect(c.count).to.deep.equal({ min: 1, max: 8 });
    expect(c.batching).to.deep.equal({ mode: "BATCH_MODE_FAN_OUT", nativeCount: { min: 1, max: 1 }, maxParallelOutputs: 4 });
  });

  it("generates n = 4 images in order with real pixels", async () => {
    const response = await grpcUnary<{ response: Record<string, unknown> }>(client, "Generate", {
      request: { prompt: "a red fox", generate: {}, parameters: { n: 4, outputFormat: "OUTPUT_FORMAT_WEBP" } },
    });
    const r = response.response as {
      data: { index: number; image: Buffer; width: number; height: number; byteSize: string; sha256: string; format: string }[];
      warnings: string[];
      usage: { totalTokens: string; provider: Record<string, string> };
      provider: string;
      effective: { n: number };
    };
    expect(r.provider).to.equal("reference");
    expect(r.data.map((d) => d.index)).to.deep.equal([0, 1, 2, 3]);
    expect(r.warnings).to.include("emulated_multi_image_fanout");
    expect(r.usage.provider["images"]).to.equal("4");
    expect(r.effective.n).to.equal(4);
    const hashes = new Set(r.data.map((d) => d.sha256));
    expect(hashes.size).to.equal(4);
    for (const d of r.data) {
      const meta = await sharp(d.image).metadata();
      expect([meta.format, meta.width, meta.height]).to.deep.equal(["webp", 64, 64]);
      expect(d.format).to.equal("OUTPUT_FORMAT_WEBP");
      expect(Number(d.byteSize)).to.equal(d.image.length);
    }
  });

  it("is deterministic for the same prompt and index", async () => {
    const generate = () =>
      createClient(ImageService, server.transport).generate({
        request: { prompt: "same", operation: { case: "generate", value: {} }, parameters: { n: 2 } },
      });
    const [a, b] = await Promise.all([generate(), generate()]);
    expect(a.response!.data.map((d) => d.sha256)).to.deep.equal(b.response!.data.map((d) => d.sha256));
  });

  it("uses the host's request id as the response id, the client's when it sends one", async () => {
    const images = createClient(ImageService, server.transport);
    const request = { request: { prompt: "ids", operation: { case: "generate" as const, value: {} }, parameters: { n: 1 } } };
    let echoed: string | null = null;
    const generated = await images.generate(request, { onHeader: (h) => (echoed = h.get("x-request-id")) });
    expect(echoed).to.match(/^[0-9a-f-]{36}$/);
    expect(generated.response!.id).to.equal(echoed);
    const given = await images.generate(request, { headers: { "x-request-id": "client-id-7" } });
    expect(given.response!.id).to.equal("client-id-7");
  });

  it("streams n = 4 with per-index partial previews, then the completed response", async () => {
    const messages = await grpcServerStream<{ event: string } & Record<string, Record<string, unknown>>>(client, "GenerateStream", {
      request: { prompt: "a blue whale", generate: {}, parameters: { n: 4, partialImages: 2 } },
    });
    expect(messages[0]!.event).to.equal("started");
    expect(messages[0]!["started"]).to.deep.include({ outputs: 4 });
    expect(messages.at(-1)!.event).to.equal("completed");
    const partials = messages.filter((m) => m.event === "partialImage").map((m) => m["partialImage"] as { index: number; partialIndex: number; image: Buffer });
    const byIndex = new Map<number, number[]>();
    for (const p of partials) byIndex.set(p.index, [...(byIndex.get(p.index) ?? []), p.partialIndex]);
    expect([...byIndex.keys()].sort()).to.deep.equal([0, 1, 2, 3]);
    for (const list of byIndex.values()) expect(list).to.deep.equal([0, 1]);
    const meta = await sharp(partials[0]!.image).metadata();
    expect(meta.width).to.equal(64);
    const progress = messages.filter((m) => m.event === "progress").map((m) => (m["progress"] as { index: number }).index);
    expect([...new Set(progress)].sort()).to.deep.equal([0, 1, 2, 3]);
    const completed = messages.at(-1)!["completed"] as { response: { data: { index: number }[] } };
    expect(completed.response.data.map((d) => d.index)).to.deep.equal([0, 1, 2, 3]);
  });

  it("ends a failing stream with a typed status after started", async () => {
    const error = (await grpcError(
      grpcServerStream(client, "GenerateStream", {
        request: { prompt: "FAIL-ME now", generate: {}, parameters: { n: 2, partialImages: 1 } },
      }),
    )) as grpc.ServiceError & { received?: { event: string }[] };
    expect(error.code).to.equal(grpc.status.UNAVAILABLE);
    expect(error.received?.[0]?.event).to.equal("started");
    expect(error.received?.some((m) => m.event === "completed")).to.equal(false);
    const detail = errorDetailOf(error);
    expect(detail.code).to.equal(pb.ErrorCode.UPSTREAM);
    expect(detail.provider).to.equal("reference");
  });

  it("rejects an invalid stream request before started", async () => {
    const error = (await grpcError(
      grpcServerStream(client, "GenerateStream", { request: { prompt: "", generate: {} } }),
    )) as grpc.ServiceError & { received?: unknown[] };
    expect(error.code).to.equal(grpc.status.INVALID_ARGUMENT);
    expect(error.received).to.have.length(0);
  });

  it("carries base64 or metadata only when asked", async () => {
    const images = createClient(ImageService, server.transport);
    const b64 = await images.generate({
      request: { prompt: "p", operation: { case: "generate", value: {} }, responseFormat: pb.ResponseFormat.B64_JSON },
    });
    const payload = b64.response!.data[0]!.payload;
    expect(payload.case).to.equal("b64Json");
    expect(Buffer.from(payload.value as string, "base64").subarray(1, 4).toString()).to.equal("PNG");
    const meta = await images.generate({
      request: { prompt: "p", operation: { case: "generate", value: {} }, responseFormat: pb.ResponseFormat.METADATA },
    });
    expect(meta.response!.data[0]!.payload.case).to.equal(undefined);
    expect(meta.response!.data[0]!.sha256).to.match(/^[0-9a-f]{64}$/);
  });

  it("maps validation errors to INVALID_ARGUMENT with a typed detail", async () => {
    const error = await grpcError(
      grpcUnary(client, "Generate", { request: { prompt: " ", generate: {}, parameters: { n: 0 } } }),
    );
    expect(error.code).to.equal(grpc.status.INVALID_ARGUMENT);
    const detail = errorDetailOf(error);
    expect(detail.code).to.equal(pb.ErrorCode.INVALID_REQUEST);
    expect(detail.retryable).to.equal(false);
    const issues = (detail.details!["issues"] as { field: string; code: string }[]).map((i) => `${i.field}/${i.code}`);
    expect(issues).to.deep.equal(["parameters.n/out_of_range", "prompt/required"]);
    expect(detail.suggestions.length).to.be.greaterThan(0);
  });

  it("generates from a request with just a prompt: no operation means generate (grpc-js and connect)", async () => {
    const viaGrpc = await grpcUnary<{ response: { data: { index: number }[]; provider: string } }>(client, "Generate", {
      request: { prompt: "just a prompt", responseFormat: "RESPONSE_FORMAT_METADATA" },
    });
    expect(viaGrpc.response.provider).to.equal("reference");
    expect(viaGrpc.response.data.map((d) => d.index)).to.deep.equal([0]);
    const images = createClient(ImageService, server.transport);
    const viaConnect = await images.generate({ request: { prompt: "just a prompt", responseFormat: pb.ResponseFormat.METADATA } });
    expect(viaConnect.response?.data.map((d) => d.index)).to.deep.equal([0]);
  });

  it("puts the first issue of an invalid request in the message and every issue in the details (grpc-js and connect)", async () => {
    const error = await grpcError(grpcUnary(client, "Generate", { request: { prompt: " ", parameters: { n: 0 } } }));
    expect(error.code).to.equal(grpc.status.INVALID_ARGUMENT);
    // grpc-js decodes grpc-message with decodeURI, which leaves "%3A" as it is; the ErrorDetail carries the plain text.
    const message = "request validation failed: parameters.n: must be between 1 and 16 (and 1 more)";
    expect(decodeURIComponent(error.details)).to.equal(message);
    expect(errorDetailOf(error).message).to.equal(message);
    const issues = (errorDetailOf(error).details!["issues"] as { field: string }[]).map((i) => i.field);
    expect(issues).to.deep.equal(["parameters.n", "prompt"]);

    const images = createClient(ImageService, server.transport);
    try {
      await images.generate({ request: { prompt: " " } });
      expect.fail("expected an error");
    } catch (e) {
      const connectError = ConnectError.from(e);
      expect(connectError.code).to.equal(Code.InvalidArgument);
      expect(connectError.rawMessage).to.equal("request validation failed: prompt: must not be blank");
      const [detail] = connectError.findDetails(pb.ErrorDetailSchema);
      expect(detail?.message).to.equal("request validation failed: prompt: must not be blank");
      expect((detail?.details!["issues"] as { field: string }[]).map((i) => i.field)).to.deep.equal(["prompt"]);
    }
  });

  it("maps strict negotiation, unknown providers and provider failures", async () => {
    const images = createClient(ImageService, server.transport);
    const call = (request: MessageInitShape<typeof pb.ImageRequestSchema>) =>
      images.generate({ request: { prompt: "p", operation: { case: "generate", value: {} }, ...request } });
    const expectError = async (promise: Promise<unknown>, code: Code, detailCode: pb.ErrorCode) => {
      try {
        await promise;
      } catch (error) {
        const e = ConnectError.from(error);
        expect(e.code).to.equal(code);
        const [detail] = e.findDetails(pb.ErrorDetailSchema);
        expect(detail?.code).to.equal(detailCode);
        return detail!;
      }
      throw new Error("expected an error");
    };
    const tooMany = await expectError(call({ parameters: create(pb.GenerationParametersSchema, { n: 9 }) }), Code.FailedPrecondition, pb.ErrorCode.UNSUPPORTED_CAPABILITY);
    expect(tooMany.details!["field"]).to.equal("parameters.n");
    const normalized = await call({
      parameters: create(pb.GenerationParametersSchema, { n: 9, failurePolicy: pb.FailurePolicy.BEST_EFFORT }),
      policies: create(pb.RequestPoliciesSchema, { compatibility: pb.CompatibilityMode.NORMALIZE }),
      responseFormat: pb.ResponseFormat.METADATA,
    });
    const tooManyForFanout = await expectError(call({ parameters: create(pb.GenerationParametersSchema, { n: 17 }) }), Code.InvalidArgument, pb.ErrorCode.INVALID_REQUEST);
    expect(tooManyForFanout.details!["issues"]).to.have.length(1);
    expect(normalized.response!.data.length + normalized.response!.failures.length).to.equal(8);
    expect(normalized.response!.requested!.n).to.equal(9);
    expect(normalized.response!.effective!.n).to.equal(8);
    expect(normalized.response!.normalizations[0]!.reason).to.equal("clamped_to_provider_range");

    const unknown = await expectError(call({ routing: create(pb.RoutingOptionsSchema, { provider: "nope" }) }), Code.FailedPrecondition, pb.ErrorCode.CONFIGURATION);
    expect(unknown.details!["provider"]).to.equal("nope");
    const failed = await expectError(call({ prompt: "please FAIL-ME", parameters: create(pb.GenerationParametersSchema, { n: 3 }) }), Code.Unavailable, pb.ErrorCode.UPSTREAM);
    expect(failed.provider).to.equal("reference");
    expect(failed.details!["output_index"]).to.be.a("number");
  });

  it("returns best-effort failures per index with typed errors", async () => {
    const images = createClient(ImageService, server.transport);
    const response = await images.generate({
      request: {
        prompt: "p",
        operation: { case: "generate", value: {} },
        parameters: { n: 8, failurePolicy: pb.FailurePolicy.BEST_EFFORT },
      },
    });
    const r = response.response!;
    expect(r.data.map((d) => d.index)).to.deep.equal([0, 1, 2, 3, 4, 5, 7]);
    expect(r.failures.map((f) => f.index)).to.deep.equal([6]);
    expect(r.failures[0]!.error!.code).to.equal(pb.ErrorCode.UPSTREAM);
    expect(r.failures[0]!.error!.details!["output_index"]).to.equal(6);
    expect(r.warnings).to.deep.equal(["emulated_multi_image_fanout", "partial_output_failure"]);
  });

  it("fails fast on the same batch without best effort", async () => {
    try {
      await createClient(ImageService, server.transport).generate({
        request: { prompt: "p", operation: { case: "generate", value: {} }, parameters: { n: 8 } },
      });
      expect.fail("expected an error");
    } catch (error) {
      const [detail] = ConnectError.from(error).findDetails(pb.ErrorDetailSchema);
      expect(detail!.code).to.equal(pb.ErrorCode.UPSTREAM);
      expect(detail!.retryable).to.equal(false);
      expect(detail!.details).to.deep.include({ outcome: "unknown", retry_scope: "do_not_retry_full_batch", output_index: 6 });
    }
  });
});

describe("images: error mapping", () => {
  it("is the module's: an ImageError becomes its status, detail and retry-after; anything else is the host's", () => {
    const mapError = imagesModule.mapError;
    expect(mapError, "imagesModule.mapError").to.be.a("function");
    const limited = mapError!(new ImageError("rate_limited", "slow down", { retryable: true, details: { retry_after_ms: 2500 } }));
    expect(limited?.code).to.equal(Code.ResourceExhausted);
    expect(limited?.metadata.get("retry-after")).to.equal("3");
    const [detail] = limited!.findDetails(pb.ErrorDetailSchema);
    expect(detail).to.deep.include({ code: pb.ErrorCode.RATE_LIMITED, message: "slow down", retryable: true });
    expect(mapError!(new ImageError("invalid_request", "bad"))?.code).to.equal(Code.InvalidArgument);
    expect(mapError!(new Error("a bug"))).to.equal(undefined);
    expect(mapError!("a string")).to.equal(undefined);
  });
});

describe("images: ImageService cancellation, deadlines and breaker", function () {
  this.timeout(30_000);
  let server: InProcessServer;
  let probe: ProbeProvider;
  /** A provider whose capabilities lookup has a bug. */
  const broken = new ProbeProvider("broken");
  broken.capabilities = () => Promise.reject(new TypeError("cannot read properties of undefined"));

  before(async () => {
    probe = new ProbeProvider("probe");
    server = await startServer({
      modules: [defineImagesModule({ extraProviders: [probe, broken] })],
      config: {
        images: {
          cancellationGraceMs: 200,
          circuitBreaker: { failureThreshold: 2 },
          reference: { failure: { promptContains: "BREAK" }, latencyMs: 0, defaultSize: "16x16" },
        },
      },
    });
  });
  after(async () => server?.close());

  it("leaves an error that is no ImageError to the host: INTERNAL naming the request id, no detail, no leaked text", async () => {
    const images = createClient(ImageService, server.transport);
    try {
      await images.getCapabilities({ provider: "broken" }, { headers: { "x-request-id": "broken-caps-1" } });
      expect.fail("expected an error");
    } catch (error) {
      const e = ConnectError.from(error);
      expect(e.code).to.equal(Code.Internal);
      expect(e.rawMessage).to.include("broken-caps-1");
      expect(e.rawMessage).to.not.include("cannot read");
      expect(e.findDetails(pb.ErrorDetailSchema)).to.have.length(0);
    }
  });

  it("delivers client cancellation to the provider (grpc-js)", async () => {
    const client = server.grpcClient(PROTO, SERVICE);
    const before = probe.started;
    const call = grpcServerStream(client, "GenerateStream", { request: { prompt: "wait", generate: {}, routing: { provider: "probe" } } }, {
      onMessage: (_msg, stream) => {
        void probe.whenStarted(before + 1).then(() => stream.cancel());
      },
    });
    const error = await grpcError(call);
    expect(error.code).to.equal(grpc.status.CANCELLED);
    await eventually(() => expect(probe.aborted).to.be.at.least(1));
  });

  it("delivers client cancellation to the provider (connect unary)", async () => {
    const images = createClient(ImageService, server.transport);
    const controller = new AbortController();
    const abortedBefore = probe.aborted;
    const startedBefore = probe.started;
    void probe.whenStarted(startedBefore + 1).then(() => controller.abort());
    await expectRejection(
      images.generate({ request: { prompt: "wait", operation: { case: "generate", value: {} }, routing: { provider: "probe" } } }, { signal: controller.signal }),
      { type: ConnectError, code: Code.Canceled },
    );
    await eventually(() => expect(probe.aborted).to.equal(abortedBefore + 1));
  });

  it("turns a client deadline into DEADLINE_EXCEEDED and aborts the provider", async () => {
    const client = server.grpcClient(PROTO, SERVICE);
    const abortedBefore = probe.aborted;
    const error = await grpcError(
      // A deadline far enough out that the call reaches the provider first, on a stalled machine too.
      grpcUnary(client, "Generate", { request: { prompt: "wait", generate: {}, routing: { provider: "probe" } } }, { deadline: new Date(Date.now() + 1000) }),
    );
    expect(error.code).to.equal(grpc.status.DEADLINE_EXCEEDED);
    await eventually(() => expect(probe.aborted).to.equal(abortedBefore + 1));
  });

  it("reports a request timeout_ms as timeout with an unknown outcome", async () => {
    const images = createClient(ImageService, server.transport);
    try {
      await images.generate({ request: { prompt: "wait", operation: { case: "generate", value: {} }, routing: { provider: "probe" }, timeoutMs: 100n } });
      expect.fail("expected a timeout");
    } catch (error) {
      const e = ConnectError.from(error);
      expect(e.code).to.equal(Code.DeadlineExceeded);
      const [detail] = e.findDetails(pb.ErrorDetailSchema);
      expect(detail?.code).to.equal(pb.ErrorCode.TIMEOUT);
      expect(detail?.retryable).to.equal(false);
      expect(detail?.details!["outcome"]).to.equal("unknown");
    }
  });

  it("opens the circuit after repeated failures so one provider cannot drag the service down", async () => {
    const images = createClient(ImageService, server.transport);
    const call = () =>
      images.generate({
        request: { prompt: "BREAK", operation: { case: "generate", value: {} }, routing: { provider: "reference", model: "" } },
      });
    const codes: string[] = [];
    for (let i = 0; i < 3; i += 1) {
      try {
        await call();
      } catch (error) {
        const [detail] = ConnectError.from(error).findDetails(pb.ErrorDetailSchema);
        codes.push(pb.ErrorCode[detail!.code]);
        if (i === 2) {
          expect(ConnectError.from(error).code).to.equal(Code.Unavailable);
          expect(detail!.details!["circuit_state"]).to.equal("open");
          expect(ConnectError.from(error).metadata.get("retry-after")).to.match(/^\d+$/);
        }
      }
    }
    expect(codes).to.deep.equal(["UPSTREAM", "UPSTREAM", "OVERLOADED"]);
    const listed = await images.listProviders({});
    expect(listed.providers.find((p) => p.name === "reference")?.circuitState).to.equal("open");
    // The other provider is unaffected.
    const probeCaps = await images.getCapabilities({ provider: "probe" });
    expect(probeCaps.capabilities?.provider).to.equal("probe");

    const metrics = await (await fetch(`http://${server.adminAddr}/metrics`)).text();
    expect(metrics).to.include('mmgate_images_circuit_state{provider="reference",state="open"} 1');
    expect(metrics).to.include('mmgate_images_circuit_state{provider="probe",state="closed"} 1');
    expect(metrics).to.match(/mmgate_images_requests_total\{provider="reference",code="overloaded"\} 1/);
    expect(metrics).to.match(/mmgate_images_outputs_total\{provider="reference",result="failed"\} 3/);
    expect(metrics).to.include('mmgate_images_queue_depth{scope="global",provider=""} 0');

    // grpc.health.v1 shows each provider's circuit; the service itself stays SERVING.
    const health = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
    expect(await grpcUnary(health, "Check", { service: "mmgate.images.v1.ImageService/reference" })).to.deep.equal({ status: "NOT_SERVING" });
    expect(await grpcUnary(health, "Check", { service: "mmgate.images.v1.ImageService/probe" })).to.deep.equal({ status: "SERVING" });
    expect(await grpcUnary(health, "Check", { service: "mmgate.images.v1.ImageService" })).to.deep.equal({ status: "SERVING" });
  });
});

describe("images: GenerateStream while the server drains", function () {
  this.timeout(30_000);

  it("finishes the stream with the completed response and drops previews", async () => {
    const server = await startServer({
      modules: [imagesModule],
      config: { images: { reference: { latencyMs: 2000, defaultSize: "16x16" } } },
    });
    const events: string[] = [];
    let shutdown: Promise<void> | undefined;
    try {
      const stream = createClient(ImageService, server.transport).generateStream({
        request: { prompt: "drain", operation: { case: "generate", value: {} }, parameters: { n: 2, partialImages: 3 } },
      });
      for await (const message of stream) {
        events.push(message.event.case ?? "none");
        if (message.event.case === "started") shutdown = server.host.shutdown();
      }
    } finally {
      await (shutdown ?? server.close());
    }
    expect(events[0]).to.equal("started");
    expect(events.at(-1)).to.equal("completed");
    expect(events).to.not.include("partialImage");
  });
});
