/**
 * cancelledOnExit against a real HTTP/2 server: a connect client's stream
 * left early (break, a throw, the caller's signal) is cancelled on the wire.
 * Without it, leaving a `for await` over connect's stream stops reading and
 * leaves the call open (connect's iterable has no return()), which the first
 * case shows.
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { expect } from "chai";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { MediaService, ReadTensorResponseSchema } from "../../gen/mmgate/media/v1/media_pb.js";
import { cancelledOnExit } from "../../src/util/index.js";
import { grpcFrame } from "../support/raw-h2.js";

describe("util: cancelledOnExit", () => {
  /** Answers every call with one message and never ends it; each stream's close, with its RST_STREAM code. */
  let server: http2.Http2Server;
  let ends: Promise<number>[];
  const sessions: http2.ServerHttp2Session[] = [];
  let client: ReturnType<typeof createClient<typeof MediaService>>;
  beforeEach(async () => {
    ends = [];
    server = http2.createServer();
    server.on("session", (session) => sessions.push(session));
    server.on("stream", (stream) => {
      stream.on("error", () => undefined);
      ends.push(new Promise((resolve) => stream.once("close", () => resolve(stream.rstCode))));
      stream.respond({ ":status": 200, "content-type": "application/grpc" });
      stream.write(grpcFrame(toBinary(ReadTensorResponseSchema, create(ReadTensorResponseSchema, { totalSize: 1n, data: new Uint8Array(1) }))));
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    client = createClient(MediaService, createGrpcTransport({ baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}` }));
  });
  afterEach(async () => {
    const closed = new Promise((resolve) => server.close(resolve));
    // The client keeps its session: cut it.
    for (const session of sessions.splice(0)) session.destroy();
    await closed;
  });

  it("a plain break leaves the call open: a later call on the same session ends, the first does not", async () => {
    const left = new AbortController();
    for await (const _ of client.readTensor({ handle: 1n }, { signal: left.signal })) break;
    const second = new AbortController();
    for await (const _ of cancelledOnExit(second.signal, (signal) => client.readTensor({ handle: 2n }, { signal }))) break;
    expect(await ends[1]).to.equal(http2.constants.NGHTTP2_CANCEL);
    expect(await Promise.race([ends[0]!.then(() => "closed"), Promise.resolve("open")])).to.equal("open");
    left.abort();
    expect(await ends[0]).to.equal(http2.constants.NGHTTP2_CANCEL);
  });

  it("a throw out of the loop cancels the call", async () => {
    const failure = new Error("refused");
    let caught: unknown;
    try {
      for await (const _ of cancelledOnExit(undefined, (signal) => client.readTensor({ handle: 1n }, { signal }))) throw failure;
    } catch (error) {
      caught = error;
    }
    expect(caught).to.equal(failure);
    expect(await ends[0]).to.equal(http2.constants.NGHTTP2_CANCEL);
  });

  it("the caller's signal still cancels a call being read", async () => {
    const caller = new AbortController();
    const received: number[] = [];
    const reading = (async () => {
      for await (const res of cancelledOnExit(caller.signal, (signal) => client.readTensor({ handle: 1n }, { signal }))) {
        received.push(res.data.length);
        caller.abort();
      }
    })();
    await reading.catch(() => undefined);
    expect(received).to.deep.equal([1]);
    expect(await ends[0]).to.equal(http2.constants.NGHTTP2_CANCEL);
  });
});
