/**
 * The image API with tracing on, in its own process, exporting to a
 * receiver this test runs: a fan-out of four outputs through the
 * OpenAI-shaped HTTP door is one trace with a chunk span per output under
 * the request; a provider call that falls back shows both attempts and the
 * upstream HTTP call, which carries its client span; and a caller's
 * traceparent is the parent of the server span on both request paths.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { expect } from "chai";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Health } from "../../gen/grpc/health/v1/health_pb.js";
import { connectPathOnly, eventually, startChildServer, type ChildServer } from "../support/index.js";
import { CLIENT, newTraceparent, SERVER, startOtlpReceiver, tracingEnv, type ReceivedSpan } from "./otlp-receiver.js";

type Receiver = Awaited<ReturnType<typeof startOtlpReceiver>>;

describe("telemetry: the image API's spans, and a caller's traceparent on both request paths", function () {
  this.timeout(60_000);
  let receiver: Receiver;
  let upstream: Server;
  /** traceparent of each call the OpenAI-compatible provider made upstream. */
  const upstreamCalls: (string | undefined)[] = [];
  let images: ChildServer;

  before(async () => {
    receiver = await startOtlpReceiver();
    // An OpenAI-compatible upstream that is rate-limited: the provider's call fails and the request falls back.
    upstream = createServer((req, res) => {
      upstreamCalls.push(req.headers["traceparent"] as string | undefined);
      req.resume();
      res.writeHead(429, { "content-type": "application/json" }).end(JSON.stringify({ error: { message: "slow down", type: "rate_limit_error", code: "rate_limit_exceeded" } }));
    });
    await new Promise<void>((resolve) => upstream.listen(0, "127.0.0.1", resolve));
    const baseUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
    images = await startChildServer(["--modules", "images"], {
      ...tracingEnv(receiver, "images"),
      MMGATE_IMAGES__OPENAI: JSON.stringify([{ name: "oai", baseUrl, apiKeyEnv: "MMGATE_TEST_OAI_KEY" }]),
      MMGATE_TEST_OAI_KEY: "sk-test-telemetry-0123456789",
      MMGATE_IMAGES__REFERENCE__LATENCY_MS: "1",
    });
  });
  after(async () => {
    await images?.close();
    await new Promise<void>((resolve) => (upstream ? upstream.close(() => resolve()) : resolve()));
    await receiver?.close();
  });

  const inTrace = (traceId: string) => receiver.spans.filter((s) => s.traceId === traceId);
  const childrenOf = (spans: readonly ReceivedSpan[], parent: ReceivedSpan) => spans.filter((s) => s.parentSpanId === parent.spanId);
  function only(spans: readonly ReceivedSpan[], name: string): ReceivedSpan {
    const found = spans.filter((s) => s.name === name);
    expect(found, `one ${name} among ${spans.map((s) => s.name).join(", ")}`).to.have.length(1);
    return found[0]!;
  }

  it("n = 4 through /v1/images/generations: the route's span, the RPC it calls, one attempt, four chunk spans under it", async () => {
    const caller = newTraceparent();
    const res = await fetch(`${images.baseUrl}/v1/images/generations`, {
      method: "POST",
      headers: { "content-type": "application/json", traceparent: caller.header },
      body: JSON.stringify({ prompt: "a red fox", n: 4 }),
    });
    expect(res.status).to.equal(200);
    expect(((await res.json()) as { data: unknown[] }).data).to.have.length(4);
    // Spans arrive in batches: the whole check is retried until every one it reads is there.
    await eventually(() => checkFanout(inTrace(caller.traceId), caller.spanId), { timeoutMs: 15_000 });
    expect(receiver.errors).to.deep.equal([]);
  });

  function checkFanout(spans: readonly ReceivedSpan[], callerSpanId: string): void {
    const route = only(spans, "POST /v1/images/generations");
    expect(route).to.deep.include({ kind: SERVER, parentSpanId: callerSpanId });
    expect(route.attributes).to.deep.include({ "http.request.method": "POST", "http.route": "/v1/images/generations", "http.response.status_code": 200 });
    // The route's in-process calls (it reads the capabilities first), and the service's span on the other side of Generate.
    const call = spans.find((s) => s.kind === CLIENT && s.parentSpanId === route.spanId && s.name === "mmgate.images.v1.ImageService/Generate");
    expect(call, "the route's Generate call").to.not.equal(undefined);
    expect(call!.attributes).to.deep.include({ "rpc.system": "connect_rpc", "rpc.service": "mmgate.images.v1.ImageService", "rpc.method": "Generate" });
    const served = spans.find((s) => s.kind === SERVER && s.parentSpanId === call!.spanId);
    expect(served?.name).to.equal("mmgate.images.v1.ImageService/Generate");
    const attempt = only(spans, "images.attempt");
    expect(attempt.parentSpanId).to.equal(served!.spanId);
    expect(attempt.attributes).to.deep.include({ "mmgate.images.provider": "reference", "mmgate.images.attempt": 1, "mmgate.images.fallback": false });
    const chunks = childrenOf(spans, attempt).filter((s) => s.name === "images.chunk");
    expect(chunks.map((c) => c.attributes["mmgate.images.chunk.offset"]).sort()).to.deep.equal([0, 1, 2, 3]);
    for (const chunk of chunks) expect(chunk.attributes["mmgate.images.chunk.count"]).to.equal(1);
  }

  it("a provider call that fails falls back: both attempts, the failed one's upstream HTTP call, which carried its own span's context", async () => {
    const caller = newTraceparent();
    const callsBefore = upstreamCalls.length;
    const res = await fetch(`${images.baseUrl}/mmgate.images.v1.ImageService/Generate`, {
      method: "POST",
      headers: { "content-type": "application/json", traceparent: caller.header },
      body: JSON.stringify({ request: { prompt: "a red fox", parameters: { n: 1 }, routing: { provider: "oai", fallbacks: [{ provider: "reference" }] } } }),
    });
    expect(res.status, await res.clone().text()).to.equal(200);
    const post = await eventually(() => checkFallback(inTrace(caller.traceId), caller.spanId), { timeoutMs: 15_000 });
    expect(upstreamCalls.slice(callsBefore)).to.deep.equal([`00-${caller.traceId}-${post.spanId}-01`]);
  });

  /** The fallback request's trace, once whole; returns the upstream call's span. */
  function checkFallback(spans: readonly ReceivedSpan[], callerSpanId: string): ReceivedSpan {
    const served = only(spans, "mmgate.images.v1.ImageService/Generate");
    expect(served).to.deep.include({ kind: SERVER, parentSpanId: callerSpanId });
    const attempts = spans.filter((s) => s.name === "images.attempt").sort((a, b) => Number(a.attributes["mmgate.images.attempt"]) - Number(b.attributes["mmgate.images.attempt"]));
    expect(attempts.map((a) => [a.parentSpanId, a.attributes["mmgate.images.provider"], a.attributes["mmgate.images.fallback"], a.status.code])).to.deep.equal([
      [served.spanId, "oai", false, 2],
      [served.spanId, "reference", true, 0],
    ]);
    expect(attempts[0]!.attributes["error.type"]).to.equal("rate_limited");
    const post = spans.find((s) => s.kind === CLIENT && s.name === "POST");
    expect(post, "the upstream call's span").to.not.equal(undefined);
    expect(post!.attributes).to.deep.include({ "http.request.method": "POST", "http.response.status_code": 429, "mmgate.images.provider": "oai" });
    expect(post!.attributes["url.full"]).to.match(/^http:\/\/127\.0\.0\.1:\d+\/v1\/images\/generations$/);
    // Under the failed attempt (through its fan-out call), and its context is what the upstream got.
    const ids = new Map(spans.map((s) => [s.spanId, s]));
    let up: ReceivedSpan | undefined = post;
    while (up !== undefined && up !== attempts[0]) up = ids.get(up.parentSpanId);
    expect(up, "the POST is under the first attempt").to.equal(attempts[0]);
    return post!;
  }

  it("a traceparent in is the server span's parent, on the lean path (gRPC over HTTP/2) and on connect's (Connect over HTTP/1.1)", async () => {
    const lean = newTraceparent();
    const health = createClient(Health, createGrpcTransport({ baseUrl: images.baseUrl }));
    await health.check({}, { headers: { traceparent: lean.header } });
    const viaConnect = newTraceparent();
    const res = await fetch(`${images.baseUrl}/grpc.health.v1.Health/Check`, {
      method: "POST",
      headers: { "content-type": "application/json", traceparent: viaConnect.header },
      body: "{}",
    });
    expect(res.status).to.equal(200);
    const [grpcSpan, connectSpan] = await eventually(
      () => [lean, viaConnect].map((caller) => only(inTrace(caller.traceId), "grpc.health.v1.Health/Check")),
      { timeoutMs: 15_000 },
    );
    expect(grpcSpan).to.deep.include({ kind: SERVER, parentSpanId: lean.spanId, service: "images" });
    expect(grpcSpan!.attributes).to.deep.include({ "rpc.system": "grpc", "rpc.service": "grpc.health.v1.Health", "rpc.method": "Check", "rpc.grpc.status_code": 0 });
    expect(connectSpan).to.deep.include({ kind: SERVER, parentSpanId: viaConnect.spanId });
    expect(connectSpan!.attributes).to.deep.include({ "rpc.system": "connect_rpc", "rpc.method": "Check" });
    // Each went the way this test says: the lean path took the gRPC call (unless the suite runs with it off), never the HTTP/1.1 one.
    // The RPC log line is written when the stream closes, which may be after the client has its answer.
    await eventually(() => {
      const lines = images.stdout.filter((l) => l.includes('"rpc finished"') && l.includes('"method":"Check"'));
      const line = (traceId: string) => JSON.parse(lines.find((l) => l.includes(traceId)) ?? "{}") as { protocol: string; span_id: string };
      expect(line(lean.traceId)).to.include({ protocol: "grpc", span_id: grpcSpan!.spanId });
      expect(line(viaConnect.traceId)).to.include({ protocol: "connect", span_id: connectSpan!.spanId });
    });
    const metrics = await (await fetch(`http://${images.adminAddr}/metrics`)).text();
    const taken = Number(/^mmgate_rpc_lean_path_calls_total (\d+)/m.exec(metrics)?.[1] ?? "0");
    if (connectPathOnly) expect(taken).to.equal(0);
    else expect(taken).to.be.greaterThan(0);
  });
});
