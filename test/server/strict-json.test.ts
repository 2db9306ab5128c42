/**
 * Protobuf JSON as `buf curl` and Go's protojson read it: a request with an
 * unknown field or an unknown enum name is refused with INVALID_ARGUMENT
 * naming it, instead of being served with the field dropped (connect-es's
 * default). Connect unary JSON calls go through the lean path unless
 * MMGATE_TEST_RPC_PATH=connect turns it off (then through connect's
 * handler); gRPC+json and gRPC-Web+json always go through connect.
 */
import { expect } from "chai";
import { imagesModule } from "../../src/images/index.js";
import { connectPathOnly, startServer } from "../support/index.js";
import type { InProcessServer } from "../support/index.js";
import { grpcFrame, parseGrpcFrames, rawH2 } from "../support/raw-h2.js";
import type { RawH2Response } from "../support/raw-h2.js";

const GENERATE = "/mmgate.images.v1.ImageService/Generate";
const HEALTH_CHECK = "/grpc.health.v1.Health/Check";

function connectJson(addr: string, path: string, body: unknown, contentType = "application/json"): Promise<RawH2Response> {
  return rawH2(addr, {
    headers: { ":method": "POST", ":path": path, "content-type": contentType },
    body: Buffer.from(JSON.stringify(body)),
  });
}

function errorOf(res: RawH2Response): { code: string; message: string } {
  return JSON.parse(res.data.toString("utf8")) as { code: string; message: string };
}

describe("server: strict protobuf JSON (unknown fields and enum names are refused)", function () {
  this.timeout(30_000);
  let server: InProcessServer;

  before(async () => {
    server = await startServer({
      modules: [imagesModule],
      config: { images: { reference: { latencyMs: 0, defaultSize: "64x64" } } },
    });
  });
  after(async () => server?.close());

  const leanCalls = async () => (await server.host.metrics.leanPathCalls.get()).values[0]?.value ?? 0;

  /** Runs `fn` and checks that the lean path took exactly `n` calls meanwhile, or none when it is off. */
  async function onPath<T>(n: number, fn: () => Promise<T>): Promise<T> {
    const before = await leanCalls();
    const result = await fn();
    expect((await leanCalls()) - before, "lean path calls").to.equal(connectPathOnly ? 0 : n);
    return result;
  }

  describe(`Connect unary JSON (${connectPathOnly ? "connect's handler" : "lean path"})`, () => {
    it("serves a valid request", async () => {
      const res = await onPath(1, () =>
        connectJson(server.addr, GENERATE, { request: { prompt: "a fox", generate: {}, parameters: { n: 2, outputFormat: "OUTPUT_FORMAT_JPEG" } } }),
      );
      expect(res.status, res.data.toString()).to.equal(200);
      const body = JSON.parse(res.data.toString("utf8")) as { response: { data: { format: string }[] } };
      expect(body.response.data.map((d) => d.format)).to.deep.equal(["OUTPUT_FORMAT_JPEG", "OUTPUT_FORMAT_JPEG"]);
    });

    it("refuses an unknown field, naming it", async () => {
      const res = await onPath(1, () => connectJson(server.addr, GENERATE, { request: { prompt: "a fox", generate: {}, parametrs: { n: 4 } } }));
      expect(res.status).to.equal(400);
      const error = errorOf(res);
      expect(error.code).to.equal("invalid_argument");
      expect(error.message).to.contain('"parametrs"').and.to.contain("mmgate.images.v1.ImageRequest");
    });

    it("refuses an unknown enum name, naming the enum and the value", async () => {
      const res = await onPath(1, () =>
        connectJson(server.addr, GENERATE, { request: { prompt: "a fox", generate: {}, parameters: { outputFormat: "webp" } } }),
      );
      expect(res.status).to.equal(400);
      const error = errorOf(res);
      expect(error.code).to.equal("invalid_argument");
      expect(error.message).to.contain("mmgate.images.v1.OutputFormat").and.to.contain('"webp"');
    });

    it("refuses an unknown field at the top level, on the host's own services too", async () => {
      const res = await onPath(1, () => connectJson(server.addr, HEALTH_CHECK, { service: "", notAField: 1 }, "application/json; charset=utf-8"));
      expect(res.status).to.equal(400);
      const error = errorOf(res);
      expect(error.code).to.equal("invalid_argument");
      expect(error.message).to.contain('"notAField"');
    });
  });

  describe("Connect server-streaming JSON (connect's handler)", () => {
    it("refuses an unknown field in the request", async () => {
      const body = Buffer.from(JSON.stringify({ request: { prompt: "a fox", generate: {}, parametrs: { n: 4 } } }));
      const res = await onPath(0, () =>
        rawH2(server.addr, {
          headers: { ":method": "POST", ":path": "/mmgate.images.v1.ImageService/GenerateStream", "content-type": "application/connect+json" },
          body: grpcFrame(body),
        }),
      );
      expect(res.status).to.equal(200);
      const { frames } = parseGrpcFrames(res.data);
      const end = frames.at(-1)!;
      expect(end.flags & 0x02, "end-stream frame").to.equal(0x02);
      const { error } = JSON.parse(Buffer.from(end.payload).toString("utf8")) as { error: { code: string; message: string } };
      expect(error.code).to.equal("invalid_argument");
      expect(error.message).to.contain('"parametrs"');
    });
  });

  for (const [name, contentType] of [
    ["gRPC+json", "application/grpc+json"],
    ["gRPC-Web+json", "application/grpc-web+json"],
  ] as const) {
    describe(`${name} (connect's handler)`, () => {
      const call = (body: unknown) =>
        onPath(0, () =>
          rawH2(server.addr, {
            headers: { ":method": "POST", ":path": GENERATE, "content-type": contentType, te: "trailers" },
            body: grpcFrame(Buffer.from(JSON.stringify(body))),
          }),
        );
      /** grpc-status and grpc-message: from the trailers (gRPC, or a trailers-only answer), else the gRPC-Web trailer frame. */
      const statusOf = (res: RawH2Response): { status: string | undefined; message: string } => {
        const fields = res.trailers ?? (res.headers?.["grpc-status"] !== undefined ? res.headers : undefined);
        if (fields) return { status: fields["grpc-status"] as string, message: decodeURIComponent(String(fields["grpc-message"] ?? "")) };
        const trailer = parseGrpcFrames(res.data).frames.find((f) => (f.flags & 0x80) !== 0);
        const lines = Buffer.from(trailer?.payload ?? new Uint8Array()).toString("utf8").split("\r\n");
        const get = (key: string) => lines.find((l) => l.toLowerCase().startsWith(`${key}:`))?.slice(key.length + 1).trim();
        return { status: get("grpc-status"), message: decodeURIComponent(get("grpc-message") ?? "") };
      };

      it("serves a valid request", async () => {
        const res = await call({ request: { prompt: "a fox", generate: {}, parameters: { outputFormat: "OUTPUT_FORMAT_PNG" } } });
        expect(statusOf(res)).to.deep.equal({ status: "0", message: "" });
      });

      it("refuses an unknown field, naming it", async () => {
        const { status, message } = statusOf(await call({ request: { prompt: "a fox", generate: {}, parametrs: { n: 4 } } }));
        expect(status).to.equal("3");
        expect(message).to.contain('"parametrs"');
      });

      it("refuses an unknown enum name", async () => {
        const { status, message } = statusOf(await call({ request: { prompt: "a fox", generate: {}, parameters: { outputFormat: "webp" } } }));
        expect(status).to.equal("3");
        expect(message).to.contain("mmgate.images.v1.OutputFormat").and.to.contain('"webp"');
      });
    });
  }
});
