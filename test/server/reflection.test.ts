import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { fromBinary } from "@bufbuild/protobuf";
import type { FileDescriptorProto } from "@bufbuild/protobuf/wkt";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import type * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import { ServerReflection } from "../../gen/grpc/reflection/v1/reflection_pb.js";
import type { GrpcClient, InProcessServer } from "../support/server.js";
import { repoRoot, startServer } from "../support/server.js";

const run = promisify(execFile);

interface ReflectionResponse {
  validHost: string;
  originalRequest: Record<string, unknown>;
  messageResponse: string;
  fileDescriptorResponse?: { fileDescriptorProto: Buffer[] };
  listServicesResponse?: { service: { name: string }[] };
  allExtensionNumbersResponse?: { baseTypeName: string; extensionNumber: number[] };
  errorResponse?: { errorCode: number; errorMessage: string };
}

/** Sends every request on one bidi stream and collects the answers in order. */
function reflect(client: GrpcClient, requests: Record<string, unknown>[]): Promise<ReflectionResponse[]> {
  const call = (client.ServerReflectionInfo as () => grpc.ClientDuplexStream<unknown, ReflectionResponse>)();
  const out: ReflectionResponse[] = [];
  return new Promise((resolve, reject) => {
    call.on("data", (msg: ReflectionResponse) => {
      out.push(msg);
      if (out.length === requests.length) call.end();
    });
    call.on("error", reject);
    call.on("end", () => resolve(out));
    for (const r of requests) call.write(r);
  });
}

const decode = (bytes: Uint8Array): FileDescriptorProto => fromBinary(FileDescriptorProtoSchema, bytes);

const EXPECTED_SERVICES = [
  "grpc.health.v1.Health",
  "grpc.reflection.v1.ServerReflection",
  "grpc.reflection.v1alpha.ServerReflection",
  "mmgate.admin.v1.AdminService",
];

