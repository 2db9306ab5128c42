import { execFileSync } from "node:child_process";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { expect } from "chai";
import { Gauge, Registry } from "prom-client";
import { Health, HealthCheckResponse_ServingStatus as S } from "../../gen/grpc/health/v1/health_pb.js";
import { ChannelConfigError, channelConfigSchema, channelDefaults, createChannel, withCallContext, type Channel } from "../../src/rpc/index.js";
import type { InProcessServer } from "../support/server.js";
import { startServer } from "../support/server.js";
import { selfSignedCertificate } from "../support/tls.js";
import { metricValue } from "../support/metrics.js";

/** The server refuses a grpc-timeout above this, which makes the header observable. */
const SERVER_MAX_TIMEOUT_MS = 60_000;

async function codeOf(work: Promise<unknown>): Promise<Code | "ok"> {
  try {
    await work;
    return "ok";
  } catch (err) {
    return ConnectError.from(err).code;
  }
}

/** Reads a Watch stream to its end; the statuses seen and the code it ended with. */
async function drainWatch(stream: AsyncIterable<{ status: S }>): Promise<{ seen: S[]; code: Code | "ok" }> {
  const seen: S[] = [];
  try {
    for await (const res of stream) seen.push(res.status);
    return { seen, code: "ok" };
  } catch (err) {
    return { seen, code: ConnectError.from(err).code };
  }
}


