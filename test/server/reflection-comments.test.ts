/**
 * Reflection serves the schema's comments: each file of proto/ comes from the
 * buf image that `npm run generate` writes (gen/descriptors.binpb), with its
 * source_code_info, and files the image lacks (well-known types) or no longer
 * matches come from the descriptors embedded in the stubs.
 */
import { readFileSync, readdirSync } from "node:fs";
import { join, relative } from "node:path";
import type { DescFile, DescService, MessageInitShape } from "@bufbuild/protobuf";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import type { FileDescriptorProto } from "@bufbuild/protobuf/wkt";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import * as grpc from "@grpc/grpc-js";
import { expect } from "chai";
import * as v1 from "../../gen/grpc/reflection/v1/reflection_pb.js";
import * as v1alpha from "../../gen/grpc/reflection/v1alpha/reflection_pb.js";
import { AdminService, file_mmgate_admin_v1_admin } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { DescriptorIndex, answerReflection } from "../../src/server/reflection.js";
import { descriptorImageUrl, parseDescriptorImage } from "../../src/server/reflection-image.js";
import type { InProcessServer } from "../support/server.js";
import { protoRoot, repoRoot, startServer } from "../support/server.js";

const decode = (bytes: Uint8Array): FileDescriptorProto => fromBinary(FileDescriptorProtoSchema, bytes);
const image = () => parseDescriptorImage(readFileSync(descriptorImageUrl));

function walk(dir: string, suffix: string): string[] {
  return readdirSync(dir, { withFileTypes: true })
    .flatMap((e) => (e.isDirectory() ? walk(join(dir, e.name), suffix) : e.name.endsWith(suffix) ? [join(dir, e.name)] : []))
    .sort();
}

/**
 * The comment above a declaration in a .proto file, in the form protoc and
 * buf record it: each `//` line's text after the slashes, newline-terminated.
 */
function protoComment(protoFile: string, declaration: RegExp): string {
  const lines = readFileSync(join(protoRoot, protoFile), "utf8").split("\n");
  const at = lines.findIndex((l) => declaration.test(l));
  expect(at, `${declaration} in ${protoFile}`).to.be.greaterThan(0);
  const comment: string[] = [];
  for (let i = at - 1; i >= 0 && lines[i]!.trim().startsWith("//"); i--) comment.unshift(lines[i]!.trim().slice(2));
  expect(comment, `a comment above ${declaration}`).to.not.be.empty;
  return `${comment.join("\n")}\n`;
}

/** A location's leading comment, or undefined when the descriptor has none for the path. */
function leadingComment(file: FileDescriptorProto, path: number[]): string | undefined {
  return file.sourceCodeInfo?.location.find((l) => l.path.length === path.length && l.path.every((p, i) => p === path[i]))
    ?.leadingComments;
}

// FileDescriptorProto field numbers, the first element of a source location path.
const MESSAGE_TYPE = 4;
const SERVICE = 6;
const MESSAGE_FIELD = 2;
const SERVICE_METHOD = 2;

function fieldPath(file: FileDescriptorProto, message: string, field: string): number[] {
  const m = file.messageType.findIndex((d) => d.name === message);
  const f = file.messageType[m]?.field.findIndex((d) => d.name === field) ?? -1;
  expect([m, f], `${message}.${field} in ${file.name}`).to.not.include(-1);
  return [MESSAGE_TYPE, m, MESSAGE_FIELD, f];
}

