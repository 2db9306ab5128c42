/**
 * HTTP/1.1 and HTTP/2 (h2c) on one cleartext port: real clients of each
 * kind (connect over HTTP/1.1 and HTTP/2, gRPC-Web, @grpc/grpc-js, fetch,
 * raw sockets), the protocol told apart however the first bytes are cut,
 * the same limits, auth, logging and drain for both; opt-in CORS; and the
 * modules' plain HTTP routes.
 */
import * as http from "node:http";
import * as http2 from "node:http2";
import { connect, createServer, type Server, type Socket } from "node:net";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { expect } from "chai";
import { pino } from "pino";
import { Registry } from "prom-client";
import { z } from "zod";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { Health, HealthCheckResponse_ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { defineModule, splitHostPort } from "../../src/server/index.js";
import type { HttpRoute } from "../../src/server/index.js";
import { HttpRequestMetrics, HttpRouteTable } from "../../src/server/http-routes.js";
import { eventually, grpcUnary, metricValue as metricValueOf, startServer, type InProcessServer } from "../support/index.js";

const TOKEN = "http1-test-token-0123456789";

/** A metric of the server under test (see test/support/metrics.ts). */
const metricValue = (server: InProcessServer, name: string, labels: Record<string, string>): Promise<number> =>
  metricValueOf(server.host.metrics.registry, name, labels);

/** Writes `request` on a fresh socket, in the given pieces with a pause between, and returns everything the server sent until it closed. */
function rawExchange(addr: string, pieces: (string | Buffer)[], options: { endAfterMs?: number } = {}): Promise<string> {
  const { host, port } = splitHostPort(addr);
  return new Promise((resolve, reject) => {
    const socket = connect(port, host);
    const received: Buffer[] = [];
    socket.on("data", (d: Buffer) => received.push(d));
    socket.on("error", reject);
    socket.on("close", () => resolve(Buffer.concat(received).toString("latin1")));
    socket.once("connect", async () => {
      for (const piece of pieces) {
        socket.write(piece);
        await new Promise((r) => setTimeout(r, 15));
      }
      if (options.endAfterMs !== undefined) setTimeout(() => socket.end(), options.endAfterMs);
    });
  });
}

/**
 * A TCP proxy in front of `addr` that forwards the client's first `slowBytes`
 * bytes one at a time, each in its own write after a pause: the server sees
 * the protocol's first bytes in as many reads as the network allows.
 */
async function dribblingProxy(addr: string, slowBytes: number): Promise<{ addr: string; close(): Promise<void> }> {
  const { host, port } = splitHostPort(addr);
  const sockets = new Set<Socket>();
  const proxy: Server = createServer((client) => {
    const upstream = connect(port, host);
    upstream.setNoDelay(true);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("error", () => undefined);
      s.once("close", () => sockets.delete(s));
    }
    upstream.pipe(client);
    let sent = 0;
    let queue = Promise.resolve();
    client.on("data", (chunk: Buffer) => {
      client.pause();
      queue = queue.then(async () => {
        for (let i = 0; i < chunk.length; ) {
          if (sent < slowBytes) {
            upstream.write(chunk.subarray(i, i + 1));
            sent += 1;
            i += 1;
            await new Promise((r) => setTimeout(r, 2));
          } else {
            upstream.write(chunk.subarray(i));
            sent += chunk.length - i;
            break;
          }
        }
        client.resume();
      });
    });
    client.once("end", () => void queue.then(() => upstream.end()));
    upstream.once("close", () => client.destroy());
  });
  await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", () => r()));
  const { port: proxyPort } = proxy.address() as { port: number };
  return {
    addr: `127.0.0.1:${proxyPort}`,
    close: () =>
      new Promise((r) => {
        for (const s of sockets) s.destroy();
        proxy.close(() => r());
      }),
  };
}

