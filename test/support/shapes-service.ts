/**
 * A test-only service with one method of each RPC shape (unary, server
 * stream, client stream, bidi), built at run time from a descriptor so that
 * host behaviour can be pinned for every shape without a proto in proto/.
 */
import { create, createFileRegistry } from "@bufbuild/protobuf";
import type { DescService } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, file_google_protobuf_wrappers } from "@bufbuild/protobuf/wkt";

const STRING = ".google.protobuf.StringValue";

const file = create(FileDescriptorProtoSchema, {
  name: "mmgate/test/v1/shapes.proto",
  package: "mmgate.test.v1",
  syntax: "proto3",
  dependency: ["google/protobuf/wrappers.proto"],
  service: [
    {
      name: "ShapesService",
      method: [
        { name: "Unary", inputType: STRING, outputType: STRING },
        { name: "ServerStream", inputType: STRING, outputType: STRING, serverStreaming: true },
        { name: "ClientStream", inputType: STRING, outputType: STRING, clientStreaming: true },
        { name: "Bidi", inputType: STRING, outputType: STRING, clientStreaming: true, serverStreaming: true },
      ],
    },
  ],
});

const registry = createFileRegistry(file, (name) => (name === file_google_protobuf_wrappers.proto.name ? file_google_protobuf_wrappers : undefined));

export const ShapesService = registry.getService("mmgate.test.v1.ShapesService") as DescService;