// Every behaviour holds on both transports a channel can use.
for (const leanPath of [true, false]) {
  describe(`rpc: createChannel against a real server (h2c, ${leanPath ? "lean" : "connect's"} transport)`, () => {
    let server: InProcessServer;
    const channels: Channel[] = [];
    const open = (options = channelDefaults, registry?: Registry) => {
      const channel = createChannel(server.addr, { ...options, leanPath }, registry ? { registry } : {});
      channels.push(channel);
      return channel;
    };
    before(async () => {
      server = await startServer({ config: { limits: { maxTimeoutMs: SERVER_MAX_TIMEOUT_MS } } });
    });
    afterEach(() => {
      for (const c of channels.splice(0)) c.abort();
    });
    after(() => server.close());

    it("calls Health/Check over cleartext HTTP/2", async () => {
      const res = await createClient(Health, open()).check({ service: "" });
      expect(res.status).to.equal(S.SERVING);
    });

    it("sends the call context's request id as x-request-id, which the server echoes", async () => {
      let echoed: string | null = null;
      await createClient(Health, open()).check(
        { service: "" },
        { contextValues: withCallContext({ requestId: "req-rpc-test-1" }), onHeader: (h) => (echoed = h.get("x-request-id")) },
      );
      expect(echoed).to.equal("req-rpc-test-1");
    });

    it("lets a caller's own x-request-id header win over the call context", async () => {
      let echoed: string | null = null;
      await createClient(Health, open()).check(
        { service: "" },
        {
          headers: { "x-request-id": "from-header" },
          contextValues: withCallContext({ requestId: "from-context" }),
          onHeader: (h) => (echoed = h.get("x-request-id")),
        },
      );
      expect(echoed).to.equal("from-header");
    });

    it("sends grpc-timeout: the caller's timeoutMs, the channel default, capped by the inbound deadline", async () => {
      const health = createClient(Health, open());
      // Above the server's maximum: the server refuses the header it received.
      expect(await codeOf(health.check({ service: "" }, { timeoutMs: 2 * SERVER_MAX_TIMEOUT_MS }))).to.equal(Code.InvalidArgument);
      // The same timeout under an inbound deadline within the maximum is cut down to it.
      const inbound = withCallContext({ deadline: performance.now() + SERVER_MAX_TIMEOUT_MS / 2 });
      expect(await codeOf(health.check({ service: "" }, { timeoutMs: 2 * SERVER_MAX_TIMEOUT_MS, contextValues: inbound }))).to.equal("ok");
      // The channel's default applies to a call that sets none.
      const withDefault = createClient(Health, open({ ...channelDefaults, defaultTimeoutMs: 2 * SERVER_MAX_TIMEOUT_MS }));
      expect(await codeOf(withDefault.check({ service: "" }))).to.equal(Code.InvalidArgument);
      expect(await codeOf(withDefault.check({ service: "" }, { timeoutMs: 1000 }))).to.equal("ok");
    });

    it("ends a server-streaming Watch with DEADLINE_EXCEEDED when its deadline (own or inbound) expires", async () => {
      const registry = new Registry();
      const health = createClient(Health, open(channelDefaults, registry));
      const own = await drainWatch(health.watch({ service: "" }, { timeoutMs: 300 }));
      expect(own).to.deep.equal({ seen: [S.SERVING], code: Code.DeadlineExceeded });
      const inbound = await drainWatch(health.watch({ service: "" }, { contextValues: withCallContext({ deadline: performance.now() + 300 }) }));
      expect(inbound).to.deep.equal({ seen: [S.SERVING], code: Code.DeadlineExceeded });
      const labels = { grpc_service: "grpc.health.v1.Health", grpc_method: "Watch" };
      expect(await metricValue(registry, "grpc_client_handled_total", { ...labels, grpc_code: "DEADLINE_EXCEEDED" })).to.equal(2);
    });

    it("fails a call whose inbound deadline has passed with DEADLINE_EXCEEDED, and counts it", async () => {
      const registry = new Registry();
      const health = createClient(Health, open(channelDefaults, registry));
      const expired = withCallContext({ deadline: performance.now() - 1 });
      expect(await codeOf(health.check({ service: "" }, { contextValues: expired }))).to.equal(Code.DeadlineExceeded);
      const labels = { grpc_service: "grpc.health.v1.Health", grpc_method: "Check", grpc_code: "DEADLINE_EXCEEDED" };
      expect(await metricValue(registry, "grpc_client_handled_total", labels)).to.equal(1);
    });

    it("counts calls by code and times them, on one set of metrics per registry", async () => {
      const registry = new Registry();
      const a = createClient(Health, open(channelDefaults, registry));
      const b = createClient(Health, open(channelDefaults, registry)); // a second channel reuses the metrics
      await a.check({ service: "" });
      await b.check({ service: "" });
      expect(await codeOf(a.check({ service: "no.such.Service" }))).to.equal(Code.NotFound);
      const check = { grpc_service: "grpc.health.v1.Health", grpc_method: "Check" };
      expect(await metricValue(registry, "grpc_client_handled_total", { ...check, grpc_code: "OK" })).to.equal(2);
      expect(await metricValue(registry, "grpc_client_handled_total", { ...check, grpc_code: "NOT_FOUND" })).to.equal(1);
      const histogram = await registry.getSingleMetric("grpc_client_handling_seconds")!.get();
      const count = histogram.values.find(
        (v) => (v as { metricName?: string }).metricName === "grpc_client_handling_seconds_count" && v.labels["grpc_method"] === "Check",
      );
      expect(count?.value).to.equal(3);
    });

    it("counts a stream when it ends: OK after the last message, CANCELLED when the caller cancels", async () => {
      const registry = new Registry();
      const health = createClient(Health, open(channelDefaults, registry));
      const watch = { grpc_service: "grpc.health.v1.Health", grpc_method: "Watch" };
      const controller = new AbortController();
      const stream = health.watch({ service: "" }, { signal: controller.signal });
      const it = stream[Symbol.asyncIterator]();
      expect((await it.next()).value?.status).to.equal(S.SERVING);
      expect(await metricValue(registry, "grpc_client_handled_total", { ...watch, grpc_code: "CANCELLED" })).to.equal(0);
      controller.abort();
      expect(await codeOf(it.next())).to.equal(Code.Canceled);
      expect(await metricValue(registry, "grpc_client_handled_total", { ...watch, grpc_code: "CANCELLED" })).to.equal(1);
    });

    it("leaves only application metadata on a failed call's error, so that a handler can rethrow it", async () => {
      const err = await createClient(Health, open())
        .check({ service: "no.such.Service" })
        .catch((e: unknown) => ConnectError.from(e));
      expect((err as ConnectError).code).to.equal(Code.NotFound);
      const names = [...(err as ConnectError).metadata.keys()];
      expect(names.filter((n) => n.startsWith("grpc-") || n.startsWith("content-"))).to.deep.equal([]);
      expect(names).to.include("x-request-id");
    });

    it("refuses a registry that already holds one of the names with another type", () => {
      const registry = new Registry();
      new Gauge({ name: "grpc_client_handled_total", help: "not a counter", registers: [registry] });
      expect(() => open(channelDefaults, registry)).to.throw(/grpc_client_handled_total is registered with another type/);
    });

    it("close() lets calls in flight end, then refuses new ones with UNAVAILABLE", async () => {
      const channel = open();
      const health = createClient(Health, channel);
      const controller = new AbortController();
      const it = health.watch({ service: "" }, { signal: controller.signal })[Symbol.asyncIterator]();
      expect((await it.next()).value?.status).to.equal(S.SERVING);
      expect(channel.inFlight).to.equal(1);
      let closed = false;
      const closing = channel.close().then(() => (closed = true));
      expect(await codeOf(health.check({ service: "" }))).to.equal(Code.Unavailable);
      await new Promise((r) => setImmediate(r));
      expect(closed).to.equal(false);
      controller.abort();
      await closing;
      expect(channel.inFlight).to.equal(0);
      expect(channel.closed).to.equal(true);
    });

    it("a call that starts already aborted (passed inbound deadline, cancelled caller) is never counted in flight, so close() still ends", async () => {
      const channel = open();
      const health = createClient(Health, channel);
      const expired = withCallContext({ deadline: performance.now() - 1 });
      expect(await codeOf(health.check({ service: "" }, { contextValues: expired }))).to.equal(Code.DeadlineExceeded);
      expect(await codeOf(health.check({ service: "" }, { signal: AbortSignal.abort() }))).to.equal(Code.Canceled);
      expect(channel.inFlight).to.equal(0);
      await channel.close();
      expect(channel.closed).to.equal(true);
    });

    it("abort() ends open calls at once", async () => {
      const channel = open();
      const it = createClient(Health, channel).watch({ service: "" })[Symbol.asyncIterator]();
      expect((await it.next()).value?.status).to.equal(S.SERVING);
      channel.abort();
      expect(await codeOf(it.next())).to.equal(Code.Canceled);
    });
  });
}

