import * as http from "node:http";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect } from "chai";
import { create, toBinary, toJson, type JsonObject, type MessageInitShape } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { z } from "zod";
import { EncodeHopService, EncodeWorkerService, Lifecycle } from "../../gen/mmgate/encode/v1/encode_pb.js";
import type { AnnotatedOutput } from "../../gen/mmgate/llm/v1/output_pb.js";
import type { PreprocessedRequestSchema } from "../../gen/mmgate/llm/v1/request_pb.js";
import { TokenWorkerService } from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { MediaService, ReadTensorResponseSchema, ReleaseTensorResponseSchema } from "../../gen/mmgate/media/v1/media_pb.js";
import { defineTokenWorkerModule, encodeWorkerModule, tokenWorkerModule, type TokenWorkerSeams } from "../../src/encode/index.js";
import { defineEncodeHopModule } from "../../src/encode/module.js";
import { descriptorFromJson } from "../../src/llm/index.js";
import { parseJson } from "../../src/util/index.js";
import {
  agentMetadataBytes,
  buildDescriptor,
  descriptorToJson,
  encodeNixlMetadata,
  mediaModule,
  newTransferAgent,
  type TensorStore,
} from "../../src/media/index.js";
import { defineModule } from "../../src/server/index.js";
import { eventually, selfSignedCertificate, spawnMmgate, startChildServer, startServer, type ChildServer, type InProcessServer } from "../support/index.js";
import { grpcFrame } from "../support/raw-h2.js";
import { freePort } from "../support/process.js";
import { encodeRaw, pattern } from "../media/fixtures.js";

type RequestInit = MessageInitShape<typeof PreprocessedRequestSchema>;

interface Receipt {
  modality: string;
  index: number;
  content_hash: string | null;
  shape: number[];
  verified: boolean;
  reason?: string;
  received_content_hash?: string;
  released: boolean;
  release_error?: string;
}

interface Report {
  encoder_result_present: boolean;
  media_items: number;
  encoder_items: number;
  receipts?: Receipt[];
}

const dataUrl = (bytes: Buffer) => `data:image/png;base64,${bytes.toString("base64")}`;
const images = (...urls: string[]): RequestInit["multiModalData"] => ({ image: { items: urls.map((url) => ({ data: { case: "url", value: url } })) } });

/** The token worker's final report (the last output's extra_args). */
function reportOf(outputs: readonly AnnotatedOutput[]): Report {
  const extra = outputs.at(-1)?.data?.extraArgs;
  if (extra === undefined) throw new Error("no report in the last output");
  return toJson(ValueSchema, extra) as unknown as Report;
}

/** Descriptor JSON naming the tensor store at `endpoint` and `handle`, as an Encode worker there would write it. */
function descriptorJson(endpoint: string, handle: bigint, shape: number[] = [2, 2, 3], contentHash = 0x1234n): string {
  const size = shape.reduce((n, d) => n * d, 1);
  const nixl = encodeNixlMetadata(agentMetadataBytes(newTransferAgent(endpoint)));
  return descriptorToJson(
    buildDescriptor(nixl, handle, size, { shape, dtype: "UINT8", metadata: { Image: { format: "Png", color_type: "Rgb8", layout: "HWC" } } }, contentHash),
  );
}

/**
 * A decoded item (as a client hands over media it decoded elsewhere) whose
 * descriptor names the tensor store at `endpoint` and `handle`: the Encode
 * worker passes it through, so the token worker reads from there.
 */
function decodedItem(endpoint: string, handle: bigint) {
  return { data: { case: "decoded" as const, value: descriptorFromJson(parseJson(descriptorJson(endpoint, handle)), "$") } };
}

/** A module that hands the test the media module's tensor store. */
function storeProbe(found: (store: TensorStore) => void) {
  return defineModule({
    name: "storeProbe",
    description: "test: the media module's tensor store",
    configSchema: z.object({}),
    requires: { media: mediaModule },
    create(ctx) {
      found(ctx.deps.media.tensors);
      return { services: [] };
    },
  });
}

