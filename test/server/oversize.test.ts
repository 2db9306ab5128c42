import * as http2 from "node:http2";
import { expect } from "chai";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import { Health } from "../../gen/grpc/health/v1/health_pb.js";
import { eventually, grpcUnary, startServer, type InProcessServer } from "../support/index.js";

const MiB = 1024 * 1024;

/**
 * An oversized request is answered from its frame header, before its body is
 * read. Once that answer is out, the rest of the body is cut (HTTP/2 reset
 * after a complete response) for every protocol, so that each client sees
 * RESOURCE_EXHAUSTED at once and the server holds nothing for it.
 */
describe("host: an oversized request, over every protocol", () => {
  let server: InProcessServer;
  before(async () => {
    server = await startServer();
  });
  after(() => server.close());

  // Node's own client session holds at most 10 MB of unsent data by default
  // and resets its stream with ENHANCE_YOUR_CALM past that; these clients
  // may buffer a whole 20 MB request.
  const nodeOptions = { maxSessionMemory: 1000 };
  const protocols: [string, (baseUrl: string) => Transport][] = [
    ["gRPC", (baseUrl) => createGrpcTransport({ baseUrl, nodeOptions })],
    ["gRPC-Web", (baseUrl) => createGrpcWebTransport({ baseUrl, httpVersion: "2", nodeOptions })],
    ["Connect", (baseUrl) => createConnectTransport({ baseUrl, httpVersion: "2", nodeOptions })],
  ];
  for (const [name, transport] of protocols) {
    for (const size of [9 * MiB, 20 * MiB]) {
      it(`${name}, ${size / MiB} MiB: RESOURCE_EXHAUSTED, not a reset or a timeout`, async () => {
        const client = createClient(Health, transport(server.baseUrl));
        const err = await client
          .check({ service: "x".repeat(size) }, { timeoutMs: 15_000 })
          .then(() => undefined)
          .catch((e: unknown) => ConnectError.from(e));
        expect(err?.code, err?.message).to.equal(Code.ResourceExhausted);
      });
    }
  }

  it("@grpc/grpc-js, 9 MiB: RESOURCE_EXHAUSTED", async () => {
    const client = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
    const err = await grpcUnary(client, "Check", { service: "x".repeat(9 * MiB) }, { deadline: new Date(Date.now() + 15_000) }).catch(
      (e: grpc.ServiceError) => e,
    );
    expect((err as grpc.ServiceError).code).to.equal(grpc.status.RESOURCE_EXHAUSTED);
  });

  for (const contentType of ["application/grpc-web+proto", "application/proto"]) {
    it(`${contentType}: the stream is released once the response is out, while the client is still sending`, async () => {
      const session = http2.connect(server.baseUrl, nodeOptions);
      session.on("error", () => undefined);
      try {
        const req = session.request({
          ":method": "POST",
          ":path": "/grpc.health.v1.Health/Check",
          "content-type": contentType,
          "connect-protocol-version": "1",
        });
        req.on("error", () => undefined);
        let ended = false;
        req.on("data", () => undefined);
        req.on("end", () => (ended = true));
        const closed = new Promise<number>((resolve) => req.on("close", () => resolve(req.rstCode ?? -1)));
        // gRPC-Web: an envelope header announcing 11.5 MB, then more than the stream window.
        // Connect unary has no envelope: the body itself passes the 8 MiB limit.
        req.write(Buffer.from([0, 0, 0xb0, 0, 0]));
        for (let i = 0; i < 10; i++) req.write(Buffer.alloc(MiB));
        // The client never ends its body: only the server can end this stream.
        expect(await closed).to.equal(http2.constants.NGHTTP2_NO_ERROR);
        expect(ended, "the whole response arrived before the reset").to.equal(true);
      } finally {
        session.destroy();
      }
    });
  }

  it("keeps serving afterwards", async () => {
    await eventually(async () => {
      const res = await createClient(Health, server.transport).check({ service: "" });
      expect(res.status).to.equal(1);
    });
  });
});
