import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { request } from "node:https";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import type { InProcessServer } from "../support/index.js";
import { grpcJsClient, grpcUnary, runMmgate, selfSignedCertificate, startServer } from "../support/index.js";


describe("TLS", () => {
  let server: InProcessServer;
  let ca: Buffer;
  let caFile: string;
  before(async function () {
    try {
      execFileSync("openssl", ["version"], { stdio: "ignore" });
    } catch {
      this.skip();
    }
    const tls = selfSignedCertificate();
    ca = readFileSync(tls.certFile);
    caFile = tls.certFile;
    server = await startServer({ config: { tls } });
  });
  after(() => server?.close());

  it("serves gRPC over TLS to grpc-js and connect clients", async () => {
    const client = grpcJsClientTls(server.addr, ca);
    const res = await grpcUnary<{ version: string }>(client, "GetStatus", {});
    client.close();
    expect(res.version).to.equal("test");
    const viaConnect = createClient(AdminService, createGrpcTransport({ baseUrl: `https://${server.addr}`, nodeOptions: { ca, servername: "" } }));
    expect((await viaConnect.getStatus({})).version).to.equal("test");
  });

  it("lets the mmgate CLI reach it with --ca (and refuses an unreadable one clearly)", async () => {
    expect(await runMmgate(["health", "--addr", server.addr, "--ca", caFile])).to.include({ code: 0, stdout: "SERVING\n" });
    const plain = await runMmgate(["health", "--addr", server.addr, "--timeout", "2000"]);
    expect(plain.code).to.equal(1);
    const badCa = await runMmgate(["images", "providers", "--addr", server.addr, "--ca", "/no/ca.pem"]);
    expect(badCa.code).to.equal(1);
    expect(badCa.stderr).to.match(/^mmgate images providers: \[io\] --ca: cannot read \/no\/ca\.pem[^\n]*\n$/);
  });

  it("answers an oversized HTTP/1.1 Connect request at once and closes its connection instead of draining the body", async () => {
    const outcome = await new Promise<{ status: number; closed: boolean }>((resolve, reject) => {
      const req = request(
        `https://${server.addr}/grpc.health.v1.Health/Check`,
        { method: "POST", ca, servername: "", headers: { "content-type": "application/proto" } },
        (res) => {
          res.resume();
          res.on("end", () => req.socket?.once("close", () => resolve({ status: res.statusCode ?? 0, closed: true })));
        },
      );
      req.on("error", (err) => reject(err));
      // 9 MiB announced by nothing but the bytes: over the 8 MiB limit, and never finished.
      for (let i = 0; i < 9; i++) req.write(Buffer.alloc(1024 * 1024));
    });
    expect(outcome).to.deep.equal({ status: 429, closed: true });
  });

  it("accepts HTTP/1.1 Connect unary calls on the same port", async () => {
    const body = await new Promise<string>((resolve, reject) => {
      const req = request(
        `https://${server.addr}/mmgate.admin.v1.AdminService/GetStatus`,
        { method: "POST", ca, servername: "", headers: { "content-type": "application/json" } },
        (res) => {
          let text = "";
          res.setEncoding("utf8");
          res.on("data", (c: string) => (text += c));
          res.on("end", () => (res.statusCode === 200 ? resolve(text) : reject(new Error(`${res.statusCode} ${text}`))));
        },
      );
      req.on("error", reject);
      req.end("{}");
    });
    expect(JSON.parse(body)).to.include({ version: "test" });
  });
});

function grpcJsClientTls(addr: string, ca: Buffer) {
  return grpcJsClient(addr, "mmgate/admin/v1/admin.proto", "mmgate.admin.v1.AdminService", undefined, grpc.credentials.createSsl(ca));
}
