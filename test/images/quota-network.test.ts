/**
 * Per-caller quotas on a real server, called over the network with
 * @grpc/grpc-js, connect and plain HTTP (the OpenAI-shaped routes), on both
 * request paths: limits come from the keys file, a key over its limit is
 * refused RESOURCE_EXHAUSTED `quota_exceeded` with `retry-after` while
 * other keys are not, images per minute count n, an idempotent replay is
 * not charged again, and anonymous calls have `images.quotas.anonymous`.
 * The buckets run on a clock the test moves, so no outcome depends on how
 * fast the calls are.
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fromBinary } from "@bufbuild/protobuf";
import { BinaryReader } from "@bufbuild/protobuf/wire";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import * as pb from "../../gen/mmgate/images/v1/images_pb.js";
import { defineImagesModule } from "../../src/images/index.js";
import { keyDigest } from "../../src/server/index.js";
import { connectPathOnly, expectRejection, FakeClock, grpcServerStream, grpcUnary, metricValue, startServer, type GrpcClient, type InProcessServer } from "../support/index.js";

const PROTO = "mmgate/images/v1/image_service.proto";
const SERVICE = "mmgate.images.v1.ImageService";

const KEYS = {
  slow: "slow-key-0123456789abcdef",
  free: "free-key-0123456789abcdef",
  few: "few-key-0123456789abcdef0",
};

const KEYS_FILE = `keys:
  - { name: slow, sha256: ${keyDigest(KEYS.slow)}, scopes: [images], limits: { requestsPerSecond: 2 } }
  - { name: free, sha256: ${keyDigest(KEYS.free)}, scopes: [images] }
  - { name: few, sha256: ${keyDigest(KEYS.few)}, scopes: [images], limits: { imagesPerMinute: 5 } }
`;

const IMAGES = { reference: { latencyMs: 1, defaultSize: "64x64", maxPartialImages: 1 }, fanout: { maxOutputs: 8, maxParallelOutputs: 8 } };

/** A request both clients send alike (no operation is a generate request). */
const generate = (n = 1) => ({ request: { prompt: "a quota", parameters: { n } } });

function bearer(key: string, extra: Record<string, string> = {}): grpc.Metadata {
  const md = new grpc.Metadata();
  md.set("authorization", `Bearer ${key}`);
  for (const [name, value] of Object.entries(extra)) md.set(name, value);
  return md;
}

const auth = (key: string, extra: Record<string, string> = {}) => ({ headers: { authorization: `Bearer ${key}`, ...extra } });

/** The ErrorDetail of a grpc-js error (grpc-status-details-bin is a google.rpc.Status with Any details). */
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
    let value: Uint8Array = new Uint8Array();
    while (any.pos < any.len) {
      const [f, w] = any.tag();
      if (f === 2) value = any.bytes();
      else if (f === 1) any.string();
      else any.skip(w);
    }
    return fromBinary(pb.ErrorDetailSchema, value);
  }
  throw new Error("no ErrorDetail in the status");
}

const grpcRefusal = (work: Promise<unknown>) => expectRejection<grpc.ServiceError>(work, { code: grpc.status.RESOURCE_EXHAUSTED });
const connectRefusal = (work: Promise<unknown>) => expectRejection<ConnectError>(work, { type: ConnectError, code: Code.ResourceExhausted });

