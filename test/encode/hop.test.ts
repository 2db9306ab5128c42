import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { expect } from "chai";
import * as grpc from "@grpc/grpc-js";
import { Code, ConnectError, createClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { z } from "zod";
import { EncodeHopService, Lifecycle } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { Health, HealthCheckResponse_ServingStatus as S } from "../../gen/grpc/health/v1/health_pb.js";
import { TokenWorkerService } from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { encodeHopModule, encodeWorkerModule, tokenWorkerModule } from "../../src/encode/index.js";
import { defineEncodeHopModule } from "../../src/encode/module.js";
import { bindService, defineModule } from "../../src/server/index.js";
import { mediaModule } from "../../src/media/index.js";
import { connectErrorOf, eventually, grpcServerStream, startServer, type InProcessServer } from "../support/index.js";
import { encodeRaw, pattern } from "../media/fixtures.js";

function metadataWith(token: string): grpc.Metadata {
  const metadata = new grpc.Metadata();
  metadata.set("authorization", `Bearer ${token}`);
  return metadata;
}

interface Report {
  encoder_result_present: boolean;
  media_items: number;
  encoder_items: number;
}

/** The token worker's final report, from the last output's extra_args. */
function reportOf(outputs: { output?: { data?: { extraArgs?: unknown } } }[]): Report {
  const extra = outputs.at(-1)?.output?.data?.extraArgs as { kind?: { case?: string; value?: unknown } } | undefined;
  const value = extra?.kind?.value as { fields?: Record<string, { kind: { value: unknown } }> } | undefined;
  if (!value?.fields) throw new Error("no report in the last output");
  // The counts only: the token worker's per-item receipts are tested in receiver.test.ts.
  const counts = ["encoder_result_present", "media_items", "encoder_items"];
  return Object.fromEntries(Object.entries(value.fields).filter(([k]) => counts.includes(k)).map(([k, v]) => [k, v.kind.value])) as unknown as Report;
}

const TOKEN = "hop-test-token-0123456789";

/** A transport that presents `token` (none when undefined), as a client of a server with auth on must. */
function transportWith(baseUrl: string, token: string | undefined): Transport {
  const auth: Interceptor = (next) => (req) => {
    if (token !== undefined) req.header.set("authorization", `Bearer ${token}`);
    return next(req);
  };
  return createGrpcTransport({ baseUrl, interceptors: [auth] });
}

// The hop as deployed with auth on (its own calls to the Encode and token
// workers must carry the caller's credentials) and off; both RPC paths run it.
for (const token of [undefined, TOKEN]) describe(`encode: the hop in one process (encode worker and token worker in memory), auth ${token ? "on" : "off"}`, () => {
  let server: InProcessServer;
  let transport: Transport;
  let png: Buffer;
  const dataUrl = (bytes: Buffer) => `data:image/png;base64,${bytes.toString("base64")}`;
  const multimodal = (url: string) => ({ tokenIds: [1, 2, 3], multiModalData: { image: { items: [{ data: { case: "url" as const, value: url } }] } } });

  before(async () => {
    png = await encodeRaw(pattern(16 * 16 * 3), 16, 16, 3, "png");
    server = await startServer({ modules: [mediaModule, encodeWorkerModule, tokenWorkerModule, encodeHopModule], config: token ? { auth: { token } } : {} });
    transport = transportWith(server.baseUrl, token);
    await eventually(async () => expect((await createClient(EncodeHopService, server.transport).getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE));
  });
  after(() => server.close());

  async function generate(request: object) {
    const out = [];
    for await (const res of createClient(EncodeHopService, transport).generate({ request })) out.push(res);
    return out;
  }

  if (token) {
    it("refuses a caller without the token, and encodes for one with it (no fallback: its own calls carry the caller's credential)", async () => {
      const refused = await connectErrorOf(
        (async () => {
          for await (const _ of createClient(EncodeHopService, server.transport).generate({ request: multimodal(dataUrl(png)) })) void _;
        })(),
      );
      expect(refused.code).to.equal(Code.Unauthenticated);
      const before = await createClient(EncodeHopService, server.transport).getStatus({});
      expect(reportOf(await generate(multimodal(dataUrl(png))))).to.deep.include({ encoder_result_present: true, encoder_items: 1 });
      const after = await createClient(EncodeHopService, server.transport).getStatus({});
      expect(after.fallbacks).to.deep.equal(before.fallbacks);
      expect(after.encoded).to.equal(before.encoded + 1n);
    });
  }

  it("is ready once its Encode target is bound", async () => {
    expect((await createClient(Health, server.transport).check({ service: "" })).status).to.equal(S.SERVING);
  });

  it("a multimodal request reaches the token worker with an encoder_result", async () => {
    const report = reportOf(await generate(multimodal(dataUrl(png))));
    expect(report).to.deep.include({ encoder_result_present: true, media_items: 1, encoder_items: 1 });
  });

  it("a text-only request passes through unchanged", async () => {
    const report = reportOf(await generate({ tokenIds: [5, 6] }));
    expect(report).to.deep.include({ encoder_result_present: false, media_items: 0, encoder_items: 0 });
  });

  it("bad media falls back: the request still succeeds, without an encoder_result, media kept", async () => {
    const before = (await createClient(EncodeHopService, server.transport).getStatus({})).fallbacks["encode_error"] ?? 0n;
    const report = reportOf(await generate(multimodal("http://127.0.0.1:1/blocked.png")));
    expect(report).to.deep.include({ encoder_result_present: false, media_items: 1, encoder_items: 0 });
    const status = await createClient(EncodeHopService, server.transport).getStatus({});
    expect(status.fallbacks["encode_error"]).to.equal(before + 1n);
  });

  it("GetStatus reports the lifecycle, the member and the counters", async () => {
    const status = await createClient(EncodeHopService, server.transport).getStatus({});
    expect(status.lifecycle).to.equal(Lifecycle.ACTIVE);
    expect(status.targetId).to.equal("local");
    expect(status.members.map((m) => m.id)).to.deep.equal(["local"]);
    expect(status.encoded >= 1n).to.equal(true);
    expect(status.passthrough >= 1n).to.equal(true);
  });

  it("serves @grpc/grpc-js clients", async () => {
    const client = server.grpcClient("mmgate/encode/v1/encode.proto", "mmgate.encode.v1.EncodeHopService");
    const outputs = await grpcServerStream<{ output?: { data?: { finishReason?: { kind: string } } } }>(
      client,
      "Generate",
      { request: { tokenIds: [1], multiModalData: { image: { items: [{ url: dataUrl(png) }] } } } },
      { deadline: new Date(Date.now() + 15_000), metadata: token ? metadataWith(token) : new grpc.Metadata() },
    );
    expect(outputs.length).to.be.greaterThan(1);
    expect(outputs.at(-1)?.output?.data?.finishReason?.kind).to.equal("KIND_LENGTH");
  });
});

describe("encode: the hop's start-up checks", () => {
  it("refuses to start with a local downstream that this process does not serve", async () => {
    const error = await startServer({ modules: [mediaModule, encodeWorkerModule, encodeHopModule] }).catch((e: unknown) => e);
    expect((error as Error).message).to.equal(
      'encodeHop.downstream is "local" but this process does not serve mmgate.llm.v1.TokenWorkerService: add "tokenWorker" to modules, or point encodeHop.downstream elsewhere',
    );
  });

  it("refuses static discovery without members, naming the field", async () => {
    const error = await startServer({ modules: [tokenWorkerModule, encodeHopModule], config: { encodeHop: { encoders: { discovery: "static" } } } }).catch(
      (e: unknown) => e,
    );
    expect((error as Error).message).to.contain("encoders.members: static discovery needs at least one member");
  });

  it("passes everything through with discovery off, and is ready at once", async () => {
    const server = await startServer({ modules: [tokenWorkerModule, encodeHopModule], config: { encodeHop: { encoders: { discovery: "off" } } } });
    try {
      expect((await createClient(Health, server.transport).check({ service: "" })).status).to.equal(S.SERVING);
      const outputs = [];
      for await (const res of createClient(EncodeHopService, server.transport).generate({
        request: { tokenIds: [1], multiModalData: { image: { items: [{ data: { case: "url", value: "data:image/png;base64,AA==" } }] } } },
      }))
        outputs.push(res);
      expect(reportOf(outputs)).to.deep.equal({ encoder_result_present: false, media_items: 1, encoder_items: 0 });
      expect((await createClient(EncodeHopService, server.transport).getStatus({})).lifecycle).to.equal(Lifecycle.UNAVAILABLE);
    } finally {
      await server.close();
    }
  });
});

describe("encode: the hop's metrics", () => {
  it("counts attempts, fallbacks by cause, passthrough, and the encode duration; the lifecycle gauge says active", async () => {
    const server = await startServer({ modules: [mediaModule, encodeWorkerModule, tokenWorkerModule, encodeHopModule] });
    try {
      const hop = createClient(EncodeHopService, server.transport);
      await eventually(async () => expect((await hop.getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE));
      const png = await encodeRaw(pattern(4 * 4 * 3), 4, 4, 3, "png");
      const send = async (request: object) => {
        for await (const _ of hop.generate({ request })) void _;
      };
      await send({ tokenIds: [1], multiModalData: { image: { items: [{ data: { case: "url", value: `data:image/png;base64,${png.toString("base64")}` } }] } } });
      await send({ tokenIds: [1], multiModalData: { image: { items: [{ data: { case: "url", value: "http://127.0.0.1:1/x" } }] } } });
      await send({ tokenIds: [1] });
      const text = await server.host.metrics.registry.metrics();
      expect(text).to.match(/^encode_attempts_total 2$/m);
      expect(text).to.match(/^encode_fallbacks_total\{cause="encode_error"\} 1$/m);
      expect(text).to.match(/^encode_passthrough_total 1$/m);
      expect(text).to.match(/^encode_duration_seconds_count\{outcome="encoded"\} 1$/m);
      expect(text).to.match(/^encode_duration_seconds_count\{outcome="fallback"\} 1$/m);
      expect(text).to.match(/^encode_hop_lifecycle\{state="active"\} 1$/m);
      expect(text).to.match(/^encode_member_requests_total\{member="local"\} 1$/m);
    } finally {
      await server.close();
    }
  });
});

describe("encode: an Encode worker that dies mid-stream", () => {
  it("the request still succeeds, by fallback, and the failure is counted against the member", async () => {
    // A worker that answers the Encode call with headers and half a message, then drops the connection.
    const dying = http2.createServer();
    dying.on("stream", (stream) => {
      stream.respond({ ":status": 200, "content-type": "application/grpc" });
      stream.write(Buffer.from([0, 0, 0, 0, 100, 1, 2, 3]));
      setImmediate(() => stream.session?.destroy());
    });
    await new Promise<void>((resolve) => dying.listen(0, "127.0.0.1", resolve));
    const address = `127.0.0.1:${(dying.address() as AddressInfo).port}`;
    const server = await startServer({
      modules: [tokenWorkerModule, encodeHopModule],
      config: { encodeHop: { encoders: { discovery: "static", members: [{ id: "dying", address }] } } },
    });
    try {
      const hop = createClient(EncodeHopService, server.transport);
      await eventually(async () => expect((await hop.getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE));
      const outputs = [];
      for await (const res of hop.generate({
        request: { tokenIds: [1], multiModalData: { image: { items: [{ data: { case: "url", value: "https://example.test/a.png" } }] } } },
      }))
        outputs.push(res);
      expect(reportOf(outputs)).to.deep.equal({ encoder_result_present: false, media_items: 1, encoder_items: 0 });
      const status = await hop.getStatus({});
      expect(status.fallbacks["transport"]).to.equal(1n);
      expect(status.members.map((m) => [m.id, m.address, m.requests, m.failures])).to.deep.equal([["dying", address, 1n, 1n]]);
      expect(status.targetId).to.equal("static");
    } finally {
      await server.close();
      dying.close();
    }
  });
});

describe("encode: a caller that leaves after the encode", () => {
  it("still gets the encoded request to the token worker (it owns the transfer), and the caller sees CANCELED", async () => {
    // A token worker that records the requests that reached it.
    const received: { encoded: boolean; mediaItems: number }[] = [];
    const recordingTokenWorker = defineModule({
      name: "recordingTokenWorker",
      description: "test: records each request",
      configSchema: z.object({}),
      create: () => ({
        services: [
          bindService(TokenWorkerService, {
            async *generate(req) {
              // The hop's start-up probe is not a request.
              if (req.request?.isProbe !== true) received.push({ encoded: req.request?.encoderResult !== undefined, mediaItems: req.request?.multiModalData["image"]?.items.length ?? 0 });
              yield { output: {} };
            },
          }),
        ],
      }),
    });
    const caller = new AbortController();
    // The seam holds the call between the encode and the downstream call
    // until the caller has gone and the hop has seen it.
    const hopModule = defineEncodeHopModule({
      afterEncode: async ({ encoded, signal }) => {
        if (!encoded) return;
        caller.abort();
        await eventually(() => expect(signal.aborted, "the hop sees the caller gone").to.equal(true));
      },
    });
    const png = await encodeRaw(pattern(16 * 16 * 3), 16, 16, 3, "png");
    const server = await startServer({ modules: [mediaModule, encodeWorkerModule, recordingTokenWorker, hopModule] });
    try {
      const hop = createClient(EncodeHopService, server.transport);
      await eventually(async () => expect((await hop.getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE));
      const request = { tokenIds: [1], multiModalData: { image: { items: [{ data: { case: "url" as const, value: `data:image/png;base64,${png.toString("base64")}` } }] } } };
      const outcome = await (async () => {
        for await (const _ of hop.generate({ request }, { signal: caller.signal })) void _;
        return "completed";
      })().catch((e: unknown) => ConnectError.from(e).code);
      expect(outcome).to.equal(Code.Canceled);
      await eventually(() => expect(received).to.deep.equal([{ encoded: true, mediaItems: 1 }]));
    } finally {
      await server.close();
    }
  });

  it("a caller that leaves (or whose deadline passes) while the downstream call is starting does not cut it before the receiver has the request", async () => {
    // A token worker slow to take the request: it answers its first output only after a pause, and says whether the call was cut meanwhile.
    const taken: { encoded: boolean; cutBeforeFirstOutput: boolean }[] = [];
    let started!: () => void;
    const downstreamStarted = new Promise<void>((resolve) => (started = resolve));
    const slowTokenWorker = defineModule({
      name: "slowTokenWorker",
      description: "test: takes its time before the first output",
      configSchema: z.object({}),
      create: () => ({
        services: [
          bindService(TokenWorkerService, {
            async *generate(req, ctx) {
              if (req.request?.isProbe === true) {
                yield { output: {} };
                return;
              }
              started();
              await new Promise((r) => setTimeout(r, 150));
              taken.push({ encoded: req.request?.encoderResult !== undefined, cutBeforeFirstOutput: ctx.signal.aborted });
              yield { output: {} };
              yield { output: {} };
            },
          }),
        ],
      }),
    });
    const png = await encodeRaw(pattern(8 * 8 * 3), 8, 8, 3, "png");
    const server = await startServer({ modules: [mediaModule, encodeWorkerModule, slowTokenWorker, encodeHopModule] });
    try {
      const hop = createClient(EncodeHopService, server.transport);
      await eventually(async () => expect((await hop.getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE));
      const request = { tokenIds: [1], multiModalData: { image: { items: [{ data: { case: "url" as const, value: `data:image/png;base64,${png.toString("base64")}` } }] } } };
      // One caller cancels as the downstream call starts, one has a deadline that passes then.
      const caller = new AbortController();
      void downstreamStarted.then(() => caller.abort());
      const cancelled = await (async () => {
        for await (const _ of hop.generate({ request }, { signal: caller.signal })) void _;
      })().catch((e: unknown) => ConnectError.from(e).code);
      expect(cancelled).to.equal(Code.Canceled);
      await eventually(() => expect(taken).to.deep.equal([{ encoded: true, cutBeforeFirstOutput: false }]));
      const late = await (async () => {
        for await (const _ of hop.generate({ request }, { timeoutMs: 60 })) void _;
      })().catch((e: unknown) => ConnectError.from(e).code);
      expect(late).to.equal(Code.DeadlineExceeded);
      await eventually(() => expect(taken).to.have.length(2));
      expect(taken[1]).to.deep.equal({ encoded: true, cutBeforeFirstOutput: false });
    } finally {
      await server.close();
    }
  });
});
