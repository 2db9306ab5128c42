import type * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import type { ChildServer } from "../support/server.js";
import { grpcServerStream, grpcUnary, startChildServer } from "../support/server.js";

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

  it("cuts a stream that outlives the grace, and still exits 0", async () => {
    server = await startChildServer(["--set", "shutdown.graceMs=300", "--log-level", "info"]);
    const reflection = server.grpcClient("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1.ServerReflection");
    // A reflection stream the client never half-closes stays open through the drain.
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
    expect(await server.exited).to.equal(0);
    expect(await outcome).to.match(/^error \d+$/);
    const messages = server.stdout.map((l) => (JSON.parse(l) as { msg: string }).msg);
    expect(messages).to.include("grace period over: cancelling the calls still running");
  });
});
