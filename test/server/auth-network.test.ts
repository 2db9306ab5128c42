/**
 * Named keys and scopes on a real server, called over the network with
 * @grpc/grpc-js and connect clients, on both request paths: a key scoped
 * `mutating` cannot call an admin method, a per-method scope opens that
 * method and no other, the caller reaches the handler (`callerKey`), the
 * request log, the request metrics and the trace span, and keys rotate
 * (`mmgate keys add`, then `remove`) without a restart.
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { expect } from "chai";
import { pino } from "pino";
import { z } from "zod";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import { callerKey } from "../../src/server/caller.js";
import { keyDigest } from "../../src/server/access/index.js";
import { bindService, defineModule } from "../../src/server/index.js";
import { resolveTracingSettings, shutdownTracing, startTracing } from "../../src/telemetry/index.js";
import {
  connectPathOnly,
  eventually,
  expectRejection,
  grpcUnary,
  metricValue,
  runMmgate,
  startServer,
  type GrpcClient,
  type InProcessServer,
} from "../support/index.js";
import { SERVER, startOtlpReceiver } from "../telemetry/otlp-receiver.js";

const KEYS = {
  ops: "ops-key-0123456789abcdef",
  cfg: "cfg-key-0123456789abcdef",
  gen: "gen-key-0123456789abcdef",
  root: "root-key-0123456789abcdef",
};

function keysYaml(keys: Record<string, [string, string[]]>): string {
  const lines = Object.entries(keys).map(([name, [key, scopes]]) => `  - { name: ${name}, sha256: ${keyDigest(key)}, scopes: [${scopes.join(", ")}] }`);
  return `keys:\n${lines.join("\n")}\n`;
}

const START_KEYS: Record<string, [string, string[]]> = {
  ops: [KEYS.ops, ["mutating"]],
  cfg: [KEYS.cfg, ["admin.getConfig"]],
  gen: [KEYS.gen, ["images.generate"]],
  root: [KEYS.root, ["admin"]],
};

/** ImageService answering at once, noting the caller each call saw in its context values. */
function imagesStub(seen: (string | undefined)[]) {
  return defineModule({
    name: "imagesStub",
    description: "ImageService that answers at once",
    configSchema: z.object({}),
    create: () => ({
      services: [
        bindService(ImageService, {
          generate: (_req, ctx) => {
            seen.push(ctx.values.get(callerKey)?.name);
            return {};
          },
          // eslint-disable-next-line require-yield
          async *generateStream(_req, ctx) {
            seen.push(ctx.values.get(callerKey)?.name);
          },
        }),
      ],
    }),
  });
}

function bearer(key: string): grpc.Metadata {
  const md = new grpc.Metadata();
  md.set("authorization", `Bearer ${key}`);
  return md;
}

const auth = (key: string) => ({ headers: { authorization: `Bearer ${key}` } });

