import * as http2 from "node:http2";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import { Health, HealthCheckResponse_ServingStatus as S } from "../../gen/grpc/health/v1/health_pb.js";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import type { InProcessServer } from "../support/index.js";
import { pino } from "pino";
import { z } from "zod";
import { defineModule, resolveConfig, startHost } from "../../src/server/index.js";
import { expectRejection, grpcJsClient, grpcUnary, startServer } from "../support/index.js";

/** One raw request over HTTP/2 (gRPC by default), returning the HTTP status, headers, trailers and body. */
function rawGrpc(addr: string, path: string, body: Uint8Array | string, headers: http2.OutgoingHttpHeaders = {}) {
  return new Promise<{ status: number; headers: http2.IncomingHttpHeaders; trailers: http2.IncomingHttpHeaders; body: Buffer }>(
    (resolve, reject) => {
      const session = http2.connect(`http://${addr}`);
      session.on("error", reject);
      const req = session.request({ ":method": "POST", ":path": path, "content-type": "application/grpc", te: "trailers", ...headers });
      let responseHeaders: http2.IncomingHttpHeaders = {};
      let trailers: http2.IncomingHttpHeaders = {};
      const chunks: Buffer[] = [];
      req.on("response", (h) => (responseHeaders = h));
      req.on("trailers", (t) => (trailers = t));
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        session.close();
        resolve({ status: Number(responseHeaders[":status"]), headers: responseHeaders, trailers, body: Buffer.concat(chunks) });
      });
      req.on("error", reject);
      req.end(body);
    },
  );
}

/** gRPC status from a trailers block or a trailers-only response. */
function grpcStatus(res: { headers: http2.IncomingHttpHeaders; trailers: http2.IncomingHttpHeaders }): number {
  return Number(res.trailers["grpc-status"] ?? res.headers["grpc-status"]);
}

function envelope(payload: Uint8Array, declaredLength = payload.length, flags = 0): Uint8Array {
  const out = new Uint8Array(5 + payload.length);
  out[0] = flags;
  new DataView(out.buffer).setUint32(1, declaredLength);
  out.set(payload, 5);
  return out;
}

const CHECK = "/grpc.health.v1.Health/Check";

