/**
 * Mutual TLS on the listener: `tls.clientAuth` require and request with
 * `tls.clientCaFile`, against certificates made here (a CA, a second CA the
 * server does not know, client certificates of each, an expired one): who
 * is turned away at the handshake, who gets in anonymously, the verified
 * certificate in the handler's context (over gRPC to connect and grpc-js
 * clients, and Connect over HTTP/1.1), and rotation of the server's
 * certificate and client CA without a restart. The request path is the
 * lean one by default; MMGATE_TEST_RPC_PATH=connect runs the same tests on
 * connect's.
 */
import { copyFileSync, mkdirSync, readFileSync, renameSync, symlinkSync } from "node:fs";
import { request } from "node:https";
import { join } from "node:path";
import { connect as http2Connect } from "node:http2";
import { connect as tlsConnect } from "node:tls";
import type { TLSSocket } from "node:tls";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { StringValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import { pino } from "pino";
import { Registry } from "prom-client";
import { AdminService, GetConfigRequestSchema, SetServingStatusRequestSchema } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { refusal } from "../../src/server/client-auth.js";
import { ConfigError, resolveConfig } from "../../src/server/index.js";
import { TlsReloader } from "../../src/server/tls-reload.js";
import { filesStamp, loadTlsFiles, tlsMetrics } from "../../src/util/index.js";
import { connectErrorOf, eventually, expectRejection, metricValue, startServer, type InProcessServer } from "../support/index.js";
import { TestPki, opensslAvailable, type TestCa, type TestCertificate } from "../support/pki.js";
import { whoAmIModule, whoAmIOver } from "../support/who-am-i.js";

interface Identity {
  readonly cert?: Buffer;
  readonly key?: Buffer;
}

function identity(certificate: TestCertificate | undefined): Identity {
  return certificate === undefined ? {} : { cert: readFileSync(certificate.certFile), key: readFileSync(certificate.keyFile) };
}

/** One call of ShapesService.Unary over a connection of its own, with connect's gRPC transport. */
async function whoAmIConnect(addr: string, ca: Buffer, client?: TestCertificate): Promise<string> {
  return whoAmIOver(createGrpcTransport({ baseUrl: `https://${addr}`, nodeOptions: { ca, servername: "", ...identity(client) } }));
}

/** The same with @grpc/grpc-js. */
async function whoAmIGrpcJs(addr: string, ca: Buffer, client?: TestCertificate): Promise<string> {
  const { cert, key } = identity(client);
  const credentials = grpc.credentials.createSsl(ca, key ?? null, cert ?? null);
  const Client = grpc.makeGenericClientConstructor(
    {
      Unary: {
        path: "/mmgate.test.v1.ShapesService/Unary",
        requestStream: false,
        responseStream: false,
        requestSerialize: (value: string) => Buffer.from(toBinary(StringValueSchema, create(StringValueSchema, { value }))),
        requestDeserialize: (bytes: Buffer) => fromBinary(StringValueSchema, bytes).value,
        responseSerialize: (value: string) => Buffer.from(toBinary(StringValueSchema, create(StringValueSchema, { value }))),
        responseDeserialize: (bytes: Buffer) => fromBinary(StringValueSchema, bytes).value,
      },
    },
    "ShapesService",
  );
  // The certificate names localhost too: grpc-js would otherwise send the IP address as SNI, which TLS forbids.
  const stub = new Client(addr, credentials, { "grpc.ssl_target_name_override": "localhost" }) as unknown as grpc.Client & { Unary: (req: string, options: grpc.CallOptions, cb: (err: grpc.ServiceError | null, res?: string) => void) => void };
  try {
    return await new Promise<string>((resolve, reject) =>
      stub.Unary("", { deadline: Date.now() + 5000 }, (err, res) => (err ? reject(err) : resolve(res ?? ""))),
    );
  } finally {
    stub.close();
  }
}

/** Connect unary over HTTP/1.1 (TLS, ALPN http/1.1): the compatibility layer's path with a plain socket. */
function whoAmIHttp1(addr: string, ca: Buffer, client?: TestCertificate): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = request(
      `https://${addr}/mmgate.test.v1.ShapesService/Unary`,
      { method: "POST", ca, servername: "", agent: false, headers: { "content-type": "application/json" }, ...identity(client) },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (c: string) => (text += c));
        res.on("end", () => (res.statusCode === 200 ? resolve(JSON.parse(text) as string) : reject(new Error(`${res.statusCode} ${text}`))));
      },
    );
    req.on("error", reject);
    req.end('""');
  });
}

