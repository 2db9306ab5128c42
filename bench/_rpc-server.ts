/**
 * One server under test for bench/rpc.ts, alone in its process:
 *
 *   node --import tsx bench/_rpc-server.ts <kind> <repeat messages> <stream message bytes>
 *
 * Kinds:
 * - host: mmgate's host with its default config (rpc.leanPath on);
 * - host-connect: the same host with rpc.leanPath off, every call through
 *   connect-node's handler;
 * - host-traced: the host with tracing on, every call sampled, its spans
 *   exported over OTLP/HTTP (protobuf) to BENCH_OTLP_ENDPOINT (the bench's
 *   sink, which discards them);
 * - host-shim: the host's services and interceptors (its in-process routes,
 *   ctx.localRoutes) behind connect's universal handlers, fed each
 *   ServerHttp2Stream directly by a thin shim (bench/_universal-shim.ts)
 *   on a listener of its own: connect's per-call pipeline without Node's
 *   HTTP/2 compatibility objects. No RPC observer (no per-call record,
 *   log line or metrics of the host's), which favours it;
 * - connect: bare connect-node (connectNodeAdapter + http2.createServer);
 * - grpc-js: a bare @grpc/grpc-js server;
 * - http2: a bare node:http2 server answering with precomputed bytes, the
 *   floor under any RPC layer.
 *
 * Every kind serves the same methods:
 * - grpc.health.v1.Health/Check, answering SERVING;
 * - mmgate.bench.v1.BenchRpc/Repeat: takes a HealthCheckRequest and sends
 *   <repeat messages> HealthCheckResponse(SERVING) messages, then OK;
 * - mmgate.bench.v1.BenchRpc/Echo: answers the google.protobuf.BytesValue it
 *   got;
 * - mmgate.bench.v1.BenchRpc/Stream: takes a google.protobuf.UInt32Value N
 *   and sends N BytesValue messages of <stream message bytes> each, then OK.
 *   The payload is allocated once per server, so what a call costs is the
 *   RPC layer's: encoding, framing, flow control.
 *
 * Why bench-only methods: Health/Watch never ends on its own, so a client
 * would have to cancel it, and that measures stream setup plus an
 * RST_STREAM rather than streaming. The service is declared in code
 * (bench/_bench-rpc.ts) and reaches the host as an ordinary module, which
 * puts it behind every host layer a real module's method goes through.
 *
 * The host, connect-node and grpc-js encode and decode with the same
 * @bufbuild/protobuf descriptors (grpc-js through serializers built from
 * them), so the bytes on the wire are the same and the codec costs the same
 * everywhere: what differs is the RPC layer. The two bare node:http2 servers
 * get the host's default HTTP/2 settings (stream window 4 MiB, connection
 * window 16 MiB, session memory 64 MB) for the same reason; grpc-js has no
 * option for its windows and keeps Node's defaults (64 KiB).
 *
 * Prints one JSON line, {"address":"127.0.0.1:PORT"}, once it listens, and
 * exits when its stdin closes (the parent bench went away).
 */
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import type { DescService, Message } from "@bufbuild/protobuf";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { BytesValue, UInt32Value } from "@bufbuild/protobuf/wkt";
import { BytesValueSchema, UInt32ValueSchema } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { createConnectRouter } from "@connectrpc/connect";
import type { UniversalHandler } from "@connectrpc/connect/protocol";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import { pino } from "pino";
import { z } from "zod";
import type { HealthCheckResponse } from "../gen/grpc/health/v1/health_pb.js";
import {
  Health,
  HealthCheckResponse_ServingStatus,
  HealthCheckResponseSchema,
} from "../gen/grpc/health/v1/health_pb.js";
import type { LocalRoutes } from "../src/server/index.js";
import { BenchRpc } from "./_bench-rpc.js";
import { universalShim } from "./_universal-shim.js";
import { frame, writable } from "./_wire.js";


const path = (service: DescService, method: string) => `/${service.typeName}/${method}`;
const CHECK_PATH = path(Health, "Check");
const REPEAT_PATH = path(BenchRpc, "Repeat");
const ECHO_PATH = path(BenchRpc, "Echo");
const STREAM_PATH = path(BenchRpc, "Stream");

/** What every server answers, built once: the handlers only hand them out. */
interface Replies {
  serving: HealthCheckResponse;
  /** One Stream message, its payload allocated once. */
  chunk: BytesValue;
  repeat: number;
}

function replies(repeat: number, streamBytes: number): Replies {
  return {
    serving: create(HealthCheckResponseSchema, { status: HealthCheckResponse_ServingStatus.SERVING }),
    chunk: create(BytesValueSchema, { value: new Uint8Array(streamBytes) }),
    repeat,
  };
}

/**
 * The connect-node implementation of BenchRpc, shared by the host and bare
 * connect-node. The descriptor is built at run time, so its methods are
 * untyped: the cast stands in for the generated type.
 */