/** One HTTP/2 request with node:http2, returning status, headers and body. */
async function h2Request(
  addr: string,
  headers: http2.OutgoingHttpHeaders,
  body?: string,
): Promise<{ status: number; headers: http2.IncomingHttpHeaders; body: string }> {
  const session = http2.connect(`http://${addr}`);
  try {
    return await new Promise((resolve, reject) => {
      session.on("error", reject);
      const stream = session.request(headers);
      let responseHeaders: http2.IncomingHttpHeaders = {};
      const chunks: Buffer[] = [];
      stream.on("response", (h) => (responseHeaders = h));
      stream.on("data", (d: Buffer) => chunks.push(d));
      stream.on("error", reject);
      stream.on("end", () =>
        resolve({ status: Number(responseHeaders[":status"]), headers: responseHeaders, body: Buffer.concat(chunks).toString() }),
      );
      stream.end(body);
    });
  } finally {
    session.close();
  }
}

/** A module that serves plain HTTP routes: an echo, one that fails, one that streams until its signal fires. */
const routesModule = defineModule({
  name: "httpRoutesTest",
  description: "test: plain HTTP routes",
  configSchema: z.object({}),
  create: () => {
    const routes: HttpRoute[] = [
      {
        method: "POST",
        path: "/v1/test/echo",
        name: "test.echo",
        async handle(req, res, ctx) {
          const chunks: Buffer[] = [];
          let size = 0;
          for await (const chunk of req as AsyncIterable<Buffer>) {
            size += chunk.length;
            if (size > ctx.readMaxBytes) {
              (res as http.ServerResponse).writeHead(413).end();
              return;
            }
            chunks.push(chunk);
          }
          (res as http.ServerResponse)
            .writeHead(200, { "content-type": "application/json" })
            .end(JSON.stringify({ echo: Buffer.concat(chunks).toString(), httpVersion: req.httpVersion, authorization: req.headers.authorization ?? null }));
        },
      },
      {
        method: "POST",
        path: "/v1/test/fail",
        name: "test.fail",
        handle() {
          return Promise.reject(new Error("route broke"));
        },
      },
    ];
    return { services: [], httpRoutes: routes };
  },
});