describe("server host", () => {
  describe("bad input", () => {
    let server: InProcessServer;
    before(async () => {
      server = await startServer({ config: { limits: { maxReceiveMessageBytes: 4096 } } });
    });
    after(() => server.close());

    async function stillServes() {
      const health = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
      expect(await grpcUnary(health, "Check", { service: "" })).to.deep.equal({ status: "SERVING" });
      expect((await createClient(Health, server.transport).check({})).status).to.equal(S.SERVING);
    }

    it("answers an unknown method with UNIMPLEMENTED", async () => {
      const res = await rawGrpc(server.addr, "/no.such.Service/Nothing", envelope(new Uint8Array()));
      expect(grpcStatus(res)).to.equal(Code.Unimplemented);
      // A grpc-js client for a service the server does not have.
      const stranger = grpcJsClient(server.addr, "grpc/health/v1/health.proto", "grpc.health.v1.Health");
      const err = await new Promise<grpc.ServiceError>((resolve) =>
        stranger.makeUnaryRequest("/grpc.health.v1.Health/Nope", (x: Buffer) => x, (x: Buffer) => x, Buffer.alloc(0), (e) => resolve(e!)),
      );
      stranger.close();
      expect(err.code).to.equal(grpc.status.UNIMPLEMENTED);
      await stillServes();
    });

    it("survives clients that reset or drop an unknown-method call mid-flight", async () => {
      for (const how of ["reset", "drop"] as const) {
        for (let i = 0; i < 10; i++) {
          const session = http2.connect(`http://${server.addr}`);
          session.on("error", () => undefined);
          await new Promise((r) => session.once("connect", r));
          const req = session.request({ ":method": "POST", ":path": "/no.Such/Method", "content-type": "application/grpc" });
          req.on("error", () => undefined);
          req.end(envelope(new Uint8Array()));
          if (how === "reset") req.close(http2.constants.NGHTTP2_CANCEL);
          else session.destroy();
          await new Promise((r) => setTimeout(r, 20));
          session.destroy();
        }
      }
      await stillServes();
    });

    it("answers an unknown method before the client half-closes", async () => {
      const session = http2.connect(`http://${server.addr}`);
      const req = session.request({ ":method": "POST", ":path": "/no.Such/Bidi", "content-type": "application/grpc" });
      const headers = await new Promise<http2.IncomingHttpHeaders>((resolve) => req.once("response", resolve));
      expect(Number(headers["grpc-status"])).to.equal(Code.Unimplemented);
      req.close();
      session.close();
    });

    it("lets go of a connection whose request body was left unread, once the client closes it", async () => {
      // A first message that fails to parse, then 200 KB the server never reads.
      const body = new Uint8Array([...envelope(new Uint8Array([0xff, 0xff, 0xff, 0xff])), ...envelope(new Uint8Array(200_000))]);
      const session = http2.connect(`http://${server.addr}`);
      session.on("error", () => undefined);
      const closed = new Promise<void>((r) => session.once("close", () => r()));
      const req = session.request({ ":method": "POST", ":path": CHECK, "content-type": "application/grpc", te: "trailers" });
      req.on("error", () => undefined);
      const status = await new Promise<string | undefined>((resolve) => {
        let trailers: http2.IncomingHttpHeaders = {};
        req.on("trailers", (t) => (trailers = t));
        req.on("data", () => undefined);
        req.on("end", () => resolve(trailers["grpc-status"] as string | undefined));
        req.end(body);
      });
      expect(status).to.be.oneOf([String(Code.Internal), String(Code.InvalidArgument), String(Code.ResourceExhausted)]);
      if (!req.closed) req.close(http2.constants.NGHTTP2_CANCEL);
      session.close();
      // Before the fix the paused stream held the connection until shutdown; this wait then ran out.
      await Promise.race([closed, new Promise((_, reject) => setTimeout(() => reject(new Error("connection still open after 10 s")), 10_000))]);
      await stillServes();
    });

    it("rejects a message over the receive limit with RESOURCE_EXHAUSTED", async () => {
      const health = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
      await expectRejection(grpcUnary(health, "Check", { service: "x".repeat(5000) }), { code: grpc.status.RESOURCE_EXHAUSTED });
      await expectRejection(createClient(Health, server.transport).check({ service: "y".repeat(5000) }), {
        type: ConnectError,
        code: Code.ResourceExhausted,
      });
      // A frame that only claims to be huge is refused from its header.
      const claimed = await rawGrpc(server.addr, CHECK, envelope(new Uint8Array(2), 0x7fffffff));
      expect(grpcStatus(claimed)).to.equal(Code.ResourceExhausted);
      await stillServes();
    });

    it("rejects malformed gRPC frames with a status and keeps serving", async () => {
      const cases: [string, Uint8Array, number[]][] = [
        ["a frame shorter than its length prefix", envelope(new Uint8Array([0x0a, 0x01]), 100), [Code.InvalidArgument, Code.Internal]],
        ["a truncated envelope header", new Uint8Array([0, 0, 0]), [Code.InvalidArgument, Code.Internal]],
        ["bytes that are not a protobuf message", envelope(new Uint8Array([0xff, 0xff, 0xff, 0xff])), [Code.InvalidArgument, Code.Internal]],
        ["a compressed flag without grpc-encoding", envelope(new Uint8Array([0x0a, 0x00]), 2, 1), [Code.InvalidArgument, Code.Internal]],
        ["two messages for a unary method", new Uint8Array([...envelope(new Uint8Array()), ...envelope(new Uint8Array())]), [Code.InvalidArgument, Code.Unimplemented, Code.Internal]],
      ];
      for (const [what, body, codes] of cases) {
        const res = await rawGrpc(server.addr, CHECK, body);
        expect(codes, what).to.include(grpcStatus(res));
      }
      await stillServes();
    });
  });

  describe("auth", () => {
    const token = "s3cret-token-for-tests-0123456789";
    let server: InProcessServer;
    before(async () => {
      server = await startServer({ config: { auth: { token } } });
    });
    after(() => server.close());

    it("requires the bearer token on admin and mutating methods, over grpc-js and connect", async () => {
      const admin = server.grpcClient("mmgate/admin/v1/admin.proto", "mmgate.admin.v1.AdminService");
      await expectRejection(grpcUnary(admin, "GetConfig", {}), { code: grpc.status.UNAUTHENTICATED });
      const wrong = new grpc.Metadata();
      wrong.set("authorization", "Bearer not-the-token");
      await expectRejection(grpcUnary(admin, "GetConfig", {}, { metadata: wrong }), { code: grpc.status.UNAUTHENTICATED });
      await expectRejection(grpcUnary(admin, "SetServingStatus", { service: "", serving: false }), { code: grpc.status.UNAUTHENTICATED });

      const client = createClient(AdminService, server.transport);
      for (const headers of [{}, { authorization: "Basic abc" }, { authorization: `Bearer ${token}x` }]) {
        await expectRejection(client.getConfig({}, { headers }), { type: ConnectError, code: Code.Unauthenticated });
      }
      // The server's status did not change through the refused call.
      expect((await client.getStatus({})).services.every((s) => s.status === S.SERVING)).to.equal(true);
    });

    it("serves them with the right token and redacts the token in GetConfig", async () => {
      const good = new grpc.Metadata();
      good.set("authorization", `Bearer ${token}`);
      const admin = server.grpcClient("mmgate/admin/v1/admin.proto", "mmgate.admin.v1.AdminService");
      const res = await grpcUnary<{ config: { fields: Record<string, unknown> } }>(admin, "GetConfig", {}, { metadata: good });
      expect(JSON.stringify(res)).to.not.include(token);
      const viaConnect = await createClient(AdminService, server.transport).getConfig({}, { headers: { authorization: `Bearer ${token}` } });
      expect((viaConnect.config as { auth: { token: string } }).auth.token).to.equal("<redacted>");
    });

    it("leaves public methods open", async () => {
      const status = await createClient(AdminService, server.transport).getStatus({});
      expect(status.version).to.equal("test");
    });
  });

  describe("protocols, logs and metrics", () => {
    let server: InProcessServer;
    const lines: string[] = [];
    before(async () => {
      server = await startServer({ logLines: lines });
    });
    after(() => server.close());

    it("serves gRPC, gRPC-Web and Connect on one port", async () => {
      for (const transport of [server.transport, server.grpcWebTransport, server.connectTransport]) {
        const res = await createClient(AdminService, transport).getStatus({});
        expect(res.services.map((s) => s.name)).to.include("mmgate.admin.v1.AdminService");
      }
    });

    it("logs one line per finished RPC with the client's request id, and counts it by code", async () => {
      const health = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
      const md = new grpc.Metadata();
      md.set("x-request-id", "req-42");
      await grpcUnary(health, "Check", { service: "" }, { metadata: md });
      await grpcUnary(health, "Check", { service: "missing" }).catch(() => undefined);
      await rawGrpc(server.addr, "/evil.Path/with-random-name", envelope(new Uint8Array()));
      const entries = lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((e) => e.msg === "rpc finished");
      const mine = entries.find((e) => e.requestId === "req-42");
      expect(mine).to.include({ service: "grpc.health.v1.Health", method: "Check", code: "OK" });
      expect(mine!.durationMs).to.be.a("number");
      expect(entries.some((e) => e.code === "NOT_FOUND" && e.method === "Check")).to.equal(true);
      const metrics = await (await fetch(`http://${server.adminAddr}/metrics`)).text();
      expect(metrics).to.match(/grpc_server_handled_total\{grpc_service="grpc.health.v1.Health",grpc_method="Check",grpc_type="unary",grpc_code="OK",caller="anonymous"\} [1-9]/);
      expect(metrics).to.match(/grpc_server_handled_total\{grpc_service="grpc.health.v1.Health",grpc_method="Check",grpc_type="unary",grpc_code="NOT_FOUND",caller="anonymous"\} 1/);
      expect(metrics).to.match(/grpc_server_handling_seconds_bucket\{.*grpc_method="Check".*\}/);
      expect(metrics).to.include("process_cpu_user_seconds_total");
      // Unknown paths share one label set, so clients cannot grow the series.
      expect(metrics).to.not.include("evil.Path");
      expect(metrics).to.match(/grpc_server_handled_total\{grpc_service="unknown",grpc_method="unknown",grpc_type="unknown",grpc_code="UNIMPLEMENTED",caller="anonymous"\} 1/);
    });

    it("records the status that went on the wire, for every protocol", async () => {
      // A long advertised address makes GetConfig's response larger than the send limit.
      const small = await startServer({
        config: { advertiseAddress: "a".repeat(2000), limits: { maxReceiveMessageBytes: 1024, maxSendMessageBytes: 1024 } },
      });
      try {
        const big = "x".repeat(3000);
        const admin = createClient(AdminService, small.transport);
        // The handler succeeds, the response is over the send limit.
        await admin.getConfig({}).catch(() => undefined);
        await createClient(Health, small.grpcWebTransport).check({ service: big }).catch(() => undefined);
        await createClient(Health, small.connectTransport).check({ service: big }).catch(() => undefined);
        const badJson = await rawGrpc(small.addr, CHECK, "{not json", { "content-type": "application/json" });
        expect(badJson.status).to.equal(400);
        const streamBadJson = await rawGrpc(small.addr, "/grpc.health.v1.Health/Watch", envelope(new TextEncoder().encode("{nope")), {
          "content-type": "application/connect+json",
        });
        expect(streamBadJson.status).to.equal(200);
        const webBadProto = await rawGrpc(small.addr, CHECK, envelope(new Uint8Array([0x0a, 0x05]), 2), {
          "content-type": "application/grpc-web+proto",
        });
        expect(webBadProto.status).to.equal(200);
        await createClient(Health, small.grpcWebTransport).check({});
        await createClient(Health, small.connectTransport).check({});
        const metrics = await (await fetch(`http://${small.adminAddr}/metrics`)).text();
        const count = (service: string, method: string, code: string) =>
          Number(new RegExp(`grpc_server_handled_total\\{grpc_service="${service}",grpc_method="${method}",grpc_type="[a-z_]+",grpc_code="${code}",caller="anonymous"\\} (\\d+)`).exec(metrics)?.[1] ?? 0);
        expect(count("mmgate.admin.v1.AdminService", "GetConfig", "RESOURCE_EXHAUSTED")).to.equal(1);
        expect(count("mmgate.admin.v1.AdminService", "GetConfig", "OK")).to.equal(0);
        expect(count("grpc.health.v1.Health", "Check", "RESOURCE_EXHAUSTED")).to.equal(2);
        expect(count("grpc.health.v1.Health", "Check", "INVALID_ARGUMENT")).to.equal(1);
        expect(count("grpc.health.v1.Health", "Watch", "INVALID_ARGUMENT")).to.equal(1);
        expect(count("grpc.health.v1.Health", "Check", "INTERNAL") + count("grpc.health.v1.Health", "Check", "INVALID_ARGUMENT")).to.equal(2);
        expect(count("grpc.health.v1.Health", "Check", "OK")).to.equal(2);
      } finally {
        await small.close();
      }
    });

    it("returns a request id to the client", async () => {
      const res = await rawGrpc(server.addr, CHECK, envelope(new Uint8Array()), { "x-request-id": "abc-1" });
      expect(res.headers["x-request-id"]).to.equal("abc-1");
      const generated = await rawGrpc(server.addr, CHECK, envelope(new Uint8Array()), { "x-request-id": "bad id with spaces" });
      expect(generated.headers["x-request-id"]).to.match(/^[0-9a-f-]{36}$/);
    });
  });

  describe("start-up failures", () => {
    it("stops the modules that started when a later module fails", async () => {
      const closed: string[] = [];
      const ok = defineModule({
        name: "first",
        description: "starts fine",
        configSchema: z.object({}),
        create: () => ({ services: [], close: () => void closed.push("first") }),
      });
      const broken = defineModule({
        name: "second",
        description: "fails to start",
        configSchema: z.object({}),
        create: () => {
          throw new Error("cannot start");
        },
      });
      const config = resolveConfig({ listen: "127.0.0.1:0", adminListen: "" }, [ok, broken]);
      await expectRejection(startHost({ config, modules: [ok, broken], logger: pino({ level: "silent" }), version: "test" }), {
        message: /^cannot start$/,
      });
      expect(closed).to.deep.equal(["first"]);
    });
  });
});