/**
 * A raw TLS connection offering h2: what the server does once the
 * handshake is done. "served": its HTTP/2 SETTINGS arrived (the session
 * started); "closed": the connection ended without a byte from HTTP/2.
 */
function handshakeOutcome(addr: string, ca: Buffer, client?: TestCertificate): Promise<{ outcome: "served" | "closed"; serverSerial: string | undefined }> {
  const [host, port] = [addr.slice(0, addr.lastIndexOf(":")), Number(addr.slice(addr.lastIndexOf(":") + 1))];
  return new Promise((resolve) => {
    const socket = tlsConnect({ host, port, ca, servername: "", ALPNProtocols: ["h2"], ...identity(client) });
    let serverSerial: string | undefined;
    let settled = false;
    const settle = (outcome: "served" | "closed") => {
      if (settled) return;
      settled = true;
      socket.destroy();
      resolve({ outcome, serverSerial });
    };
    socket.once("secureConnect", () => {
      serverSerial = socket.getPeerCertificate().serialNumber;
      // The client preface: the server answers it with SETTINGS once HTTP/2 serves the connection.
      socket.write(Buffer.concat([Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])]));
    });
    socket.on("data", () => settle("served"));
    socket.on("error", () => settle("closed"));
    socket.on("close", () => settle("closed"));
  });
}

/**
 * A call on a connection the server refused fails without reaching a
 * handler. Over TLS 1.3 the client's side of the handshake is complete
 * before the server has seen its certificate, so connect's client may have
 * sent its request already: it then reports the stream cut (CANCELED)
 * rather than UNAVAILABLE.
 */
async function expectRefusedCall(addr: string, ca: Buffer, who: TestCertificate | undefined, name: string): Promise<void> {
  const err = await connectErrorOf(whoAmIConnect(addr, ca, who));
  expect([Code.Unavailable, Code.Canceled], `${name}: ${err.message}`).to.include(err.code);
  const grpcErr = await whoAmIGrpcJs(addr, ca, who).then(
    () => undefined,
    (e: grpc.ServiceError) => e,
  );
  expect(grpcErr?.code, `${name}: ${grpcErr?.message}`).to.equal(grpc.status.UNAVAILABLE);
}

/** A TLS session ticket the server issues to `client` on a connection it serves. */
function sessionTicket(addr: string, ca: Buffer, client: TestCertificate): Promise<Buffer> {
  const port = Number(addr.slice(addr.lastIndexOf(":") + 1));
  return new Promise((resolve, reject) => {
    const socket = tlsConnect({ host: "127.0.0.1", port, ca, servername: "", ALPNProtocols: ["h2"], ...identity(client) });
    socket.once("session", (ticket: Buffer) => {
      socket.destroy();
      resolve(ticket);
    });
    socket.once("error", reject);
  });
}