for (const leanPath of [true, false]) {
  const label = leanPath && !connectPathOnly ? "lean path" : "connect path";
  const tag = label.replace(" ", "-");

  describe(`images: per-key quotas over the network (${label})`, function () {
    this.timeout(30_000);
    const clock = new FakeClock(1_700_000_000_000);
    let dir: string;
    let server: InProcessServer;
    let grpcClient: GrpcClient;
    let images: Client<typeof ImageService>;

    before(async () => {
      dir = await mkdtemp(join(tmpdir(), "mmgate-quota-net-"));
      const file = join(dir, "keys.yaml");
      await writeFile(file, KEYS_FILE);
      server = await startServer({
        modules: [defineImagesModule({ quotaClock: clock.now })],
        config: { auth: { keysFile: file }, rpc: { leanPath }, images: IMAGES },
      });
      grpcClient = server.grpcClient(PROTO, SERVICE);
      images = createClient(ImageService, server.transport);
    });
    after(async () => {
      await server?.close();
      await rm(dir, { recursive: true, force: true });
    });
    // Every bucket full again: an hour is more than any of them takes to refill.
    beforeEach(() => clock.advance(3_600_000));

    const rejections = (caller: string, limit: string) => metricValue(server.host.metrics.registry, "mmgate_images_quota_rejections_total", { caller, limit });

    it("refuses a key limited to 2 requests a second its third call, with retry-after; another key is unaffected", async () => {
      const before = await rejections("slow", "requests");
      await grpcUnary(grpcClient, "Generate", generate(), { metadata: bearer(KEYS.slow) });
      await images.generate(generate(), auth(KEYS.slow));
      const refused = await grpcRefusal(grpcUnary(grpcClient, "Generate", generate(), { metadata: bearer(KEYS.slow) }));
      expect(refused.metadata.get("retry-after")).to.deep.equal(["1"]);
      expect(decodeURIComponent(refused.details)).to.equal("caller slow is over the quota of 2 requests per second; retry in 1 s");
      const detail = errorDetailOf(refused);
      expect(detail).to.deep.include({ code: pb.ErrorCode.QUOTA_EXCEEDED, retryable: true });
      expect(detail.details).to.deep.include({ limit: "requests", caller: "slow", quota: 2, retry_after_ms: 500 });

      const viaConnect = await connectRefusal(images.generate(generate(), auth(KEYS.slow)));
      expect(viaConnect.metadata.get("retry-after")).to.equal("1");
      expect(viaConnect.findDetails(pb.ErrorDetailSchema)[0]?.code).to.equal(pb.ErrorCode.QUOTA_EXCEEDED);

      // A key without limits, meanwhile, as often as it likes.
      for (let i = 0; i < 5; i += 1) await grpcUnary(grpcClient, "Generate", generate(), { metadata: bearer(KEYS.free) });
      await images.generate(generate(), auth(KEYS.free));

      // Half a second later there is a request again, and only one.
      clock.advance(500);
      await images.generate(generate(), auth(KEYS.slow));
      await connectRefusal(images.generate(generate(), auth(KEYS.slow)));
      expect((await rejections("slow", "requests")) - before).to.equal(3);
      expect(await rejections("free", "requests")).to.equal(0);
    });

    it("refuses GenerateStream before `started`: a status with retry-after and no messages", async () => {
      await images.generate(generate(), auth(KEYS.slow));
      await images.generate(generate(), auth(KEYS.slow));
      const refused = await grpcRefusal(grpcServerStream(grpcClient, "GenerateStream", generate(), { metadata: bearer(KEYS.slow) }));
      expect((refused as grpc.ServiceError & { received?: unknown[] }).received).to.deep.equal([]);
      expect(refused.metadata.get("retry-after")).to.deep.equal(["1"]);
      const events: string[] = [];
      const viaConnect = await connectRefusal(
        (async () => {
          for await (const message of images.generateStream(generate(), auth(KEYS.slow))) events.push(message.event.case ?? "");
        })(),
      );
      expect(events).to.deep.equal([]);
      expect(viaConnect.metadata.get("retry-after")).to.equal("1");
      // Another key streams as usual.
      const free: string[] = [];
      for await (const message of images.generateStream(generate(), auth(KEYS.free))) free.push(message.event.case ?? "");
      expect(free[0]).to.equal("started");
      expect(free.at(-1)).to.equal("completed");
    });

    it("counts images per minute by n, and refuses for good a request larger than the whole minute", async () => {
      await images.generate(generate(3), auth(KEYS.few));
      const over = await connectRefusal(images.generate(generate(3), auth(KEYS.few)));
      expect(over.rawMessage).to.equal("caller few is over the quota of 5 images per minute (this request asks for 3); retry in 12 s");
      expect(over.metadata.get("retry-after")).to.equal("12");
      // What is left still serves a smaller request.
      await grpcUnary(grpcClient, "Generate", generate(2), { metadata: bearer(KEYS.few) });
      const never = await grpcRefusal(grpcUnary(grpcClient, "Generate", generate(6), { metadata: bearer(KEYS.few) }));
      expect(errorDetailOf(never)).to.deep.include({ code: pb.ErrorCode.QUOTA_EXCEEDED, retryable: false });
      expect(decodeURIComponent(never.details)).to.match(/asks for 6 images, more than caller few's quota of 5 images per minute allows at once/);
      clock.advance(60_000);
      await images.generate(generate(5), auth(KEYS.few));
      expect(await rejections("few", "images")).to.be.at.least(2);
    });

    it("does not charge an idempotent replay again: only calls that run are counted", async () => {
      const key = { "idempotency-key": `quota-replay-${tag}` };
      const first = await images.generate(generate(), auth(KEYS.slow, key));
      // Replays, as often as the client retries, over both clients.
      for (let i = 0; i < 3; i += 1) {
        let replayed: string | null = null;
        const again = await images.generate(generate(), { ...auth(KEYS.slow, key), onHeader: (h) => (replayed = h.get("idempotency-replayed")) });
        expect(replayed).to.equal("true");
        expect(again.response?.id).to.equal(first.response?.id);
      }
      await grpcUnary(grpcClient, "Generate", generate(), { metadata: bearer(KEYS.slow, key) });
      // One request of the two is left, for a call that runs.
      await images.generate(generate(), auth(KEYS.slow));
      await connectRefusal(images.generate(generate(), auth(KEYS.slow)));
      // A keyed call that would run is charged, and refused before `started` on a stream too; its key stays free.
      const fresh = { "idempotency-key": `quota-fresh-${tag}` };
      const refused = await grpcRefusal(grpcServerStream(grpcClient, "GenerateStream", generate(), { metadata: bearer(KEYS.slow, fresh) }));
      expect((refused as grpc.ServiceError & { received?: unknown[] }).received).to.deep.equal([]);
      clock.advance(500);
      const ran = await images.generate(generate(), auth(KEYS.slow, fresh));
      expect(ran.response?.data).to.have.length(1);
    });

    it("answers the OpenAI-shaped routes 429 rate_limit_exceeded with Retry-After, streaming or not", async () => {
      const post = (body: Record<string, unknown>, headers: Record<string, string> = {}) =>
        fetch(`http://${server.addr}/v1/images/generations`, {
          method: "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${KEYS.slow}`, ...headers },
          body: JSON.stringify({ prompt: "a quota over http", ...body }),
        });
      for (let i = 0; i < 2; i += 1) {
        const answer = await post({});
        expect(answer.status, await answer.text()).to.equal(200);
      }
      for (const [body, headers] of [
        [{}, {}],
        [{ stream: true, partial_images: 1 }, {}],
        [{ stream: true, partial_images: 1 }, { "idempotency-key": `quota-http-${tag}` }],
      ] as const) {
        const answer = await post(body, headers);
        expect(answer.status, await answer.clone().text()).to.equal(429);
        expect(answer.headers.get("retry-after")).to.equal("1");
        const { error } = (await answer.json()) as { error: { type: string; code: string; message: string } };
        expect(error).to.deep.equal({ type: "rate_limit_error", code: "rate_limit_exceeded", param: null, message: "caller slow is over the quota of 2 requests per second; retry in 1 s" });
      }
    });
  });
}

describe("images: quotas of anonymous calls (images.quotas.anonymous)", function () {
  this.timeout(30_000);
  const clock = new FakeClock(1_700_000_000_000);
  let server: InProcessServer;

  before(async () => {
    server = await startServer({
      modules: [defineImagesModule({ quotaClock: clock.now })],
      config: { images: { ...IMAGES, quotas: { anonymous: { requestsPerSecond: 1 } } } },
    });
  });
  after(async () => server?.close());

  it("holds every call without a key to one shared bucket, labelled anonymous", async () => {
    const images = createClient(ImageService, server.transport);
    await images.generate(generate());
    const refused = await connectRefusal(createClient(ImageService, server.connectTransport).generate(generate()));
    expect(refused.rawMessage).to.equal("anonymous callers are over the quota of 1 requests per second; retry in 1 s");
    expect(await metricValue(server.host.metrics.registry, "mmgate_images_quota_rejections_total", { caller: "anonymous", limit: "requests" })).to.equal(1);
    clock.advance(1000);
    await images.generate(generate());
  });
});