describe("one cleartext port: HTTP/1.1 and h2c", () => {
  let server: InProcessServer;
  let lines: string[];
  before(async () => {
    lines = [];
    server = await startServer({ modules: [routesModule], config: { auth: { token: TOKEN } }, logLines: lines });
  });
  after(() => server?.close());

  it("serves Connect and gRPC-Web over HTTP/1.1, Connect over HTTP/2 and gRPC to grpc-js, all on the one port", async () => {
    const baseUrl = server.baseUrl;
    const connect11 = createClient(Health, createConnectTransport({ baseUrl, httpVersion: "1.1" }));
    expect((await connect11.check({})).status).to.equal(HealthCheckResponse_ServingStatus.SERVING);
    const web11 = createClient(Health, createGrpcWebTransport({ baseUrl, httpVersion: "1.1" }));
    expect((await web11.check({})).status).to.equal(HealthCheckResponse_ServingStatus.SERVING);
    const connect2 = createClient(Health, server.connectTransport);
    expect((await connect2.check({})).status).to.equal(HealthCheckResponse_ServingStatus.SERVING);
    const grpcJs = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
    expect(await grpcUnary(grpcJs, "Check", {})).to.deep.include({ status: "SERVING" });
    // A server stream over HTTP/1.1: the first message arrives while the response is still open.
    const abort = new AbortController();
    for await (const res of connect11.watch({}, { signal: abort.signal })) {
      expect(res.status).to.equal(HealthCheckResponse_ServingStatus.SERVING);
      break;
    }
    abort.abort();
  });

  it("answers plain HTTP/1.1 JSON as curl sends it, strict JSON included", async () => {
    const ok = await fetch(`${server.baseUrl}/grpc.health.v1.Health/Check`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}",
    });
    expect(ok.status).to.equal(200);
    expect(await ok.json()).to.deep.equal({ status: "SERVING" });
    const unknownField = await fetch(`${server.baseUrl}/grpc.health.v1.Health/Check`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: '{"servise":"x"}',
    });
    expect(unknownField.status).to.equal(400);
    expect(((await unknownField.json()) as { code: string }).code).to.equal("invalid_argument");
  });

  it("applies auth over HTTP/1.1 as over HTTP/2", async () => {
    const admin = createClient(AdminService, createConnectTransport({ baseUrl: server.baseUrl, httpVersion: "1.1" }));
    const refused = await admin.getConfig({}).then(
      () => undefined,
      (err: { code: number }) => err,
    );
    expect(refused?.code).to.equal(16); // UNAUTHENTICATED
    const allowed = await admin.getConfig({}, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(allowed.config).to.have.property("listen");
  });

  it("logs an HTTP/1.1 call's rpc finished line like any other, with its peer and protocol", async () => {
    const before = lines.length;
    await fetch(`${server.baseUrl}/grpc.health.v1.Health/Check`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    const line = await eventually(() => {
      const found = lines
        .slice(before)
        .map((l) => JSON.parse(l) as Record<string, unknown>)
        .find((l) => l["msg"] === "rpc finished" && l["method"] === "Check");
      if (!found) throw new Error("no rpc finished line yet");
      return found;
    });
    expect(line).to.include({ service: "grpc.health.v1.Health", code: "OK", protocol: "connect" });
    expect(line["peer"]).to.match(/^127\.0\.0\.1:\d+$/);
  });

  for (const slowBytes of [1, 5, 23, 24, 40]) {
    it(`tells the protocols apart when the first ${slowBytes} bytes arrive one by one`, async () => {
      const proxy = await dribblingProxy(server.addr, slowBytes);
      try {
        const viaHttp1 = await fetch(`http://${proxy.addr}/grpc.health.v1.Health/Check`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: "{}",
        });
        expect(await viaHttp1.json()).to.deep.equal({ status: "SERVING" });
        const viaHttp2 = createClient(Health, createConnectTransport({ baseUrl: `http://${proxy.addr}`, httpVersion: "2" }));
        expect((await viaHttp2.check({})).status).to.equal(HealthCheckResponse_ServingStatus.SERVING);
      } finally {
        await proxy.close();
      }
    });
  }

  it("answers a request that starts like the HTTP/2 preface but is not one as HTTP/1.1 (400), and keeps serving", async () => {
    const answer = await rawExchange(server.addr, ["PRI * HTTP/1.1\r\nHost: x\r\n\r\n"], { endAfterMs: 50 });
    expect(answer).to.match(/^HTTP\/1\.1 4\d\d /);
    const grpcJs = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
    expect(await grpcUnary(grpcJs, "Check", {})).to.deep.include({ status: "SERVING" });
  });

  it("serves a module's plain HTTP route over HTTP/1.1 and HTTP/2, logged and counted as that route", async () => {
    const viaHttp1 = await fetch(`${server.baseUrl}/v1/test/echo?x=1`, { method: "POST", body: "hello", headers: { authorization: "Bearer abc" } });
    expect(await viaHttp1.json()).to.deep.equal({ echo: "hello", httpVersion: "1.1", authorization: "Bearer abc" });
    const viaHttp2 = await h2Request(server.addr, { ":method": "POST", ":path": "/v1/test/echo" }, "there");
    expect(JSON.parse(viaHttp2.body)).to.deep.equal({ echo: "there", httpVersion: "2.0", authorization: null });
    const wrongMethod = await fetch(`${server.baseUrl}/v1/test/echo`);
    expect(wrongMethod.status).to.equal(405);
    expect(wrongMethod.headers.get("allow")).to.equal("POST");
    const failed = await fetch(`${server.baseUrl}/v1/test/fail`, { method: "POST", body: "" });
    expect(failed.status).to.equal(500);
    expect(await failed.json()).to.deep.equal({ error: { message: "internal error", type: "server_error", param: null, code: "internal" } });
    await eventually(async () => {
      expect(await metricValue(server, "mmgate_http_requests_total", { route: "test.echo", status: "200" })).to.equal(2);
      expect(await metricValue(server, "mmgate_http_requests_total", { route: "test.echo", status: "405" })).to.equal(1);
      expect(await metricValue(server, "mmgate_http_requests_total", { route: "test.fail", status: "500" })).to.equal(1);
    });
    const logged = lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l["msg"] === "http request finished");
    expect(logged.map((l) => [l["route"], l["status"], l["protocol"]])).to.deep.include.members([
      ["test.echo", 200, "http/1.1"],
      ["test.echo", 200, "http/2.0"],
      ["test.fail", 500, "http/1.1"],
    ]);
    // Routes are not RPCs: no rpc finished line names them.
    expect(lines.some((l) => l.includes('"rpc finished"') && l.includes("/v1/test/"))).to.equal(false);
  });
});

