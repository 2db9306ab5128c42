/**
 * A handler (or an error it throws) that carries a header HTTP/2 forbids,
 * or an error message with a lone surrogate, still gets its call answered
 * with a status on both request paths, and the server keeps serving. Node
 * refuses to send such headers: left alone, the call would never end (the
 * lean path) or the compatibility layer would throw out of its trailer
 * callback (connect's path).
 */
import { expect } from "chai";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { z } from "zod";
import { bindService, defineModule } from "../../src/server/index.js";
import { startServer, type InProcessServer } from "../support/index.js";
import { ShapesService } from "../support/shapes-service.js";

const module = defineModule({
  name: "connectionHeaders",
  description: "test: handlers that set forbidden headers",
  configSchema: z.object({}),
  create: () => ({
    services: [
      bindService(ShapesService, {
        unary(req: { value: string }, ctx: { responseHeader: Headers; responseTrailer: Headers }) {
          switch (req.value) {
            case "trailer":
              ctx.responseTrailer.set("keep-alive", "timeout=5");
              ctx.responseTrailer.set("te", "gzip");
              ctx.responseTrailer.set("x-kept", "yes");
              return { value: "ok" };
            case "header":
              ctx.responseHeader.set("transfer-encoding", "chunked");
              ctx.responseHeader.set("x-kept", "yes");
              return { value: "ok" };
            case "metadata":
              throw new ConnectError("refused", Code.FailedPrecondition, { "proxy-connection": "keep-alive", upgrade: "h2c", "x-kept": "yes" });
            case "surrogate":
              throw new ConnectError("bad \uD800 name", Code.InvalidArgument);
            default:
              return { value: req.value };
          }
        },
        async *serverStream(req: { value: string }, ctx: { responseTrailer: Headers }) {
          yield { value: "first" };
          if (req.value === "trailer") ctx.responseTrailer.set("upgrade", "websocket");
          if (req.value === "surrogate") throw new ConnectError("\uDC00 alone", Code.Aborted);
        },
      } as never),
    ],
  }),
});

for (const leanPath of [true, false]) {
  describe(`forbidden headers and unencodable messages (rpc.leanPath ${leanPath})`, () => {
    let server: InProcessServer;
    let client: Client<typeof ShapesService>;
    before(async () => {
      server = await startServer({ modules: [module], config: { rpc: { leanPath } } });
      client = createClient(ShapesService, server.transport);
    });
    after(() => server.close());

    /** The call's outcome, its headers and trailers; a 5 s deadline turns a hang into a failure. */
    async function unary(value: string) {
      let header = new Headers();
      let trailer = new Headers();
      const options = { timeoutMs: 5000, onHeader: (h: Headers) => (header = h), onTrailer: (t: Headers) => (trailer = t) };
      try {
        const res = (await (client as unknown as Record<string, (r: object, o: object) => Promise<{ value: string }>>)["unary"]!({ value }, options)).value;
        return { res, header, trailer };
      } catch (e) {
        const err = ConnectError.from(e);
        return { code: err.code, message: err.rawMessage, metadata: err.metadata, header, trailer };
      }
    }

    it("drops a handler's connection-specific trailers and sends the rest", async () => {
      const out = await unary("trailer");
      expect(out.res).to.equal("ok");
      expect(out.trailer.get("x-kept")).to.equal("yes");
      expect(out.trailer.has("keep-alive")).to.equal(false);
      expect(out.trailer.has("te")).to.equal(false);
    });

    it("drops a handler's connection-specific headers and sends the rest", async () => {
      const out = await unary("header");
      expect(out.res).to.equal("ok");
      expect(out.header.get("x-kept")).to.equal("yes");
      expect(out.header.has("transfer-encoding")).to.equal(false);
    });

    it("drops an error's connection-specific metadata and answers with its status", async () => {
      const out = await unary("metadata");
      expect(out.code).to.equal(Code.FailedPrecondition);
      expect(out.metadata?.get("x-kept")).to.equal("yes");
      expect(out.metadata?.has("proxy-connection")).to.equal(false);
    });

    it("answers an error whose message has a lone surrogate, with U+FFFD in its place", async () => {
      const out = await unary("surrogate");
      expect(out.code).to.equal(Code.InvalidArgument);
      expect(out.message).to.equal("bad \uFFFD name");
    });

    it("ends a stream whose trailers carry a forbidden name, and one failing with a lone surrogate", async () => {
      const read = async (value: string) => {
        const got: string[] = [];
        try {
          for await (const m of (client as unknown as Record<string, (r: object, o: object) => AsyncIterable<{ value: string }>>)["serverStream"]!({ value }, { timeoutMs: 5000 }))
            got.push(m.value);
          return { got, code: 0 };
        } catch (e) {
          return { got, code: ConnectError.from(e).code };
        }
      };
      expect(await read("trailer")).to.deep.equal({ got: ["first"], code: 0 });
      expect(await read("surrogate")).to.deep.equal({ got: ["first"], code: Code.Aborted });
      // And the server still serves.
      expect((await unary("still")).res).to.equal("still");
    });
  });
}