function benchImpl(r: Replies): Partial<ServiceImpl<typeof BenchRpc>> {
  const impl = {
    async *repeat() {
      for (let i = 0; i < r.repeat; i++) yield r.serving;
    },
    echo: (req: BytesValue) => req,
    async *stream(req: UInt32Value) {
      for (let i = 0; i < req.value; i++) yield r.chunk;
    },
  };
  return impl as unknown as Partial<ServiceImpl<typeof BenchRpc>>;
}


async function mmgateHost(r: Replies, leanPath: boolean, traced = false): Promise<string> {
  // Loaded here so the bare servers' processes hold no mmgate code.
  const { bindService, defineModule, resolveConfig, startHost } = await import("../src/server/index.js");
  if (traced) {
    // As `mmgate serve` does it: the SDK first, then the host (which looks once whether tracing is on).
    const { resolveTracingSettings, startTracing } = await import("../src/telemetry/index.js");
    const endpoint = process.env["BENCH_OTLP_ENDPOINT"];
    if (endpoint === undefined) throw new Error("host-traced needs BENCH_OTLP_ENDPOINT");
    const settings = resolveTracingSettings({ enabled: true, endpoint, protocol: "http/protobuf", serviceName: "bench", sampleRatio: 1 }, {});
    await startTracing(settings, { logger: pino({ level: "silent" }), version: "bench" });
  }
  const benchModule = defineModule({
    name: "bench",
    description: "bench-only methods",
    configSchema: z.object({}),
    create: () => ({ services: [bindService(BenchRpc, benchImpl(r))] }),
  });
  const config = resolveConfig(
    { listen: "127.0.0.1:0", adminListen: "", modules: ["bench"], rpc: { leanPath } },
    [benchModule],
  );
  const streamed = toBinary(BytesValueSchema, r.chunk).length;
  if (streamed > config.limits.maxSendMessageBytes) {
    throw new Error(`a Stream message of ${streamed} bytes is over the host's limits.maxSendMessageBytes (${config.limits.maxSendMessageBytes})`);
  }
  const host = await startHost({ config, modules: [benchModule], logger: pino({ level: "silent" }), version: "bench" });
  return host.address;
}

/**
 * The host's services and interceptors on connect's universal handlers,
 * reached through the thin shim rather than the host's listener: the host
 * runs (its own listener idle), and a second node:http2 server with the
 * host's HTTP/2 settings serves its routes, which a module reads from
 * ctx.localRoutes once they are live.
 */
async function hostShim(r: Replies): Promise<string> {
  const { bindService, defineModule, resolveConfig, startHost } = await import("../src/server/index.js");
  let local: LocalRoutes | undefined;
  const benchModule = defineModule({
    name: "bench",
    description: "bench-only methods",
    configSchema: z.object({}),
    create: (ctx) => ({
      services: [bindService(BenchRpc, benchImpl(r))],
      start: () => {
        local = ctx.localRoutes;
      },
    }),
  });
  const config = resolveConfig({ listen: "127.0.0.1:0", adminListen: "", modules: ["bench"] }, [benchModule]);
  await startHost({ config, modules: [benchModule], logger: pino({ level: "silent" }), version: "bench" });
  if (local === undefined) throw new Error("the bench module did not start");
  // As the host's adapter has them: its limits and JSON options, no response compression.
  const router = createConnectRouter({
    interceptors: local.interceptors(),
    readMaxBytes: local.readMaxBytes,
    writeMaxBytes: local.writeMaxBytes,
    compressMinBytes: Number.MAX_SAFE_INTEGER,
  });
  local.routes(router);
  const handlers = new Map<string, UniversalHandler>(router.handlers.map((h) => [h.requestPath, h]));
  const server = http2.createServer(HOST_HTTP2);
  server.on("stream", universalShim(handlers));
  return listen(server);
}

/** The host's default HTTP/2 settings, for the bare node:http2 servers. */
const HOST_HTTP2 = { settings: { initialWindowSize: 4 * 1024 * 1024 }, maxSessionMemory: 64 };
const HOST_CONNECTION_WINDOW = 16 * 1024 * 1024;

async function listen(server: http2.Http2Server): Promise<string> {
  server.on("session", (session) =>
    session.once("localSettings", () => {
      try {
        session.setLocalWindowSize(HOST_CONNECTION_WINDOW);
      } catch {
        /* the session closed already */
      }
    }),
  );
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `127.0.0.1:${(server.address() as AddressInfo).port}`;
}

function bareConnect(r: Replies): Promise<string> {
  const handler = connectNodeAdapter({
    routes: (router) => {
      router.service(Health, { check: () => r.serving });
      router.service(BenchRpc, benchImpl(r));
    },
  });
  return listen(http2.createServer(HOST_HTTP2, handler));
}

