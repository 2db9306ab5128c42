import { Code, ConnectError, createClient } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Health, HealthCheckRequestSchema, HealthCheckResponse_ServingStatus as S, HealthCheckResponseSchema } from "../../gen/grpc/health/v1/health_pb.js";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import type { GrpcClient, InProcessServer } from "../support/index.js";
import { eventually, expectRejection, grpcServerStream, grpcUnary, startServer } from "../support/index.js";
import { HealthRegistry, ServingStatus, healthService } from "../../src/server/health.js";
import { connectH2, grpcFrame, parseGrpcFrames, startRawH2 } from "../support/raw-h2.js";

describe("grpc.health.v1", () => {
  let server: InProcessServer;
  let health: GrpcClient;
  beforeEach(async () => {
    server = await startServer();
    health = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
  });
  afterEach(() => server.close());

  it("reports SERVING for the server and for every registered service", async () => {
    for (const service of ["", "grpc.health.v1.Health", "mmgate.admin.v1.AdminService", "grpc.reflection.v1.ServerReflection"]) {
      expect(await grpcUnary(health, "Check", { service })).to.deep.equal({ status: "SERVING" });
    }
    const list = await createClient(Health, server.transport).list({});
    expect(Object.keys(list.statuses)).to.include.members(["", "mmgate.admin.v1.AdminService"]);
  });

  it("answers Check for an unknown service with NOT_FOUND", async () => {
    await expectRejection(grpcUnary(health, "Check", { service: "no.such.Service" }), { code: grpc.status.NOT_FOUND });
  });

  it("Watch sends the current status, then every change", async () => {
    const admin = createClient(AdminService, server.transport);
    const seen: string[] = [];
    const cancelled = expectRejection(
      grpcServerStream<{ status: string }>(health, "Watch", { service: "mmgate.admin.v1.AdminService" }, {
        onMessage: (m, call) => {
          seen.push(m.status);
          if (seen.length === 3) call.cancel();
        },
      }),
      { code: grpc.status.CANCELLED },
    );
    await eventually(() => expect(seen).to.deep.equal(["SERVING"]));
    await admin.setServingStatus({ service: "mmgate.admin.v1.AdminService", serving: false });
    await eventually(() => expect(seen).to.deep.equal(["SERVING", "NOT_SERVING"]));
    await admin.setServingStatus({ service: "mmgate.admin.v1.AdminService", serving: true });
    await cancelled;
    expect(seen).to.deep.equal(["SERVING", "NOT_SERVING", "SERVING"]);
  });

  it("Watch of an unknown service says SERVICE_UNKNOWN and keeps watching", async () => {
    const seen: string[] = [];
    const done = grpcServerStream<{ status: string }>(health, "Watch", { service: "later.Service" }, {
      onMessage: (m, call) => {
        seen.push(m.status);
        call.cancel();
      },
    }).catch(() => undefined);
    await done;
    expect(seen).to.deep.equal(["SERVICE_UNKNOWN"]);
  });

  it("Watch sees NOT_SERVING when the server drains, then the stream ends with OK", async () => {
    const seen: string[] = [];
    const watch = grpcServerStream<{ status: string }>(health, "Watch", { service: "" }, { onMessage: (m) => seen.push(m.status) });
    const connectSeen: S[] = [];
    const connectWatch = (async () => {
      for await (const res of createClient(Health, server.transport).watch({ service: "mmgate.admin.v1.AdminService" })) {
        connectSeen.push(res.status);
      }
    })();
    // Both streams are open (each has its first status) before the drain starts.
    await eventually(() => expect([seen.length, connectSeen.length]).to.deep.equal([1, 1]));
    await server.host.shutdown();
    expect(await watch).to.deep.equal([{ status: "SERVING" }, { status: "NOT_SERVING" }]);
    await connectWatch;
    expect(connectSeen).to.deep.equal([S.SERVING, S.NOT_SERVING]);
  });

  it("Watch ends DEADLINE_EXCEEDED at its deadline, on both paths, even for a client that does not enforce it", async () => {
    // A raw client: grpc-timeout 100m is sent and never enforced here, so the status is the server's own.
    const session = await connectH2(server.addr);
    try {
      const call = startRawH2(session, {
        headers: { ":method": "POST", ":path": "/grpc.health.v1.Health/Watch", "content-type": "application/grpc", te: "trailers", "grpc-timeout": "100m" },
        body: grpcFrame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema, { service: "" }))),
        timeoutMs: 10_000,
      });
      const res = await call.response;
      expect(parseGrpcFrames(res.data).frames.map((f) => fromBinary(HealthCheckResponseSchema, f.payload).status)).to.deep.equal([S.SERVING]);
      expect(res.trailers?.["grpc-status"]).to.equal(String(Code.DeadlineExceeded));
    } finally {
      session.destroy();
    }
  });

  it("readyz follows the server's status; healthz stays up", async () => {
    const admin = createClient(AdminService, server.transport);
    expect((await fetch(`http://${server.adminAddr}/readyz`)).status).to.equal(200);
    await admin.setServingStatus({ service: "", serving: false });
    expect((await fetch(`http://${server.adminAddr}/readyz`)).status).to.equal(503);
    expect((await fetch(`http://${server.adminAddr}/healthz`)).status).to.equal(200);
    expect((await createClient(Health, server.transport).check({ service: "" })).status).to.equal(S.NOT_SERVING);
    await expectRejection(admin.setServingStatus({ service: "nope", serving: true }), { type: ConnectError, code: Code.NotFound });
  });
});

describe("health Watch and the drain", () => {
  it("sends the drain's NOT_SERVING even when the drain comes while the previous message is being written", async () => {
    const registry = new HealthRegistry();
    const drain = new AbortController();
    const watch = healthService(registry, drain.signal).watch as unknown as (
      req: { service: string },
      ctx: { signal: AbortSignal },
    ) => AsyncGenerator<{ status: ServingStatus }>;
    const stream = watch({ service: "" }, { signal: new AbortController().signal });
    expect((await stream.next()).value?.status).to.equal(ServingStatus.SERVING);
    // The generator is suspended at its yield (the transport writes SERVING); SIGTERM arrives.
    registry.drain();
    drain.abort();
    expect((await stream.next()).value?.status).to.equal(ServingStatus.NOT_SERVING);
    expect((await stream.next()).done).to.equal(true);
  });
});
