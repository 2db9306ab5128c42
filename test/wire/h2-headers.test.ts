import type { IncomingHttpHeaders } from "node:http2";
import { create, toBinary } from "@bufbuild/protobuf";
import type { HandlerContext } from "@connectrpc/connect";
import { expect } from "chai";
import { z } from "zod";
import { GenerateRequestSchema, TokenWorkerService } from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { bindService, defineModule } from "../../src/server/index.js";
import { incomingHeaderValue, requestHeaderValue, webHeadersOf } from "../../src/wire/index.js";
import { startServer, type InProcessServer } from "../support/index.js";
import { grpcFrame, parseGrpcFrames, rawH2 } from "../support/raw-h2.js";

describe("wire: one request header read from Node's headers", () => {
  const incoming: IncomingHttpHeaders = {
    ":path": "/x",
    authorization: "Bearer abc",
    padded: " \t value with inner  spaces \t",
    "set-cookie": ["a=1", " b=2 "],
    empty: "",
    traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
  };
  const names = ["authorization", "padded", "set-cookie", "empty", "traceparent", "absent", "x-request-id"];
  for (const name of names) {
    it(`${name}: what webHeadersOf(...).get gives`, () => {
      expect(incomingHeaderValue(incoming, name)).to.equal(webHeadersOf(incoming).get(name));
    });
  }

  describe("in a handler", () => {
    let server: InProcessServer;
    const seen: (string | null)[][] = [];
    before(async () => {
      const probe = defineModule({
        name: "headerProbe",
        description: "test: reads request headers both ways",
        configSchema: z.object({}),
        create: () => ({
          services: [
            bindService(TokenWorkerService, {
              async *generate(_req, ctx: HandlerContext) {
                const read = () => ["authorization", "traceparent", "x-extra"].map((n) => requestHeaderValue(ctx, n));
                const before = read();
                // Once the Headers exists, a change a handler (or an interceptor) made to it is what is read.
                ctx.requestHeader.set("x-extra", "changed");
                seen.push(before, read(), ["authorization", "traceparent", "x-extra"].map((n) => ctx.requestHeader.get(n)));
                yield { output: { id: "ok", event: "token" } };
              },
            }),
          ],
        }),
      });
      server = await startServer({ modules: [probe] });
    });
    after(async () => server?.close());

    it("gives what requestHeader.get gives, before and after the Headers is made and changed", async () => {
      const res = await rawH2(server.addr, {
        headers: {
          ":method": "POST",
          ":path": "/mmgate.llm.v1.TokenWorkerService/Generate",
          "content-type": "application/grpc",
          te: "trailers",
          traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
          "x-extra": "first",
        },
        body: grpcFrame(toBinary(GenerateRequestSchema, create(GenerateRequestSchema, {}))),
      });
      expect(res.trailers?.["grpc-status"], String(res.trailers?.["grpc-message"])).to.equal("0");
      expect(parseGrpcFrames(res.data).frames).to.have.length(1);
      const [before, after, viaHeaders] = seen;
      expect(before).to.deep.equal([null, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "first"]);
      expect(after).to.deep.equal(viaHeaders);
      expect(after![2]).to.equal("changed");
    });
  });
});
