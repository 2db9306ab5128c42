import { connect } from "node:net";
import { splitHostPort } from "../../src/server/index.js";
import type * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import type { ChildServer } from "../support/server.js";
import { grpcServerStream, grpcUnary, repoRoot, startChildServer } from "../support/server.js";

describe("graceful shutdown of `mmgate serve`", function () {
  this.timeout(40_000);
  let server: ChildServer | undefined;
  afterEach(async () => {
    await server?.close();
    server = undefined;
  });

  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    it(`on ${signal}: Watch sees NOT_SERVING, the stream ends with OK, the process exits 0`, async () => {
      server = await startChildServer(["--log-level", "info"]);
      const health = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
      expect(await grpcUnary(health, "Check", { service: "" })).to.deep.equal({ status: "SERVING" });
      let first!: () => void;
      const gotFirst = new Promise<void>((r) => (first = r));
      const watch = grpcServerStream<{ status: string }>(health, "Watch", { service: "" }, { onMessage: () => first() });
      await gotFirst;
      server.process.kill(signal);
      expect(await watch).to.deep.equal([{ status: "SERVING" }, { status: "NOT_SERVING" }]);
      expect(await server.exited).to.equal(0);
      const messages = server.stdout.map((l) => (JSON.parse(l) as { msg: string }).msg);
      expect(messages).to.include.members(["shutdown requested", "draining", "stopped"]);
    });
  }

  it("lets an in-flight unary call finish, refuses new connections, and exits 0", async () => {
    // The reference image provider answers after 1.5 s: long enough to be in flight at SIGTERM.
    server = await startChildServer(["--log-level", "info", "--set", "images.reference.latencyMs=1500", "--set", "images.reference.defaultSize=\"64x64\""]);
    const images = server.grpcClient("mmgate/images/v1/image_service.proto", "mmgate.images.v1.ImageService");
    const generate = grpcUnary<{ response: { data: unknown[] } }>(images, "Generate", {
      request: { prompt: "in flight", generate: {}, parameters: { n: 2 } },
    });
    // Wait until the server has the call (its started counter), however slow the machine.
    const generateStarted = /grpc_server_started_total\{grpc_service="mmgate.images.v1.ImageService",grpc_method="Generate",grpc_type="unary"\} 1/;
    for (let tries = 0; tries < 200; tries++) {
      if (generateStarted.test(await (await fetch(`http://${server.adminAddr}/metrics`)).text())) break;
      await new Promise((r) => setTimeout(r, 25));
    }
    server.process.kill("SIGTERM");
    // Wait for the drain to begin (its log line), then try a fresh connection.
    const deadline = Date.now() + 5000;
    while (!server.stdout.some((l) => l.includes('"msg":"draining"')) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
    }
    const late = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
    const err = await grpcUnary(late, "Check", { service: "" }, { deadline: new Date(Date.now() + 3000) }).catch((e: grpc.ServiceError) => e);
    expect((err as grpc.ServiceError).code).to.equal(14); // UNAVAILABLE: the listener is closed
    const res = await generate;
    expect(res.response.data).to.have.length(2);
    expect(await server.exited).to.equal(0);
  });

  it("ignores a second signal during the drain and still exits 0", async () => {
    server = await startChildServer(["--log-level", "info", "--set", "shutdown.graceMs=500"]);
    const health = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
    let first!: () => void;
    const gotFirst = new Promise<void>((r) => (first = r));
    const watch = grpcServerStream(health, "Watch", { service: "" }, { onMessage: () => first() }).catch(() => undefined);
    await gotFirst;
    server.process.kill("SIGTERM");
    server.process.kill("SIGINT");
    expect(await server.exited).to.equal(0);
    await watch;
  });

  it("ends an open reflection stream cleanly on drain", async () => {
    server = await startChildServer(["--set", "shutdown.graceMs=30000"]);
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
    server.process.kill("SIGTERM");
    expect(await outcome).to.equal("end");
    expect(await server.exited).to.equal(0);
  });

  it("cuts a stream that outlives the grace, and still exits 0", async () => {
    // An image stream whose provider takes 5 s, against a 300 ms grace.
    server = await startChildServer(["--log-level", "info", "--set", "shutdown.graceMs=300", "--set", "images.reference.latencyMs=5000"]);
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
    server.process.kill("SIGTERM");
    expect(await server.exited).to.equal(0);
    expect(await stream).to.match(/^error \d+$/);
    const messages = server.stdout.map((l) => (JSON.parse(l) as { msg: string }).msg);
    expect(messages).to.include("grace period over: cancelling the calls still running");
  });

  it("closes connections that never spoke HTTP/2 once the grace is over", async () => {
    server = await startChildServer(["--set", "shutdown.graceMs=300"]);
    const { host, port } = splitHostPort(server.addr);
    // An idle TCP connection, and one that sent half a preface.
    const idle = connect(port, host);
    const half = connect(port, host, () => half.write("PRI * HTTP/2.0\r\n"));
    for (const socket of [idle, half]) socket.on("error", () => undefined);
    await Promise.all([idle, half].map((socket) => new Promise((r) => socket.once("connect", r))));
    server.process.kill("SIGTERM");
    // Without closing them the listener never finishes closing and the process hangs.
    expect(await server.exited).to.equal(0);
    idle.destroy();
    half.destroy();
  });

  it("logs a stray rejection and keeps serving; drains and exits 1 after an uncaught exception", async () => {
    server = await startChildServer(["--log-level", "info"], {}, ["--import", `${repoRoot}test/fixtures/faults.mjs`]);
    const health = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
    server.process.kill("SIGHUP");
    const logged = async (msg: string) => {
      for (let i = 0; i < 200 && !server!.stdout.some((l) => l.includes(`"msg":"${msg}"`)); i++) await new Promise((r) => setTimeout(r, 25));
      return server!.stdout.some((l) => l.includes(`"msg":"${msg}"`));
    };
    expect(await logged("unhandled promise rejection")).to.equal(true);
    expect(await grpcUnary(health, "Check", { service: "" })).to.deep.equal({ status: "SERVING" });
    server.process.kill("SIGUSR2");
    expect(await server.exited).to.equal(1);
    const messages = server.stdout.map((l) => (JSON.parse(l) as { msg: string }).msg);
    expect(messages).to.include.members(["uncaught exception", "draining", "stopped"]);
  });
});
