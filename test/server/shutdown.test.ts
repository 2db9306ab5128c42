import * as http2 from "node:http2";
import { connect } from "node:net";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import { imagesModule } from "../../src/images/index.js";
import { splitHostPort } from "../../src/server/index.js";
import type { ChildServer, InProcessServer } from "../support/index.js";
import { eventually, expectRejection, grpcServerStream, grpcUnary, metricValue, repoRoot, startChildServer, startServer } from "../support/index.js";

const messagesOf = (lines: readonly string[]) => lines.map((l) => (JSON.parse(l) as { msg: string }).msg);

/** Opens a health Watch on "" and resolves once its first status has arrived. */
async function watchServer(server: ChildServer | InProcessServer) {
  const health = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
  let first!: () => void;
  const gotFirst = new Promise<void>((r) => (first = r));
  const watch = grpcServerStream<{ status: string }>(health, "Watch", { service: "" }, { onMessage: () => first() });
  await gotFirst;
  return { health, watch };
}

describe("graceful shutdown of `mmgate serve` (the process)", function () {
  // Each test has a server process of its own, which loads every capability.
  this.timeout(40_000);
  /** The tests' processes: independent of each other, so they start side by side. */
  let servers: { sigterm: ChildServer; sigint: ChildServer; faults: ChildServer } | undefined;
  before(async () => {
    const started = await Promise.allSettled([
      startChildServer(["--log-level", "info"]),
      startChildServer(["--log-level", "info"]),
      startChildServer(["--log-level", "info"], {}, ["--import", `${repoRoot}test/fixtures/faults.mjs`]),
    ]);
    const failed = started.find((s) => s.status === "rejected");
    if (failed) {
      await Promise.all(started.map((s) => (s.status === "fulfilled" ? s.value.close() : undefined)));
      throw failed.reason;
    }
    const [sigterm, sigint, faults] = started.map((s) => (s as PromiseFulfilledResult<ChildServer>).value) as [ChildServer, ChildServer, ChildServer];
    servers = { sigterm, sigint, faults };
  });
  after(async () => {
    await Promise.all(Object.values(servers ?? {}).map((server) => server.close()));
  });

  it("on SIGTERM: Watch sees NOT_SERVING, the stream ends with OK, the process exits 0", async () => {
    const server = servers!.sigterm;
    const { health, watch } = await watchServer(server);
    expect(await grpcUnary(health, "Check", { service: "" })).to.deep.equal({ status: "SERVING" });
    server.process.kill("SIGTERM");
    expect(await watch).to.deep.equal([{ status: "SERVING" }, { status: "NOT_SERVING" }]);
    expect(await server.exited).to.equal(0);
    expect(messagesOf(server.stdout)).to.include.members(["shutdown requested", "draining", "stopped"]);
  });

  it("on SIGINT, and a second signal during the drain: the drain goes on, Watch ends with OK, the process exits 0", async () => {
    const server = servers!.sigint;
    const { watch } = await watchServer(server);
    // A call whose request never ends holds the drain open, so that the
    // second signal surely comes during it; ending the request lets it finish.
    const session = http2.connect(`http://${server.addr}`);
    session.on("error", () => undefined);
    await new Promise<void>((resolve) => session.once("connect", () => resolve()));
    const pending = session.request({ ":method": "POST", ":path": "/grpc.health.v1.Health/Check", "content-type": "application/grpc", te: "trailers" });
    pending.on("error", () => undefined);
    pending.on("data", () => undefined);
    // A 2-byte HealthCheckRequest (service ""), of which the second byte comes later.
    pending.write(Buffer.from([0, 0, 0, 0, 2, 0x0a]));
    // The server has the call once it acks a PING sent after it.
    await new Promise<void>((resolve, reject) => session.ping((err) => (err ? reject(err) : resolve())));
    const entries = () => server.stdout.map((l) => JSON.parse(l) as { msg: string; reason?: string });
    server.process.kill("SIGINT");
    await eventually(() => expect(entries().map((e) => e.msg)).to.include("draining"));
    server.process.kill("SIGTERM");
    await eventually(() => expect(entries().map((e) => e.msg)).to.include("shutdown already in progress; it ends within the grace period"));
    pending.end(Buffer.from([0x00]));
    expect(await watch).to.deep.equal([{ status: "SERVING" }, { status: "NOT_SERVING" }]);
    expect(await server.exited).to.equal(0);
    session.destroy();
    expect(entries().map((e) => e.msg)).to.include.members(["shutdown requested", "draining", "stopped"]);
    // The first signal started the drain; the second was logged and ignored.
    expect(entries().filter((e) => e.msg === "shutdown requested").map((e) => e.reason)).to.deep.equal(["SIGINT"]);
    expect(entries().filter((e) => e.msg === "shutdown already in progress; it ends within the grace period").map((e) => e.reason)).to.deep.equal([
      "SIGTERM",
    ]);
  });

  it("logs a stray rejection and keeps serving; drains and exits 1 after an uncaught exception", async () => {
    const server = servers!.faults;
    const health = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
    server.process.kill("SIGHUP");
    await eventually(() => expect(messagesOf(server.stdout)).to.include("unhandled promise rejection"));
    expect(await grpcUnary(health, "Check", { service: "" })).to.deep.equal({ status: "SERVING" });
    server.process.kill("SIGUSR2");
    expect(await server.exited).to.equal(1);
    expect(messagesOf(server.stdout)).to.include.members(["uncaught exception", "draining", "stopped"]);
  });
});

