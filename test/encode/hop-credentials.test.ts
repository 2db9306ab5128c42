/**
 * The hop's outbound calls carry credentials and context: the caller's
 * `authorization` passed on by default (one token domain), a channel's own
 * credential (`channel.token` / `tokenFile`, `downstreamChannel`) in its
 * place, and the context metadata allow-list (x-request-id, traceparent,
 * tracestate, baggage, `forwardHeaders`), never protocol or other headers.
 * Workers in their own servers, auth on, both RPC paths.
 */
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { expect } from "chai";
import { z } from "zod";
import { EncodeHopService, EncodeWorkerService, Lifecycle } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { FinishReason_Kind } from "../../gen/mmgate/llm/v1/output_pb.js";
import { TokenWorkerService } from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { encodeHopModule, encodeWorkerModule, tokenWorkerModule } from "../../src/encode/index.js";
import { mediaModule } from "../../src/media/index.js";
import { bindService, defineModule, resolveConfig } from "../../src/server/index.js";
import { eventually, startServer, type InProcessServer } from "../support/index.js";
import { encodeRaw, pattern } from "../media/fixtures.js";

const HOP_TOKEN = "hop-callers-token-0123456789";
const WORKER_TOKEN = "worker-service-token-0123456789";

function transportWith(baseUrl: string, headers: Record<string, string>): Transport {
  const add: Interceptor = (next) => (req) => {
    for (const [name, value] of Object.entries(headers)) req.header.set(name, value);
    return next(req);
  };
  return createGrpcTransport({ baseUrl, interceptors: [add] });
}

async function encodedReport(hop: InProcessServer, transport: Transport, request: object): Promise<boolean> {
  let present: unknown;
  for await (const res of createClient(EncodeHopService, transport).generate({ request })) {
    const fields = (res.output?.data?.extraArgs?.kind?.value as { fields?: Record<string, { kind: { value: unknown } }> } | undefined)?.fields;
    if (fields?.["encoder_result_present"]) present = fields["encoder_result_present"].kind.value;
  }
  void hop;
  return present === true;
}

