import * as http2 from "node:http2";
import { connect } from "node:net";
import type { Socket } from "node:net";
import { connect as tlsConnect } from "node:tls";
import { expect } from "chai";
import { ConfigError, resolveConfig } from "../../src/server/index.js";
import type { InProcessServer } from "../support/index.js";
import { eventually, metricValue, selfSignedCertificate, startServer } from "../support/index.js";

/** A gRPC message frame holding an empty HealthCheckRequest (service ""). */
const EMPTY_REQUEST = Buffer.from([0, 0, 0, 0, 0]);
const PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");
/** An empty SETTINGS frame: length 0, type 4, no flags, stream 0. */
const EMPTY_SETTINGS = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]);


function grpcHeaders(method: "Check" | "Watch"): http2.OutgoingHttpHeaders {
  return {
    ":method": "POST",
    ":path": `/grpc.health.v1.Health/${method}`,
    "content-type": "application/grpc",
    te: "trailers",
  };
}

interface Client {
  readonly session: http2.ClientHttp2Session;
  /** Error codes of the GOAWAY frames received. */
  readonly goaways: number[];
  /** PINGs received from the server. */
  pings: number;
  closed: boolean;
}

interface RawSocket {
  readonly socket: Socket;
  readonly received: Buffer[];
  closed: boolean;
}

