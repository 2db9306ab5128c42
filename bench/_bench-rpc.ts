/**
 * mmgate.bench.v1.BenchRpc, the bench-only service of bench/_rpc-server.ts
 * (its header says what each method does), declared in code: a
 * FileDescriptorProto over the health and wrapper messages, so there is no
 * .proto file to generate. Servers and in-process clients share it.
 */
import { create, createFileRegistry } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, file_google_protobuf_wrappers } from "@bufbuild/protobuf/wkt";
import { file_grpc_health_v1_health } from "../gen/grpc/health/v1/health_pb.js";

const benchFile = create(FileDescriptorProtoSchema, {
  name: "mmgate/bench/v1/bench_rpc.proto",
  package: "mmgate.bench.v1",
  dependency: [file_grpc_health_v1_health.proto.name, file_google_protobuf_wrappers.proto.name],
  syntax: "proto3",
  service: [
    {
      name: "BenchRpc",
      method: [
        {
          name: "Repeat",
          inputType: ".grpc.health.v1.HealthCheckRequest",
          outputType: ".grpc.health.v1.HealthCheckResponse",
          serverStreaming: true,
        },
        { name: "Echo", inputType: ".google.protobuf.BytesValue", outputType: ".google.protobuf.BytesValue" },
        {
          name: "Stream",
          inputType: ".google.protobuf.UInt32Value",
          outputType: ".google.protobuf.BytesValue",
          serverStreaming: true,
        },
      ],
    },
  ],
});
const imports = new Map([file_grpc_health_v1_health, file_google_protobuf_wrappers].map((f) => [f.proto.name, f]));
export const BenchRpc = createFileRegistry(benchFile, (name) => imports.get(name)).getService("mmgate.bench.v1.BenchRpc")!;
