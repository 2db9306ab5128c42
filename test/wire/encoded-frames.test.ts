import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { gzipSync } from "node:zlib";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextValues, type HandlerContext } from "@connectrpc/connect";
import { createAsyncIterable } from "@connectrpc/connect/protocol";
import { expect } from "chai";
import { z } from "zod";
import { GenerateRequestSchema, GenerateResponseSchema, TokenWorkerService } from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { channelDefaults, createChannel } from "../../src/rpc/index.js";
import { bindService, defineModule } from "../../src/server/index.js";
import { acceptsEncoded, checkFrames, EncodedFrames, encodeEnvelope, framedResponsesKey } from "../../src/wire/index.js";
import { connectPathOnly, startServer, type InProcessServer } from "../support/index.js";
import { grpcFrame, parseGrpcFrames, rawH2 } from "../support/raw-h2.js";

const message = (id: string) => toBinary(GenerateResponseSchema, create(GenerateResponseSchema, { output: { id, event: "token" } }));
const frames = (...ids: string[]) => Buffer.concat(ids.map((id) => encodeEnvelope(message(id))));

describe("wire: relayed frames (EncodedFrames)", () => {
  describe("checkFrames", () => {
    const two = frames("a", "b");
    const table: { name: string; frames: EncodedFrames; max: number; code?: Code; text?: RegExp }[] = [
      { name: "two whole frames", frames: new EncodedFrames(two, 2), max: 1024 },
      { name: "an empty message", frames: new EncodedFrames(encodeEnvelope(new Uint8Array(0)), 1), max: 0 },
      { name: "a frame over writeMaxBytes", frames: new EncodedFrames(two, 2), max: message("a").length - 1, code: Code.ResourceExhausted, text: /larger than configured writeMaxBytes/ },
      { name: "a count that is not the frames'", frames: new EncodedFrames(two, 3), max: 1024, code: Code.Internal, text: /not 3 whole messages/ },
      { name: "a frame cut short", frames: new EncodedFrames(two.subarray(0, two.length - 1), 2), max: 1024, code: Code.Internal },
      { name: "a header cut short", frames: new EncodedFrames(Buffer.concat([two, Buffer.from([0, 0])]), 2), max: 1024, code: Code.Internal },
    ];
    for (const row of table) {
      it(`${row.name}: ${row.code === undefined ? "passes" : Code[row.code]}`, () => {
        if (row.code === undefined) {
          checkFrames(row.frames, row.max);
          return;
        }
        try {
          checkFrames(row.frames, row.max);
          expect.fail("checkFrames passed");
        } catch (e) {
          expect(e).to.be.instanceOf(ConnectError);
          expect((e as ConnectError).code).to.equal(row.code);
          if (row.text) expect((e as ConnectError).rawMessage).to.match(row.text);
        }
      });
    }
  });

  describe("the lean client reads a server stream as runs of frames when asked", () => {
    /** How the raw server writes the next answer: each entry one write, a pause between them (one DATA frame each). */
    let plan: { writes: Buffer[]; headers?: http2.OutgoingHttpHeaders } = { writes: [] };
    let server: http2.Http2Server;
    let addr = "";
    before(async () => {
      server = http2.createServer();
      server.on("stream", (stream) => {
        const { writes, headers } = plan;
        stream.on("data", () => undefined);
        stream.once("end", () => {
          void (async () => {
            stream.respond({ ":status": 200, "content-type": "application/grpc", ...headers }, { waitForTrailers: true });
            stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
            for (const part of writes) {
              stream.write(part);
              await sleep(5);
            }
            stream.end();
          })();
        });
      });
      await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
      addr = `127.0.0.1:${(server.address() as AddressInfo).port}`;
    });
    after(async () => new Promise<void>((resolve) => server.close(() => resolve())));

    const read = async (framed: boolean): Promise<unknown[]> => {
      const channel = createChannel(addr, channelDefaults);
      try {
        const values = createContextValues();
        if (framed) values.set(framedResponsesKey, true);
        const input = createAsyncIterable([create(GenerateRequestSchema, {})]);
        const res = await channel.stream(TokenWorkerService.method.generate, undefined, 5000, undefined, input, values);
        const out: unknown[] = [];
        for await (const m of res.message) out.push(m);
        return out;
      } finally {
        await channel.close();
      }
    };

    it("frames that came in one DATA frame make one run; one split across DATA frames comes on its own; the bytes are the server's", async () => {
      const body = frames("1", "2", "3", "4", "5");
      const third = encodeEnvelope(message("3"));
      const thirdAt = body.indexOf(third);
      // 1+2 in one write; 3 split inside its header and again inside its message; 4+5 in one write.
      const cuts = [thirdAt, thirdAt + 2, thirdAt + 7, thirdAt + third.length];
      plan = { writes: [body.subarray(0, cuts[0]), body.subarray(cuts[0], cuts[1]), body.subarray(cuts[1], cuts[2]), body.subarray(cuts[2], cuts[3]), body.subarray(cuts[3])] };
      const out = await read(true);
      for (const m of out) expect(m).to.be.instanceOf(EncodedFrames);
      const runs = out as EncodedFrames[];
      for (const run of runs) checkFrames(run, 1024);
      expect(Buffer.concat(runs.map((r) => r.bytes))).to.deep.equal(body);
      expect(runs.map((r) => r.count)).to.deep.equal([2, 1, 2]);
      expect(Buffer.from(runs[1]!.bytes)).to.deep.equal(third);
    });

    it("a compressed frame comes decompressed, framed again with flags 0", async () => {
      const plain = message("z");
      plan = { writes: [grpcFrame(gzipSync(plain), { flags: 1 }), encodeEnvelope(message("y"))], headers: { "grpc-encoding": "gzip" } };
      const runs = (await read(true)) as EncodedFrames[];
      expect(Buffer.concat(runs.map((r) => r.bytes))).to.deep.equal(Buffer.concat([encodeEnvelope(plain), encodeEnvelope(message("y"))]));
      expect(runs.reduce((n, r) => n + r.count, 0)).to.equal(2);
    });

    it("without the option the same body comes as parsed messages", async () => {
      plan = { writes: [frames("1", "2")] };
      const out = await read(false);
      expect(out.map((m) => (m as { output?: { id?: string } }).output?.id)).to.deep.equal(["1", "2"]);
    });
  });

  describe("the lean gRPC path writes a handler's EncodedFrames as they are", () => {
    const body = frames("p", "q", "r");
    let yielded: () => EncodedFrames = () => new EncodedFrames(body, 3);
    let server: InProcessServer;
    before(async () => {
      const relay = defineModule({
        name: "framesRelay",
        description: "test: answers with relayed frames",
        configSchema: z.object({}),
        create: () => ({
          services: [
            bindService(TokenWorkerService, {
              async *generate(_req, ctx: HandlerContext) {
                if (acceptsEncoded(ctx)) yield yielded() as never;
                else for (const id of ["p", "q", "r"]) yield { output: { id, event: "token" } };
              },
            }),
          ],
        }),
      });
      server = await startServer({ modules: [relay], config: { limits: { maxSendMessageBytes: 1024 } } });
    });
    after(async () => server?.close());

    const call = () =>
      rawH2(server.addr, {
        headers: { ":method": "POST", ":path": "/mmgate.llm.v1.TokenWorkerService/Generate", "content-type": "application/grpc", te: "trailers" },
        body: grpcFrame(toBinary(GenerateRequestSchema, create(GenerateRequestSchema, {}))),
      });

    it(`three frames in one write arrive as they were (${connectPathOnly ? "connect path: as three messages" : "lean path"})`, async () => {
      yielded = () => new EncodedFrames(body, 3);
      const res = await call();
      expect(res.trailers?.["grpc-status"]).to.equal("0");
      expect(parseGrpcFrames(res.data).frames).to.have.length(3);
      expect(res.data.equals(body)).to.equal(true);
    });

    it("frames that are not what they say end the call with INTERNAL, a message over the limit with RESOURCE_EXHAUSTED", async function () {
      if (connectPathOnly) this.skip();
      yielded = () => new EncodedFrames(body, 2);
      let res = await call();
      expect(res.trailers?.["grpc-status"]).to.equal(String(Code.Internal));
      expect(res.data.length).to.equal(0);
      yielded = () => new EncodedFrames(encodeEnvelope(new Uint8Array(1025)), 1);
      res = await call();
      expect(res.trailers?.["grpc-status"]).to.equal(String(Code.ResourceExhausted));
      expect(res.data.length).to.equal(0);
    });
  });
});