describe("HTTP/1.1 answers given before the request body was read", () => {
  let server: InProcessServer;
  before(async () => {
    server = await startServer({ modules: [routesModule] });
  });
  after(() => server?.close());

  it("never lose the next request on a keep-alive connection: it is kept only when the response says so", async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const post = (path: string, body: string) =>
      new Promise<{ status: number; connection: string | undefined }>((resolve, reject) => {
        const req = http.request(`${server.baseUrl}${path}`, { method: "POST", agent }, (res) => {
          res.resume();
          res.on("end", () => resolve({ status: res.statusCode ?? 0, connection: res.headers.connection }));
        });
        req.on("error", reject);
        req.end(body);
      });
    try {
      // Early answers (the failing route does not read its body; Connect refuses a missing
      // content type at once), each followed by a request on the same agent: whether the body
      // had arrived when the answer went out decides keep-alive or close, never a lost request.
      for (let i = 0; i < 10; i++) {
        expect((await post("/v1/test/fail", "x".repeat(100 * i))).status).to.equal(500);
        expect((await post("/grpc.health.v1.Health/Check", "{}")).status).to.equal(415);
        expect(await post("/v1/test/echo", "again")).to.deep.equal({ status: 200, connection: "keep-alive" });
      }
    } finally {
      agent.destroy();
    }
  });

  it("say Connection: close, and close, when the body was still arriving", async () => {
    const answer = await rawExchange(server.addr, [
      "POST /v1/test/fail HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\n",
      "only the first bytes",
    ]);
    expect(answer).to.match(/^HTTP\/1\.1 500 /);
    expect(answer.toLowerCase()).to.include("connection: close");
  });
});

describe("HTTP/1.1 limits and drain on the cleartext port", () => {
  let server: InProcessServer | undefined;
  afterEach(async () => {
    await server?.close();
    server = undefined;
  });

  it("holds HTTP/1.1 requests to the same message size limit", async () => {
    server = await startServer({ config: { limits: { maxReceiveMessageBytes: 1024 } } });
    const big = await fetch(`${server.baseUrl}/grpc.health.v1.Health/Check`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ service: "x".repeat(4096) }),
    });
    expect(big.status).to.equal(429);
    expect(((await big.json()) as { code: string }).code).to.equal("resource_exhausted");
  });

  it("closes connections that do not show their protocol, or an HTTP/1.1 request's headers, within connections.handshakeTimeoutMs", async () => {
    server = await startServer({ config: { connections: { handshakeTimeoutMs: 200 } } });
    const silent = await rawExchange(server.addr, []);
    expect(silent).to.equal("");
    const halfHeaders = await rawExchange(server.addr, ["POST /grpc.health.v1.Health/Check HTTP/1.1\r\nHost: x\r\n"]);
    expect(halfHeaders).to.match(/^(HTTP\/1\.1 408 |$)/);
    expect(await metricValue(server, "mmgate_connections_closed_total", { reason: "handshake_timeout" })).to.be.at.least(1);
  });

  it("closes idle keep-alive HTTP/1.1 connections when it drains, without waiting for the grace", async () => {
    server = await startServer({ config: { shutdown: { graceMs: 60_000 } } });
    const agent = new http.Agent({ keepAlive: true });
    // Wrapped: a promise resolved with a promise would wait for it.
    const { socketClosed } = await new Promise<{ socketClosed: Promise<void> }>((resolve, reject) => {
      const req = http.request(
        `${server!.baseUrl}/grpc.health.v1.Health/Check`,
        { method: "POST", agent, headers: { "content-type": "application/json" } },
        (res) => {
          expect(res.headers.connection).to.equal("keep-alive");
          res.resume();
          res.on("end", () => resolve({ socketClosed: new Promise<void>((r) => req.socket!.once("close", () => r())) }));
        },
      );
      req.on("error", reject);
      req.end("{}");
    });
    // The connection stays open after the call; shutdown closes it and
    // finishes (it would otherwise wait the whole minute of grace).
    await server.host.shutdown();
    await socketClosed;
    agent.destroy();
  });
});

