/**
 * The router's readiness and load streams of one relay (src/relay/router/
 * relay-state.ts) against a relay that breaks the contract: the update is
 * refused, and the stream it came on is cancelled at once, not left open on
 * the relay while the router waits to subscribe again.
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { expect } from "chai";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { ServingReadinessUpdateSchema } from "../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { RELAY_PROTOCOL_VERSION } from "../../src/relay/index.js";
import { RelayState, type RelayStateEvent } from "../../src/relay/router/index.js";
import { eventually } from "../support/index.js";
import { grpcFrame } from "../support/raw-h2.js";

describe("router: a relay's readiness stream that breaks the contract", () => {
  it("is cancelled as soon as its update is refused, while the router goes on", async () => {
    // Readiness: one update with the wrong contract marker, then the stream stays open. Load: open, silent.
    const relay = http2.createServer();
    const sessions: http2.ServerHttp2Session[] = [];
    relay.on("session", (session) => sessions.push(session));
    const readinessEnds: Promise<number>[] = [];
    let openStreams = 0;
    relay.on("stream", (stream, headers) => {
      openStreams += 1;
      stream.once("close", () => (openStreams -= 1));
      stream.on("error", () => undefined);
      stream.respond({ ":status": 200, "content-type": "application/grpc" });
      if (headers[":path"] === "/dynamo.kvrelay.v1.KvEventRelay/SubscribeServingReadiness") {
        readinessEnds.push(new Promise((resolve) => stream.once("close", () => resolve(stream.rstCode))));
        const update = create(ServingReadinessUpdateSchema, { protocolVersion: RELAY_PROTOCOL_VERSION, contractMarker: 0x1234, revision: 1n });
        stream.write(grpcFrame(toBinary(ServingReadinessUpdateSchema, update)));
      }
    });
    await new Promise<void>((resolve) => relay.listen(0, "127.0.0.1", resolve));
    const events: RelayStateEvent[] = [];
    const state = new RelayState({
      transport: createGrpcTransport({ baseUrl: `http://127.0.0.1:${(relay.address() as AddressInfo).port}` }),
      subscriberId: "router-test",
      // The next attempt waits a minute: within the test, only the router's own cancel can end the first stream.
      backoff: { minMs: 60_000, maxMs: 60_000 },
      onEvent: (event) => events.push(event),
    });
    const stop = new AbortController();
    const running = state.run(stop.signal);
    try {
      await eventually(() => expect(events.flatMap((e) => (e.type === "stream-error" ? [e.error.reason] : []))).to.deep.equal(["ContractMarker"]));
      const first = await Promise.race([readinessEnds[0]!, new Promise<string>((resolve) => setTimeout(() => resolve("still open"), 2000))]);
      expect(first).to.equal(http2.constants.NGHTTP2_CANCEL);
      expect(readinessEnds).to.have.length(1);
    } finally {
      stop.abort();
      await running;
      // The router's resets of its streams arrive first: destroying a session while Node still has to reset one of
      // its streams aborted the process here (std::bad_alloc in Http2Session::CopyDataIntoOutgoing, Node 20.20.2).
      await eventually(() => expect(openStreams).to.equal(0));
      for (const session of sessions) session.destroy();
      await new Promise((resolve) => relay.close(resolve));
    }
  });
});
