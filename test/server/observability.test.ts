/**
 * What an operator sees of each call: the "rpc finished" log line (status,
 * error message, protocol, peer), a client-cancelled stream counted as
 * CANCELLED, and the per-message counters, on both request paths.
 */
import { expect } from "chai";
import { parse as parseYaml } from "yaml";
import * as grpc from "@grpc/grpc-js";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { Registry } from "prom-client";
import { z } from "zod";
import { Health } from "../../gen/grpc/health/v1/health_pb.js";
import { ImageMetrics } from "../../src/images/metrics.js";
import { bindService, defineModule } from "../../src/server/index.js";
import type { InProcessServer } from "../support/index.js";
import { eventually, expectRejection, grpcServerStream, metricValue as metricValueOf, runMmgate, startServer } from "../support/index.js";
import { StatusSniffer } from "../../src/server/status-sniffer.js";
import { ShapesService } from "../support/shapes-service.js";

const module = defineModule({
  name: "observed",
  description: "test: calls to observe",
  configSchema: z.object({}),
  create: () => ({
    services: [
      bindService(ShapesService, {
        unary(req: { value: string }) {
          if (req.value === "fail") throw new ConnectError("no such shape", Code.NotFound);
          return { value: req.value };
        },
        async *serverStream(req: { value: string }) {
          const n = Number(req.value);
          for (let i = 0; i < n; i++) yield { value: String(i) };
        },
        async clientStream(reqs: AsyncIterable<{ value: string }>) {
          let n = 0;
          for await (const _ of reqs) n++;
          return { value: String(n) };
        },
        async *bidi(reqs: AsyncIterable<{ value: string }>) {
          for await (const req of reqs) {
            yield req;
            yield req;
          }
        },
      } as never),
    ],
  }),
});

interface RpcLine {
  msg: string;
  service: string;
  method: string;
  code: string;
  protocol?: string;
  peer?: string;
  error?: string;
}

function finished(lines: string[], method: string): RpcLine[] {
  return lines
    .map((l) => JSON.parse(l) as RpcLine)
    .filter((l) => l.msg === "rpc finished" && l.method === method);
}

/** A metric of the server under test (see test/support/metrics.ts). */
const metricValue = (server: InProcessServer, name: string, labels: Record<string, string>): Promise<number> =>
  metricValueOf(server.host.metrics.registry, name, labels);