describe("draining with connections that never sent a byte", () => {
  it("closes them at once instead of waiting for the grace (no handshake timeout set)", async () => {
    const server = await startServer({ config: { shutdown: { graceMs: 60_000 }, connections: { handshakeTimeoutMs: 0 } } });
    const { host, port } = splitHostPort(server.addr);
    const silent = connect(port, host);
    silent.on("error", () => undefined);
    const closed = new Promise<void>((r) => silent.once("close", () => r()));
    await new Promise<void>((r) => silent.once("connect", () => r()));
    // Let the server take the connection (it answers nothing before the first bytes).
    await new Promise((r) => setTimeout(r, 100));
    // Would wait the minute of grace (the test's own timeout ends it sooner) if the silent connection held the listener.
    await server.close();
    await closed;
  });
});

describe("CORS on the gRPC port", () => {
  let server: InProcessServer | undefined;
  afterEach(async () => {
    await server?.close();
    server = undefined;
  });
  const preflight = (origin: string) =>
    fetch(`${server!.baseUrl}/grpc.health.v1.Health/Check`, {
      method: "OPTIONS",
      headers: { origin, "access-control-request-method": "POST", "access-control-request-headers": "content-type,connect-protocol-version" },
    });

  it("is off by default: a preflight gets 405, and is neither an RPC in the logs nor in the gRPC metrics", async () => {
    const lines: string[] = [];
    server = await startServer({ logLines: lines });
    const res = await preflight("https://app.example");
    expect(res.status).to.equal(405);
    expect(res.headers.get("access-control-allow-origin")).to.equal(null);
    expect(lines.filter((l) => l.includes('"rpc finished"'))).to.deep.equal([]);
    expect(await metricValue(server, "grpc_server_started_total", { grpc_method: "Check" })).to.equal(0);
    expect(await metricValue(server, "mmgate_http_requests_total", { route: "cors.preflight", status: "405" })).to.equal(1);
    const call = await fetch(`${server.baseUrl}/grpc.health.v1.Health/Check`, {
      method: "POST",
      headers: { origin: "https://app.example", "content-type": "application/json" },
      body: "{}",
    });
    expect(call.status).to.equal(200);
    expect(call.headers.get("access-control-allow-origin")).to.equal(null);
  });

  it("echoes the well-formed headers a preflight asks for (the OpenAI SDKs send their own) and exposes Retry-After", async () => {
    server = await startServer({ config: { cors: { allowedOrigins: ["https://app.example"] } } });
    const res = await fetch(`${server.baseUrl}/v1/images/generations`, {
      method: "OPTIONS",
      headers: { origin: "https://app.example", "access-control-request-method": "POST", "access-control-request-headers": "x-stainless-lang, x-stainless-os,bad header,content-type" },
    });
    expect(res.status).to.equal(204);
    const allowed = res.headers.get("access-control-allow-headers")!.split(", ").map((h) => h.toLowerCase());
    expect(allowed).to.include.members(["x-stainless-lang", "x-stainless-os", "content-type", "authorization"]);
    expect(allowed).to.not.include("bad header");
    const call = await fetch(`${server.baseUrl}/grpc.health.v1.Health/Check`, {
      method: "POST",
      headers: { origin: "https://app.example", "content-type": "application/json" },
      body: "{}",
    });
    expect(call.headers.get("access-control-expose-headers")).to.include("Retry-After").and.include("Idempotency-Replayed");
    const other = await fetch(`${server.baseUrl}/grpc.health.v1.Health/Check`, {
      method: "POST",
      headers: { origin: "https://other.example", "content-type": "application/json" },
      body: "{}",
    });
    expect(other.headers.get("access-control-allow-origin")).to.equal(null);
    expect(other.headers.get("vary")).to.equal("Origin");
  });

  it("refuses a module route's request from a browser page of an origin CORS does not allow (a form needs no preflight)", async () => {
    server = await startServer({ modules: [routesModule], config: { cors: { allowedOrigins: ["https://app.example"] } } });
    const from = (origin?: string) =>
      fetch(`${server!.baseUrl}/v1/test/echo`, { method: "POST", body: "x", headers: origin === undefined ? {} : { origin } });
    const refused = await from("https://evil.example");
    expect(refused.status).to.equal(403);
    expect(((await refused.json()) as { error: { code: string } }).error.code).to.equal("origin_not_allowed");
    expect((await from("https://app.example")).status).to.equal(200);
    expect((await from(`http://${server.addr}`)).status).to.equal(200); // the server's own origin
    expect((await from()).status).to.equal(200); // not a browser
  });

  it("answers preflights from the allowed origins with connect's methods and headers, and refuses the others", async () => {
    server = await startServer({ config: { cors: { allowedOrigins: ["https://app.example"], maxAgeSeconds: 600 } } });
    const allowed = await preflight("https://app.example");
    expect(allowed.status).to.equal(204);
    expect(allowed.headers.get("access-control-allow-origin")).to.equal("https://app.example");
    expect(allowed.headers.get("access-control-allow-methods")).to.equal("POST, GET");
    expect(allowed.headers.get("access-control-allow-headers")).to.include("Connect-Protocol-Version").and.include("Authorization");
    expect(allowed.headers.get("access-control-max-age")).to.equal("600");
    const refused = await preflight("https://evil.example");
    expect(refused.status).to.equal(403);
    expect(refused.headers.get("access-control-allow-origin")).to.equal(null);
  });

  for (const leanPath of [true, false]) {
    it(`puts the CORS headers on calls from an allowed origin over HTTP/1.1 and HTTP/2 (rpc.leanPath ${leanPath})`, async () => {
      server = await startServer({ config: { cors: { allowedOrigins: ["*"] }, rpc: { leanPath } } });
      const viaHttp1 = await fetch(`${server.baseUrl}/grpc.health.v1.Health/Check`, {
        method: "POST",
        headers: { origin: "https://any.example", "content-type": "application/json" },
        body: "{}",
      });
      expect(viaHttp1.headers.get("access-control-allow-origin")).to.equal("https://any.example");
      expect(viaHttp1.headers.get("access-control-expose-headers")).to.include("Grpc-Status");
      const viaHttp2 = await h2Request(
        server.addr,
        { ":method": "POST", ":path": "/grpc.health.v1.Health/Check", "content-type": "application/json", origin: "https://other.example" },
        "{}",
      );
      expect(viaHttp2.status).to.equal(200);
      expect(viaHttp2.headers["access-control-allow-origin"]).to.equal("https://other.example");
      expect(JSON.parse(viaHttp2.body)).to.deep.equal({ status: "SERVING" });
    });
  }
});

