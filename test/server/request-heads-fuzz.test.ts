/**
 * Nothing one request carries may reach the process's uncaught-exception
 * handler. A seeded fuzz over request heads (Host and `:authority`,
 * content-type, te, grpc-timeout, Origin, connect-protocol-version, method
 * and path) against a real `mmgate serve` process with CORS on, over
 * HTTP/1.1 (raw sockets, so that any head can be sent) and HTTP/2: every
 * request gets an answer (a status line, response headers or a reset), and
 * the process still serves at the end. `MMGATE_TEST_RPC_PATH=connect` runs
 * it with the lean path off. A failing seed is replayed with
 * `MMGATE_FUZZ_SEED=<seed>`.
 */
import * as http2 from "node:http2";
import { connect } from "node:net";
import { expect } from "chai";
import { splitHostPort } from "../../src/server/index.js";
import { grpcUnary, prng, startChildServer, type ChildServer } from "../support/index.js";
import { grpcFrame } from "../support/raw-h2.js";

const SEED = Number(process.env["MMGATE_FUZZ_SEED"] ?? 20261201);
const ROUNDS_PER_PROTOCOL = 150;
/** A request with no answer by then counts as unanswered (a hang). */
const ANSWER_WITHIN_MS = 5000;
const ALLOWED_ORIGIN = "https://app.example";

interface Head {
  method: string;
  path: string;
  headers: Record<string, string>;
  body: Buffer;
}

function heads(port: number): (random: () => number) => Head {
  const pick = <T>(random: () => number, values: readonly T[]): T => values[Math.floor(random() * values.length)]!;
  const authorities = [
    `127.0.0.1:${port}`,
    `localhost:${port}`,
    `[::1]:${port}`,
    "[",
    "]",
    "[::1",
    "::1",
    "",
    "a@b",
    "x:99999",
    "x:",
    "host:1:2",
    "attacker.example",
    `attacker.example:${port}`,
    "%",
    "%zz",
    "é.example",
    "a".repeat(4000),
    "[fe80::1%25eth0]:1",
    " 127.0.0.1",
  ];
  const contentTypes = [
    "application/grpc",
    "application/grpc+proto",
    "application/grpc+json",
    "application/grpc-web",
    "application/grpc-web+proto",
    "application/grpc-web-text",
    "application/json",
    "application/proto",
    "application/connect+proto",
    "application/connect+json",
    "application/grpc; charset=utf-8",
    "text/plain",
    "multipart/form-data; boundary=x",
    "",
    ";;;",
  ];
  const origins = [
    undefined,
    "null",
    ALLOWED_ORIGIN,
    `http://127.0.0.1:${port}`,
    `http://attacker.example:${port}`,
    "https://127.0.0.1",
    "[",
    "http://[",
    "",
    "javascript:alert(1)",
  ];
  const paths = [
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/mmgate.kvevents.v1.KvEventService/Publish",
    "/dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPool",
    "/dynamo.kvrelay.v1.KvEventRelay/ListKvPools",
    "/mmgate.admin.v1.AdminService/GetStatus",
    "/v1/images/generations",
    "/v1/models",
    "/v1/models/x",
    "/grpc.health.v1.Health/Check?x=[",
    "/",
    "/%",
    "//",
    "/nope/Nope",
    "*",
  ];
  const bodies = [Buffer.alloc(0), Buffer.from("{}"), grpcFrame(new Uint8Array(0)), Buffer.from([0, 0, 0, 0, 9, 1, 2]), Buffer.from("\u0000\u00ff{[")];
  return (random) => {
    const headers: Record<string, string> = {};
    headers["authority"] = pick(random, authorities);
    const contentType = pick(random, contentTypes);
    if (contentType !== "" || random() < 0.5) headers["content-type"] = contentType;
    if (random() < 0.5) headers["te"] = pick(random, ["trailers", "gzip", ""]);
    if (random() < 0.4) headers["grpc-timeout"] = pick(random, ["1S", "0m", "99999999H", "-1S", "abc", "1n", "", "100000000m"]);
    const origin = pick(random, origins);
    if (origin !== undefined) headers["origin"] = origin;
    if (random() < 0.3) headers["connect-protocol-version"] = pick(random, ["1", "2", "", "x"]);
    return {
      method: pick(random, ["POST", "POST", "POST", "GET", "OPTIONS", "PUT"]),
      path: pick(random, paths),
      headers,
      body: pick(random, bodies),
    };
  };
}

/** One HTTP/1.1 exchange on its own socket: resolves with the status line, or "" when the server closed without one. */
function http1Exchange(addr: string, head: Head): Promise<string> {
  const { host, port } = splitHostPort(addr);
  return new Promise((resolve, reject) => {
    const socket = connect(port, host);
    let received = "";
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`no answer within ${ANSWER_WITHIN_MS} ms`));
    }, ANSWER_WITHIN_MS);
    const finish = (line: string) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(line);
    };
    socket.on("data", (d: Buffer) => {
      received += d.toString("latin1");
      const end = received.indexOf("\r\n");
      if (end !== -1) finish(received.slice(0, end));
    });
    socket.on("error", () => finish(received));
    socket.on("close", () => finish(received));
    socket.once("connect", () => {
      const lines = [`${head.method} ${head.path} HTTP/1.1`];
      // "authority" is the Host header here; the empty string sends `Host:`.
      for (const [name, value] of Object.entries(head.headers)) lines.push(`${name === "authority" ? "host" : name}: ${value}`);
      lines.push(`content-length: ${head.body.length}`, "connection: close", "", "");
      socket.write(Buffer.concat([Buffer.from(lines.join("\r\n"), "latin1"), head.body]));
    });
  });
}