for (const leanPath of [true, false]) {
  describe(`observability (rpc.leanPath ${leanPath})`, () => {
    let server: InProcessServer;
    let lines: string[];

    beforeEach(async () => {
      lines = [];
      server = await startServer({ modules: [module], config: { rpc: { leanPath } }, logLines: lines });
    });
    afterEach(() => server.close());

    const transports: [string, (s: InProcessServer) => Transport][] = [
      ["grpc", (s) => s.transport],
      ["grpc-web", (s) => s.grpcWebTransport],
      ["connect", (s) => s.connectTransport],
    ];
    for (const [protocol, transport] of transports) {
      it(`logs the error message, protocol and peer of a failed ${protocol} call`, async () => {
        const client = createClient(ShapesService, transport(server));
        await expectRejection((client as never as { unary(r: { value: string }): Promise<unknown> }).unary({ value: "fail" }), {
          code: Code.NotFound,
        });
        await eventually(() => expect(finished(lines, "Unary")).to.have.length(1));
        const line = finished(lines, "Unary")[0]!;
        expect(line.code).to.equal("NOT_FOUND");
        expect(line.error).to.equal("no such shape");
        expect(line.protocol).to.equal(protocol);
        expect(line.peer).to.match(/^127\.0\.0\.1:\d+$/);
      });
    }

    it("logs no error for a successful call", async () => {
      const client = createClient(ShapesService, server.transport) as never as { unary(r: { value: string }): Promise<unknown> };
      await client.unary({ value: "ok" });
      await eventually(() => expect(finished(lines, "Unary")).to.have.length(1));
      const line = finished(lines, "Unary")[0]!;
      expect(line.code).to.equal("OK");
      expect(line).not.to.have.property("error");
      expect(line.protocol).to.equal("grpc");
    });

    it("counts the messages of a server stream", async () => {
      const client = createClient(ShapesService, server.transport) as never as {
        serverStream(r: { value: string }): AsyncIterable<unknown>;
      };
      let n = 0;
      for await (const _ of client.serverStream({ value: "5" })) n++;
      expect(n).to.equal(5);
      const labels = { grpc_service: "mmgate.test.v1.ShapesService", grpc_method: "ServerStream", grpc_type: "server_stream" };
      await eventually(async () => {
        expect(await metricValue(server, "grpc_server_msg_sent_total", labels)).to.equal(5);
        expect(await metricValue(server, "grpc_server_msg_received_total", labels)).to.equal(1);
      });
    });

    it("counts the messages of client and bidi streams", async () => {
      const client = createClient(ShapesService, server.transport) as never as {
        clientStream(r: AsyncIterable<{ value: string }>): Promise<{ value: string }>;
        bidi(r: AsyncIterable<{ value: string }>): AsyncIterable<unknown>;
      };
      async function* three() {
        for (const value of ["a", "b", "c"]) yield { value };
      }
      expect((await client.clientStream(three())).value).to.equal("3");
      let n = 0;
      for await (const _ of client.bidi(three())) n++;
      expect(n).to.equal(6);
      const labels = (grpc_method: string, grpc_type: string) => ({ grpc_service: "mmgate.test.v1.ShapesService", grpc_method, grpc_type });
      await eventually(async () => {
        expect(await metricValue(server, "grpc_server_msg_received_total", labels("ClientStream", "client_stream"))).to.equal(3);
        expect(await metricValue(server, "grpc_server_msg_sent_total", labels("ClientStream", "client_stream"))).to.equal(1);
        expect(await metricValue(server, "grpc_server_msg_received_total", labels("Bidi", "bidi_stream"))).to.equal(3);
        expect(await metricValue(server, "grpc_server_msg_sent_total", labels("Bidi", "bidi_stream"))).to.equal(6);
      });
    });

    it("logs and counts a Watch the connect client aborts as CANCELLED", async () => {
      const health = createClient(Health, server.transport);
      const controller = new AbortController();
      const seen: unknown[] = [];
      await expectRejection(
        (async () => {
          for await (const m of health.watch({ service: "" }, { signal: controller.signal })) {
            seen.push(m);
            controller.abort();
          }
        })(),
        { code: Code.Canceled },
      );
      expect(seen).to.have.length(1);
      await eventually(() => expect(finished(lines, "Watch")).to.have.length(1));
      expect(finished(lines, "Watch")[0]!.code).to.equal("CANCELLED");
      const labels = { grpc_service: "grpc.health.v1.Health", grpc_method: "Watch", grpc_code: "CANCELLED" };
      expect(await metricValue(server, "grpc_server_handled_total", labels)).to.equal(1);
      expect(await metricValue(server, "grpc_server_handled_total", { grpc_method: "Watch", grpc_code: "OK" })).to.equal(0);
    });

    it("logs and counts a Watch grpc-js cancels as CANCELLED", async () => {
      const health = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
      await expectRejection(
        grpcServerStream(health, "Watch", { service: "" }, { onMessage: (_m, call) => call.cancel() }),
        { code: grpc.status.CANCELLED },
      );
      await eventually(() => expect(finished(lines, "Watch")).to.have.length(1));
      expect(finished(lines, "Watch")[0]!.code).to.equal("CANCELLED");
      const labels = { grpc_service: "grpc.health.v1.Health", grpc_method: "Watch", grpc_code: "CANCELLED" };
      expect(await metricValue(server, "grpc_server_handled_total", labels)).to.equal(1);
    });
  });
}

describe("serve --print-config --format", () => {
  it("prints YAML that reads back as the JSON form", async () => {
    const json = await runMmgate(["serve", "--print-config"]);
    const yaml = await runMmgate(["serve", "--print-config", "--format", "yaml"]);
    expect(json.code).to.equal(0);
    expect(yaml.code).to.equal(0);
    expect(parseYaml(yaml.stdout)).to.deep.equal(JSON.parse(json.stdout));
  });

  it("refuses an unknown format", async () => {
    const res = await runMmgate(["serve", "--print-config", "--format", "toml"]);
    expect(res.code).not.to.equal(0);
  });
});

