import { expect } from "chai";
import { z } from "zod";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { createContextValues, type HandlerContext } from "@connectrpc/connect";
import { createAsyncIterable } from "@connectrpc/connect/protocol";
import { GenerateRequestSchema as HopGenerateRequestSchema } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { PreprocessedRequestSchema } from "../../gen/mmgate/llm/v1/request_pb.js";
import { GenerateRequestSchema, GenerateResponseSchema, TokenWorkerService } from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { encodeHopModule, tokenWorkerModule } from "../../src/encode/index.js";
import { channelDefaults, createChannel } from "../../src/rpc/index.js";
import { bindService, defineModule } from "../../src/server/index.js";
import { acceptsEncoded, EncodedMessage, encodedResponsesKey, requestEncoding } from "../../src/wire/index.js";
import { connectPathOnly, startServer, type InProcessServer } from "../support/index.js";
import { grpcFrame, parseGrpcFrames, rawH2 } from "../support/raw-h2.js";

/** A gRPC request's headers for `path`, as a client sends them. */
const grpcHeaders = (path: string) => ({ ":method": "POST", ":path": path, "content-type": "application/grpc", te: "trailers" });

const request = { tokenIds: [1, 2, 3, 4, 5], samplingOptions: { temperature: 0.5 }, stopConditions: { maxTokens: 6 } };

describe("encode: the hop relays the token worker's frames", () => {
  let worker: InProcessServer;
  let hop: InProcessServer;
  before(async () => {
    worker = await startServer({ modules: [tokenWorkerModule] });
    hop = await startServer({
      modules: [encodeHopModule],
      config: { encodeHop: { encoders: { discovery: "off" }, downstream: worker.addr, downstreamCheckIntervalMs: 0 } },
    });
  });
  after(async () => {
    await hop?.close();
    await worker?.close();
  });

  it("answers a text-only request with the very bytes the token worker sends (the two GenerateRequest and GenerateResponse types share a wire shape)", async () => {
    // One request body for both: the hop's GenerateRequest and the token worker's encode alike.
    const body = grpcFrame(toBinary(HopGenerateRequestSchema, create(HopGenerateRequestSchema, { request })));
    expect(Buffer.from(toBinary(GenerateRequestSchema, create(GenerateRequestSchema, { request })))).to.deep.equal(body.subarray(5));
    const direct = await rawH2(worker.addr, { headers: grpcHeaders("/mmgate.llm.v1.TokenWorkerService/Generate"), body });
    const relayed = await rawH2(hop.addr, { headers: grpcHeaders("/mmgate.encode.v1.EncodeHopService/Generate"), body });
    expect(direct.trailers?.["grpc-status"]).to.equal("0");
    expect(relayed.trailers?.["grpc-status"]).to.equal("0");
    const frames = parseGrpcFrames(direct.data);
    expect(frames.rest.length).to.equal(0);
    expect(frames.frames.length).to.be.greaterThan(2);
    expect(relayed.data.equals(direct.data), "the hop's DATA bytes equal the token worker's").to.equal(true);
  });
});

describe("encode: the hop passes a request it does not change on as it came", () => {
  const seen: Buffer[] = [];
  let worker: InProcessServer;
  let hop: InProcessServer;
  before(async () => {
    // A token worker that notes the request it got, as its bytes.
    const recorder = defineModule({
      name: "recordingTokenWorker",
      description: "test: notes the bytes of each request",
      configSchema: z.object({}),
      create: () => ({
        services: [
          bindService(TokenWorkerService, {
            async *generate(req, ctx: HandlerContext) {
              seen.push(Buffer.from(requestEncoding(ctx) ?? toBinary(GenerateRequestSchema, req)));
              yield { output: { id: "r", event: "token" } };
            },
          }),
        ],
      }),
    });
    worker = await startServer({ modules: [recorder] });
    hop = await startServer({
      modules: [encodeHopModule],
      config: { encodeHop: { encoders: { discovery: "off" }, downstream: worker.addr, downstreamCheckIntervalMs: 0 } },
    });
  });
  after(async () => {
    await hop?.close();
    await worker?.close();
  });

  it(`a text-only request reaches the token worker ${connectPathOnly ? "parsed and written again (connect path)" : "byte for byte (lean path)"}, a field neither knows included`, async () => {
    // Field 1000 of PreprocessedRequest (varint 1), unknown to both schemas, ahead of the known ones: a hop that
    // parses and writes again moves it to the end (protobuf-es writes unknown fields last); one that sends the bytes it read does not.
    const inner = new Uint8Array([0xc0, 0x3e, 0x01, ...toBinary(PreprocessedRequestSchema, create(PreprocessedRequestSchema, request))]);
    const length = inner.length < 0x80 ? [inner.length] : [(inner.length & 0x7f) | 0x80, inner.length >> 7];
    const message = new Uint8Array([0x0a, ...length, ...inner]);
    const res = await rawH2(hop.addr, { headers: grpcHeaders("/mmgate.encode.v1.EncodeHopService/Generate"), body: grpcFrame(message) });
    expect(res.trailers?.["grpc-status"], String(res.trailers?.["grpc-message"])).to.equal("0");
    expect(seen).to.have.length(1);
    if (connectPathOnly) {
      expect(seen[0]!.equals(Buffer.from(message))).to.equal(false);
      expect(fromBinary(GenerateRequestSchema, seen[0]!)).to.deep.equal(fromBinary(GenerateRequestSchema, message));
    } else expect(seen[0]!.equals(Buffer.from(message)), "the token worker got the hop's request bytes").to.equal(true);
  });
});