describe("rpc: createChannel targets", () => {
  it("refuses a target that is not HOST:PORT", () => {
    expect(() => createChannel("http://127.0.0.1:50051", channelDefaults)).to.throw(RangeError, /expected HOST:PORT/);
    expect(() => createChannel("127.0.0.1:99999", channelDefaults)).to.throw(RangeError, /port must be 0..65535/);
  });
});

describe("rpc: channelConfigSchema", () => {
  it("fills every default", () => {
    expect(channelConfigSchema.parse({})).to.deep.equal({
      tls: false,
      caFile: "",
      serverName: "",
      certFile: "",
      keyFile: "",
      keepaliveIntervalMs: 30_000,
      keepaliveTimeoutMs: 20_000,
      idleConnectionTimeoutMs: 900_000,
      maxReceiveMessageBytes: 8 * 1024 * 1024,
      maxSendMessageBytes: 8 * 1024 * 1024,
      leanPath: true,
      defaultTimeoutMs: 0,
      token: "",
      tokenFile: "",
    });
  });

  it("refuses token with tokenFile, and a token with white space", () => {
    expect(channelConfigSchema.safeParse({ token: "a", tokenFile: "/t" }).error?.issues.map((i) => i.path.join("."))).to.deep.equal(["tokenFile"]);
    expect(channelConfigSchema.safeParse({ token: "a b" }).error?.issues.map((i) => i.path.join("."))).to.deep.equal(["token"]);
  });

  it("names the field of a bad setting", () => {
    const unknown = channelConfigSchema.safeParse({ tsl: true });
    expect(unknown.success).to.equal(false);
    const caWithoutTls = channelConfigSchema.safeParse({ caFile: "/etc/ca.pem" });
    expect(caWithoutTls.error?.issues.map((i) => i.path.join("."))).to.deep.equal(["caFile"]);
    const tooSmall = channelConfigSchema.safeParse({ maxReceiveMessageBytes: 10 });
    expect(tooSmall.error?.issues.map((i) => i.path.join("."))).to.deep.equal(["maxReceiveMessageBytes"]);
  });
});

describe("rpc: createChannel over TLS", () => {
  let server: InProcessServer;
  let caFile: string;
  const channels: Channel[] = [];
  before(async function () {
    try {
      execFileSync("openssl", ["version"], { stdio: "ignore" });
    } catch {
      this.skip();
    }
    const { certFile, keyFile } = selfSignedCertificate();
    caFile = certFile;
    server = await startServer({ config: { tls: { certFile: caFile, keyFile } } });
  });
  afterEach(() => {
    for (const c of channels.splice(0)) c.abort();
  });
  after(() => server?.close());

  it("reaches a server whose certificate the CA file signed, and refuses one it cannot verify", async () => {
    const trusted = createChannel(server.addr, { ...channelDefaults, tls: true, caFile });
    channels.push(trusted);
    expect((await createClient(Health, trusted).check({ service: "" })).status).to.equal(S.SERVING);
    const untrusted = createChannel(server.addr, { ...channelDefaults, tls: true });
    channels.push(untrusted);
    const refused = await createClient(Health, untrusted)
      .check({ service: "" })
      .then(() => undefined, (err: unknown) => ConnectError.from(err));
    expect(refused?.message).to.match(/certificate/i);
  });

  it("throws a ChannelConfigError naming caFile when the CA file cannot be read", () => {
    let error: unknown;
    try {
      createChannel(server.addr, { ...channelDefaults, tls: true, caFile: "/no/such/ca.pem" });
    } catch (err) {
      error = err;
    }
    expect(error).to.be.instanceOf(ChannelConfigError);
    expect((error as ChannelConfigError).field).to.equal("caFile");
    expect((error as Error).message).to.match(/^caFile: cannot read \/no\/such\/ca\.pem/);
  });
});