describe("HttpRouteTable", () => {
  const serveWith = async (draining: boolean) => {
    const route: HttpRoute = {
      method: "POST",
      path: "/r",
      name: "r",
      handle: async (_req, res) => void (res as http.ServerResponse).writeHead(204).end(),
    };
    const table = new HttpRouteTable({
      routes: [route],
      logger: pino({ level: "silent" }),
      metrics: new HttpRequestMetrics(new Registry()),
      draining: () => draining,
      shutdownSignal: new AbortController().signal,
      readMaxBytes: 1024,
    });
    const plain = http.createServer((req, res) => {
      if (!table.serve(req, res)) res.writeHead(404).end();
    });
    await new Promise<void>((r) => plain.listen(0, "127.0.0.1", () => r()));
    const { port } = plain.address() as { port: number };
    try {
      const hit = await fetch(`http://127.0.0.1:${port}/r`, { method: "POST" });
      const miss = await fetch(`http://127.0.0.1:${port}/other`, { method: "POST" });
      return { hit: hit.status, retryAfter: hit.headers.get("retry-after"), miss: miss.status };
    } finally {
      await new Promise((r) => plain.close(r));
    }
  };

  it("answers 503 with Retry-After while the server drains, and leaves other paths alone", async () => {
    expect(await serveWith(false)).to.deep.equal({ hit: 204, retryAfter: null, miss: 404 });
    expect(await serveWith(true)).to.deep.equal({ hit: 503, retryAfter: "1", miss: 404 });
  });

  it("serves prefix routes (path ending in /*) after exact paths, the longest prefix first, with the rest of the path", async () => {
    const route = (method: HttpRoute["method"], path: string, name: string): HttpRoute => ({
      method,
      path,
      name,
      handle: async (_req, res, ctx) => void (res as http.ServerResponse).writeHead(200).end(JSON.stringify({ name, rest: ctx.pathRest ?? null })),
    });
    const table = new HttpRouteTable({
      routes: [route("GET", "/m", "list"), route("GET", "/m/*", "one"), route("GET", "/m/deep/*", "deep"), route("GET", "/m/fixed", "fixed")],
      logger: pino({ level: "silent" }),
      metrics: new HttpRequestMetrics(new Registry()),
      draining: () => false,
      shutdownSignal: new AbortController().signal,
      readMaxBytes: 1024,
    });
    expect(table.paths).to.deep.equal(["GET /m", "GET /m/fixed", "GET /m/*", "GET /m/deep/*"]);
    const plain = http.createServer((req, res) => {
      if (!table.serve(req, res)) res.writeHead(404).end();
    });
    await new Promise<void>((r) => plain.listen(0, "127.0.0.1", () => r()));
    const { port } = plain.address() as { port: number };
    const get = async (path: string, method = "GET") => {
      const res = await fetch(`http://127.0.0.1:${port}${path}`, { method });
      const text = await res.text();
      return res.status === 200 ? (JSON.parse(text) as unknown) : [res.status, res.headers.get("allow")];
    };
    try {
      expect(await get("/m")).to.deep.equal({ name: "list", rest: null });
      expect(await get("/m/fixed")).to.deep.equal({ name: "fixed", rest: null });
      // The rest is as sent: slashes kept, percent-escapes left for the route to decode, the query dropped.
      expect(await get("/m/a%2Fb/c?x=1")).to.deep.equal({ name: "one", rest: "a%2Fb/c" });
      expect(await get("/m/fixed/more")).to.deep.equal({ name: "one", rest: "fixed/more" });
      expect(await get("/m/deep/x/y")).to.deep.equal({ name: "deep", rest: "x/y" });
      expect(await get("/m/deep/")).to.deep.equal({ name: "one", rest: "deep/" });
      // The prefix alone is no match; nor is a path that only starts like it.
      expect(await get("/m/")).to.deep.equal([404, null]);
      expect(await get("/mx")).to.deep.equal([404, null]);
      expect(await get("/m/x", "POST")).to.deep.equal([405, "GET"]);
    } finally {
      await new Promise((r) => plain.close(r));
    }
  });

  it("refuses a * anywhere but a trailing /*, and a prefix route registered twice", () => {
    const build = (...paths: string[]) =>
      new HttpRouteTable({
        routes: paths.map((path) => ({ method: "GET" as const, path, name: path, handle: async () => undefined })),
        logger: pino({ level: "silent" }),
        metrics: new HttpRequestMetrics(new Registry()),
        draining: () => false,
        shutdownSignal: new AbortController().signal,
        readMaxBytes: 1,
      });
    for (const path of ["/a*", "/a/*/b", "/a/**", "*"]) expect(() => build(path), path).to.throw('only a trailing "/*" is a pattern');
    expect(() => build("/a/*", "/a/*")).to.throw("GET /a/* is registered twice");
    // An exact path and the prefix route under it are different routes.
    expect(build("/a", "/a/*").size).to.equal(2);
  });

  it("refuses a route registered twice", () => {
    const route: HttpRoute = { method: "GET", path: "/x", name: "x", handle: async () => undefined };
    expect(
      () =>
        new HttpRouteTable({
          routes: [route, route],
          logger: pino({ level: "silent" }),
          metrics: new HttpRequestMetrics(new Registry()),
          draining: () => false,
          shutdownSignal: new AbortController().signal,
          readMaxBytes: 1,
        }),
    ).to.throw("GET /x is registered twice");
  });
});