/** Connect unary JSON over HTTP/2 on a connection resuming `ticket`: whether the server resumed it, and the answer. */
function whoAmIConnectJson(addr: string, ca: Buffer, client: TestCertificate, ticket: Buffer): Promise<{ reused: boolean; value: string }> {
  return new Promise((resolve, reject) => {
    const session = http2Connect(`https://${addr}`, { ca, servername: "", session: ticket, ...identity(client) });
    session.on("error", reject);
    const stream = session.request({ ":method": "POST", ":path": "/mmgate.test.v1.ShapesService/Unary", "content-type": "application/json" });
    let text = "";
    stream.setEncoding("utf8");
    stream.on("data", (chunk: string) => (text += chunk));
    stream.on("end", () => {
      const reused = (session.socket as TLSSocket).isSessionReused();
      session.close();
      resolve({ reused, value: JSON.parse(text) as string });
    });
    stream.on("error", reject);
    stream.end('""');
  });
}

function pem(file: string): Buffer {
  return readFileSync(file);
}

describe("mutual TLS on the listener", function () {
  this.timeout(30_000);
  let pki: TestPki;
  let ca: TestCa;
  let unknownCa: TestCa;
  let serverCert: TestCertificate;
  let client: TestCertificate;
  let strangerClient: TestCertificate;
  let expiredClient: TestCertificate;
  let serverUsage: TestCertificate;
  let caPem: Buffer;

  before(function () {
    if (!opensslAvailable()) this.skip();
    pki = new TestPki();
    ca = pki.ca("mmgate-test-ca");
    unknownCa = pki.ca("unknown-ca");
    caPem = pem(ca.certFile);
    serverCert = pki.issue(ca, { cn: "localhost", usage: "server" });
    client = pki.issue(ca, { cn: "worker-1", usage: "client" });
    strangerClient = pki.issue(unknownCa, { cn: "stranger", usage: "client" });
    expiredClient = pki.issue(ca, { cn: "expired", usage: "client", notBefore: new Date(Date.now() - 3 * 86_400_000), notAfter: new Date(Date.now() - 86_400_000) });
    serverUsage = pki.issue(ca, { cn: "not-a-client", usage: "server" });
  });
  after(() => pki?.remove());

  const start = (clientAuth: "request" | "require", logLines?: string[]) =>
    startServer({
      modules: [whoAmIModule],
      config: { tls: { certFile: serverCert.certFile, keyFile: serverCert.keyFile, clientCaFile: ca.certFile, clientAuth } },
      ...(logLines ? { logLines } : {}),
    });

  describe("clientAuth: require", () => {
    let server: InProcessServer;
    const logLines: string[] = [];
    before(async () => {
      server = await start("require", logLines);
    });
    after(() => server?.close());

    it("serves a client whose certificate the client CA signed, and hands the verified certificate to the handler", async () => {
      const expected = `worker-1/${client.serialNumber}`;
      expect(await whoAmIConnect(server.addr, caPem, client)).to.equal(expected);
      expect(await whoAmIGrpcJs(server.addr, caPem, client)).to.equal(expected);
      // HTTP/1.1 over TLS: the certificate is read from the request's own socket.
      expect(await whoAmIHttp1(server.addr, caPem, client)).to.equal(expected);
    });

    it("refuses, at the handshake, a client without a certificate, one from an unknown CA, an expired one and a server certificate", async () => {
      for (const [name, who] of [["none", undefined], ["unknown CA", strangerClient], ["expired", expiredClient], ["server usage", serverUsage]] as const) {
        expect((await handshakeOutcome(server.addr, caPem, who)).outcome, name).to.equal("closed");
        await expectRefusedCall(server.addr, caPem, who, name);
      }
      // HTTP/1.1 (ALPN http/1.1) goes through the same check.
      await expectRejection(whoAmIHttp1(server.addr, caPem, expiredClient), { message: /socket hang up|ECONNRESET|EPIPE/ });
      expect((await handshakeOutcome(server.addr, caPem, client)).outcome).to.equal("served");
    });

    it("serves a resumed session of a verified client, with its certificate", async () => {
      const ticket = await sessionTicket(server.addr, caPem, client);
      const resumed = await whoAmIConnectJson(server.addr, caPem, client, ticket);
      expect(resumed).to.deep.equal({ reused: true, value: `worker-1/${client.serialNumber}` });
    });

    it("logs and counts each refusal with the verification's reason", async () => {
      const before = await metricValue(server.host.metrics.registry, "mmgate_connections_closed_total", { reason: "client_certificate" });
      await handshakeOutcome(server.addr, caPem, expiredClient);
      await handshakeOutcome(server.addr, caPem, strangerClient);
      // At least these two: a client refused by an earlier test may still be reconnecting in the background, and each attempt counts too.
      await eventually(async () =>
        expect(await metricValue(server.host.metrics.registry, "mmgate_connections_closed_total", { reason: "client_certificate" })).to.be.at.least(before + 2),
      );
      const refusals = logLines.map((l) => JSON.parse(l) as { msg: string; reason?: string }).filter((l) => l.msg.startsWith("TLS connection refused"));
      expect(refusals.map((r) => r.reason)).to.include.members(["CERT_HAS_EXPIRED", "UNABLE_TO_VERIFY_LEAF_SIGNATURE"]);
    });
  });

  describe("clientAuth: request", () => {
    let server: InProcessServer;
    before(async () => {
      server = await start("request");
    });
    after(() => server?.close());

    it("lets a client without a certificate in, anonymous", async () => {
      expect(await whoAmIConnect(server.addr, caPem)).to.equal("anonymous");
      expect(await whoAmIGrpcJs(server.addr, caPem)).to.equal("anonymous");
      expect(await whoAmIHttp1(server.addr, caPem)).to.equal("anonymous");
    });

    it("hands a verified certificate to the handler", async () => {
      expect(await whoAmIConnect(server.addr, caPem, client)).to.equal(`worker-1/${client.serialNumber}`);
      expect(await whoAmIGrpcJs(server.addr, caPem, client)).to.equal(`worker-1/${client.serialNumber}`);
    });

    it("refuses a certificate that does not verify rather than serve it as anonymous", async () => {
      for (const [name, who] of [["unknown CA", strangerClient], ["expired", expiredClient]] as const) {
        expect((await handshakeOutcome(server.addr, caPem, who)).outcome, name).to.equal("closed");
        await expectRefusedCall(server.addr, caPem, who, name);
      }
    });
  });

  describe("the check after the handshake", () => {
    const socket = (authorized: boolean, certificate: object, authorizationError?: string) =>
      ({ authorized, authorizationError, getPeerCertificate: () => certificate }) as unknown as Parameters<typeof refusal>[0];
    const cert = { subject: { CN: "x" }, raw: Buffer.alloc(1) };

    it("require: a verified certificate, and nothing less (not a resumed session Node calls authorized without one)", () => {
      expect(refusal(socket(true, cert), "require")).to.equal(undefined);
      expect(refusal(socket(true, {}), "require")).to.equal("NO_CERTIFICATE");
      expect(refusal(socket(false, {}, "UNABLE_TO_GET_ISSUER_CERT"), "require")).to.equal("NO_CERTIFICATE");
      expect(refusal(socket(false, cert, "CERT_HAS_EXPIRED"), "require")).to.equal("CERT_HAS_EXPIRED");
    });

    it("request: none (anonymous) or a verified one", () => {
      expect(refusal(socket(false, {}, "UNABLE_TO_GET_ISSUER_CERT"), "request")).to.equal(undefined);
      expect(refusal(socket(true, {}), "request")).to.equal(undefined);
      expect(refusal(socket(true, cert), "request")).to.equal(undefined);
      expect(refusal(socket(false, cert, "UNABLE_TO_VERIFY_LEAF_SIGNATURE"), "request")).to.equal("UNABLE_TO_VERIFY_LEAF_SIGNATURE");
    });
  });

  describe("configuration", () => {
    it("refuses request and require without a client CA, a client CA with none, and mutual TLS without TLS", () => {
      const load = (tls: Record<string, unknown>) => () => resolveConfig({ tls }, []);
      expect(load({ certFile: "a.pem", keyFile: "a.key", clientAuth: "require" })).to.throw(ConfigError, /tls\.clientCaFile: clientAuth require needs tls\.clientCaFile/);
      expect(load({ certFile: "a.pem", keyFile: "a.key", clientAuth: "request" })).to.throw(ConfigError, /tls\.clientCaFile: clientAuth request needs/);
      expect(load({ certFile: "a.pem", keyFile: "a.key", clientCaFile: "ca.pem" })).to.throw(ConfigError, /tls\.clientAuth: tls\.clientCaFile is set but clientAuth is none/);
      expect(load({ clientCaFile: "ca.pem", clientAuth: "require" })).to.throw(ConfigError, /tls\.clientAuth: clientAuth require needs TLS/);
      expect(load({ certFile: "a.pem", keyFile: "a.key", clientAuth: "sometimes" })).to.throw(ConfigError, /tls\.clientAuth/);
    });

    it("names an unreadable client CA, and a key that is not the certificate's, when the server starts", async () => {
      const base = { certFile: serverCert.certFile, keyFile: serverCert.keyFile, clientAuth: "require" };
      await expectRejection(startServer({ config: { tls: { ...base, clientCaFile: "/no/ca.pem" } } }), { type: ConfigError, message: /tls\.clientCaFile: cannot read \/no\/ca\.pem/ });
      await expectRejection(startServer({ config: { tls: { ...base, keyFile: client.keyFile, clientCaFile: ca.certFile } } }), {
        type: ConfigError,
        message: /tls\.keyFile: .* is not the key of the certificate/,
      });
    });
  });

  describe("rotation without a restart", () => {
    let server: InProcessServer;
    let dir: string;
    const logLines: string[] = [];
    let secondServerCert: TestCertificate;

    before(async () => {
      dir = join(pki.dir, "rotating");
      mkdirSync(dir);
      copyFileSync(serverCert.certFile, join(dir, "tls.crt"));
      copyFileSync(serverCert.keyFile, join(dir, "tls.key"));
      copyFileSync(ca.certFile, join(dir, "ca.crt"));
      secondServerCert = pki.issue(ca, { cn: "localhost", usage: "server" });
      server = await startServer({
        modules: [whoAmIModule],
        config: { tls: { certFile: join(dir, "tls.crt"), keyFile: join(dir, "tls.key"), clientCaFile: join(dir, "ca.crt"), clientAuth: "require" } },
        logLines,
      });
    });
    after(() => server?.close());

    const serialSeen = async () => (await handshakeOutcome(server.addr, caPem, client)).serverSerial;
    const reloads = (result: string) => metricValue(server.host.metrics.registry, "mmgate_tls_reload_total", { role: "server", result });

    it("serves a replaced certificate to new connections while open ones go on", async () => {
      expect(await serialSeen()).to.equal(serverCert.serialNumber);
      const open = createGrpcTransport({ baseUrl: `https://${server.addr}`, nodeOptions: { ca: caPem, servername: "", ...identity(client) } });
      await whoAmIOver(open);
      const expiryBefore = await metricValue(server.host.metrics.registry, "mmgate_tls_certificate_expiry_timestamp_seconds", { role: "server" });
      expect(expiryBefore).to.be.greaterThan(Date.now() / 1000);
      // Written aside, then renamed over the old files, as a certificate manager does.
      copyFileSync(secondServerCert.certFile, join(dir, "tls.crt.new"));
      copyFileSync(secondServerCert.keyFile, join(dir, "tls.key.new"));
      renameSync(join(dir, "tls.key.new"), join(dir, "tls.key"));
      renameSync(join(dir, "tls.crt.new"), join(dir, "tls.crt"));
      await eventually(async () => expect(await serialSeen()).to.equal(secondServerCert.serialNumber));
      expect(await reloads("success")).to.equal(1);
      // The connection opened before the rotation still carries calls.
      expect(await whoAmIOver(open)).to.equal(`worker-1/${client.serialNumber}`);
      expect(logLines.some((l) => l.includes("TLS certificate reloaded"))).to.equal(true);
    });

    it("keeps the certificate in use when the new pair does not check out, and takes the next good one", async () => {
      const errorsBefore = await reloads("error");
      // A key that is not the certificate's: half a rotation.
      copyFileSync(client.keyFile, join(dir, "tls.key"));
      await eventually(async () => expect(await reloads("error")).to.equal(errorsBefore + 1));
      expect(await serialSeen()).to.equal(secondServerCert.serialNumber);
      expect(logLines.some((l) => l.includes("cannot be used") && l.includes("KEY_MISMATCH"))).to.equal(true);
      // The other half arrives.
      copyFileSync(serverCert.keyFile, join(dir, "tls.key"));
      copyFileSync(serverCert.certFile, join(dir, "tls.crt"));
      await eventually(async () => expect(await serialSeen()).to.equal(serverCert.serialNumber));
    });

    it("takes a new client CA: clients of the new CA get in, those of the old one no longer do", async () => {
      const newClient = pki.issue(unknownCa, { cn: "worker-2", usage: "client" });
      expect((await handshakeOutcome(server.addr, caPem, newClient)).outcome).to.equal("closed");
      copyFileSync(unknownCa.certFile, join(dir, "ca.crt"));
      await eventually(async () => expect((await handshakeOutcome(server.addr, caPem, newClient)).outcome).to.equal("served"));
      expect((await handshakeOutcome(server.addr, caPem, client)).outcome).to.equal("closed");
    });

    it("reloads on what the files' stat says: an identical rewrite is no reload, a new pair is (the periodic check's step)", () => {
      const files = { certFile: join(pki.dir, "check.crt"), keyFile: join(pki.dir, "check.key"), caFile: "" };
      const fields = { certFile: "tls.certFile", keyFile: "tls.keyFile", caFile: "tls.clientCaFile" };
      copyFileSync(serverCert.certFile, files.certFile);
      copyFileSync(serverCert.keyFile, files.keyFile);
      const registry = new Registry();
      const applied: string[] = [];
      const stamp = filesStamp(files);
      const reloader = new TlsReloader(
        { files, fields, intervalMs: 0, apply: (m) => void applied.push(m.leaf!.serialNumber), logger: pino({ level: "silent" }), metrics: tlsMetrics(registry, "server") },
        loadTlsFiles(files, fields),
        stamp,
      );
      expect(reloader.check()).to.equal(false);
      copyFileSync(serverCert.certFile, files.certFile);
      expect(reloader.check()).to.equal(false);
      copyFileSync(secondServerCert.keyFile, files.keyFile);
      copyFileSync(secondServerCert.certFile, files.certFile);
      expect(reloader.check()).to.equal(true);
      expect(reloader.check()).to.equal(false);
      expect(applied).to.deep.equal([secondServerCert.serialNumber]);
    });

    it("follows a mounted Secret's link swap", async () => {
      // Kubernetes projects a Secret as links into a ..data link that is swapped at once.
      const secret = join(pki.dir, "secret");
      mkdirSync(join(secret, "..v1"), { recursive: true });
      copyFileSync(serverCert.certFile, join(secret, "..v1", "tls.crt"));
      copyFileSync(serverCert.keyFile, join(secret, "..v1", "tls.key"));
      symlinkSync("..v1", join(secret, "..data"));
      symlinkSync("..data/tls.crt", join(secret, "tls.crt"));
      symlinkSync("..data/tls.key", join(secret, "tls.key"));
      const mounted = await startServer({ config: { tls: { certFile: join(secret, "tls.crt"), keyFile: join(secret, "tls.key") } } });
      try {
        const seen = async () => (await handshakeOutcome(mounted.addr, caPem)).serverSerial;
        expect(await seen()).to.equal(serverCert.serialNumber);
        mkdirSync(join(secret, "..v2"));
        copyFileSync(secondServerCert.certFile, join(secret, "..v2", "tls.crt"));
        copyFileSync(secondServerCert.keyFile, join(secret, "..v2", "tls.key"));
        symlinkSync("..v2", join(secret, "..data_tmp"));
        renameSync(join(secret, "..data_tmp"), join(secret, "..data"));
        await eventually(async () => expect(await seen()).to.equal(secondServerCert.serialNumber));
      } finally {
        await mounted.close();
      }
    });
  });
  describe("a certificate as a caller (auth.certificates)", () => {
    let server: InProcessServer;
    before(async () => {
      server = await startServer({
        modules: [whoAmIModule],
        config: {
          tls: { certFile: serverCert.certFile, keyFile: serverCert.keyFile, clientCaFile: ca.certFile, clientAuth: "request" },
          auth: { certificates: [{ name: "worker-rule", subject: "CN=worker-1", scopes: ["mutating"] }] },
        },
      });
    });
    after(() => server?.close());

    /** AdminService over gRPC with a client certificate: connect's transport, and grpc-js's generic client. */
    const adminConnect = (who: TestCertificate) =>
      createClient(AdminService, createGrpcTransport({ baseUrl: `https://${server.addr}`, nodeOptions: { ca: caPem, servername: "", ...identity(who) } }));
    const adminGrpcJs = (who: TestCertificate, method: "GetConfig" | "SetServingStatus", body: Uint8Array): Promise<void> => {
      const { cert, key } = identity(who);
      const Client = grpc.makeGenericClientConstructor(
        {
          [method]: {
            path: `/mmgate.admin.v1.AdminService/${method}`,
            requestStream: false,
            responseStream: false,
            requestSerialize: (value: Uint8Array) => Buffer.from(value),
            requestDeserialize: (bytes: Buffer) => bytes,
            responseSerialize: (value: Uint8Array) => Buffer.from(value),
            responseDeserialize: (bytes: Buffer) => bytes,
          },
        },
        "AdminService",
      );
      const client = new Client(server.addr, grpc.credentials.createSsl(caPem, key ?? null, cert ?? null), { "grpc.ssl_target_name_override": "localhost" });
      return new Promise<void>((resolve, reject) => {
        (client as unknown as Record<string, (req: Uint8Array, cb: (err: grpc.ServiceError | null) => void) => void>)[method]!(body, (err) => {
          client.close();
          if (err) reject(err);
          else resolve();
        });
      });
    };

    it("a certificate mapped to mutating calls a mutating method and is refused an admin one, naming the rule (grpc-js and connect)", async () => {
      const serving = toBinary(SetServingStatusRequestSchema, create(SetServingStatusRequestSchema, { service: "", serving: true }));
      await adminGrpcJs(client, "SetServingStatus", serving);
      await adminConnect(client).setServingStatus({ service: "", serving: true });
      const refusedGrpcJs = await expectRejection<grpc.ServiceError>(adminGrpcJs(client, "GetConfig", toBinary(GetConfigRequestSchema, create(GetConfigRequestSchema))), {
        code: grpc.status.PERMISSION_DENIED,
      });
      expect(decodeURIComponent(refusedGrpcJs.details)).to.match(/worker-rule lacks scope admin for mmgate\.admin\.v1\.AdminService\/GetConfig/);
      await expectRejection(adminConnect(client).getConfig({}), { type: ConnectError, code: Code.PermissionDenied, message: /worker-rule lacks scope admin/ });
    });

    it("a verified certificate no rule names is anonymous: refused a mutating method, unauthenticated", async () => {
      const other = pki.issue(ca, { cn: "worker-2", usage: "client" });
      await expectRejection(adminConnect(other).setServingStatus({ service: "", serving: true }), { type: ConnectError, code: Code.Unauthenticated });
    });
  });
});