describe("connection limits of the HTTP/2 listener and the admin listener", function () {
  this.timeout(20_000);
  let server: InProcessServer | undefined;
  const clients: Client[] = [];
  const sockets: RawSocket[] = [];

  afterEach(async () => {
    for (const c of clients.splice(0)) c.session.destroy();
    for (const s of sockets.splice(0)) s.socket.destroy();
    await server?.close();
    server = undefined;
  });

  const start = (config: Record<string, unknown>) =>
    startServer({ config: { shutdown: { graceMs: 200 }, ...config } }).then((s) => (server = s));

  function h2(addr: string): Client {
    const session = http2.connect(`http://${addr}`);
    const client: Client = { session, goaways: [], pings: 0, closed: false };
    session.on("goaway", (code) => client.goaways.push(code));
    session.on("ping", () => (client.pings += 1));
    session.on("error", () => undefined);
    session.on("close", () => (client.closed = true));
    clients.push(client);
    return client;
  }

  function raw(addr: string): Promise<RawSocket> {
    const [host, port] = [addr.slice(0, addr.lastIndexOf(":")), Number(addr.slice(addr.lastIndexOf(":") + 1))];
    const socket = connect(port, host);
    const entry: RawSocket = { socket, received: [], closed: false };
    socket.on("data", (chunk: Buffer) => entry.received.push(chunk));
    socket.on("error", () => undefined);
    socket.on("close", () => (entry.closed = true));
    sockets.push(entry);
    return new Promise((resolve, reject) => {
      socket.once("connect", () => resolve(entry));
      socket.once("error", reject);
    });
  }

  /** A unary Health/Check over the session; resolves with its grpc-status. */
  function check(client: Client): Promise<string> {
    return new Promise((resolve, reject) => {
      const stream = client.session.request(grpcHeaders("Check"));
      let status = "";
      stream.on("trailers", (trailers) => (status = String(trailers["grpc-status"])));
      stream.on("data", () => undefined);
      stream.on("error", reject);
      stream.on("close", () => (status ? resolve(status) : reject(new Error(`stream closed without a status (${stream.rstCode})`))));
      stream.end(EMPTY_REQUEST);
    });
  }

  /** Sends a PING once the session is connected and resolves on its ack. */
  async function ping(client: Client): Promise<void> {
    if (client.session.connecting) await new Promise((resolve) => client.session.once("connect", resolve));
    return new Promise((resolve, reject) => {
      client.session.ping((err) => (err ? reject(err) : resolve()));
    });
  }

  async function closedBy(reason: string): Promise<number> {
    return metricValue(server!.host.metrics.registry, "mmgate_connections_closed_total", { reason });
  }

  /** The frame types and flags in the bytes a raw socket received after the preface. */
  function frames(bytes: Buffer): { type: number; flags: number }[] {
    const out: { type: number; flags: number }[] = [];
    for (let at = 0; at + 9 <= bytes.length; ) {
      const length = bytes.readUIntBE(at, 3);
      out.push({ type: bytes[at + 3]!, flags: bytes[at + 4]! });
      at += 9 + length;
    }
    return out;
  }

  it("closes a session idle for idleTimeoutMs with GOAWAY, and never one with an open stream", async () => {
    await start({ connections: { idleTimeoutMs: 300 } });
    const busy = h2(server!.addr);
    const watch = busy.session.request(grpcHeaders("Watch"));
    watch.on("error", () => undefined);
    const firstStatus = new Promise((resolve) => watch.once("data", resolve));
    watch.end(EMPTY_REQUEST);
    await firstStatus;

    // Opened after the Watch: its idle limit runs out after the busy session's would have.
    const idle = h2(server!.addr);
    await eventually(() => expect(idle.goaways).to.include(http2.constants.NGHTTP2_NO_ERROR));
    expect(idle.goaways.every((code) => code === http2.constants.NGHTTP2_NO_ERROR)).to.equal(true);
    await eventually(() => expect(idle.closed).to.equal(true));

    // The busy session was left alone: a new call on it still works.
    expect(await check(busy)).to.equal("0");
    expect(busy.goaways).to.deep.equal([]);
    expect(busy.closed).to.equal(false);

    // Once its last stream closes, it is idle too.
    watch.close(http2.constants.NGHTTP2_CANCEL);
    await eventually(() => expect(busy.goaways).to.include(http2.constants.NGHTTP2_NO_ERROR));
    expect(busy.goaways.every((code) => code === http2.constants.NGHTTP2_NO_ERROR)).to.equal(true);
    await eventually(() => expect(busy.closed).to.equal(true));
    expect(await closedBy("idle")).to.equal(2);
  });

  it("destroys a connection that sends no HTTP/2 preface within handshakeTimeoutMs", async () => {
    await start({ connections: { handshakeTimeoutMs: 300 } });
    const client = h2(server!.addr);
    expect(await check(client)).to.equal("0");
    const silent = await raw(server!.addr);
    await eventually(() => expect(silent.closed).to.equal(true));
    expect(await closedBy("handshake_timeout")).to.equal(1);
    // A connection that did its handshake is not affected.
    expect(await check(client)).to.equal("0");
    expect(client.closed).to.equal(false);
  });

  it("with TLS, destroys connections that stall in the TLS handshake or before the HTTP/2 preface", async () => {
    await start({ tls: selfSignedCertificate(), connections: { handshakeTimeoutMs: 300 } });
    // TCP only: no ClientHello.
    const silent = await raw(server!.addr);
    // TLS done (ALPN h2), then no preface.
    const { port } = new URL(`https://${server!.addr}`);
    const secure = tlsConnect({ host: "127.0.0.1", port: Number(port), ALPNProtocols: ["h2"], rejectUnauthorized: false });
    let secureClosed = false;
    secure.on("error", () => undefined);
    secure.resume();
    secure.on("close", () => (secureClosed = true));
    sockets.push({ socket: secure, received: [], closed: false });
    await new Promise((resolve) => secure.once("secureConnect", resolve));
    expect(secure.alpnProtocol).to.equal("h2");
    await eventually(() => expect(silent.closed).to.equal(true));
    await eventually(() => expect(secureClosed).to.equal(true));
    expect(await closedBy("handshake_timeout")).to.equal(2);
  });

  it("answers a client that pings faster than minPingIntervalMs with GOAWAY ENHANCE_YOUR_CALM", async () => {
    await start({ connections: { minPingIntervalMs: 60_000 } });
    const polite = h2(server!.addr);
    // Two strikes in a row are allowed, and a new stream clears them.
    for (let round = 0; round < 2; round++) {
      for (let i = 0; i < 3; i++) await ping(polite);
      expect(await check(polite)).to.equal("0");
    }
    expect(polite.goaways).to.deep.equal([]);

    const abusive = h2(server!.addr);
    for (let i = 0; i < 4; i++) await ping(abusive).catch(() => undefined);
    await eventually(() => expect(abusive.goaways).to.include(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM));
    expect(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM).to.equal(11);
    await eventually(() => expect(abusive.closed).to.equal(true));
    expect(await closedBy("ping_abuse")).to.equal(1);
    expect(polite.closed).to.equal(false);
  });

  it("pings a silent session after keepaliveTimeMs and destroys it when no ack comes", async () => {
    await start({ connections: { keepaliveTimeMs: 200, keepaliveTimeoutMs: 300 } });
    // A peer that completes the preface by hand and then never answers anything.
    const mute = await raw(server!.addr);
    mute.socket.write(Buffer.concat([PREFACE, EMPTY_SETTINGS]));
    await eventually(() => expect(mute.closed).to.equal(true));
    const received = frames(Buffer.concat(mute.received));
    expect(received.some((f) => f.type === 6 && (f.flags & 1) === 0), "a PING without the ACK flag").to.equal(true);
    expect(await closedBy("keepalive_timeout")).to.equal(1);
  });

  it("keeps a session whose peer acks the keepalive PINGs", async () => {
    await start({ connections: { keepaliveTimeMs: 100, keepaliveTimeoutMs: 2000 } });
    const client = h2(server!.addr);
    expect(await check(client)).to.equal("0");
    await eventually(() => expect(client.pings).to.be.at.least(3));
    expect(client.closed).to.equal(false);
    expect(await check(client)).to.equal("0");
    expect(await closedBy("keepalive_timeout")).to.equal(0);
  });

  it("closes a connection over maxConnections at once", async () => {
    await start({ connections: { maxConnections: 2 } });
    const first = await raw(server!.addr);
    const second = await raw(server!.addr);
    const third = await raw(server!.addr);
    await eventually(() => expect(third.closed).to.equal(true));
    expect(await closedBy("over_limit")).to.equal(1);
    expect(first.closed).to.equal(false);
    expect(second.closed).to.equal(false);
    // A freed place is taken again.
    first.socket.destroy();
    await eventually(async () => {
      const client = h2(server!.addr);
      expect(await check(client)).to.equal("0");
    });
  });

  it("cuts an admin client that sends part of its headers and then nothing", async () => {
    await start({ admin: { headersTimeoutMs: 200, requestTimeoutMs: 1000 } });
    const dripping = await raw(server!.adminAddr);
    dripping.socket.write("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    await eventually(() => expect(dripping.closed).to.equal(true));
    expect(Buffer.concat(dripping.received).toString("latin1")).to.match(/^HTTP\/1\.1 408 /);
    // A complete request is still answered.
    const response = await fetch(`http://${server!.adminAddr}/healthz`);
    expect(response.status).to.equal(200);
  });

  it("has documented defaults and refuses an admin headers limit over the request limit", () => {
    const config = resolveConfig({}, []);
    expect(config.connections).to.deep.equal({
      idleTimeoutMs: 300_000,
      keepaliveTimeMs: 7_200_000,
      keepaliveTimeoutMs: 20_000,
      minPingIntervalMs: 10_000,
      maxPingStrikes: 2,
      handshakeTimeoutMs: 10_000,
      maxConnections: 0,
    });
    expect(config.admin).to.deep.equal({ headersTimeoutMs: 10_000, requestTimeoutMs: 30_000, keepAliveTimeoutMs: 5_000 });
    expect(() => resolveConfig({ admin: { headersTimeoutMs: 5000, requestTimeoutMs: 1000 } }, [])).to.throw(
      ConfigError,
      /admin: admin.headersTimeoutMs must not exceed admin.requestTimeoutMs/,
    );
  });
});