/** One HTTP/2 stream on `session`: resolves with `:status`, `reset <code>`, or `refused by the client` when Node's client would not send the head. */
function http2Exchange(session: http2.ClientHttp2Session, head: Head): Promise<string> {
  const headers: http2.OutgoingHttpHeaders = { ":method": head.method, ":path": head.path };
  for (const [name, value] of Object.entries(head.headers)) headers[name === "authority" ? ":authority" : name] = value;
  let stream: http2.ClientHttp2Stream;
  try {
    stream = session.request(headers, { endStream: false });
  } catch {
    return Promise.resolve("refused by the client");
  }
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      stream.close(http2.constants.NGHTTP2_CANCEL);
      reject(new Error(`no answer within ${ANSWER_WITHIN_MS} ms`));
    }, ANSWER_WITHIN_MS);
    const finish = (outcome: string) => {
      clearTimeout(timer);
      if (!stream.destroyed) stream.close(http2.constants.NGHTTP2_CANCEL);
      resolve(outcome);
    };
    stream.on("response", (h) => finish(String(h[":status"])));
    // Read what comes, or the stream never closes on this side.
    stream.resume();
    stream.on("error", () => finish(`reset ${stream.rstCode ?? "?"}`));
    stream.on("close", () => finish(`reset ${stream.rstCode ?? "?"}`));
    stream.end(head.body);
  });
}

// With the default allow-list (loopback names) most odd hosts are refused
// up front; with "*" every well-formed one reaches the handlers.
for (const allowedHosts of ["", "*"]) describe(`request heads fuzz (server.allowedHosts=${JSON.stringify(allowedHosts)}): every request is answered, the process lives on`, function () {
  this.timeout(120_000);
  let server: ChildServer;

  before(async () => {
    server = await startChildServer(["--log-level", "info"], {
      MMGATE_CORS__ALLOWED_ORIGINS: ALLOWED_ORIGIN,
      ...(allowedHosts === "" ? {} : { MMGATE_SERVER__ALLOWED_HOSTS: allowedHosts }),
    });
  });
  after(async () => {
    await server?.close();
  });

  /** The process is up, serves a call, and logged no uncaught exception and no error (a request the host's boundary had to catch). */
  async function expectAlive(): Promise<void> {
    const reply = await grpcUnary(server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health"), "check", {});
    expect(reply["status"]).to.equal("SERVING");
    expect(server.process.exitCode, "the server process exited").to.equal(null);
    const failures = server.stdout.filter((line) => line.includes("uncaught") || /"level":(50|60)/.test(line));
    expect(failures, "errors logged").to.deep.equal([]);
  }

  it(`answers ${ROUNDS_PER_PROTOCOL} random HTTP/1.1 heads (seed ${SEED})`, async () => {
    const random = prng(SEED);
    const next = heads(splitHostPort(server.addr).port);
    const outcomes = new Map<string, number>();
    for (let i = 0; i < ROUNDS_PER_PROTOCOL; i++) {
      const head = next(random);
      const line = await http1Exchange(server.addr, head).catch((err: Error) => {
        throw new Error(`request ${i} ${JSON.stringify(head)}: ${err.message}`);
      });
      // A closed connection without a status line is no answer, unless Node's parser refused the head outright.
      expect(line, `request ${i} ${JSON.stringify({ ...head, body: head.body.length })}`).to.match(/^HTTP\/1\.[01] \d{3}/);
      const status = line.split(" ")[1]!;
      outcomes.set(status, (outcomes.get(status) ?? 0) + 1);
    }
    // The fuzz reached the host's own refusals, not only Node's parser.
    expect(outcomes.get("400") ?? 0).to.be.greaterThan(0);
    if (allowedHosts === "") expect(outcomes.get("403") ?? 0).to.be.greaterThan(0);
    await expectAlive();
  });

  it(`answers ${ROUNDS_PER_PROTOCOL} random HTTP/2 heads on one connection at a time (seed ${SEED + 1})`, async () => {
    const random = prng(SEED + 1);
    const next = heads(splitHostPort(server.addr).port);
    let session = http2.connect(`http://${server.addr}`);
    session.on("error", () => undefined);
    const outcomes = new Map<string, number>();
    for (let i = 0; i < ROUNDS_PER_PROTOCOL; i++) {
      // A session the server (or Node's client) gave up on is replaced; the next request must still be answered.
      if (session.closed || session.destroyed) {
        session = http2.connect(`http://${server.addr}`);
        session.on("error", () => undefined);
      }
      const head = next(random);
      const outcome = await http2Exchange(session, head).catch((err: Error) => {
        throw new Error(`request ${i} ${JSON.stringify({ ...head, body: head.body.length })}: ${err.message}`);
      });
      outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
    }
    session.destroy();
    expect([...outcomes.keys()].some((k) => /^\d{3}$/.test(k)), JSON.stringify([...outcomes])).to.equal(true);
    await expectAlive();
  });
});