/** Calls `hop.generate` with `caller`'s signal; with `leaveAfterFirst` the caller goes away once the first output arrived. */
async function callHop(
  hop: Client<typeof EncodeHopService>,
  request: RequestInit,
  options: { caller?: AbortController; leaveAfterFirst?: boolean } = {},
): Promise<{ outputs: AnnotatedOutput[]; code?: Code }> {
  const caller = options.caller ?? new AbortController();
  const outputs: AnnotatedOutput[] = [];
  try {
    for await (const res of hop.generate({ request }, { signal: caller.signal })) {
      if (res.output) outputs.push(res.output);
      if (options.leaveAfterFirst) caller.abort();
    }
    return { outputs };
  } catch (err) {
    return { outputs, code: ConnectError.from(err).code };
  }
}

/** A port nothing listens on. */
async function closedEndpoint(): Promise<string> {
  return `127.0.0.1:${await freePort()}`;
}

describe("encode: the token worker as a receiver, in one process (media, encodeWorker, tokenWorker, encodeHop)", function () {
  this.timeout(60_000);
  let server: InProcessServer;
  let hop: Client<typeof EncodeHopService>;
  let media: Client<typeof MediaService>;
  let store: TensorStore | undefined;
  let afterRead: TokenWorkerSeams["afterRead"];
  /** The hop's inbound call of the request it last encoded. */
  let hopCall: AbortSignal | undefined;
  const W = 16;
  const H = 8;
  let png: Buffer;
  let png2: Buffer;
  let big: Buffer;
  const MAX_TENSOR_BYTES = 1024;

  before(async () => {
    png = await encodeRaw(pattern(W * H * 3), W, H, 3, "png");
    png2 = await encodeRaw(pattern(W * H * 3, 17, 3), W, H, 3, "png");
    big = await encodeRaw(pattern(24 * 24 * 3), 24, 24, 3, "png");
    const tokenWorker = defineTokenWorkerModule({ afterRead: (read) => afterRead?.(read) });
    const encodeHop = defineEncodeHopModule({
      afterEncode: async ({ signal }) => {
        hopCall = signal;
      },
    });
    server = await startServer({
      modules: [mediaModule, encodeWorkerModule, tokenWorker, encodeHop, storeProbe((s) => (store = s))],
      config: { tokenWorker: { receiver: { maxTensorBytes: MAX_TENSOR_BYTES } } },
    });
    hop = createClient(EncodeHopService, server.transport);
    media = createClient(MediaService, server.transport);
    await eventually(async () => expect((await hop.getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE));
  });
  afterEach(() => {
    afterRead = undefined;
  });
  after(() => server?.close());

  const hashOf = async (bytes: Buffer) => (await media.decode({ source: { case: "data", value: bytes }, options: { skipStore: true } })).contentHashKey;

  it("reads, verifies and releases every item: the receipts carry MediaService's content hashes", async () => {
    expect(store!.count).to.equal(0);
    const { outputs, code } = await callHop(hop, { tokenIds: [1, 2, 3], stopConditions: { maxTokens: 2 }, multiModalData: images(dataUrl(png), dataUrl(png2)) });
    expect(code).to.equal(undefined);
    const report = reportOf(outputs);
    expect(report).to.deep.include({ encoder_result_present: true, media_items: 2, encoder_items: 2 });
    expect(report.receipts).to.deep.equal([
      { modality: "image", index: 0, content_hash: await hashOf(png), shape: [H, W, 3], verified: true, released: true },
      { modality: "image", index: 1, content_hash: await hashOf(png2), shape: [H, W, 3], verified: true, released: true },
    ]);
    expect(store!.count).to.equal(0);
    expect(store!.bytes).to.equal(0);
    expect(await server.host.metrics.registry.metrics()).to.match(/^mmgate_token_worker_receipts_total\{result="verified"\} [1-9]/m);
  });

  it("a text-only request reports no receipts", async () => {
    const report = reportOf((await callHop(hop, { tokenIds: [5] })).outputs);
    expect(report).to.deep.equal({ encoder_result_present: false, media_items: 0, encoder_items: 0 });
  });

  it("bytes that do not hash to the claimed content hash are not verified, and still released", async () => {
    afterRead = ({ data }) => {
      data[0] = data[0]! ^ 0xff;
    };
    const report = reportOf((await callHop(hop, { tokenIds: [1], multiModalData: images(dataUrl(png)) })).outputs);
    const [receipt] = report.receipts!;
    expect(receipt).to.include({ modality: "image", index: 0, content_hash: await hashOf(png), verified: false, released: true });
    expect(receipt!.reason).to.match(/^hash_mismatch: the bytes read hash to [0-9a-f]{16}, the encoder result says [0-9a-f]{16}$/);
    expect(receipt!.received_content_hash).to.match(/^[0-9a-f]{16}$/).and.not.equal(receipt!.content_hash);
    expect(store!.count).to.equal(0);
  });

  it("a tensor store that cannot be reached is reported, with the endpoint", async () => {
    const endpoint = await closedEndpoint();
    const report = reportOf((await callHop(hop, { tokenIds: [1], multiModalData: { image: { items: [decodedItem(endpoint, 42n)] } } })).outputs);
    const [receipt] = report.receipts!;
    expect(receipt).to.include({ modality: "image", index: 0, content_hash: "0000000000001234", verified: false, released: false });
    expect(receipt!.reason).to.match(new RegExp(`^unreachable: cannot reach the tensor store at ${endpoint}: `));
    expect(receipt!.release_error).to.match(/^unreachable: /);
  });

  it("a handle the store does not hold is reported as not found", async () => {
    const report = reportOf((await callHop(hop, { tokenIds: [1], multiModalData: { image: { items: [decodedItem(server.addr, 7n)] } } })).outputs);
    const [receipt] = report.receipts!;
    expect(receipt).to.include({ verified: false, released: false });
    expect(receipt!.reason).to.match(/^not_found: /);
    expect(receipt).to.not.have.property("release_error");
  });

  it("a tensor over maxTensorBytes is not read, and is released", async () => {
    const report = reportOf((await callHop(hop, { tokenIds: [1], multiModalData: images(dataUrl(png), dataUrl(big)) })).outputs);
    const [small, large] = report.receipts!;
    expect(small).to.include({ verified: true, released: true });
    expect(large).to.include({ index: 1, content_hash: await hashOf(big), verified: false, released: true });
    expect(large!.reason).to.equal(`too_large: the tensor is ${24 * 24 * 3} bytes, more than tokenWorker.receiver.maxTensorBytes (${MAX_TENSOR_BYTES})`);
    expect(store!.count).to.equal(0);
  });

  it("leaves the store empty after 20 requests, callers that leave mid-generation or mid-read included", async () => {
    const outcomes: (Code | "ok")[] = [];
    for (let i = 0; i < 20; i++) {
      const request: RequestInit = { tokenIds: [i], stopConditions: { maxTokens: 3 }, multiModalData: images(dataUrl(png), dataUrl(png2)) };
      switch (i % 4) {
        case 0:
        case 3: {
          const { code } = await callHop(hop, request);
          outcomes.push(code ?? "ok");
          break;
        }
        case 1: {
          // Leaves once the first token arrived.
          const { code } = await callHop(hop, request, { leaveAfterFirst: true });
          outcomes.push(code ?? "ok");
          break;
        }
        case 2: {
          // Leaves while the first item is being received. The hop keeps the downstream call of an encoded request
          // until the receiver has its items (handoffTimeoutMs): the token worker goes on, reads the second item too
          // with its call still live, and releases both.
          const caller = new AbortController();
          const reads: { index: number; callLive: boolean }[] = [];
          afterRead = async ({ index, signal }) => {
            if (index === 0) {
              caller.abort();
              await eventually(() => expect(hopCall?.aborted, "the hop sees its caller gone").to.equal(true));
              // Time for a cancellation the hop would pass on to reach the token worker.
              await new Promise((resolve) => setTimeout(resolve, 50));
            }
            reads.push({ index, callLive: !signal.aborted });
          };
          const { code } = await callHop(hop, request, { caller });
          await eventually(() => expect(reads).to.deep.equal([0, 1].map((index) => ({ index, callLive: true }))));
          afterRead = undefined;
          outcomes.push(code ?? "ok");
          break;
        }
      }
    }
    expect(outcomes.filter((c) => c === "ok")).to.have.length(10);
    expect(outcomes.filter((c) => c === Code.Canceled)).to.have.length(10);
    await eventually(() => expect([store!.count, store!.bytes]).to.deep.equal([0, 0]));
  });
});

describe("encode: the receiver's credentials", function () {
  this.timeout(60_000);
  const TOKEN = "s3cret-s3cret-s3cret";
  let dir: string;
  let png: Buffer;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), "mmgate-receiver-"));
    png = await encodeRaw(pattern(4 * 4 * 3), 4, 4, 3, "png");
  });
  after(() => rm(dir, { recursive: true, force: true }));

  /** Encodes `request` on `encoder` (which needs the token) and has the token worker on `tokens` receive the result. */
  async function receive(encoder: InProcessServer, tokens: InProcessServer, request: RequestInit, headers: Record<string, string>): Promise<Receipt[]> {
    const encoded = [];
    for await (const res of createClient(EncodeWorkerService, encoder.transport).encode({ request }, { headers: { authorization: `Bearer ${TOKEN}` } })) encoded.push(res);
    const outputs: AnnotatedOutput[] = [];
    const call = createClient(TokenWorkerService, tokens.transport).generate({ request: { ...request, encoderResult: encoded[0]!.output!.data!.encoderResult! } }, { headers });
    for await (const res of call) if (res.output) outputs.push(res.output);
    return reportOf(outputs).receipts!;
  }

  it("passes the inbound authorization header on to ReleaseTensor (a mutating method)", async () => {
    let store: TensorStore | undefined;
    const server = await startServer({
      modules: [mediaModule, encodeWorkerModule, tokenWorkerModule, storeProbe((s) => (store = s))],
      config: { auth: { token: TOKEN } },
    });
    try {
      const request: RequestInit = { tokenIds: [1], stopConditions: { maxTokens: 1 }, multiModalData: images(dataUrl(png)) };
      const [good] = await receive(server, server, request, { authorization: `Bearer ${TOKEN}` });
      expect(good).to.include({ verified: true, released: true });
      expect(store!.count).to.equal(0);
    } finally {
      await server.close();
    }
  });

  it("a service credential (tokenFile) wins over the inbound header, for a store in another server", async () => {
    const file = join(dir, "token");
    await writeFile(file, `${TOKEN}\n`);
    let store: TensorStore | undefined;
    const encoder = await startServer({ modules: [mediaModule, encodeWorkerModule, storeProbe((s) => (store = s))], config: { auth: { token: TOKEN } } });
    const withCredential = await startServer({ modules: [tokenWorkerModule], config: { tokenWorker: { receiver: { tokenFile: file } } } });
    const without = await startServer({ modules: [tokenWorkerModule] });
    try {
      const request: RequestInit = { tokenIds: [1], stopConditions: { maxTokens: 1 }, multiModalData: images(dataUrl(png)) };
      // ReadTensor is public, so the bytes arrive; ReleaseTensor is refused without the credential.
      const [refused] = await receive(encoder, without, request, {});
      expect(refused).to.include({ verified: true, released: false });
      expect(refused!.release_error).to.match(/^unauthenticated: /);
      expect(store!.count).to.equal(1);
      store!.clear();

      const [released] = await receive(encoder, withCredential, request, { authorization: "Bearer wrong-wrong-wrong" });
      expect(released).to.include({ verified: true, released: true });
      expect(store!.count).to.equal(0);
    } finally {
      await Promise.all([encoder.close(), withCredential.close(), without.close()]);
    }
  });

  it("refuses token and tokenFile together, and an unreadable tokenFile, at start-up", async () => {
    const both = await startServer({ modules: [tokenWorkerModule], config: { tokenWorker: { receiver: { token: "a", tokenFile: "/x" } } } }).catch((e: unknown) => e);
    expect((both as Error).message).to.contain("token and tokenFile exclude each other");
    const missing = join(dir, "missing");
    const unreadable = await startServer({ modules: [tokenWorkerModule], config: { tokenWorker: { receiver: { tokenFile: missing } } } }).catch((e: unknown) => e);
    expect((unreadable as Error).message).to.contain(`tokenWorker.receiver.tokenFile: cannot read ${missing}`);
  });
});

