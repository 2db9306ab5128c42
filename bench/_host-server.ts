/**
 * One server under test for bench/host.ts, alone in its process:
 *
 *   node --import tsx bench/_host-server.ts <host|connect|grpc-js> <stream messages>
 *
 * Every kind serves the same two methods:
 * - grpc.health.v1.Health/Check, answering SERVING;
 * - mmgate.bench.v1.BenchStream/Repeat, a bench-only server-streaming method
 *   that takes a HealthCheckRequest and sends <stream messages>
 *   HealthCheckResponse(SERVING) messages, then ends with OK.
 *
 * Why a bench-only method: Health/Watch never ends on its own, so a client
 * would have to cancel it, and that measures stream setup plus an
 * RST_STREAM rather than streaming. The bench method is declared in code
 * (a FileDescriptorProto over the health messages, so there is no .proto
 * file to generate) and reaches the host as an ordinary module, which puts
 * it behind every host layer a real module's method goes through.
 *
 * Prints one JSON line, {"address":"127.0.0.1:PORT"}, once it listens, and
 * exits when its stdin closes (the parent bench went away).
 */
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create, createFileRegistry } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { pino } from "pino";
import { z } from "zod";
import { file_grpc_health_v1_health, Health, HealthCheckResponse_ServingStatus } from "../gen/grpc/health/v1/health_pb.js";

const STREAM_PATH = "/mmgate.bench.v1.BenchStream/Repeat";

const benchFile = create(FileDescriptorProtoSchema, {
  name: "mmgate/bench/v1/bench_stream.proto",
  package: "mmgate.bench.v1",
  dependency: ["grpc/health/v1/health.proto"],
  syntax: "proto3",
  service: [
    {
      name: "BenchStream",
      method: [
        {
          name: "Repeat",
          inputType: ".grpc.health.v1.HealthCheckRequest",
          outputType: ".grpc.health.v1.HealthCheckResponse",
          serverStreaming: true,
        },
      ],
    },
  ],
});
const BenchStream = createFileRegistry(benchFile, (name) =>
  name === file_grpc_health_v1_health.proto.name ? file_grpc_health_v1_health : undefined,
).getService("mmgate.bench.v1.BenchStream")!;

const SERVING = HealthCheckResponse_ServingStatus.SERVING;

/**
 * The connect-node implementation of BenchStream, shared by the host and bare
 * connect-node. The descriptor is built at run time, so its methods are
 * untyped: the cast stands in for the generated type.
 */
function repeatImpl(messages: number): Partial<ServiceImpl<typeof BenchStream>> {
  const impl = {
    async *repeat() {
      for (let i = 0; i < messages; i++) yield { status: SERVING };
    },
  };
  return impl as unknown as Partial<ServiceImpl<typeof BenchStream>>;
}

async function mmgateHost(messages: number): Promise<string> {
  // Loaded here so the bare servers' processes hold no mmgate code.
  const { bindService, defineModule, resolveConfig, startHost } = await import("../src/server/index.js");
  const benchModule = defineModule({
    name: "bench",
    description: "bench-only server-streaming method",
    configSchema: z.object({}),
    create: () => ({ services: [bindService(BenchStream, repeatImpl(messages))] }),
  });
  const config = resolveConfig({ listen: "127.0.0.1:0", adminListen: "", modules: ["bench"] }, [benchModule]);
  const host = await startHost({ config, modules: [benchModule], logger: pino({ level: "silent" }), version: "bench" });
  return host.address;
}

async function bareConnect(messages: number): Promise<string> {
  const handler = connectNodeAdapter({
    routes: (r) => {
      r.service(Health, { check: () => ({ status: SERVING }) });
      r.service(BenchStream, repeatImpl(messages));
    },
  });
  const server = http2.createServer(handler);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return `127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function bareGrpcJs(messages: number): Promise<string> {
  const protoRoot = new URL("../proto", import.meta.url).pathname;
  const definition = grpc.loadPackageDefinition(protoLoader.loadSync("grpc/health/v1/health.proto", { includeDirs: [protoRoot] }));
  const HealthClient = (definition.grpc as Record<string, Record<string, Record<string, grpc.ServiceClientConstructor>>>).health!.v1!.Health!;
  const check = HealthClient.service.Check!;
  const server = new grpc.Server();
  server.addService(HealthClient.service, {
    Check: (_call: unknown, cb: grpc.sendUnaryData<unknown>) => cb(null, { status: "SERVING" }),
  });
  server.addService(
    { Repeat: { ...check, path: STREAM_PATH, originalName: "repeat", responseStream: true } },
    {
      Repeat: (call: grpc.ServerWritableStream<unknown, unknown>) => {
        for (let i = 0; i < messages; i++) call.write({ status: "SERVING" });
        call.end();
      },
    },
  );
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  return `127.0.0.1:${port}`;
}

const [kind, messagesArg] = process.argv.slice(2);
const messages = Number(messagesArg ?? 16);
const start = { host: mmgateHost, connect: bareConnect, "grpc-js": bareGrpcJs }[kind ?? ""];
if (!start || !(Number.isInteger(messages) && messages > 0)) {
  process.stderr.write("usage: _host-server.ts <host|connect|grpc-js> <stream messages>\n");
  process.exit(2);
}
const address = await start(messages);
process.stdout.write(`${JSON.stringify({ address })}\n`);
process.stdin.resume();
process.stdin.on("end", () => process.exit(0));