describe("wire: a message relayed as its encoding", () => {
  // A field this schema does not know (field 15, varint 1): kept only by a relay that writes the bytes it read.
  const unknownField = Uint8Array.of(0x78, 0x01);
  const output = { id: "fixed", event: "token", comment: ["relayed"] };
  const known = toBinary(GenerateResponseSchema, create(GenerateResponseSchema, { output }));
  const withUnknown = new Uint8Array([...known, ...unknownField]);
  let server: InProcessServer;
  before(async () => {
    // A token worker that answers with fixed bytes: as its encoding where the call takes it, else parsed from them.
    const fixed = defineModule({
      name: "fixedFrames",
      description: "test: a token worker answering with fixed frames",
      configSchema: z.object({}),
      create: () => ({
        services: [
          bindService(TokenWorkerService, {
            async *generate(_req, ctx: HandlerContext) {
              for (let i = 0; i < 3; i++) {
                if (acceptsEncoded(ctx)) yield new EncodedMessage(withUnknown) as never;
                else yield { output };
              }
            },
          }),
        ],
      }),
    });
    server = await startServer({ modules: [fixed] });
  });
  after(async () => server?.close());

  it(`the server writes a handler's EncodedMessage as it is on the lean gRPC path (${connectPathOnly ? "connect path: it gets parsed messages" : "lean path"})`, async () => {
    const body = grpcFrame(toBinary(GenerateRequestSchema, create(GenerateRequestSchema, { request })));
    const res = await rawH2(server.addr, { headers: grpcHeaders("/mmgate.llm.v1.TokenWorkerService/Generate"), body });
    expect(res.trailers?.["grpc-status"]).to.equal("0");
    const { frames } = parseGrpcFrames(res.data);
    expect(frames.length).to.equal(3);
    for (const f of frames) expect(Buffer.from(f.payload)).to.deep.equal(Buffer.from(connectPathOnly ? known : withUnknown));
  });

  it("the lean client yields a server stream's messages as their bytes when asked, parsed otherwise", async () => {
    const channel = createChannel(server.addr, channelDefaults);
    try {
      const call = async (encoded: boolean) => {
        const values = createContextValues();
        if (encoded) values.set(encodedResponsesKey, true);
        const input = createAsyncIterable([create(GenerateRequestSchema, { request })]);
        const res = await channel.stream(TokenWorkerService.method.generate, undefined, 5000, undefined, input, values);
        const out: unknown[] = [];
        for await (const m of res.message) out.push(m);
        return out;
      };
      const encoded = await call(true);
      expect(encoded).to.have.length(3);
      for (const m of encoded) {
        expect(m).to.be.instanceOf(EncodedMessage);
        expect(Buffer.from((m as EncodedMessage).bytes)).to.deep.equal(Buffer.from(connectPathOnly ? known : withUnknown));
      }
      const parsed = await call(false);
      expect(parsed).to.have.length(3);
      for (const m of parsed) expect((m as { output?: { id?: string } }).output?.id).to.equal("fixed");
    } finally {
      await channel.close();
    }
  });
});