describe("graceful shutdown: the drain", function () {
  this.timeout(20_000);
  let server: InProcessServer | undefined;
  afterEach(async () => {
    await server?.close();
    server = undefined;
  });

  it("lets an in-flight unary call finish and refuses new connections", async () => {
    const lines: string[] = [];
    // The reference image provider answers after 1.5 s: long enough to be in flight through the checks below.
    server = await startServer({
      modules: [imagesModule],
      config: { images: { reference: { latencyMs: 1500, defaultSize: "64x64" } } },
      logLines: lines,
    });
    const running = server;
    const images = running.grpcClient("mmgate/images/v1/image_service.proto", "mmgate.images.v1.ImageService");
    const generate = grpcUnary<{ response: { data: unknown[] } }>(images, "Generate", {
      request: { prompt: "in flight", generate: {}, parameters: { n: 2 } },
    });
    // Wait until the server has the call (its started counter), however slow the machine.
    const generateStarted = /grpc_server_started_total\{grpc_service="mmgate.images.v1.ImageService",grpc_method="Generate",grpc_type="unary"\} 1/;
    await eventually(async () => expect(await (await fetch(`http://${running.adminAddr}/metrics`)).text()).to.match(generateStarted));
    const stopped = running.host.shutdown();
    await eventually(() => expect(messagesOf(lines)).to.include("draining"));
    const late = running.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
    await expectRejection(grpcUnary(late, "Check", { service: "" }, { deadline: new Date(Date.now() + 3000) }), {
      code: grpc.status.UNAVAILABLE, // the listener is closed
    });
    expect((await generate).response.data).to.have.length(2);
    await stopped;
  });

  it("ends an open reflection stream cleanly", async () => {
    server = await startServer({ config: { shutdown: { graceMs: 30_000 } } });
    const reflection = server.grpcClient("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1.ServerReflection");
    // A stream the client never half-closes: it must not hold shutdown for the 30 s grace.
    const call = (reflection.ServerReflectionInfo as () => grpc.ClientDuplexStream<unknown, unknown>)();
    const outcome = new Promise<string>((resolve) => {
      call.on("data", () => undefined);
      call.on("error", (e: grpc.ServiceError) => resolve(`error ${e.code}`));
      call.on("end", () => resolve("end"));
    });
    const answered = new Promise<void>((r) => call.once("data", () => r()));
    call.write({ listServices: "" });
    await answered;
    const stopped = server.host.shutdown();
    expect(await outcome).to.equal("end");
    await stopped;
  });

  it("cuts a stream that outlives the grace", async () => {
    const lines: string[] = [];
    // An image stream whose provider takes 5 s, against a 300 ms grace.
    server = await startServer({
      modules: [imagesModule],
      config: { shutdown: { graceMs: 300 }, images: { reference: { latencyMs: 5000 } } },
      logLines: lines,
    });
    const images = server.grpcClient("mmgate/images/v1/image_service.proto", "mmgate.images.v1.ImageService");
    let started!: () => void;
    const gotStarted = new Promise<void>((r) => (started = r));
    const stream = grpcServerStream(images, "GenerateStream", { request: { prompt: "slow", generate: {}, parameters: { n: 1 } } }, {
      onMessage: () => started(),
    }).then(
      () => "end",
      (e: grpc.ServiceError) => `error ${e.code}`,
    );
    await gotStarted;
    await server.host.shutdown();
    expect(await stream).to.match(/^error \d+$/);
    expect(messagesOf(lines)).to.include("grace period over: cancelling the calls still running");
  });

  it("closes connections that never finished a request once the grace is over", async () => {
    server = await startServer({ config: { shutdown: { graceMs: 300 } } });
    const { host, port } = splitHostPort(server.addr);
    // An idle TCP connection, one that sent half an HTTP/2 preface, and one half an HTTP/1.1 request.
    const idle = connect(port, host);
    const half = connect(port, host, () => half.write("PRI * HTTP/2.0\r\n"));
    const halfHttp1 = connect(port, host, () => halfHttp1.write("POST /grpc.health.v1.Health/Check HTTP/1.1\r\nHost: x\r\n"));
    const sockets = [idle, half, halfHttp1];
    const closed = Promise.all(sockets.map((socket) => new Promise<void>((r) => socket.once("close", () => r()))));
    for (const socket of sockets) socket.on("error", () => undefined);
    await Promise.all(sockets.map((socket) => new Promise<void>((r) => (socket.connecting ? socket.once("connect", () => r()) : r()))));
    // Let the server take the connections and their bytes (no answer comes before a whole request).
    await new Promise((r) => setTimeout(r, 100));
    // Without closing them the listener never finishes closing and shutdown never ends.
    await server.host.shutdown();
    await closed;
  });
});