/** A grpc-js service definition whose (de)serializers are the @bufbuild/protobuf ones the other servers use. */
function grpcService(service: DescService): grpc.ServiceDefinition {
  const buffer = (bytes: Uint8Array) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return Object.fromEntries(
    service.methods.map((m): [string, grpc.MethodDefinition<Message, Message>] => [
      m.name,
      {
        path: path(service, m.name),
        requestStream: false,
        responseStream: m.methodKind === "server_streaming",
        requestSerialize: (msg) => buffer(toBinary(m.input, msg)),
        requestDeserialize: (bytes) => fromBinary(m.input, bytes),
        responseSerialize: (msg) => buffer(toBinary(m.output, msg)),
        responseDeserialize: (bytes) => fromBinary(m.output, bytes),
      },
    ]),
  );
}

async function bareGrpcJs(r: Replies): Promise<string> {
  const server = new grpc.Server();
  server.addService(grpcService(Health), {
    Check: (_call: unknown, cb: grpc.sendUnaryData<Message>) => cb(null, r.serving),
  });
  server.addService(grpcService(BenchRpc), {
    Repeat: (call: grpc.ServerWritableStream<Message, Message>) => {
      for (let i = 0; i < r.repeat; i++) call.write(r.serving);
      call.end();
    },
    Echo: (call: grpc.ServerUnaryCall<BytesValue, BytesValue>, cb: grpc.sendUnaryData<BytesValue>) => cb(null, call.request),
    Stream: async (call: grpc.ServerWritableStream<UInt32Value, BytesValue>) => {
      for (let i = 0; i < call.request.value && !call.cancelled; i++) {
        if (!call.write(r.chunk)) await writable(call, "cancelled");
      }
      call.end();
    },
  });
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  return `127.0.0.1:${port}`;
}


/**
 * The floor: gRPC over node:http2 with nothing between the stream and the
 * bytes. Each call's request body is read to its end, then the answer goes
 * out as precomputed frames (Echo writes back the frame it got: request and
 * response are both a BytesValue), with the status in trailers.
 */
function bareHttp2(r: Replies): Promise<string> {
  const servingFrame = frame(toBinary(HealthCheckResponseSchema, r.serving));
  const repeatFrames = Buffer.concat(Array.from({ length: r.repeat }, () => servingFrame));
  const chunkFrame = frame(toBinary(BytesValueSchema, r.chunk));
  const server = http2.createServer(HOST_HTTP2);
  server.on("stream", (stream, headers) => {
    const body: Buffer[] = [];
    stream.on("data", (chunk: Buffer) => body.push(chunk));
    // A client that resets its stream is no concern of the floor's.
    stream.on("error", () => undefined);
    stream.on("end", () => {
      if (stream.destroyed) return;
      const p = headers[":path"];
      if (p !== CHECK_PATH && p !== REPEAT_PATH && p !== ECHO_PATH && p !== STREAM_PATH) {
        stream.respond({ ":status": 200, "content-type": "application/grpc+proto", "grpc-status": "12" }, { endStream: true });
        return;
      }
      stream.respond({ ":status": 200, "content-type": "application/grpc+proto" }, { waitForTrailers: true });
      stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
      if (p === CHECK_PATH) stream.end(servingFrame);
      else if (p === REPEAT_PATH) stream.end(repeatFrames);
      else if (p === ECHO_PATH) stream.end(Buffer.concat(body));
      else void streamChunks(stream, fromBinary(UInt32ValueSchema, Buffer.concat(body).subarray(5)).value, chunkFrame);
    });
  });
  return listen(server);
}

async function streamChunks(stream: http2.ServerHttp2Stream, count: number, chunkFrame: Buffer): Promise<void> {
  for (let i = 0; i < count && !stream.destroyed; i++) {
    if (!stream.write(chunkFrame)) await writable(stream, "close");
  }
  stream.end();
}

const starts: Record<string, (r: Replies) => Promise<string>> = {
  host: (r) => mmgateHost(r, true),
  "host-connect": (r) => mmgateHost(r, false),
  "host-traced": (r) => mmgateHost(r, true, true),
  "host-shim": hostShim,
  connect: bareConnect,
  "grpc-js": bareGrpcJs,
  http2: bareHttp2,
};

const [kind, repeatArg, bytesArg] = process.argv.slice(2);
const repeat = Number(repeatArg);
const streamBytes = Number(bytesArg);
const start = starts[kind ?? ""];
if (!start || !(Number.isInteger(repeat) && repeat > 0) || !(Number.isInteger(streamBytes) && streamBytes >= 0)) {
  process.stderr.write(`usage: _rpc-server.ts <${Object.keys(starts).join("|")}> <repeat messages> <stream message bytes>\n`);
  process.exit(2);
}
const address = await start(replies(repeat, streamBytes));
process.stdout.write(`${JSON.stringify({ address })}\n`);
process.stdin.resume();
process.stdin.on("end", () => process.exit(0));