describe("encode: the hop's outbound credentials, with auth on", function () {
  this.timeout(20_000);
  let png: Buffer;
  let multimodal: object;
  const servers: InProcessServer[] = [];
  before(async () => {
    png = await encodeRaw(pattern(8 * 8 * 3), 8, 8, 3, "png");
    multimodal = { tokenIds: [1], multiModalData: { image: { items: [{ data: { case: "url", value: `data:image/png;base64,${png.toString("base64")}` } }] } } };
  });
  afterEach(async () => {
    for (const s of servers.splice(0).reverse()) await s.close();
  });
  const start = async (...args: Parameters<typeof startServer>) => {
    const server = await startServer(...args);
    servers.push(server);
    return server;
  };
  const hopWith = async (workerAddr: string, encodeHop: Record<string, unknown> = {}) =>
    start({
      modules: [tokenWorkerModule, encodeHopModule],
      config: { auth: { token: HOP_TOKEN }, encodeHop: { encoders: { discovery: "static", members: [{ id: "w", address: workerAddr }] }, ...encodeHop } },
    });

  it("passes the caller's token on to an Encode worker in another server of the same token domain", async () => {
    const worker = await start({ modules: [mediaModule, encodeWorkerModule], config: { auth: { token: HOP_TOKEN } } });
    const hop = await hopWith(worker.addr);
    const transport = transportWith(hop.baseUrl, { authorization: `Bearer ${HOP_TOKEN}` });
    await eventually(async () => expect((await createClient(EncodeHopService, hop.transport).getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE));
    expect(await encodedReport(hop, transport, multimodal)).to.equal(true);
    expect((await createClient(EncodeHopService, hop.transport).getStatus({})).fallbacks).to.deep.equal({});
  });

  it("with passAuthorization off, the caller's token stays behind for a remote worker (refused, so the request falls back) and still reaches the local downstream", async () => {
    const worker = await start({ modules: [mediaModule, encodeWorkerModule], config: { auth: { token: HOP_TOKEN } } });
    const hop = await hopWith(worker.addr, { passAuthorization: false, downstream: "local" });
    const transport = transportWith(hop.baseUrl, { authorization: `Bearer ${HOP_TOKEN}` });
    await eventually(async () => expect((await createClient(EncodeHopService, hop.transport).getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE));
    expect(await encodedReport(hop, transport, multimodal)).to.equal(false);
    expect((await createClient(EncodeHopService, hop.transport).getStatus({})).fallbacks["transport"]).to.equal(1n);
  });

  it("a service credential (channel.token, or tokenFile) replaces the caller's for a worker of another token domain", async () => {
    const worker = await start({ modules: [mediaModule, encodeWorkerModule], config: { auth: { token: WORKER_TOKEN } } });
    const dir = mkdtempSync(join(tmpdir(), "mmgate-token-"));
    const tokenFile = join(dir, "token");
    writeFileSync(tokenFile, `${WORKER_TOKEN}\n`);
    for (const channel of [{ token: WORKER_TOKEN }, { tokenFile }]) {
      const hop = await hopWith(worker.addr, { channel });
      const transport = transportWith(hop.baseUrl, { authorization: `Bearer ${HOP_TOKEN}` });
      await eventually(async () => expect((await createClient(EncodeHopService, hop.transport).getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE));
      expect(await encodedReport(hop, transport, multimodal), JSON.stringify(Object.keys(channel))).to.equal(true);
    }
  });

  it("the downstream gets its own credential from downstreamChannel", async () => {
    const tokenWorker = await start({ modules: [tokenWorkerModule], config: { auth: { token: WORKER_TOKEN } } });
    const hop = await start({
      modules: [encodeHopModule],
      config: { auth: { token: HOP_TOKEN }, encodeHop: { downstream: tokenWorker.addr, encoders: { discovery: "off" }, downstreamChannel: { token: WORKER_TOKEN } } },
    });
    const transport = transportWith(hop.baseUrl, { authorization: `Bearer ${HOP_TOKEN}` });
    let outputs = 0;
    for await (const _ of createClient(EncodeHopService, transport).generate({ request: { tokenIds: [1, 2] } })) outputs++;
    expect(outputs).to.be.greaterThan(1);
  });

  it("refuses a channel with both token and tokenFile, and protocol headers in forwardHeaders, naming the key", () => {
    expect(() => resolveConfig({ encodeHop: { channel: { token: "a".repeat(20), tokenFile: "/x" } } }, [encodeHopModule])).to.throw(/encodeHop\.channel\.tokenFile/);
    for (const name of ["te", "grpc-timeout", "Content-Type", "connection", ":path", "x-request-id"]) {
      expect(() => resolveConfig({ encodeHop: { forwardHeaders: [name] } }, [encodeHopModule]), name).to.throw(/encodeHop\.forwardHeaders/);
    }
  });
});

describe("encode: the hop passes the caller's context on to both calls, and nothing else", function () {
  this.timeout(20_000);
  const seen: { encode: Record<string, string>[]; generate: Record<string, string>[] } = { encode: [], generate: [] };
  const headersOf = (h: Headers) => Object.fromEntries([...h.entries()]);
  const recordingWorkers = defineModule({
    name: "recordingWorkers",
    description: "test: an Encode worker and a token worker that record the headers of each call",
    configSchema: z.object({}),
    create: () => ({
      services: [
        bindService(EncodeWorkerService, {
          async *encode(req, ctx) {
            if (req.request?.isProbe !== true) seen.encode.push(headersOf(ctx.requestHeader));
            yield { output: { data: { finishReason: { kind: FinishReason_Kind.STOP }, encoderResult: { items: [] } } } };
          },
        }),
        bindService(TokenWorkerService, {
          async *generate(req, ctx) {
            if (req.request?.isProbe !== true) seen.generate.push(headersOf(ctx.requestHeader));
            yield { output: { data: { finishReason: { kind: FinishReason_Kind.STOP } } } };
          },
        }),
      ],
    }),
  });
  let workers: InProcessServer;
  let hop: InProcessServer;
  before(async () => {
    workers = await startServer({ modules: [recordingWorkers], config: { auth: { token: HOP_TOKEN } } });
    hop = await startServer({
      modules: [encodeHopModule],
      config: {
        auth: { token: HOP_TOKEN },
        encodeHop: { downstream: workers.addr, encoders: { discovery: "static", members: [{ id: "r", address: workers.addr }] }, forwardHeaders: ["x-tenant"] },
      },
    });
  });
  after(async () => {
    await hop?.close();
    await workers?.close();
  });

  it("sends authorization, x-request-id, traceparent, tracestate, baggage and the configured extras to the Encode and token workers", async () => {
    await eventually(async () => expect((await createClient(EncodeHopService, hop.transport).getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE));
    const inbound = {
      authorization: `Bearer ${HOP_TOKEN}`,
      "x-request-id": "req-ctx-1",
      traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      tracestate: "vendor=opaque",
      baggage: "tenant=acme",
      "x-tenant": "acme",
      "x-not-listed": "stays",
      cookie: "session=secret",
    };
    const transport = transportWith(hop.baseUrl, inbound);
    for await (const _ of createClient(EncodeHopService, transport).generate({
      request: { tokenIds: [1], multiModalData: { image: { items: [{ data: { case: "url", value: "https://example.test/a.png" } }] } } },
    }))
      void _;
    expect(seen.encode).to.have.length(1);
    expect(seen.generate).to.have.length(1);
    for (const [call, headers] of [["encode", seen.encode[0]!], ["generate", seen.generate[0]!]] as const) {
      for (const name of ["authorization", "x-request-id", "traceparent", "tracestate", "baggage", "x-tenant"] as const) {
        expect(headers[name], `${call}: ${name}`).to.equal(inbound[name]);
      }
      expect(headers, call).to.not.have.any.keys("x-not-listed", "cookie");
    }
  });
});
