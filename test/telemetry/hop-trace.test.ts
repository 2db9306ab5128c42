/**
 * One multimodal request through the encode hop, an Encode worker and the
 * token worker, each its own process with tracing on, exporting to a
 * receiver this test runs: one trace, each process's spans linked parent to
 * child across the calls, the media fetch's HTTP request carrying its
 * client span; and the processes' log lines naming their spans.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { expect } from "chai";
import { createClient, ConnectError, type Client } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { EncodeHopService, Lifecycle } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { eventually, startChildServer, type ChildServer } from "../support/index.js";
import { encodeRaw, pattern } from "../media/fixtures.js";
import { CLIENT, newTraceparent, SERVER, startOtlpReceiver, tracingEnv, type ReceivedSpan } from "./otlp-receiver.js";

type Receiver = Awaited<ReturnType<typeof startOtlpReceiver>>;

interface LogLine {
  msg?: string;
  trace_id?: string;
  span_id?: string;
  service?: string;
  method?: string;
}

function logLines(server: ChildServer): LogLine[] {
  return server.stdout.flatMap((line) => {
    try {
      return [JSON.parse(line) as LogLine];
    } catch {
      return [];
    }
  });
}

describe("telemetry: a multimodal request through hop → Encode worker → token worker, three processes, one trace", function () {
  this.timeout(120_000);
  let receiver: Receiver;
  let media: Server;
  let mediaUrl: string;
  /** traceparent of each request the Encode worker made for media. */
  const fetched: (string | undefined)[] = [];
  /** Its tracestate and baggage. */
  const fetchedContext: { tracestate?: string; baggage?: string }[] = [];
  let tokenWorker: ChildServer;
  let encodeWorker: ChildServer;
  let hop: ChildServer;
  let client: Client<typeof EncodeHopService>;

  before(async () => {
    receiver = await startOtlpReceiver();
    const png = await encodeRaw(pattern(16 * 8 * 3), 16, 8, 3, "png");
    media = createServer((req, res) => {
      fetched.push(req.headers["traceparent"] as string | undefined);
      fetchedContext.push({ tracestate: req.headers["tracestate"] as string | undefined, baggage: req.headers["baggage"] as string | undefined });
      if (req.url === "/fox.png") res.writeHead(200, { "content-type": "image/png" }).end(png);
      else res.writeHead(404).end();
    });
    await new Promise<void>((resolve) => media.listen(0, "127.0.0.1", resolve));
    mediaUrl = `http://127.0.0.1:${(media.address() as AddressInfo).port}`;
    [tokenWorker, encodeWorker] = await Promise.all([
      startChildServer(["--modules", "tokenWorker"], tracingEnv(receiver, "token-worker")),
      // The worker fetches from this test's loopback server; its spans go out as OTLP/JSON.
      startChildServer(["--modules", "media,encodeWorker"], { ...tracingEnv(receiver, "encode-worker", "http/json"), DYN_MM_ALLOW_INTERNAL: "1" }),
    ]);
    hop = await startChildServer(["--modules", "encodeHop"], {
      ...tracingEnv(receiver, "hop"),
      MMGATE_ENCODE_HOP__DOWNSTREAM: tokenWorker.addr,
      MMGATE_ENCODE_HOP__ENCODERS__DISCOVERY: "static",
      MMGATE_ENCODE_HOP__ENCODERS__MEMBERS: JSON.stringify([{ id: "worker", address: encodeWorker.addr }]),
    });
    client = createClient(EncodeHopService, createGrpcTransport({ baseUrl: hop.baseUrl }));
    await eventually(async () => expect((await client.getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE), { timeoutMs: 20_000 });
  });
  after(async () => {
    await hop?.close();
    await Promise.all([tokenWorker?.close(), encodeWorker?.close()]);
    await new Promise<void>((resolve) => (media ? media.close(() => resolve()) : resolve()));
    await receiver?.close();
  });

  /** Sends one Generate with `traceparent`; returns once the stream ended. */
  async function generate(url: string, traceparent: string, more: Record<string, string> = {}): Promise<void> {
    const request = { tokenIds: [1, 2], stopConditions: { maxTokens: 2 }, multiModalData: { image: { items: [{ data: { case: "url" as const, value: url } }] } } };
    try {
      for await (const _ of client.generate({ request }, { headers: { traceparent, ...more } })) void _;
    } catch (err) {
      throw new Error(`Generate failed: ${ConnectError.from(err).message}`, { cause: err });
    }
  }

  const inTrace = (traceId: string) => receiver.spans.filter((s) => s.traceId === traceId);
  function one(spans: readonly ReceivedSpan[], where: Partial<Pick<ReceivedSpan, "service" | "name" | "kind" | "parentSpanId">>): ReceivedSpan {
    const found = spans.filter((s) => Object.entries(where).every(([k, v]) => s[k as keyof ReceivedSpan] === v));
    expect(found, `one span ${JSON.stringify(where)} among ${spans.map((s) => `${s.service}:${s.name}`).join(", ")}`).to.have.length(1);
    return found[0]!;
  }

  it("every span of the three processes is in the caller's trace, and each hop's server span is the child of the caller's client span", async () => {
    const caller = newTraceparent();
    const fetchesBefore = fetched.length;
    await generate(`${mediaUrl}/fox.png`, caller.header, { tracestate: "vendor=opaque", baggage: "tenant=blue" });
    // Each process exports on its own schedule: the whole check is retried until every span has arrived.
    await eventually(() => checkTrace(inTrace(caller.traceId), caller.spanId), { timeoutMs: 15_000 });
    expect(receiver.errors).to.deep.equal([]);
    // The media server saw the GET's own context: a child of that client span.
    const get = one(inTrace(caller.traceId), { service: "encode-worker", kind: CLIENT, name: "GET" });
    expect(fetched.slice(fetchesBefore)).to.deep.equal([`00-${caller.traceId}-${get.spanId}-01`]);
    // The caller's tracestate and baggage travel on with the trace, through every process.
    expect(fetchedContext.slice(fetchesBefore)).to.deep.equal([{ tracestate: "vendor=opaque", baggage: "tenant=blue" }]);
  });

  /** The first test's trace, as it must be once every span arrived; `callerSpanId` is the caller's own span. */
  function checkTrace(spans: readonly ReceivedSpan[], callerSpanId: string): void {
    expect(new Set(spans.map((s) => s.service))).to.deep.equal(new Set(["hop", "encode-worker", "token-worker"]));

    // The hop: its server span is the caller's child; encode and forward under it, each with its client call.
    const hopServer = one(spans, { service: "hop", kind: SERVER, name: "mmgate.encode.v1.EncodeHopService/Generate" });
    expect(hopServer.parentSpanId).to.equal(callerSpanId);
    expect(hopServer.attributes).to.deep.include({ "rpc.system": "grpc", "rpc.service": "mmgate.encode.v1.EncodeHopService", "rpc.method": "Generate", "rpc.grpc.status_code": 0 });
    const encode = one(spans, { service: "hop", name: "hop.encode", parentSpanId: hopServer.spanId });
    expect(encode.attributes).to.deep.include({ "mmgate.encode.outcome": "encoded", "mmgate.encode.member": "worker" });
    const encodeCall = one(spans, { service: "hop", kind: CLIENT, name: "mmgate.encode.v1.EncodeWorkerService/Encode", parentSpanId: encode.spanId });
    expect(encodeCall.attributes).to.deep.include({ "rpc.system": "grpc", "rpc.grpc.status_code": 0, "server.address": "127.0.0.1" });
    const forward = one(spans, { service: "hop", name: "hop.forward", parentSpanId: hopServer.spanId });
    expect(forward.attributes).to.deep.include({ "mmgate.hop.encoded": true });
    const forwardCall = one(spans, { service: "hop", kind: CLIENT, name: "mmgate.llm.v1.TokenWorkerService/Generate", parentSpanId: forward.spanId });

    // The Encode worker: its server span is the hop's client span's child; per item, fetch (an HTTP client span), decode and hash.
    const workerServer = one(spans, { service: "encode-worker", kind: SERVER, name: "mmgate.encode.v1.EncodeWorkerService/Encode" });
    expect(workerServer.parentSpanId).to.equal(encodeCall.spanId);
    const item = one(spans, { service: "encode-worker", name: "encode.item", parentSpanId: workerServer.spanId });
    expect(item.attributes).to.deep.include({ "mmgate.media.modality": "image", "mmgate.media.index": 0, "mmgate.media.source": "url" });
    const fetch = one(spans, { service: "encode-worker", name: "media.fetch", parentSpanId: item.spanId });
    const get = one(spans, { service: "encode-worker", kind: CLIENT, name: "GET", parentSpanId: fetch.spanId });
    expect(get.attributes).to.deep.include({ "http.request.method": "GET", "url.full": `${mediaUrl}/fox.png`, "http.response.status_code": 200 });
    const decode = one(spans, { service: "encode-worker", name: "media.decode", parentSpanId: item.spanId });
    one(spans, { service: "encode-worker", name: "media.hash", parentSpanId: decode.spanId });

    // The token worker: its server span is the hop's forward call's child; its reads from the Encode worker's store link on.
    const tokenServer = one(spans, { service: "token-worker", kind: SERVER, name: "mmgate.llm.v1.TokenWorkerService/Generate" });
    expect(tokenServer.parentSpanId).to.equal(forwardCall.spanId);
    const reads = spans.filter((s) => s.service === "token-worker" && s.kind === CLIENT);
    expect(reads.length).to.be.greaterThan(0);
    for (const read of reads) {
      const served = spans.filter((s) => s.service === "encode-worker" && s.kind === SERVER && s.parentSpanId === read.spanId);
      expect(served, `the Encode worker's span of ${read.name}`).to.have.length(1);
    }

    // One tree: every span's parent is in the trace, but the hop's, whose parent is the caller's.
    const ids = new Set(spans.map((s) => s.spanId));
    for (const s of spans) if (s !== hopServer) expect(ids.has(s.parentSpanId), `${s.service}:${s.name}'s parent is in the trace`).to.equal(true);
  }

  it("log lines name the trace and span they were written in (the RPC line its server span, a line inside a span that span)", async () => {
    const caller = newTraceparent();
    // A URL the media server answers 404: the worker answers with an error item, the hop falls back.
    await generate(`${mediaUrl}/missing.png`, caller.header);
    const spans = await eventually(
      () => {
        const now = inTrace(caller.traceId);
        // Each process exports on its own schedule: wait for every span this test reads.
        one(now, { service: "token-worker", kind: SERVER });
        one(now, { service: "hop", kind: SERVER });
        one(now, { service: "hop", name: "hop.encode" });
        one(now, { service: "encode-worker", kind: CLIENT, name: "GET" });
        one(now, { service: "encode-worker", kind: SERVER, name: "mmgate.encode.v1.EncodeWorkerService/Encode" });
        return now;
      },
      { timeoutMs: 15_000 },
    );
    const hopServer = one(spans, { service: "hop", kind: SERVER });
    const encode = one(spans, { service: "hop", name: "hop.encode" });
    expect(encode.attributes).to.deep.include({ "mmgate.encode.outcome": "fallback", "mmgate.encode.fallback_cause": "encode_error" });
    expect(encode.status.code).to.equal(2);
    const get = one(spans, { service: "encode-worker", kind: CLIENT, name: "GET" });
    expect(get.attributes["http.response.status_code"]).to.equal(404);
    expect(get.status.code).to.equal(2);

    await eventually(() => {
      const lines = logLines(hop).filter((l) => l.trace_id === caller.traceId);
      // The RPC line: the call's server span.
      expect(lines.find((l) => l.msg === "rpc finished" && l.method === "Generate")).to.include({ span_id: hopServer.spanId });
      // The fallback warning, written inside the encode step's span.
      expect(lines.find((l) => l.msg?.startsWith("Encoder hop failed"))).to.include({ span_id: encode.spanId });
    });
    const workerServer = one(spans, { service: "encode-worker", kind: SERVER, name: "mmgate.encode.v1.EncodeWorkerService/Encode" });
    await eventually(() => {
      const line = logLines(encodeWorker).find((l) => l.trace_id === caller.traceId && l.msg === "encode failed; answering with an error item");
      expect(line).to.include({ span_id: workerServer.spanId });
    });
    // A line written outside any span (start-up) names none.
    expect(logLines(hop).find((l) => l.msg === "mmgate serving")).to.not.have.property("trace_id");
  });
});