describe("graceful shutdown: shutdown.delayMs", function () {
  this.timeout(20_000);
  it("says NOT_SERVING at once and still takes calls until the delay is over, then refuses new ones", async () => {
    const server = await startServer({ config: { shutdown: { delayMs: 1500, graceMs: 1000 } } });
    const health = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
    expect((await grpcUnary(health, "check", {}))["status"]).to.equal("SERVING");
    const registry = server.host.metrics.registry;
    expect(await metricValue(registry, "mmgate_draining")).to.equal(0);
    expect(await metricValue(registry, "mmgate_drain_started_timestamp_seconds")).to.equal(0);
    expect(await metricValue(registry, "mmgate_shutdown_grace_seconds")).to.equal(2.5);
    const before = Date.now() / 1000;
    const closed = server.host.shutdown();
    // The health entry flips first; a call made meanwhile is still served.
    await eventually(() => expect(server.host.health.isDraining).to.equal(true));
    // The drain shows in the metrics from its start (what the MmgateDrainStuck alert reads).
    expect(await metricValue(registry, "mmgate_draining")).to.equal(1);
    expect(await metricValue(registry, "mmgate_drain_started_timestamp_seconds")).to.be.within(before, Date.now() / 1000);
    const admin = server.grpcClient("mmgate/admin/v1/admin.proto", "mmgate.admin.v1.AdminService");
    const status = await grpcUnary(admin, "getStatus", {});
    expect(status["version"]).to.equal("test");
    expect((await grpcUnary(health, "check", {}))["status"]).to.equal("NOT_SERVING");
    // Once the delay is over, new calls are refused.
    await eventually(async () => expect(await grpcUnary(admin, "getStatus", {}).then(() => "served", (e: grpc.ServiceError) => e.code)).to.equal(grpc.status.UNAVAILABLE), { timeoutMs: 5000 });
    await closed;
    await server.close();
  });
});