describe("encode: the receiver's deadline", function () {
  this.timeout(30_000);
  /** The receipt of a Generate call on `server` whose encoder result holds one 2x2x3 item held by the store at `endpoint`. */
  async function oneItemReceipt(server: InProcessServer, endpoint: string): Promise<Receipt> {
    const descriptor = JSON.parse(descriptorJson(endpoint, 9n)) as JsonObject;
    const encoderResult = { schema_version: 1, items: [{ modality: "image", index: 0, content_hash: "0000000000001234", shape: [2, 2, 3], dtype: "UINT8", descriptor }] };
    const outputs: AnnotatedOutput[] = [];
    for await (const res of createClient(TokenWorkerService, server.transport).generate({ request: { tokenIds: [1], encoderResult } })) {
      if (res.output) outputs.push(res.output);
    }
    return reportOf(outputs).receipts![0]!;
  }

  it("a read refused part way (a chunk out of place) is read_failed, and the store's stream is cancelled", async () => {
    // Answers ReadTensor with one chunk at the wrong offset and keeps the stream open; answers ReleaseTensor released.
    const store = http2.createServer();
    const readEnds: Promise<number>[] = [];
    store.on("stream", (stream, headers) => {
      stream.on("error", () => undefined);
      stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
      stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
      if (headers[":path"] === "/mmgate.media.v1.MediaService/ReadTensor") {
        readEnds.push(new Promise((resolve) => stream.once("close", () => resolve(stream.rstCode))));
        stream.write(grpcFrame(toBinary(ReadTensorResponseSchema, create(ReadTensorResponseSchema, { totalSize: 12n, offset: 4n, data: new Uint8Array(4) }))));
      } else {
        stream.end(grpcFrame(toBinary(ReleaseTensorResponseSchema, create(ReleaseTensorResponseSchema, { released: true }))));
      }
    });
    await new Promise<void>((resolve) => store.listen(0, "127.0.0.1", resolve));
    const endpoint = `127.0.0.1:${(store.address() as AddressInfo).port}`;
    const server = await startServer({ modules: [tokenWorkerModule] });
    try {
      const receipt = await oneItemReceipt(server, endpoint);
      expect(receipt).to.include({ verified: false, released: true });
      expect(receipt.reason).to.equal(`read_failed: ${endpoint} sent 4 bytes at 4, expected them at 0 (of 12)`);
      // The store's stream is cancelled, not left open on the token worker's session to it (kept per endpoint).
      expect(await Promise.all(readEnds)).to.deep.equal([http2.constants.NGHTTP2_CANCEL]);
    } finally {
      await server.close();
      store.close();
    }
  });

  it("a store that never answers ends the read and the release at timeoutMs", async () => {
    // Accepts every call and never answers it.
    const silent = http2.createServer();
    const streams: http2.ServerHttp2Stream[] = [];
    silent.on("stream", (stream) => {
      stream.on("error", () => undefined);
      streams.push(stream);
    });
    await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
    const endpoint = `127.0.0.1:${(silent.address() as AddressInfo).port}`;
    const server = await startServer({ modules: [tokenWorkerModule], config: { tokenWorker: { receiver: { timeoutMs: 300 } } } });
    try {
      const receipt = await oneItemReceipt(server, endpoint);
      expect(receipt).to.include({ verified: false, released: false });
      expect(receipt.reason).to.match(new RegExp(`^timeout: read from ${endpoint} did not finish within its deadline`));
      expect(receipt.release_error).to.match(/^timeout: release from /);
    } finally {
      await server.close();
      for (const s of streams) s.destroy();
      silent.close();
    }
  });
});

