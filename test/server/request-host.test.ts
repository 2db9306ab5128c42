/**
 * The authority a request names: parsed strictly, refused with 400 /
 * INVALID_ARGUMENT when it cannot be used (it used to reach connect's URL
 * building and take the process down), and checked against
 * `server.allowedHosts` (403 / PERMISSION_DENIED), which stops DNS
 * rebinding; the same-origin rule compares scheme, host and port. Every
 * way in named in the report is here, on both request paths.
 */
import * as grpc from "@grpc/grpc-js";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { Code } from "@connectrpc/connect";
import { expect } from "chai";
import { connect } from "node:net";
import { Health, HealthCheckResponse_ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { HostAllowList, parseAuthority } from "../../src/server/request-host.js";
import { CorsPolicy } from "../../src/server/cors.js";
import { resolveConfig, splitHostPort } from "../../src/server/index.js";
import { relayModule } from "../../src/relay/index.js";
import { connectErrorOf, grpcUnary, metricValue, startServer, type InProcessServer } from "../support/index.js";
import { connectH2, grpcFrame, rawH2, startRawH2 } from "../support/raw-h2.js";

describe("parseAuthority", () => {
  const cases: [string | undefined, { host: string; port: number | undefined } | undefined][] = [
    ["127.0.0.1:50051", { host: "127.0.0.1", port: 50051 }],
    ["LocalHost", { host: "localhost", port: undefined }],
    ["example.com.:443", { host: "example.com", port: 443 }],
    ["[::1]:8080", { host: "[::1]", port: 8080 }],
    ["[0:0:0:0:0:0:0:1]", { host: "[::1]", port: undefined }],
    ["xn--bcher-kva.example", { host: "xn--bcher-kva.example", port: undefined }],
    ["a%2Eb", { host: "a%2eb", port: undefined }],
    [undefined, undefined],
    ["", undefined],
    ["[", undefined],
    ["]", undefined],
    ["[::1", undefined],
    ["[nope]:1", undefined],
    ["::1", undefined],
    ["a@b", undefined],
    ["user@host:1", undefined],
    ["x:", undefined],
    ["x:99999", undefined],
    ["x:-1", undefined],
    ["host:1:2", undefined],
    ["%", undefined],
    ["%zz", undefined],
    ["é.example", undefined],
    [" host", undefined],
    ["host/path", undefined],
    ["a".repeat(400), undefined],
  ];
  for (const [raw, expected] of cases) {
    it(`${JSON.stringify(raw?.slice(0, 40))} → ${expected ? `${expected.host} ${expected.port ?? "(no port)"}` : "unusable"}`, () => {
      expect(parseAuthority(raw)).to.deep.equal(expected);
    });
  }
});

describe("HostAllowList", () => {
  const verdict = (list: HostAllowList, authority: string | undefined) => {
    const v = list.check(authority === undefined ? {} : { host: authority });
    return v.ok ? "ok" : v.reason;
  };
  it("a loopback listener answers to the loopback names, names under .localhost, and the advertised host", () => {
    const list = HostAllowList.forListener([], "127.0.0.1", "gateway.internal:50051");
    for (const ok of ["127.0.0.1:1", "localhost", "LOCALHOST:50051", "[::1]:50051", "app.localhost", "gateway.internal:9"]) expect(verdict(list, ok), ok).to.equal("ok");
    for (const no of ["attacker.example:50051", "127.0.0.2", "localhost.attacker.example", "example.com"]) expect(verdict(list, no), no).to.equal("host_not_allowed");
    expect(verdict(list, "[")).to.equal("bad_authority");
    expect(verdict(list, undefined)).to.equal("bad_authority");
  });
  it("an IPv6 loopback listener is loopback too; a wildcard or routable one answers to any host", () => {
    expect(verdict(HostAllowList.forListener([], "::1", ""), "attacker.example")).to.equal("host_not_allowed");
    expect(verdict(HostAllowList.forListener([], "localhost", ""), "attacker.example")).to.equal("host_not_allowed");
    for (const bind of ["0.0.0.0", "::", "10.0.0.5"]) {
      const list = HostAllowList.forListener([], bind, "");
      expect(list.allowsAny, bind).to.equal(true);
      expect(verdict(list, "anything.example:1"), bind).to.equal("ok");
      // The form is still checked.
      expect(verdict(list, "["), bind).to.equal("bad_authority");
    }
  });
  it("configured entries replace the default: names, addresses, .domain and *", () => {
    const list = HostAllowList.forListener(["api.example.com", ".svc.cluster.local", "10.0.0.5", "::1"], "0.0.0.0", "");
    for (const ok of ["api.example.com:443", "API.example.com", "svc.cluster.local", "mmgate.ns.svc.cluster.local:50051", "10.0.0.5:1", "[::1]"]) expect(verdict(list, ok), ok).to.equal("ok");
    for (const no of ["example.com", "xsvc.cluster.local", "localhost", "127.0.0.1"]) expect(verdict(list, no), no).to.equal("host_not_allowed");
    expect(verdict(HostAllowList.forListener(["*"], "127.0.0.1", ""), "attacker.example")).to.equal("ok");
  });
  it("a config entry that is no host is a config error naming the key", () => {
    for (const bad of ["host:80", "a@b", "", "[", "http://x"]) {
      expect(() => resolveConfig({ server: { allowedHosts: [bad] } }, []), bad).to.throw(/server\.allowedHosts/);
    }
  });
});

describe("CorsPolicy.admits: the server's own origin is scheme, host and port", () => {
  const headers = (origin: string, host: string) => ({ origin, host });
  it("cleartext: same host and port over http only", () => {
    const cors = new CorsPolicy({ allowedOrigins: [], maxAgeSeconds: 0 }, false);
    expect(cors.admits(headers("http://127.0.0.1:50051", "127.0.0.1:50051"))).to.equal(true);
    expect(cors.admits(headers("http://localhost", "localhost:80"))).to.equal(true);
    expect(cors.admits(headers("https://127.0.0.1:50051", "127.0.0.1:50051"))).to.equal(false);
    expect(cors.admits(headers("http://127.0.0.1:50052", "127.0.0.1:50051"))).to.equal(false);
    expect(cors.admits(headers("http://127.0.0.1", "127.0.0.1:50051"))).to.equal(false);
    expect(cors.admits(headers("null", "127.0.0.1:50051"))).to.equal(false);
    expect(cors.admits({ host: "127.0.0.1:50051" })).to.equal(true);
  });
  it("TLS: https only, 443 by default", () => {
    const cors = new CorsPolicy({ allowedOrigins: [], maxAgeSeconds: 0 }, true);
    expect(cors.admits(headers("https://gw.example", "gw.example:443"))).to.equal(true);
    expect(cors.admits(headers("http://gw.example:443", "gw.example:443"))).to.equal(false);
  });
});

/** One HTTP/1.x exchange on its own socket; resolves with everything the server sent until it closed (rejects if it did not within 5 s). */
function http1Raw(addr: string, request: string): Promise<string> {
  const { host, port } = splitHostPort(addr);
  return new Promise((resolve, reject) => {
    const socket = connect(port, host);
    let received = "";
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`the server did not close the connection; it sent ${JSON.stringify(received.slice(0, 200))}`));
    }, 5000);
    socket.on("data", (d: Buffer) => (received += d.toString("latin1")));
    socket.on("error", reject);
    socket.on("close", () => {
      clearTimeout(timer);
      resolve(received);
    });
    socket.once("connect", () => socket.write(request));
  });
}

