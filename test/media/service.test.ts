import { expect } from "chai";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { fromBinary } from "@bufbuild/protobuf";
import type * as grpc from "@grpc/grpc-js";
import { DataType, ErrorDetailSchema, MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import { mediaModule, parseDescriptorJson, decodeNixlMetadata } from "../../src/media/index.js";
import { expectRejection, grpcServerStream, grpcUnary, startServer, type InProcessServer } from "../support/index.js";
import { encodeRaw, pattern, claimedPng } from "./fixtures.js";

const PROTO = "mmgate/media/v1/media.proto";
const SERVICE = "mmgate.media.v1.MediaService";

function detailCode(error: ConnectError): string | undefined {
  return error.findDetails(ErrorDetailSchema)[0]?.code;
}

const connectError = (p: Promise<unknown>) => expectRejection(p, { type: ConnectError });

describe("MediaService contract", function () {
  this.timeout(60_000);
  let server: InProcessServer;
  let client: Client<typeof MediaService>;
  let media: http.Server;
  let mediaPort = 0;
  const W = 32;
  const H = 24;
  const RAW = pattern(W * H * 3);
  let png: Buffer;

  before(async () => {
    png = await encodeRaw(RAW, W, H, 3, "png");
    media = http.createServer((req, res) => {
      if (req.url === "/img.png") return void res.end(png);
      res.writeHead(404).end();
    });
    await new Promise<void>((resolve) => media.listen(0, "127.0.0.1", resolve));
    mediaPort = (media.address() as AddressInfo).port;
    server = await startServer({
      modules: [mediaModule],
      config: {
        media: {
          store: { maxBytes: 64 * 1024 * 1024 },
          maxInlinePixelBytes: 100_000,
          readChunkBytes: 4096,
          decoder: { maxImageWidth: 4000 },
          // Loopback opened for this suite's local media server only.
          fetch: { allowDirectIp: true, allowDirectPort: true, allowedIpNetworks: ["127.0.0.1/32"], timeoutMs: 10_000 },
        },
      },
    });
    client = createClient(MediaService, server.transport);
  });

  after(async () => {
    await server?.close();
    media?.closeAllConnections();
    await new Promise((resolve) => media?.close(resolve));
  });

  describe("through the connect client", () => {
    it("Decode returns tensor info, hash, descriptor and inline pixels", async () => {
      const res = await client.decode({ source: { case: "data", value: png }, options: { returnPixels: true } });
      expect(res.tensorInfo?.shape).to.deep.equal([BigInt(H), BigInt(W), 3n]);
      expect(res.tensorInfo?.dtype).to.equal(DataType.UINT8);
      expect(res.tensorInfo?.metadata.case).to.equal("image");
      expect(res.tensorInfo?.metadata.value).to.include({ format: "Png", colorType: "Rgb8", layout: "HWC" });
      expect(Buffer.from(res.pixels).equals(Buffer.from(RAW))).to.equal(true);
      expect(res.sizeBytes).to.equal(BigInt(RAW.length));
      expect(res.contentHashKey).to.equal(res.contentHash!.toString(16).padStart(16, "0"));

      const descriptor = parseDescriptorJson(res.descriptorJson);
      expect(descriptor.nixl_descriptor).to.deep.equal({ addr: res.handle, size: RAW.length, mem_type: "Dram", device_id: 0n });
      expect(descriptor.content_hash).to.equal(res.contentHashKey);
      expect(descriptor.tensor_info.shape).to.deep.equal([H, W, 3]);
      const agent = JSON.parse(Buffer.from(decodeNixlMetadata(descriptor.nixl_metadata)).toString()) as Record<string, string>;
      expect(agent["name"]).to.match(/^media-loader-/);
      expect(agent["endpoint"]).to.equal(server.addr);
      expect(Object.keys(JSON.parse(res.descriptorJson) as object)).to.deep.equal([
        "nixl_metadata", "nixl_descriptor", "shape", "dtype", "metadata", "content_hash",
      ]);
    });

    it("Decode fetches from a URL under the configured policy", async () => {
      const res = await client.decode({ source: { case: "url", value: `http://127.0.0.1:${mediaPort}/img.png` } });
      expect(res.tensorInfo?.shape).to.deep.equal([BigInt(H), BigInt(W), 3n]);
      expect(res.pixels).to.have.length(0);
      const blocked = await connectError(client.decode({ source: { case: "url", value: `http://localhost:${mediaPort}/img.png` } }));
      expect(blocked.code).to.equal(Code.InvalidArgument);
      expect(detailCode(blocked)).to.equal("URL_BLOCKED_HOST");
      const missing = await connectError(client.decode({ source: { case: "url", value: `http://127.0.0.1:${mediaPort}/nope.png` } }));
      expect(detailCode(missing)).to.equal("FETCH_HTTP_STATUS");
      expect(missing.code).to.equal(Code.InvalidArgument);
    });

    it("Decode takes a data URL", async () => {
      const res = await client.decode({ source: { case: "url", value: `data:image/png;base64,${png.toString("base64")}` } });
      const direct = await client.decode({ source: { case: "data", value: png }, options: { skipStore: true } });
      expect(res.contentHashKey).to.equal(direct.contentHashKey);
      const bad = await connectError(client.decode({ source: { case: "url", value: "data:image/png;base64," } }));
      expect(detailCode(bad)).to.equal("DATA_URL_INVALID");
    });

    it("ReadTensor streams the stored bytes in bounded chunks and ReleaseTensor drops them", async () => {
      const res = await client.decode({ source: { case: "data", value: png } });
      const chunks: Uint8Array[] = [];
      for await (const msg of client.readTensor({ handle: res.handle })) {
        expect(msg.data.length).to.be.at.most(4096);
        expect(msg.offset).to.equal(BigInt(chunks.reduce((n, c) => n + c.length, 0)));
        expect(msg.totalSize).to.equal(BigInt(RAW.length));
        chunks.push(msg.data);
      }
      expect(chunks.length).to.equal(Math.ceil(RAW.length / 4096));
      expect(Buffer.concat(chunks).equals(Buffer.from(RAW))).to.equal(true);

      const part: Uint8Array[] = [];
      for await (const msg of client.readTensor({ handle: res.handle, offset: 100n, length: 1000n })) part.push(msg.data);
      expect(Buffer.concat(part).equals(Buffer.from(RAW.subarray(100, 1100)))).to.equal(true);
      const range = await connectError((async () => {
        for await (const _ of client.readTensor({ handle: res.handle, offset: BigInt(RAW.length), length: 1n })) void _;
      })());
      expect(range.code).to.equal(Code.OutOfRange);

      expect((await client.releaseTensor({ handle: res.handle })).released).to.equal(true);
      expect((await client.releaseTensor({ handle: res.handle })).released).to.equal(false);
      const gone = await connectError((async () => {
        for await (const _ of client.readTensor({ handle: res.handle })) void _;
      })());
      expect(gone.code).to.equal(Code.NotFound);
      expect(detailCode(gone)).to.equal("TENSOR_NOT_FOUND");
    });

    it("HashTensor returns the golden hash and validates the payload", async () => {
      const res = await client.hashTensor({ shape: [1n, 2n, 3n], dtype: DataType.UINT8, data: Uint8Array.of(0, 1, 2, 3, 4, 5) });
      expect(res.contentHash).to.equal(0x7a9bbcb11a898630n);
      expect(res.contentHashKey).to.equal("7a9bbcb11a898630");
      const empty = await client.hashTensor({ shape: [0n], data: new Uint8Array(0) });
      expect(empty.contentHash).to.equal(undefined);
      expect(empty.contentHashKey).to.equal("");
      const mismatch = await connectError(client.hashTensor({ shape: [2n, 2n], data: Uint8Array.of(1, 2, 3) }));
      expect(mismatch.code).to.equal(Code.InvalidArgument);
      expect(detailCode(mismatch)).to.equal("TENSOR_INVALID");
    });

    it("HashTensor hashes videos with metadata and applies the seed's validation", async () => {
      const bytes = Uint8Array.from({ length: 12 }, (_, i) => i);
      const videoMetadata = { sourceFps: 24, sourceDuration: 10, sampledTimestamps: [0, 5] };
      const res = await client.hashTensor({ shape: [2n, 1n, 2n, 3n], data: bytes, videoMetadata });
      expect(res.contentHashKey).to.equal("7e4b54c46acd410c");
      const five = await client.hashTensor({
        shape: [2n, 1n, 2n, 3n],
        data: bytes,
        videoMetadata: { ...videoMetadata, sourceTotalFrames: 240n, framesIndices: { values: [0n, 120n] } },
      });
      expect(five.contentHashKey).to.equal("673960f3e4288e55");
      const rgba = await connectError(client.hashTensor({ shape: [1n, 1n, 3n, 4n], data: bytes, videoMetadata }));
      expect(rgba.message).to.include("decoded video must contain RGB frames");
      expect(detailCode(rgba)).to.equal("VIDEO_TENSOR_INVALID");
      const short = await connectError(client.hashTensor({ shape: [2n, 1n, 2n, 3n], data: bytes.subarray(0, 11), videoMetadata }));
      expect(short.message).to.include("decoded video payload has 11 bytes, expected 12");
    });

    it("HashTensor refuses shapes and metadata beyond their size limits", async () => {
      // 7 MB of ones would take seconds and gigabytes to turn into a header.
      const deep = await connectError(client.hashTensor({ shape: Array<bigint>(1_000_000).fill(1n), data: Uint8Array.of(1) }));
      expect(deep.code).to.equal(Code.InvalidArgument);
      expect(deep.message).to.include("tensor rank 1000000 exceeds the limit of 8");
      expect(detailCode(deep)).to.equal("TENSOR_INVALID");
      const frames = await connectError(
        client.hashTensor({
          shape: [2n, 1n, 2n, 3n],
          data: new Uint8Array(12),
          videoMetadata: { sourceFps: 24, sourceDuration: 10, sampledTimestamps: Array<number>(65_537).fill(0) },
        }),
      );
      expect(frames.message).to.include("video metadata lists 65537 frames, more than the limit of 65536");
      expect(detailCode(frames)).to.equal("VIDEO_METADATA_INVALID");
      // The server still answers.
      expect((await client.hashTensor({ shape: [1n, 2n, 3n], data: Uint8Array.of(0, 1, 2, 3, 4, 5) })).contentHashKey).to.equal("7a9bbcb11a898630");
    });

    it("Decode enforces every limit with a typed detail", async () => {
      const wide = await connectError(client.decode({ source: { case: "data", value: claimedPng(4001, 10) } }));
      expect(wide.code).to.equal(Code.InvalidArgument);
      expect(detailCode(wide)).to.equal("IMAGE_DIMENSIONS_EXCEED_LIMITS");
      expect(wide.rawMessage).to.equal("Image dimensions exceed configured limits: 4001x10");
      const bomb = await connectError(client.decode({ source: { case: "data", value: claimedPng(100_000, 100_000) } }));
      expect(bomb.code).to.equal(Code.InvalidArgument);
      expect(detailCode(bomb)).to.equal("IMAGE_DIMENSIONS_EXCEED_LIMITS");
      const tall = await connectError(client.decode({ source: { case: "data", value: claimedPng(4000, 12_000) } }));
      expect(detailCode(tall)).to.equal("IMAGE_ALLOCATION_EXCEEDS_LIMIT");
      expect(tall.rawMessage).to.equal("Image allocation 144000000 bytes exceeds configured limit 134217728 bytes");
      const detail = tall.findDetails(ErrorDetailSchema)[0]!;
      expect(detail.limit).to.equal(134217728n);
      expect(detail.actual).to.equal(144_000_000n);
      const inline = await connectError(
        client.decode({ source: { case: "data", value: await encodeRaw(pattern(200 * 200 * 3), 200, 200, 3, "png") }, options: { returnPixels: true } }),
      );
      expect(inline.code).to.equal(Code.ResourceExhausted);
      expect(detailCode(inline)).to.equal("INLINE_PIXELS_TOO_LARGE");
    });

    it("answers truncated and garbage files with INVALID_ARGUMENT and keeps serving", async () => {
      for (const bad of [png.subarray(0, png.length >> 1), Buffer.from("garbage"), new Uint8Array(0)]) {
        const error = await connectError(client.decode({ source: { case: "data", value: bad } }));
        expect(error.code).to.equal(Code.InvalidArgument);
      }
      const missingSource = await connectError(client.decode({}));
      expect(missingSource.code).to.equal(Code.InvalidArgument);
      const ok = await client.decode({ source: { case: "data", value: png }, options: { skipStore: true } });
      expect(ok.handle).to.equal(0n);
      expect(ok.descriptorJson).to.equal("");
      expect(ok.contentHash).to.not.equal(undefined);
    });
  });

  describe("through @grpc/grpc-js", () => {
    let grpcClient: ReturnType<InProcessServer["grpcClient"]>;
    before(() => {
      grpcClient = server.grpcClient(PROTO, SERVICE);
    });

    it("Decode, ReadTensor and ReleaseTensor", async () => {
      const res = await grpcUnary<Record<string, unknown>>(grpcClient, "Decode", { data: png, options: { returnPixels: true } });
      const info = res["tensorInfo"] as { shape: string[]; dtype: string; image: Record<string, string>; metadata: string };
      expect(info.shape).to.deep.equal([String(H), String(W), "3"]);
      expect(info.dtype).to.equal("DATA_TYPE_UINT8");
      expect(info.metadata).to.equal("image");
      expect(info.image).to.include({ format: "Png", colorType: "Rgb8", layout: "HWC" });
      expect(Buffer.from(res["pixels"] as Buffer).equals(Buffer.from(RAW))).to.equal(true);
      expect(res["contentHashKey"]).to.match(/^[0-9a-f]{16}$/);
      expect(BigInt(res["contentHash"] as string)).to.equal(BigInt(`0x${res["contentHashKey"] as string}`));

      const chunks = await grpcServerStream<{ data: Buffer; offset: string }>(grpcClient, "ReadTensor", { handle: res["handle"] });
      expect(Buffer.concat(chunks.map((c) => c.data)).equals(Buffer.from(RAW))).to.equal(true);
      const released = await grpcUnary<{ released: boolean }>(grpcClient, "ReleaseTensor", { handle: res["handle"] });
      expect(released.released).to.equal(true);
    });

    it("HashTensor golden vector", async () => {
      const res = await grpcUnary<{ contentHash: string; contentHashKey: string }>(grpcClient, "HashTensor", {
        shape: ["1", "2", "3"],
        dtype: "DATA_TYPE_UINT8",
        data: Buffer.from("000102030405", "hex"),
      });
      expect(res.contentHash).to.equal(String(0x7a9bbcb11a898630n));
      expect(res.contentHashKey).to.equal("7a9bbcb11a898630");
    });

    it("errors carry the status code and a decodable ErrorDetail", async () => {
      const e = await expectRejection<grpc.ServiceError>(grpcUnary(grpcClient, "Decode", { url: "ftp://example.com/x.png" }), { code: 3 });
      expect(e.details).to.equal("Only HTTP(S) and data URLs are allowed");
      const bin = e.metadata.get("grpc-status-details-bin")[0] as Buffer;
      expect(bin).to.be.instanceOf(Buffer);
      // google.rpc.Status{code=1, message=2, details=3(Any{type_url=1, value=2})}: find the Any's value.
      const text = bin.toString("latin1");
      expect(text).to.include("type.googleapis.com/mmgate.media.v1.ErrorDetail");
      const marker = Buffer.from("URL_SCHEME_NOT_ALLOWED");
      const at = bin.indexOf(marker);
      // The ErrorDetail message starts at its field-1 tag (0x0a) two bytes before the string.
      const detail = fromBinary(ErrorDetailSchema, bin.subarray(at - 2, at + marker.length));
      expect(detail.code).to.equal("URL_SCHEME_NOT_ALLOWED");
    });

    it("cancelling ReadTensor mid-stream ends the call", async () => {
      const big = await encodeRaw(pattern(256 * 256 * 3), 256, 256, 3, "png");
      const res = await grpcUnary<{ handle: string }>(grpcClient, "Decode", { data: big });
      await expectRejection(grpcServerStream(grpcClient, "ReadTensor", { handle: res.handle }, { onMessage: (_m, call) => call.cancel() }), {
        code: 1, // CANCELLED
      });
      // The server keeps serving.
      const again = await grpcUnary<{ released: boolean }>(grpcClient, "ReleaseTensor", { handle: res.handle });
      expect(again.released).to.equal(true);
    });
  });
});

describe("MediaService with the default policy and a bearer token", function () {
  this.timeout(60_000);
  const TOKEN = "media-test-token-0123456789";
  let server: InProcessServer;
  let media: http.Server;
  let mediaPort = 0;
  let hits = 0;

  before(async () => {
    media = http.createServer((_req, res) => {
      hits++;
      res.end("never fetched");
    });
    await new Promise<void>((resolve) => media.listen(0, "127.0.0.1", resolve));
    mediaPort = (media.address() as AddressInfo).port;
    server = await startServer({ modules: [mediaModule], config: { auth: { token: TOKEN } } });
  });

  after(async () => {
    await server?.close();
    media?.closeAllConnections();
    await new Promise((resolve) => media?.close(resolve));
  });

  it("refuses loopback media URLs without touching them", async () => {
    const client = createClient(MediaService, server.transport);
    for (const [url, code] of [
      [`http://127.0.0.1:${mediaPort}/img.png`, "URL_DIRECT_IP_NOT_ALLOWED"],
      [`http://localhost:${mediaPort}/img.png`, "URL_DIRECT_PORT_NOT_ALLOWED"],
      ["http://localhost/img.png", "URL_BLOCKED_HOST"],
      ["http://[::1]/img.png", "URL_DIRECT_IP_NOT_ALLOWED"],
    ] as const) {
      const error = await connectError(client.decode({ source: { case: "url", value: url } }));
      expect(error.code, url).to.equal(Code.InvalidArgument);
      expect(detailCode(error), url).to.equal(code);
    }
    expect(hits).to.equal(0);
  });

  it("requires the token for ReleaseTensor only", async () => {
    const client = createClient(MediaService, server.transport);
    const png = await encodeRaw(pattern(4 * 4 * 3), 4, 4, 3, "png");
    const res = await client.decode({ source: { case: "data", value: png } });
    const denied = await connectError(client.releaseTensor({ handle: res.handle }));
    expect(denied.code).to.equal(Code.Unauthenticated);
    const ok = await client.releaseTensor({ handle: res.handle }, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(ok.released).to.equal(true);
  });

  it("exports tensor store metrics", async () => {
    // A server of its own, so that the counts are this test's alone.
    const own = await startServer({ modules: [mediaModule], config: { auth: { token: TOKEN } } });
    try {
      const client = createClient(MediaService, own.transport);
      const png = await encodeRaw(pattern(4 * 4 * 3), 4, 4, 3, "png");
      const released = await client.decode({ source: { case: "data", value: png } });
      await client.decode({ source: { case: "data", value: png } });
      await client.releaseTensor({ handle: released.handle }, { headers: { authorization: `Bearer ${TOKEN}` } });
      const text = await new Promise<string>((resolve, reject) => {
        http.get(`http://${own.adminAddr}/metrics`, (res) => {
          let body = "";
          res.setEncoding("utf8");
          res.on("data", (c: string) => (body += c));
          res.on("end", () => resolve(body));
        }).on("error", reject);
      });
      expect(text).to.match(/mmgate_media_tensor_store_bytes 48/);
      expect(text).to.match(/mmgate_media_tensor_store_tensors 1/);
      expect(text).to.match(/mmgate_media_tensor_store_removals_total\{reason="released"\} 1/);
    } finally {
      await own.close();
    }
  });
});