describe("reflection: descriptors with source comments", () => {
  describe("the descriptor image (gen/descriptors.binpb)", () => {
    it("holds exactly the files of proto/, each with source info", () => {
      const files = image();
      const protos = walk(protoRoot, ".proto").map((p) => relative(protoRoot, p));
      expect([...files.keys()].sort()).to.deep.equal(protos);
      for (const f of files.values()) expect(f.sourceCodeInfo?.location, f.name).to.not.be.empty;
    });

    it("matches the embedded descriptor of every generated file, so reflection serves each with its comments", async () => {
      // Every stub's file descriptor, and through their services an index that reaches them all.
      const stubs = walk(join(repoRoot, "gen"), "_pb.ts");
      const files: DescFile[] = [];
      for (const stub of stubs) {
        const mod = (await import(stub)) as Record<string, unknown>;
        for (const [name, value] of Object.entries(mod)) if (name.startsWith("file_")) files.push(value as DescFile);
      }
      expect(files.map((f) => f.proto.name).sort()).to.deep.equal([...image().keys()].sort());
      const services: DescService[] = files.flatMap((f) => f.services);
      const index = new DescriptorIndex(services);
      index.useImage(image());
      for (const file of files) {
        // Every file is reached from some service (options.proto, say, as a dependency).
        const served = index.fileByName(file.proto.name);
        expect(served, file.proto.name).to.not.equal(undefined);
        const [first] = index.serializeWithDependencies(served!);
        expect(decode(first!).sourceCodeInfo?.location, file.proto.name).to.not.be.empty;
      }
    });
  });

  describe("fallback to the embedded descriptors", () => {
    const ask = (index: DescriptorIndex, symbol: string) => {
      const res = answerReflection(index, create(v1.ServerReflectionRequestSchema, { messageRequest: { case: "fileContainingSymbol", value: symbol } }));
      if (res.messageResponse?.case !== "fileDescriptorResponse") throw new Error(`answered ${res.messageResponse?.case}`);
      return (res.messageResponse.value.fileDescriptorProto ?? []).map(decode);
    };

    it("serves files the image lacks as embedded, and image files without buf's bookkeeping", () => {
      const index = new DescriptorIndex([AdminService]);
      index.useImage(image());
      const files = ask(index, "mmgate.admin.v1.AdminService");
      const byName = new Map(files.map((f) => [f.name, f]));
      expect(byName.get("mmgate/admin/v1/admin.proto")!.sourceCodeInfo).to.not.equal(undefined);
      expect(byName.get("mmgate/admin/v1/admin.proto")!.$unknown ?? []).to.deep.equal([]);
      // Well-known types come from @bufbuild/protobuf, not from proto/.
      expect(byName.get("google/protobuf/struct.proto")!.sourceCodeInfo).to.equal(undefined);
      expect(byName.get("google/protobuf/struct.proto")!.messageType.map((m) => m.name)).to.include("Struct");
    });

    it("serves the embedded descriptor when the image's entry describes another schema", () => {
      const stale = new Map(image());
      const admin = stale.get("mmgate/admin/v1/admin.proto")!;
      const renamed = fromBinary(FileDescriptorProtoSchema, toBinary(FileDescriptorProtoSchema, admin));
      renamed.messageType.find((m) => m.name === "GetStatusResponse")!.field[1]!.name = "uptime";
      stale.set(admin.name, renamed);
      const index = new DescriptorIndex([AdminService]);
      index.useImage(stale);
      const [served] = ask(index, "mmgate.admin.v1.AdminService");
      expect(served!.sourceCodeInfo).to.equal(undefined);
      expect(toBinary(FileDescriptorProtoSchema, served!)).to.deep.equal(toBinary(FileDescriptorProtoSchema, file_mmgate_admin_v1_admin.proto));
    });
  });

  describe("over the network", () => {
    let server: InProcessServer;
    before(async () => {
      server = await startServer();
    });
    after(() => server.close());

    const uptimeComment = () => protoComment("mmgate/admin/v1/admin.proto", /double uptime_seconds = 2;/);

    for (const [version, pb] of [
      ["v1", v1],
      ["v1alpha", v1alpha],
    ] as const) {
      it(`grpc.reflection.${version} through @grpc/grpc-js: a field's comment is the .proto's`, async () => {
        // A raw call, encoded and decoded with the generated reflection messages.
        const client = new grpc.Client(server.addr, grpc.credentials.createInsecure());
        type Req = MessageInitShape<typeof pb.ServerReflectionRequestSchema>;
        const call = client.makeBidiStreamRequest(
          `/grpc.reflection.${version}.ServerReflection/ServerReflectionInfo`,
          (req: Req) => Buffer.from(toBinary(pb.ServerReflectionRequestSchema, create(pb.ServerReflectionRequestSchema, req))),
          (bytes: Buffer) => fromBinary(pb.ServerReflectionResponseSchema, bytes),
        );
        try {
          const answer = new Promise<v1.ServerReflectionResponse>((resolve, reject) => {
            call.once("data", resolve);
            call.once("error", reject);
          });
          call.write({ messageRequest: { case: "fileContainingSymbol", value: "mmgate.admin.v1.GetStatusResponse.uptime_seconds" } });
          const res = await answer;
          call.end();
          if (res.messageResponse.case !== "fileDescriptorResponse") throw new Error(`answered ${res.messageResponse.case}`);
          const files = res.messageResponse.value.fileDescriptorProto.map(decode);
          const admin = files[0]!;
          expect(admin.name).to.equal("mmgate/admin/v1/admin.proto");
          expect(leadingComment(admin, fieldPath(admin, "GetStatusResponse", "uptime_seconds"))).to.equal(uptimeComment());
          // A dependency from proto/ is documented too; a well-known type is served as embedded.
          const health = files.find((f) => f.name === "grpc/health/v1/health.proto")!;
          expect(health.sourceCodeInfo?.location).to.not.be.empty;
          expect(files.find((f) => f.name === "google/protobuf/struct.proto")!.sourceCodeInfo).to.equal(undefined);
        } finally {
          client.close();
        }
      });
    }

    it("grpc.reflection.v1 through a connect client: service and method comments are the .proto's", async () => {
      const client = createClient(v1.ServerReflection, server.transport);
      async function* requests() {
        yield { messageRequest: { case: "fileByFilename" as const, value: "mmgate/admin/v1/admin.proto" } };
      }
      const got: v1.ServerReflectionResponse[] = [];
      for await (const res of client.serverReflectionInfo(requests())) got.push(res);
      const res = got[0]!.messageResponse;
      if (res.case !== "fileDescriptorResponse") throw new Error(`answered ${res.case}`);
      const admin = decode(res.value.fileDescriptorProto[0]!);
      const s = admin.service.findIndex((d) => d.name === "AdminService");
      const m = admin.service[s]!.method.findIndex((d) => d.name === "SetServingStatus");
      expect(leadingComment(admin, [SERVICE, s])).to.equal(protoComment("mmgate/admin/v1/admin.proto", /^service AdminService \{/));
      expect(leadingComment(admin, [SERVICE, s, SERVICE_METHOD, m])).to.equal(
        protoComment("mmgate/admin/v1/admin.proto", /rpc SetServingStatus\(/),
      );
    });
  });
});