const HEALTH_PATH = "/grpc.health.v1.Health/Check";
const PUBLISH_PATH = "/mmgate.kvevents.v1.KvEventService/Publish";

describe("requests whose authority cannot be used are refused, and the server keeps serving", function () {
  this.timeout(20_000);
  let server: InProcessServer;
  before(async () => {
    server = await startServer({ modules: [relayModule], config: { cors: { allowedOrigins: ["https://app.example"] } } });
  });
  after(() => server?.close());

  async function stillServing(): Promise<void> {
    const reply = await grpcUnary(server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health"), "check", {});
    expect(reply["status"]).to.equal("SERVING");
  }

  const http1Cases: [string, string][] = [
    ["Host: [ over HTTP/1.1", `POST ${HEALTH_PATH} HTTP/1.1\r\nHost: [\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}`],
    ["an empty Host over HTTP/1.1", `POST ${HEALTH_PATH} HTTP/1.1\r\nHost:\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}`],
    ["no Host over HTTP/1.0", `POST ${HEALTH_PATH} HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}`],
    ["an empty Host over HTTP/1.0", `POST ${HEALTH_PATH} HTTP/1.0\r\nHost:\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}`],
    ["Host: [ with an Origin CORS allows", `POST ${HEALTH_PATH} HTTP/1.1\r\nHost: [\r\norigin: https://app.example\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}`],
    ["Host: [ on a preflight", `OPTIONS ${HEALTH_PATH} HTTP/1.1\r\nHost: [\r\norigin: https://app.example\r\naccess-control-request-method: POST\r\nconnection: close\r\n\r\n`],
  ];
  for (const [name, request] of http1Cases) {
    it(`${name}: 400 invalid_argument`, async () => {
      const answer = await http1Raw(server.addr, request);
      expect(answer).to.match(/^HTTP\/1\.[01] 400 /);
      expect(answer).to.include('"code":"invalid_argument"');
      await stillServing();
    });
  }

  it("gRPC-Web over HTTP/1.1 with Host: [ gets INVALID_ARGUMENT as a gRPC status", async () => {
    const answer = await http1Raw(
      server.addr,
      `POST ${HEALTH_PATH} HTTP/1.1\r\nHost: [\r\ncontent-type: application/grpc-web+proto\r\ncontent-length: 5\r\nconnection: close\r\n\r\n\0\0\0\0\0`,
    );
    expect(answer).to.match(/^HTTP\/1\.1 200 /);
    expect(answer.toLowerCase()).to.include(`grpc-status: ${Code.InvalidArgument}`);
    await stillServing();
  });

  const h2Cases: [string, string, Record<string, string>][] = [
    ["a unary gRPC call", HEALTH_PATH, {}],
    ["a client stream (KvEventService/Publish)", PUBLISH_PATH, {}],
    ["a call with an Origin CORS allows", HEALTH_PATH, { origin: "https://app.example" }],
  ];
  for (const [name, path, extra] of h2Cases) {
    it(`HTTP/2 :authority [ on ${name}: INVALID_ARGUMENT`, async () => {
      const response = await rawH2(server.addr, {
        headers: { ":method": "POST", ":path": path, ":authority": "[", "content-type": "application/grpc", te: "trailers", ...extra },
        body: grpcFrame(new Uint8Array(0)),
      });
      expect(response.status).to.equal(200);
      expect(response.headers?.["grpc-status"]).to.equal(String(Code.InvalidArgument));
      expect(decodeURIComponent(String(response.headers?.["grpc-message"]))).to.match(/authority "\["/);
      await stillServing();
    });
  }

  it("the refusals are counted by reason", async () => {
    expect(await metricValue(server.host.metrics.registry, "mmgate_requests_refused_total", { reason: "bad_authority" })).to.be.greaterThan(0);
  });
});

describe("server.allowedHosts: a request for a host the server does not answer to is refused (DNS rebinding)", function () {
  this.timeout(20_000);
  let server: InProcessServer;
  let port: number;
  before(async () => {
    server = await startServer({ config: { cors: { allowedOrigins: [] } } });
    port = splitHostPort(server.addr).port;
  });
  after(() => server?.close());

  it("a page on attacker.example resolving to 127.0.0.1 cannot call (connect over HTTP/1.1, same Origin and Host): 403 permission_denied", async () => {
    const answer = await http1Raw(
      server.addr,
      `POST ${HEALTH_PATH} HTTP/1.1\r\nHost: attacker.example:${port}\r\norigin: http://attacker.example:${port}\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}`,
    );
    expect(answer).to.match(/^HTTP\/1\.1 403 /);
    expect(answer).to.include('"code":"permission_denied"');
    expect(answer).to.include("server.allowedHosts");
  });

  it("a refusal given while the request body is still arriving says Connection: close, and closes", async () => {
    const answer = await http1Raw(server.addr, `POST /v1/images/generations HTTP/1.1\r\nHost: attacker.example\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{"prompt":`);
    expect(answer).to.match(/^HTTP\/1\.1 403 /);
    expect(answer.toLowerCase()).to.include("connection: close");
  });

  it("grpc-js with another authority gets PERMISSION_DENIED; with the loopback names it is served", async () => {
    const other = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health", { "grpc.default_authority": `attacker.example:${port}` });
    const err = (await grpcUnary(other, "check", {}).then(
      () => undefined,
      (e: unknown) => e,
    )) as grpc.ServiceError | undefined;
    expect(err?.code).to.equal(grpc.status.PERMISSION_DENIED);
    for (const authority of [`localhost:${port}`, `127.0.0.1:${port}`]) {
      const client = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health", { "grpc.default_authority": authority });
      expect((await grpcUnary(client, "check", {}))["status"]).to.equal("SERVING");
    }
  });

  it("a connect client over HTTP/2 on localhost is served", async () => {
    const client = createClient(Health, createConnectTransport({ baseUrl: `http://localhost:${port}`, httpVersion: "2" }));
    expect((await client.check({})).status).to.equal(HealthCheckResponse_ServingStatus.SERVING);
  });

  it("a plain HTTP route (OpenAI door) for another host: 403; the same request on localhost passes the check", async () => {
    const refused = await http1Raw(server.addr, `GET /v1/models HTTP/1.1\r\nHost: attacker.example\r\nconnection: close\r\n\r\n`);
    expect(refused).to.match(/^HTTP\/1\.1 403 /);
    const served = await http1Raw(server.addr, `GET /v1/models HTTP/1.1\r\nHost: localhost:${port}\r\nconnection: close\r\n\r\n`);
    expect(served).to.not.match(/^HTTP\/1\.1 403 /);
  });

  it("over HTTP/2 on one connection: a refused stream leaves the connection serving", async () => {
    const session = await connectH2(server.addr);
    try {
      const refused = await startRawH2(session, {
        headers: { ":method": "POST", ":path": HEALTH_PATH, ":authority": "attacker.example", "content-type": "application/grpc", te: "trailers" },
        body: grpcFrame(new Uint8Array(0)),
      }).response;
      expect(refused.headers?.["grpc-status"]).to.equal(String(Code.PermissionDenied));
      const served = await startRawH2(session, {
        headers: { ":method": "POST", ":path": HEALTH_PATH, ":authority": `127.0.0.1:${port}`, "content-type": "application/grpc", te: "trailers" },
        body: grpcFrame(new Uint8Array(0)),
      }).response;
      expect(served.trailers?.["grpc-status"]).to.equal("0");
    } finally {
      session.destroy();
    }
    expect(await metricValue(server.host.metrics.registry, "mmgate_requests_refused_total", { reason: "host_not_allowed" })).to.be.greaterThan(0);
  });

  it("the connect client's error is typed", async () => {
    const client = createClient(Health, createConnectTransport({ baseUrl: `http://127.0.0.1:${port}`, httpVersion: "1.1", interceptors: [(next) => (req) => {
      req.header.set("host", "attacker.example");
      return next(req);
    }] }));
    const err = await connectErrorOf(client.check({}));
    expect(err.code).to.be.oneOf([Code.PermissionDenied]);
  });
});
