import { expect } from "chai";
import * as http from "node:http";
import { toJson, type MessageInitShape } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { EncodeWorkerService } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { FinishReason_Kind, type AnnotatedOutput } from "../../gen/mmgate/llm/v1/output_pb.js";
import type { PreprocessedRequestSchema } from "../../gen/mmgate/llm/v1/request_pb.js";
import { TokenWorkerService } from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import { consumeEncodeStream, EncodeHopError, encodeWorkerModule, tokenWorkerModule } from "../../src/encode/index.js";
import { descriptorFromJson } from "../../src/llm/index.js";
import { parseJson } from "../../src/util/index.js";
import { mediaModule } from "../../src/media/index.js";
import { expectRejection, grpcServerStream, startServer, type InProcessServer } from "../support/index.js";
import { encodeRaw, pattern } from "../media/fixtures.js";

type RequestInit = MessageInitShape<typeof PreprocessedRequestSchema>;

interface ResultItem {
  modality: string;
  index: number;
  content_hash: string | null;
  shape: number[];
  dtype: string;
  descriptor: { nixl_descriptor: { addr: number; size: number }; content_hash?: string; shape: number[] };
}

describe("encode and token workers", function () {
  this.timeout(60_000);
  let server: InProcessServer;
  let encoder: Client<typeof EncodeWorkerService>;
  let tokens: Client<typeof TokenWorkerService>;
  let media: Client<typeof MediaService>;
  const W = 16;
  const H = 8;
  const RAW = pattern(W * H * 3);
  const RAW2 = pattern(W * H * 3, 17, 3);
  let png: Buffer;
  let png2: Buffer;
  const dataUrl = (bytes: Buffer) => `data:image/png;base64,${bytes.toString("base64")}`;

  before(async () => {
    png = await encodeRaw(RAW, W, H, 3, "png");
    png2 = await encodeRaw(RAW2, W, H, 3, "png");
    server = await startServer({
      modules: [mediaModule, encodeWorkerModule, tokenWorkerModule],
      config: { tokenWorker: { maxTokens: 20 } },
    });
    encoder = createClient(EncodeWorkerService, server.transport);
    tokens = createClient(TokenWorkerService, server.transport);
    media = createClient(MediaService, server.transport);
  });

  after(async () => {
    await server?.close();
  });

  async function encode(request: RequestInit, client = encoder): Promise<AnnotatedOutput[]> {
    const outputs: AnnotatedOutput[] = [];
    for await (const res of client.encode({ request })) if (res.output) outputs.push(res.output);
    return outputs;
  }

  async function* replay(outputs: readonly AnnotatedOutput[]): AsyncGenerator<AnnotatedOutput> {
    yield* outputs;
  }

  function resultItems(output: AnnotatedOutput): ResultItem[] {
    const result = output.data?.encoderResult as { schema_version: number; items: ResultItem[] } | undefined;
    expect(result?.schema_version).to.equal(1);
    return result!.items;
  }

  async function readTensor(handle: bigint): Promise<Buffer> {
    const chunks: Uint8Array[] = [];
    for await (const msg of media.readTensor({ handle })) chunks.push(msg.data);
    return Buffer.concat(chunks);
  }

  const images = (...urls: string[]): RequestInit["multiModalData"] => ({ image: { items: urls.map((url) => ({ data: { case: "url", value: url } })) } });

  describe("EncodeWorkerService through the connect client", () => {
    it("encodes a data URL into a terminal the hop accepts", async () => {
      const outputs = await encode({ tokenIds: [1, 2, 3], multiModalData: images(dataUrl(png)) });
      expect(outputs).to.have.length(1);
      const terminal = outputs[0]!;
      expect(terminal.event).to.equal(undefined);
      expect(terminal.data?.finishReason?.kind).to.equal(FinishReason_Kind.STOP);
      expect(terminal.data?.index).to.equal(0);
      expect(terminal.data?.workerTraceLink?.traceId).to.match(/^[0-9a-f]{32}$/);
      expect(terminal.data?.workerTraceLink?.spanId).to.match(/^[0-9a-f]{16}$/);

      const items = resultItems(terminal);
      expect(items).to.have.length(1);
      const [item] = items;
      const direct = await media.decode({ source: { case: "data", value: png }, options: { skipStore: true } });
      expect(item).to.include({ modality: "image", index: 0, content_hash: direct.contentHashKey, dtype: "UINT8" });
      expect(item!.shape).to.deep.equal([H, W, 3]);
      expect(item!.descriptor.content_hash).to.equal(direct.contentHashKey);
      expect(item!.descriptor.shape).to.deep.equal([H, W, 3]);
      expect(item!.descriptor.nixl_descriptor.size).to.equal(RAW.length);
      expect((await readTensor(BigInt(item!.descriptor.nixl_descriptor.addr))).equals(Buffer.from(RAW))).to.equal(true);

      const outcome = await consumeEncodeStream(replay(outputs));
      expect(outcome.encoderResult).to.deep.equal(terminal.data?.encoderResult);
      expect(outcome.traceLink?.traceId).to.equal(terminal.data?.workerTraceLink?.traceId);
    });

    it("encodes modalities in key order and items in request order, and passes decoded items through", async () => {
      const first = resultItems((await encode({ multiModalData: images(dataUrl(png)) }))[0]!)[0]!;
      const decoded = descriptorFromJson(parseJson(JSON.stringify(first.descriptor)), "$");
      const outputs = await encode({
        multiModalData: {
          video: { items: [{ data: { case: "decoded", value: decoded } }] },
          image: { items: [{ data: { case: "url", value: dataUrl(png2) } }, { data: { case: "rawUrl", value: dataUrl(png) } }] },
        },
      });
      const items = resultItems(outputs[0]!);
      expect(items.map((i) => [i.modality, i.index])).to.deep.equal([["image", 0], ["image", 1], ["video", 0]]);
      const hash2 = (await media.decode({ source: { case: "data", value: png2 }, options: { skipStore: true } })).contentHashKey;
      expect(items[0]!.content_hash).to.equal(hash2);
      expect(items[1]!.content_hash).to.equal(first.content_hash);
      expect(items[2]!.content_hash).to.equal(first.content_hash);
      expect(items[2]!.shape).to.deep.equal([H, W, 3]);
      expect(items[2]!.descriptor).to.deep.equal(first.descriptor);
      expect((await readTensor(BigInt(items[0]!.descriptor.nixl_descriptor.addr))).equals(Buffer.from(RAW2))).to.equal(true);
    });

    it("answers a request without media with an empty item list", async () => {
      const outputs = await encode({ tokenIds: [5] });
      expect(outputs).to.have.length(1);
      expect(outputs[0]!.data?.finishReason?.kind).to.equal(FinishReason_Kind.STOP);
      expect(resultItems(outputs[0]!)).to.deep.equal([]);
    });

    it("links its span into the trace of the request's migration_link", async () => {
      const traceId = "0af7651916cd43dd8448eb211c80319c";
      const outputs = await encode({ migrationLink: { traceId, spanId: "b7ad6b7169203331" } });
      expect(outputs[0]!.data?.workerTraceLink?.traceId).to.equal(traceId);
      expect(outputs[0]!.data?.workerTraceLink?.spanId).to.match(/^[0-9a-f]{16}$/).and.not.equal("b7ad6b7169203331");
    });

    it("answers bad media with an error item on a stream that ends normally", async () => {
      for (const url of ["http://127.0.0.1:1/x", "http://localhost/x.png", "data:image/png;base64,"]) {
        const outputs = await encode({ multiModalData: images(dataUrl(png), url) });
        expect(outputs, url).to.have.length(1);
        const [item] = outputs;
        expect(item!.event).to.equal("error");
        expect(item!.comment).to.have.length(1);
        expect(item!.comment[0]).to.match(/^image\[1\]: /);
        expect(item!.data?.finishReason?.kind).to.equal(FinishReason_Kind.ERROR);
        expect(item!.data?.finishReason?.errorMessage).to.equal(item!.comment[0]);
        const error = await expectRejection(consumeEncodeStream(replay(outputs)), { type: EncodeHopError });
        expect(error.cause_).to.equal("encode_error");
      }
    });

    it("releases the tensors of a request that failed", async () => {
      const storedTensors = async () => {
        const text = await new Promise<string>((resolve, reject) => {
          http.get(`http://${server.adminAddr}/metrics`, (res) => {
            let body = "";
            res.setEncoding("utf8");
            res.on("data", (c: string) => (body += c));
            res.on("end", () => resolve(body));
          }).on("error", reject);
        });
        return Number(/^mmgate_media_tensor_store_tensors (\d+)$/m.exec(text)?.[1]);
      };
      const before = await storedTensors();
      const [item] = await encode({ multiModalData: images(dataUrl(png), dataUrl(png2), "http://127.0.0.1:1/x") });
      expect(item!.event).to.equal("error");
      expect(await storedTensors()).to.equal(before);
      await encode({ multiModalData: images(dataUrl(png)) });
      expect(await storedTensors()).to.equal(before + 1);
    });

    it("answers a request over the item limit with an error item", async () => {
      const urls = Array.from({ length: 65 }, () => dataUrl(png));
      const [item] = await encode({ multiModalData: images(...urls) });
      expect(item!.event).to.equal("error");
      expect(item!.comment[0]).to.include("65 media items, more than the limit of 64");
    });

    it("serves the same stream over the Connect protocol", async () => {
      const outputs = await encode({ multiModalData: images(dataUrl(png)) }, createClient(EncodeWorkerService, server.connectTransport));
      expect(resultItems(outputs[0]!)).to.have.length(1);
    });
  });

  describe("EncodeWorkerService through @grpc/grpc-js", () => {
    it("streams the terminal and the error item", async () => {
      const client = server.grpcClient("mmgate/encode/v1/encode.proto", "mmgate.encode.v1.EncodeWorkerService");
      type Output = { output: { data: { finishReason: { kind: string; errorMessage: string }; index: number; encoderResult: { fields: Record<string, { listValue?: { values: unknown[] }; numberValue?: number }> } }; event?: string; comment: string[] } };
      const good = await grpcServerStream<Output>(client, "Encode", { request: { multiModalData: { image: { items: [{ url: dataUrl(png) }] } } } });
      expect(good).to.have.length(1);
      expect(good[0]!.output.data.finishReason.kind).to.equal("KIND_STOP");
      expect(good[0]!.output.data.index).to.equal(0);
      expect(good[0]!.output.data.encoderResult.fields["schema_version"]!.numberValue).to.equal(1);
      expect(good[0]!.output.data.encoderResult.fields["items"]!.listValue!.values).to.have.length(1);

      const bad = await grpcServerStream<Output>(client, "Encode", { request: { multiModalData: { image: { items: [{ rawUrl: "http://127.0.0.1:1/x" }] } } } });
      expect(bad).to.have.length(1);
      expect(bad[0]!.output.event).to.equal("error");
      expect(bad[0]!.output.data.finishReason.kind).to.equal("KIND_ERROR");
      expect(bad[0]!.output.comment[0]).to.match(/^image\[0\]: /);
    });
  });

  describe("TokenWorkerService", () => {
    async function generate(request: RequestInit): Promise<AnnotatedOutput[]> {
      const outputs: AnnotatedOutput[] = [];
      for await (const res of tokens.generate({ request })) if (res.output) outputs.push(res.output);
      return outputs;
    }
    const ids = (outputs: AnnotatedOutput[]) => outputs.flatMap((o) => o.data?.tokenIds ?? []);
    const report = (outputs: AnnotatedOutput[]) => toJson(ValueSchema, outputs.at(-1)!.data!.extraArgs!);

    it("streams deterministic tokens, then a final output with finish_reason length", async () => {
      const request: RequestInit = { tokenIds: [10, 20, 30], stopConditions: { maxTokens: 5 } };
      const a = await generate(request);
      const b = await generate(request);
      expect(a).to.have.length(6);
      for (const o of a.slice(0, 5)) {
        expect(o.data?.tokenIds).to.have.length(1);
        expect(o.data?.finishReason).to.equal(undefined);
        expect(o.data?.index).to.equal(0);
      }
      expect(a[5]!.data?.finishReason?.kind).to.equal(FinishReason_Kind.LENGTH);
      expect(a[5]!.data?.tokenIds).to.deep.equal([]);
      expect(ids(a)).to.deep.equal(ids(b));
      expect(ids(a).every((id) => id < 32_000)).to.equal(true);
      expect(ids(await generate({ tokenIds: [10, 20, 31], stopConditions: { maxTokens: 5 } }))).to.not.deep.equal(ids(a));
      expect(report(a)).to.deep.equal({ encoder_result_present: false, media_items: 0, encoder_items: 0 });
    });

    it("generates 8 tokens by default and caps max_tokens at its configured limit", async () => {
      expect(ids(await generate({ tokenIds: [1] }))).to.have.length(8);
      expect(ids(await generate({ tokenIds: [1], stopConditions: { maxTokens: 1000 } }))).to.have.length(20);
      const none = await generate({ tokenIds: [1], stopConditions: { maxTokens: 0 } });
      expect(none).to.have.length(1);
      expect(none[0]!.data?.finishReason?.kind).to.equal(FinishReason_Kind.LENGTH);
    });

    it("reports whether an encoder result reached it", async () => {
      const request: RequestInit = { tokenIds: [7], stopConditions: { maxTokens: 1 }, multiModalData: images(dataUrl(png), dataUrl(png2)) };
      expect(report(await generate(request))).to.deep.equal({ encoder_result_present: false, media_items: 2, encoder_items: 0 });
      const terminal = (await encode(request))[0]!;
      const encoded = await generate({ ...request, encoderResult: terminal.data!.encoderResult!, migrationLink: terminal.data!.workerTraceLink! });
      // With an encoder result, one receipt per item: read from the store, hash checked, released.
      const hashes = resultItems(terminal).map((item) => item.content_hash);
      expect(report(encoded)).to.deep.equal({
        encoder_result_present: true,
        media_items: 2,
        encoder_items: 2,
        receipts: hashes.map((content_hash, index) => ({ modality: "image", index, content_hash, shape: [H, W, 3], verified: true, released: true })),
      });
    });

    it("answers a probe with one final output and no tokens", async () => {
      const outputs = await generate({ tokenIds: [1, 2], isProbe: true });
      expect(outputs).to.have.length(1);
      expect(outputs[0]!.data?.finishReason?.kind).to.equal(FinishReason_Kind.STOP);
      expect(outputs[0]!.data?.tokenIds).to.deep.equal([]);
    });

    it("serves @grpc/grpc-js clients", async () => {
      const client = server.grpcClient("mmgate/llm/v1/token_worker.proto", "mmgate.llm.v1.TokenWorkerService");
      type Output = { output: { data: { tokenIds: number[]; finishReason: { kind: string } | null } } };
      const request = { request: { tokenIds: [10, 20, 30], stopConditions: { maxTokens: 5 } } };
      const outputs = await grpcServerStream<Output>(client, "Generate", request);
      expect(outputs).to.have.length(6);
      expect(outputs[5]!.output.data.finishReason?.kind).to.equal("KIND_LENGTH");
      const viaConnect = await generate({ tokenIds: [10, 20, 30], stopConditions: { maxTokens: 5 } });
      expect(outputs.slice(0, 5).flatMap((o) => o.output.data.tokenIds)).to.deep.equal(ids(viaConnect));
    });
  });
});

describe("the demo token worker's pacing", () => {
  it("pauses before each token (tokenIntervalMs) and gives the pause up when the call ends", async () => {
    const server = await startServer({ modules: [tokenWorkerModule], config: { tokenWorker: { tokenIntervalMs: 60_000 } } });
    try {
      const received: unknown[] = [];
      const outcome = await (async () => {
        for await (const res of createClient(TokenWorkerService, server.transport).generate({ request: { tokenIds: [1, 2] } }, { timeoutMs: 200 })) received.push(res);
        return "completed";
      })().catch((e: unknown) => ConnectError.from(e).code);
      // No token before the first pause is over, and the deadline ends the call rather than the pause.
      expect(outcome).to.equal(Code.DeadlineExceeded);
      expect(received).to.deep.equal([]);
    } finally {
      await server.close();
    }
  });
});