for (const leanPath of [true, false]) {
  const label = leanPath && !connectPathOnly ? "lean path" : "connect path";

  describe(`auth over the network: keys and scopes (${label})`, function () {
    this.timeout(30_000);
    let dir: string;
    let file: string;
    let server: InProcessServer;
    let admin: GrpcClient;
    let transport: Transport;
    const lines: string[] = [];
    const seen: (string | undefined)[] = [];

    before(async () => {
      dir = await mkdtemp(join(tmpdir(), "mmgate-auth-net-"));
      file = join(dir, "keys.yaml");
      await writeFile(file, keysYaml(START_KEYS));
      server = await startServer({ modules: [imagesStub(seen)], config: { auth: { keysFile: file }, rpc: { leanPath } }, logLines: lines });
      admin = server.grpcClient("mmgate/admin/v1/admin.proto", "mmgate.admin.v1.AdminService");
      transport = server.transport;
    });
    after(async () => {
      await server?.close();
      await rm(dir, { recursive: true, force: true });
    });

    const finished = () => lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((e) => e.msg === "rpc finished");

    it("a key scoped mutating calls a mutating method, and is refused an admin one with the scope it lacks (grpc-js and connect)", async () => {
      const status = { service: "mmgate.images.v1.ImageService", serving: true };
      expect(await grpcUnary(admin, "SetServingStatus", status, { metadata: bearer(KEYS.ops) })).to.deep.equal({ status: "SERVING" });
      const message = "key ops lacks scope admin for mmgate.admin.v1.AdminService/GetConfig (admin or admin.getConfig would grant it too)";
      const refused = await expectRejection<grpc.ServiceError>(grpcUnary(admin, "GetConfig", {}, { metadata: bearer(KEYS.ops) }), { code: grpc.status.PERMISSION_DENIED });
      // gRPC percent-encodes grpc-message; grpc-js leaves the "/" encoded.
      expect(decodeURIComponent(refused.details)).to.equal(message);
      const client = createClient(AdminService, transport);
      await expectRejection(client.drain({}, auth(KEYS.ops)), { type: ConnectError, code: Code.PermissionDenied, message: /key ops lacks scope admin for mmgate.admin.v1.AdminService\/Drain/ });
      await expectRejection(createClient(AdminService, server.connectTransport).getConfig({}, auth(KEYS.ops)), { type: ConnectError, code: Code.PermissionDenied });
      expect(server.host.health.isDraining).to.equal(false);
    });

    it("a per-method scope opens that method and no other, whatever its level", async () => {
      const res = await grpcUnary<{ config: unknown }>(admin, "GetConfig", {}, { metadata: bearer(KEYS.cfg) });
      expect(JSON.stringify(res)).to.include("keysFile");
      const denied = await expectRejection<grpc.ServiceError>(grpcUnary(admin, "SetServingStatus", { service: "", serving: true }, { metadata: bearer(KEYS.cfg) }), {
        code: grpc.status.PERMISSION_DENIED,
      });
      expect(decodeURIComponent(denied.details)).to.equal("key cfg lacks scope mutating for mmgate.admin.v1.AdminService/SetServingStatus (admin or admin.setServingStatus would grant it too)");

      const images = createClient(ImageService, transport);
      seen.length = 0;
      await images.generate({}, auth(KEYS.gen));
      await expectRejection(
        (async () => {
          for await (const _ of images.generateStream({}, auth(KEYS.gen))) void _;
        })(),
        { type: ConnectError, code: Code.PermissionDenied, message: /key gen lacks scope mutating for mmgate.images.v1.ImageService\/GenerateStream \(images or images.generateStream/ },
      );
      await images.generate({}, auth(KEYS.ops));
      // The handler saw each caller; the refused call never reached it.
      expect(seen).to.deep.equal(["gen", "ops"]);
      // A public method needs no key; one given names its caller.
      expect((await createClient(AdminService, server.connectTransport).getStatus({})).version).to.equal("test");
      expect((await grpcUnary<{ version: string }>(admin, "GetStatus", {}, { metadata: bearer(KEYS.gen) })).version).to.equal("test");
    });

    it("refuses a call without a key, with an unknown key, as before", async () => {
      await expectRejection<grpc.ServiceError>(grpcUnary(admin, "SetServingStatus", { service: "", serving: true }), {
        code: grpc.status.UNAUTHENTICATED,
        message: /mmgate.admin.v1.AdminService(\/|%2F)SetServingStatus requires a bearer token/,
      });
      await expectRejection(createClient(AdminService, transport).getConfig({}, auth("not-a-key-0123456789")), { type: ConnectError, code: Code.Unauthenticated, message: /invalid bearer token/ });
    });

    it("names the caller in the request log and the metrics' caller label; anonymous calls name none", async () => {
      await grpcUnary(admin, "SetServingStatus", { service: "", serving: true }, { metadata: bearer(KEYS.ops) });
      await grpcUnary(admin, "GetStatus", {});
      await eventually(() => {
        const mine = finished().filter((e) => e.method === "SetServingStatus" && e.caller === "ops" && e.code === "OK");
        expect(mine).to.not.be.empty;
        const denied = finished().find((e) => e.method === "GetConfig" && e.code === "PERMISSION_DENIED");
        expect(denied).to.deep.include({ caller: "ops" });
        const anonymous = finished().find((e) => e.method === "GetStatus" && e.caller === undefined);
        expect(anonymous, "an anonymous call's line").to.not.equal(undefined);
      });
      for (const line of lines) for (const key of Object.values(KEYS)) expect(line).to.not.include(key);
      const registry = server.host.metrics.registry;
      expect(await metricValue(registry, "grpc_server_handled_total", { grpc_method: "SetServingStatus", grpc_code: "OK", caller: "ops" })).to.be.at.least(2);
      expect(await metricValue(registry, "grpc_server_handled_total", { grpc_method: "GetConfig", grpc_code: "PERMISSION_DENIED", caller: "ops" })).to.be.at.least(1);
      expect(await metricValue(registry, "grpc_server_handled_total", { grpc_method: "GetStatus", grpc_code: "OK", caller: "anonymous" })).to.be.at.least(1);
      expect(await metricValue(registry, "mmgate_auth_keys")).to.equal(4);
      const text = await (await fetch(`http://${server.adminAddr}/metrics`)).text();
      expect(text).to.match(/grpc_server_handled_total\{grpc_service="mmgate.images.v1.ImageService",grpc_method="Generate",grpc_type="unary",grpc_code="OK",caller="gen"\} 1/);
    });

    it("rotates keys without a restart: keys add, clients move, keys remove; a bad file keeps the keys in force", async () => {
      const added = await runMmgate(["keys", "add", "ops-2", "--scope", "mutating", "--file", file, "--json"]);
      expect(added.code, added.stderr).to.equal(0);
      const { key } = JSON.parse(added.stdout) as { key: string };
      const status = { service: "", serving: true };
      await eventually(() => grpcUnary(admin, "SetServingStatus", status, { metadata: bearer(key) }), { timeoutMs: 10_000 });
      // Both work while clients move.
      await grpcUnary(admin, "SetServingStatus", status, { metadata: bearer(KEYS.ops) });
      expect((await runMmgate(["keys", "remove", "ops", "--file", file])).code).to.equal(0);
      await eventually(() => expectRejection(grpcUnary(admin, "SetServingStatus", status, { metadata: bearer(KEYS.ops) }), { code: grpc.status.UNAUTHENTICATED }), { timeoutMs: 10_000 });
      await createClient(AdminService, transport).setServingStatus(status, auth(key));
      const registry = server.host.metrics.registry;
      expect(await metricValue(registry, "mmgate_auth_keys_reload_total", { result: "ok" })).to.be.at.least(2);

      await writeFile(file, "keys:\n  - { name: ops-2 }\n");
      await eventually(async () => expect(await metricValue(registry, "mmgate_auth_keys_reload_total", { result: "error" })).to.equal(1), { timeoutMs: 10_000 });
      await createClient(AdminService, transport).setServingStatus(status, auth(key));
      const warning = lines.map((l) => JSON.parse(l) as Record<string, unknown>).find((e) => String(e.msg).startsWith("auth keys file not reloaded"));
      expect(warning?.msg).to.match(/^auth keys file not reloaded: keys\[0\]\.sha256: .*; keys\[0\]\.scopes: .*; the 4 keys loaded before stay in force$/);
      await writeFile(file, keysYaml(START_KEYS));
      await eventually(() => grpcUnary(admin, "SetServingStatus", status, { metadata: bearer(KEYS.ops) }), { timeoutMs: 10_000 });
    });
  });
}

describe("auth over the network: Drain with keys only, and the trace span's caller", function () {
  this.timeout(30_000);
  let dir: string;
  let file: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), "mmgate-auth-drain-"));
    file = join(dir, "keys.yaml");
    await writeFile(file, keysYaml(START_KEYS));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  it("serves Drain to an admin key when a keys file is the only auth: any key configured is auth on", async () => {
    const server = await startServer({ config: { auth: { keysFile: file }, shutdown: { graceMs: 500 } } });
    try {
      const client = createClient(AdminService, server.transport);
      await expectRejection(client.drain({}, auth(KEYS.ops)), { type: ConnectError, code: Code.PermissionDenied });
      expect((await client.drain({}, auth(KEYS.root))).alreadyDraining).to.equal(false);
      await server.host.closed;
    } finally {
      await server.close();
    }
  });

  it("sets mmgate.caller on the call's server span", async () => {
    const receiver = await startOtlpReceiver();
    try {
      await startTracing(resolveTracingSettings({ enabled: true, endpoint: receiver.endpoint, protocol: "http/protobuf", serviceName: "auth-test", sampleRatio: 1 }, {}), {
        logger: pino({ level: "silent" }),
        version: "test",
      });
      const server = await startServer({ config: { auth: { keysFile: file } } });
      const client = createClient(AdminService, server.transport);
      await client.setServingStatus({ service: "", serving: true }, auth(KEYS.ops));
      await expectRejection(client.getConfig({}, auth(KEYS.ops)), { code: Code.PermissionDenied });
      await client.getStatus({});
      // Shutting the server down exports the spans still buffered.
      await server.close();
      const spans = receiver.spans.filter((s) => s.kind === SERVER && s.name.startsWith("mmgate.admin.v1.AdminService/"));
      const attribute = (name: string) => spans.find((s) => s.name === `mmgate.admin.v1.AdminService/${name}`)?.attributes["mmgate.caller"];
      expect(attribute("SetServingStatus")).to.equal("ops");
      expect(attribute("GetConfig"), "a refused call names its caller too").to.equal("ops");
      expect(spans.some((s) => s.name.endsWith("/GetStatus")), "the anonymous call's span").to.equal(true);
      expect(attribute("GetStatus")).to.equal(undefined);
    } finally {
      await shutdownTracing();
      await receiver.close();
    }
  });
});