/** `mmgate_media_tensor_store_tensors` of a server, from its admin listener. */
async function storedTensors(adminAddr: string): Promise<number> {
  const text = await new Promise<string>((resolve, reject) => {
    http
      .get(`http://${adminAddr}/metrics`, (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (c: string) => (body += c));
        res.on("end", () => resolve(body));
      })
      .on("error", reject);
  });
  const match = /^mmgate_media_tensor_store_tensors (\d+)$/m.exec(text);
  if (!match) throw new Error("no mmgate_media_tensor_store_tensors in the metrics");
  return Number(match[1]);
}

/**
 * As production runs it (issue: the hop in a real deployment): TLS and a
 * token on every process, each role its own process (an Encode worker, the
 * token worker, the hop), and the executable's own client.
 */
describe("encode: deployed as processes with TLS and a token: hop generate is encoded in one process, verified in another, and nothing is left in the store", function () {
  this.timeout(90_000);
  const token = "deployed-stack-token-0123456789";
  let tokenWorker: ChildServer;
  let encodeWorker: ChildServer;
  let hop: ChildServer;
  let cert: { certFile: string; keyFile: string };
  let dir: string;
  let png: Buffer;

  before(async () => {
    png = await encodeRaw(pattern(32 * 16 * 3), 32, 16, 3, "png");
    cert = selfSignedCertificate();
    dir = mkdtempSync(join(tmpdir(), "mmgate-deployed-"));
    const secured = { MMGATE_AUTH_TOKEN: token, MMGATE_TLS_CERT_FILE: cert.certFile, MMGATE_TLS_KEY_FILE: cert.keyFile };
    [tokenWorker, encodeWorker] = await Promise.all([
      startChildServer(["--modules", "tokenWorker"], { ...secured, MMGATE_TOKEN_WORKER__RECEIVER__CHANNEL__TLS: "true", MMGATE_TOKEN_WORKER__RECEIVER__CHANNEL__CA_FILE: cert.certFile }),
      startChildServer(["--modules", "media,encodeWorker"], secured),
    ]);
    hop = await startChildServer(["--modules", "encodeHop"], {
      ...secured,
      MMGATE_ENCODE_HOP__DOWNSTREAM: tokenWorker.addr,
      MMGATE_ENCODE_HOP__ENCODERS__DISCOVERY: "static",
      MMGATE_ENCODE_HOP__ENCODERS__MEMBERS: JSON.stringify([{ id: "worker", address: encodeWorker.addr }]),
      MMGATE_ENCODE_HOP__CHANNEL__TLS: "true",
      MMGATE_ENCODE_HOP__CHANNEL__CA_FILE: cert.certFile,
    });
  });
  after(async () => {
    await hop?.close();
    await Promise.all([tokenWorker?.close(), encodeWorker?.close()]);
  });

  it("mmgate hop generate --ca --token: every item verified and released by the token worker; the Encode worker's store is empty after, cancelled callers included", async () => {
    const file = join(dir, "request.json");
    writeFileSync(file, JSON.stringify({ token_ids: [1, 2], stop_conditions: { max_tokens: 3 }, multi_modal_data: { image: [{ Url: dataUrl(png) }, { Url: dataUrl(png) }] } }));
    const cli = ["hop", "generate", file, "--addr", hop.addr, "--ca", cert.certFile, "--token", token, "--json"];
    const result = await spawnMmgate(cli);
    expect(result.code, result.stderr).to.equal(0);
    const receipts = (JSON.parse(result.stdout.trimEnd().split("\n").at(-1)!) as { receipts: Record<string, unknown>[] }).receipts;
    expect(receipts.map((r) => [r["modality"], r["index"], r["shape"], r["verified"], r["released"]])).to.deep.equal([
      ["image", 0, [16, 32, 3], true, true],
      ["image", 1, [16, 32, 3], true, true],
    ]);
    expect(receipts[0]!["content_hash"]).to.match(/^[0-9a-f]{16}$/);
    // No fallback: the hop's own calls carried the caller's credential over TLS.
    const status = await spawnMmgate(["hop", "status", "--addr", hop.addr, "--ca", cert.certFile]);
    const parsed = JSON.parse(status.stdout) as { encoded: string; fallbacks: Record<string, string> };
    expect(parsed.fallbacks).to.deep.equal({});
    expect(parsed.encoded).to.equal("1");
    // Without the token the hop refuses the caller.
    const refused = await spawnMmgate(["hop", "generate", file, "--addr", hop.addr, "--ca", cert.certFile]);
    expect(refused.code).to.equal(1);
    expect(refused.stderr).to.match(/unauthenticated/);
    await eventually(async () => expect(await storedTensors(encodeWorker.adminAddr)).to.equal(0));
  });
});
