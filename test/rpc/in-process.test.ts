import { Code, ConnectError, createClient } from "@connectrpc/connect";
import type { Interceptor } from "@connectrpc/connect";
import { expect } from "chai";
import { Registry } from "prom-client";
import { Health, HealthCheckResponse_ServingStatus as S } from "../../gen/grpc/health/v1/health_pb.js";
import { channelDefaults, createChannel, inProcessTransport, outboundContextValues, type Channel } from "../../src/rpc/index.js";
import type { InProcessServer } from "../support/server.js";
import { startServer } from "../support/server.js";

const SERVER_MAX_TIMEOUT_MS = 60_000;

describe("rpc: inProcessTransport", () => {
  it("calls services registered in this process, through the given handler interceptors", async () => {
    const seen: string[] = [];
    const observe: Interceptor = (next) => (req) => {
      seen.push(`${req.method.name} ${req.header.get("x-request-id")}`);
      return next(req);
    };
    const transport = inProcessTransport({
      routes: (router) =>
        router.service(Health, {
          check: (req) => ({ status: req.service === "" ? S.SERVING : S.SERVICE_UNKNOWN }),
        }),
      interceptors: [observe],
    });
    const health = createClient(Health, transport);
    expect((await health.check({ service: "" }, { headers: { "x-request-id": "in-1" } })).status).to.equal(S.SERVING);
    expect(seen).to.deep.equal(["Check in-1"]);
  });

  it("applies the handler's message limit", async () => {
    const transport = inProcessTransport({
      routes: (router) => router.service(Health, { check: () => ({ status: S.SERVING }) }),
      readMaxBytes: 16,
    });
    const err = await createClient(Health, transport)
      .check({ service: "x".repeat(64) })
      .catch((e: unknown) => ConnectError.from(e));
    expect((err as ConnectError).code).to.equal(Code.ResourceExhausted);
  });

  it("counts calls when given a registry", async () => {
    const registry = new Registry();
    const transport = inProcessTransport({ routes: (router) => router.service(Health, { check: () => ({ status: S.SERVING }) }), registry });
    await createClient(Health, transport).check({ service: "" });
    const { values } = await registry.getSingleMetric("grpc_client_handled_total")!.get();
    expect(values.map((v) => [v.labels["grpc_method"], v.labels["grpc_code"], v.value])).to.deep.equal([["Check", "OK", 1]]);
  });

  describe("a handler that calls a real server downstream", () => {
    let server: InProcessServer;
    let downstream: Channel;
    before(async () => {
      server = await startServer({ config: { limits: { maxTimeoutMs: SERVER_MAX_TIMEOUT_MS } } });
      downstream = createChannel(server.addr, channelDefaults);
    });
    after(async () => {
      downstream?.abort();
      await server?.close();
    });

    /** A Health front whose Check forwards to the server, passing the inbound request id and deadline on. */
    const front = () =>
      createClient(
        Health,
        inProcessTransport({
          routes: (router) =>
            router.service(Health, {
              async check(req, ctx) {
                let echoed = "";
                const res = await createClient(Health, downstream).check(req, {
                  signal: ctx.signal,
                  contextValues: outboundContextValues(ctx),
                  onHeader: (h) => (echoed = h.get("x-request-id") ?? ""),
                });
                ctx.responseHeader.set("x-downstream-request-id", echoed);
                return res;
              },
            }),
        }),
      );

    it("passes the inbound request id on", async () => {
      let downstreamId: string | null = null;
      await front().check({ service: "" }, { headers: { "x-request-id": "hop-1" }, onHeader: (h) => (downstreamId = h.get("x-downstream-request-id")) });
      expect(downstreamId).to.equal("hop-1");
    });

    it("passes the inbound deadline on as grpc-timeout", async () => {
      // Within the server's maximum: accepted. Above it: the server refuses the grpc-timeout it got from the hop.
      expect((await front().check({ service: "" }, { timeoutMs: SERVER_MAX_TIMEOUT_MS / 2 })).status).to.equal(S.SERVING);
      const err = await front()
        .check({ service: "" }, { timeoutMs: 2 * SERVER_MAX_TIMEOUT_MS })
        .catch((e: unknown) => ConnectError.from(e));
      expect((err as ConnectError).code).to.equal(Code.InvalidArgument);
    });
  });
});
