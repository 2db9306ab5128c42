/**
 * AdminService.Drain: the graceful shutdown SIGTERM starts, asked for over
 * the network by an admin.
 */
import * as grpc from "@grpc/grpc-js";
import type { ConnectError} from "@connectrpc/connect";
import { Code, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { expect } from "chai";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { adminService } from "../../src/server/admin-service.js";
import { HealthRegistry, resolveConfig } from "../../src/server/index.js";
import { grpcUnary, startServer } from "../support/index.js";

const TOKEN = "drain-test-token-0123456789";

describe("AdminService.Drain", () => {
  it("needs the admin token, answers with the grace, then drains and closes the server", async () => {
    const server = await startServer({ config: { auth: { token: TOKEN }, shutdown: { graceMs: 1234 } } });
    try {
      const admin = server.grpcClient("mmgate/admin/v1/admin.proto", "mmgate.admin.v1.AdminService");
      const refused = await grpcUnary(admin, "Drain", {}).catch((err: grpc.ServiceError) => err);
      expect((refused as grpc.ServiceError).code).to.equal(grpc.status.UNAUTHENTICATED);
      const metadata = new grpc.Metadata();
      metadata.set("authorization", `Bearer ${TOKEN}`);
      const answer = await grpcUnary(admin, "Drain", {}, { metadata });
      expect(answer).to.deep.equal({ graceMs: 1234, alreadyDraining: false });
      await server.host.closed;
      expect(server.host.health.isDraining).to.equal(true);
    } finally {
      await server.close();
    }
  });

  it("reports a drain already under way and does not start another", async () => {
    const health = new HealthRegistry();
    let drains = 0;
    const config = resolveConfig({ auth: { token: TOKEN } }, []);
    const service = adminService({ version: "t", startedAt: 0, config, health, drain: () => void drains++ });
    const drain = service.drain as () => { graceMs: number; alreadyDraining: boolean };
    expect(drain()).to.deep.equal({ graceMs: config.shutdown.graceMs, alreadyDraining: false });
    // A second call in the same tick, before the drain began, is told so too.
    expect(drain().alreadyDraining).to.equal(true);
    await new Promise((r) => setImmediate(r));
    expect(drains).to.equal(1);
    health.drain();
    expect(drain().alreadyDraining).to.equal(true);
    await new Promise((r) => setImmediate(r));
    expect(drains).to.equal(1);
  });

  it("is refused while no token is configured, and served to connect clients over HTTP/1.1 once one is", async () => {
    const open = await startServer();
    try {
      const admin = createClient(AdminService, createConnectTransport({ baseUrl: open.baseUrl, httpVersion: "1.1" }));
      const refused = await admin.drain({}).catch((err: ConnectError) => err);
      expect((refused as ConnectError).code).to.equal(Code.FailedPrecondition);
      expect((refused as ConnectError).rawMessage).to.include("auth.token");
      expect(open.host.health.isDraining).to.equal(false);
    } finally {
      await open.close();
    }
    const server = await startServer({ config: { auth: { token: TOKEN } } });
    try {
      const admin = createClient(AdminService, createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "1.1" }));
      expect((await admin.drain({}, { headers: { authorization: `Bearer ${TOKEN}` } })).alreadyDraining).to.equal(false);
      await server.host.closed;
    } finally {
      await server.close();
    }
  });
});
