import { expect } from "chai";
import { Code, createClient, type ConnectError } from "@connectrpc/connect";
import { fromBinary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import { DataType, ErrorDetailSchema, MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import { mediaModule } from "../../src/media/index.js";
import { connectErrorOf, grpcServerStream, startServer, type InProcessServer } from "../support/index.js";
import { encodeRaw, pattern } from "./fixtures.js";

const U64_MAX = 2n ** 64n - 1n;


function detailOf(err: ConnectError) {
  const detail = err.details.find((d) => "type" in d && d.type === ErrorDetailSchema.typeName);
  if (!detail || !("value" in detail) || !(detail.value instanceof Uint8Array)) throw new Error("no ErrorDetail");
  return fromBinary(ErrorDetailSchema, detail.value);
}

describe("media: u64 arithmetic on request values never breaks a status", () => {
  let server: InProcessServer;
  let handle = 0n;
  const RAW = pattern(8 * 8 * 3);

  before(async () => {
    server = await startServer({ modules: [mediaModule] });
    const png = await encodeRaw(RAW, 8, 8, 3, "png");
    handle = (await createClient(MediaService, server.transport).decode({ source: { case: "data", value: png } })).handle;
  });
  after(() => server.close());

  const ranges: [string, bigint, bigint][] = [
    ["offset 1, length 2^64 - 1 (offset + length is 2^64)", 1n, U64_MAX],
    ["offset 2^64 - 1, length 2^64 - 1", U64_MAX, U64_MAX],
    ["offset 2^64 - 1, length 0", U64_MAX, 0n],
  ];
  for (const [name, offset, length] of ranges) {
    it(`ReadTensor ${name}: OUT_OF_RANGE at once, the detail saturated at 2^64 - 1`, async () => {
      const client = createClient(MediaService, server.transport);
      const err = await connectErrorOf(async () => {
        for await (const _ of client.readTensor({ handle, offset, length }, { timeoutMs: 10_000 })) void _;
      });
      expect(err.code).to.equal(Code.OutOfRange);
      const detail = detailOf(err);
      expect(detail.code).to.equal("READ_RANGE_INVALID");
      expect(detail.limit).to.equal(BigInt(RAW.length));
      expect(detail.actual <= U64_MAX).to.equal(true);
    });
  }

  it("the same over @grpc/grpc-js", async () => {
    const client = server.grpcClient("mmgate/media/v1/media.proto", "mmgate.media.v1.MediaService");
    const err = await grpcServerStream(client, "ReadTensor", { handle: handle.toString(), offset: "1", length: U64_MAX.toString() }).catch(
      (e: grpc.ServiceError) => e,
    );
    expect((err as grpc.ServiceError).code).to.equal(grpc.status.OUT_OF_RANGE);
  });

  it("HashTensor whose shape's element count passes 2^64: INVALID_ARGUMENT with a saturated detail", async () => {
    const client = createClient(MediaService, server.transport);
    const big = 2n ** 32n + 1n;
    const err = await connectErrorOf(() => client.hashTensor({ shape: [big, big], dtype: DataType.UINT8, data: new Uint8Array(4) }, { timeoutMs: 10_000 }));
    expect(err.code).to.be.oneOf([Code.InvalidArgument, Code.OutOfRange]);
    const detail = detailOf(err);
    expect(detail.limit <= U64_MAX && detail.actual <= U64_MAX).to.equal(true);
  });
});