describe("gRPC server reflection", () => {
  let server: InProcessServer;
  before(async () => {
    server = await startServer();
  });
  after(() => server.close());

  for (const version of ["v1", "v1alpha"]) {
    describe(`grpc.reflection.${version} through @grpc/grpc-js`, () => {
      let client: GrpcClient;
      before(() => {
        client = server.grpcClient(`grpc/reflection/${version}/reflection.proto`, `grpc.reflection.${version}.ServerReflection`);
      });

      it("lists every registered service", async () => {
        const [res] = await reflect(client, [{ host: "h1", listServices: "*" }]);
        expect(res!.messageResponse).to.equal("listServicesResponse");
        expect(res!.validHost).to.equal("h1");
        expect(res!.listServicesResponse!.service.map((s) => s.name)).to.deep.equal(EXPECTED_SERVICES);
      });

      it("returns each service's file first, then its transitive dependencies once each", async () => {
        const responses = await reflect(
          client,
          EXPECTED_SERVICES.map((s) => ({ fileContainingSymbol: s })),
        );
        for (const [i, res] of responses.entries()) {
          const files = res.fileDescriptorResponse!.fileDescriptorProto.map(decode);
          const first = files[0]!;
          const fqServices = first.service.map((s) => `${first.package}.${s.name}`);
          expect(fqServices).to.include(EXPECTED_SERVICES[i]);
          const names = files.map((f) => f.name);
          expect(new Set(names).size).to.equal(names.length);
          // Every dependency of every returned file is itself returned.
          for (const f of files) for (const dep of f.dependency) expect(names).to.include(dep);
        }
        const admin = responses[3]!.fileDescriptorResponse!.fileDescriptorProto.map(decode).map((f) => f.name);
        expect(admin[0]).to.equal("mmgate/admin/v1/admin.proto");
        expect(admin).to.include.members([
          "google/protobuf/struct.proto",
          "grpc/health/v1/health.proto",
          "mmgate/options/v1/options.proto",
          "google/protobuf/descriptor.proto",
        ]);
      });

      it("finds files by name and by every kind of symbol", async () => {
        const symbols = [
          "mmgate.admin.v1.AdminService.GetStatus", // method
          ".mmgate.admin.v1.GetStatusResponse", // message, leading dot
          "mmgate.admin.v1.GetStatusResponse.uptime_seconds", // field
          "grpc.health.v1.HealthCheckResponse.ServingStatus", // nested enum
          "grpc.health.v1.HealthCheckResponse.NOT_SERVING", // nested enum value, scoped to the message
          "mmgate.options.v1.ACCESS_ADMIN", // top-level enum value, scoped to the package
          "mmgate.options.v1.access", // extension
          "grpc.reflection.v1.ServerReflectionRequest.message_request", // oneof
        ];
        const expectedFiles = [
          "mmgate/admin/v1/admin.proto",
          "mmgate/admin/v1/admin.proto",
          "mmgate/admin/v1/admin.proto",
          "grpc/health/v1/health.proto",
          "grpc/health/v1/health.proto",
          "mmgate/options/v1/options.proto",
          "mmgate/options/v1/options.proto",
          "grpc/reflection/v1/reflection.proto",
        ];
        const responses = await reflect(client, [
          ...symbols.map((s) => ({ fileContainingSymbol: s })),
          { fileByFilename: "google/protobuf/struct.proto" },
        ]);
        const firstFiles = responses.map((r) => decode(r.fileDescriptorResponse!.fileDescriptorProto[0]!).name);
        expect(firstFiles).to.deep.equal([...expectedFiles, "google/protobuf/struct.proto"]);
      });

      it("answers extension queries", async () => {
        const [numbers, byExt, unknownType, unknownExt] = await reflect(client, [
          { allExtensionNumbersOfType: "google.protobuf.MethodOptions" },
          { fileContainingExtension: { containingType: "google.protobuf.MethodOptions", extensionNumber: 51001 } },
          { allExtensionNumbersOfType: "no.such.Type" },
          { fileContainingExtension: { containingType: "google.protobuf.MethodOptions", extensionNumber: 7 } },
        ]);
        expect(numbers!.allExtensionNumbersResponse).to.deep.equal({ baseTypeName: "google.protobuf.MethodOptions", extensionNumber: [51001] });
        expect(decode(byExt!.fileDescriptorResponse!.fileDescriptorProto[0]!).name).to.equal("mmgate/options/v1/options.proto");
        expect(unknownType!.errorResponse).to.deep.equal({ errorCode: 5, errorMessage: "type no.such.Type not found" });
        expect(unknownExt!.errorResponse).to.deep.equal({ errorCode: 5, errorMessage: "extension google.protobuf.MethodOptions#7 not found" });
      });

      it("answers unknown symbols and files with NOT_FOUND (5) and keeps the stream open", async () => {
        const responses = await reflect(client, [
          { fileContainingSymbol: "no.such.Symbol" },
          { fileByFilename: "no/such.proto" },
          { listServices: "" },
        ]);
        expect(responses[0]!.errorResponse).to.deep.equal({ errorCode: 5, errorMessage: "symbol no.such.Symbol not found" });
        expect(responses[0]!.originalRequest.fileContainingSymbol).to.equal("no.such.Symbol");
        expect(responses[1]!.errorResponse).to.deep.equal({ errorCode: 5, errorMessage: "file no/such.proto not found" });
        expect(responses[2]!.messageResponse).to.equal("listServicesResponse");
      });

      it("answers a request with no question with UNIMPLEMENTED (12)", async () => {
        const [res] = await reflect(client, [{ host: "x" }]);
        expect(res!.errorResponse!.errorCode).to.equal(12);
      });
    });
  }

  it("serves v1 to a connect client", async () => {
    const client = createClient(ServerReflection, server.transport);
    async function* requests() {
      yield { messageRequest: { case: "listServices" as const, value: "" } };
      yield { messageRequest: { case: "fileContainingSymbol" as const, value: "mmgate.admin.v1.AdminService" } };
    }
    const got = [];
    for await (const res of client.serverReflectionInfo(requests())) got.push(res);
    expect(got).to.have.length(2);
    const list = got[0]!.messageResponse;
    expect(list.case).to.equal("listServicesResponse");
    if (list.case === "listServicesResponse") expect(list.value.service.map((s) => s.name)).to.deep.equal(EXPECTED_SERVICES);
    expect(got[1]!.messageResponse.case).to.equal("fileDescriptorResponse");
  });

  it("lets `buf curl` list the services and call a method it learned by reflection", async () => {
    const buf = `${repoRoot}node_modules/.bin/buf`;
    const list = await run(buf, ["curl", "--http2-prior-knowledge", "--list-services", server.baseUrl]);
    expect(list.stdout.trim().split("\n")).to.deep.equal(EXPECTED_SERVICES);
    const methods = await run(buf, ["curl", "--http2-prior-knowledge", "--list-methods", server.baseUrl]);
    expect(methods.stdout).to.include("mmgate.admin.v1.AdminService/GetStatus");
    const call = await run(buf, ["curl", "--http2-prior-knowledge", "--protocol", "grpc", `${server.baseUrl}/mmgate.admin.v1.AdminService/GetStatus`]);
    const status = JSON.parse(call.stdout) as { version: string; services: { name: string; status: string }[] };
    expect(status.version).to.equal("test");
    expect(status.services.map((s) => s.name)).to.deep.equal(EXPECTED_SERVICES);
    expect(status.services.every((s) => s.status === "SERVING")).to.equal(true);
  });
});