describe("mmgate_images_circuit_rejected_calls_total", () => {
  it("is a counter that follows the breakers' running counts and never goes down", async () => {
    const registry = new Registry();
    let rejected = 0;
    let breaker = { snapshot: () => ({ state: "open", rejectedCalls: rejected }) };
    const entry = () => ({ name: "p", breaker, gate: { queueDepth: 0 }, provider: { activeOperations: 0, abandonedOperations: 0 } });
    new ImageMetrics(registry, () => ({ registry: { list: () => [entry()] }, globalQueueDepth: 0 }) as never);
    const value = async () => {
      const metric = await registry.getSingleMetric("mmgate_images_circuit_rejected_calls_total")!.get();
      expect(metric.type).to.equal("counter");
      return metric.values.find((v) => v.labels["provider"] === "p")?.value;
    };
    expect(await value()).to.equal(0);
    rejected = 3;
    expect(await value()).to.equal(3);
    expect(await value()).to.equal(3);
    // A new breaker (a reload) starts from zero: the counter keeps its total.
    rejected = 1;
    breaker = { snapshot: () => ({ state: "closed", rejectedCalls: rejected }) };
    expect(await value()).to.equal(4);
    expect(registry.getSingleMetric("mmgate_images_circuit_rejected_calls")).to.equal(undefined);
  });
});

describe("observability of calls the host answers itself", () => {
  let server: InProcessServer;
  let lines: string[];
  before(async () => {
    lines = [];
    server = await startServer({ logLines: lines });
  });
  after(() => server.close());

  for (const [protocol, transport] of [
    ["grpc", (s: InProcessServer) => s.transport],
    ["grpc-web", (s: InProcessServer) => s.grpcWebTransport],
    ["connect", (s: InProcessServer) => s.connectTransport],
  ] as const) {
    it(`logs the message of an unknown ${protocol} method`, async () => {
      lines.length = 0;
      const client = createClient(ShapesService, transport(server)) as never as { unary(r: { value: string }): Promise<unknown> };
      await expectRejection(client.unary({ value: "x" }), { code: Code.Unimplemented });
      const line = await eventually(() => {
        const found = lines.map((l) => JSON.parse(l) as RpcLine).find((l) => l.msg === "rpc finished");
        expect(found).to.not.equal(undefined);
        return found!;
      });
      expect(line.code).to.equal("UNIMPLEMENTED");
      expect(line.protocol).to.equal(protocol);
      expect(line.error).to.be.a("string").and.not.equal("");
    });
  }
});

describe("status sniffer messages", () => {
  const frame = (flags: number, payload: Uint8Array) => {
    const out = new Uint8Array(5 + payload.length);
    out[0] = flags;
    new DataView(out.buffer).setUint32(1, payload.length);
    out.set(payload, 5);
    return out;
  };
  const text = (s: string) => new TextEncoder().encode(s);

  it("reads the message of a gRPC-Web trailer frame, a Connect end-stream message and a Connect unary error", () => {
    const web = new StatusSniffer("grpc-web");
    web.write(frame(0x80, text("grpc-status: 5\r\ngrpc-message: no%20such%20thing\r\n")));
    expect(web.status(200)).to.equal(Code.NotFound);
    expect(web.message()).to.equal("no such thing");

    const stream = new StatusSniffer("connect-stream");
    stream.write(frame(0x02, text(JSON.stringify({ error: { code: "not_found", message: "gone" } }))));
    expect(stream.message()).to.equal("gone");

    const unary = new StatusSniffer("connect-unary");
    unary.write(text(JSON.stringify({ code: "invalid_argument", message: "bad json" })));
    expect(unary.status(400)).to.equal(Code.InvalidArgument);
    expect(unary.message()).to.equal("bad json");

    expect(new StatusSniffer("grpc-web").message()).to.equal(undefined);
    expect(new StatusSniffer("none").message()).to.equal(undefined);
  });
});
