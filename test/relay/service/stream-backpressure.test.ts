/**
 * Pool streams and the transport under them, on one HTTP/2 connection with
 * a raw client: subscribers that do not read end lagged and free their slot,
 * one connection or one address cannot take every slot, and subscriptions
 * cancelled mid-snapshot leave the connection usable.
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { expect } from "chai";
import * as http2 from "node:http2";
import { SubscribeKvPoolRequestSchema } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { HealthCheckRequestSchema } from "../../../gen/grpc/health/v1/health_pb.js";
import { KvEventService, PublishRequestSchema, type RouterEvent as WireRouterEvent } from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { SubscribeKvPoolDecodedRequestSchema } from "../../../gen/mmgate/kvrelay/v1/cbi1_pb.js";
import { producerToWire, RELAY_CONTRACT_MARKER } from "../../../src/relay/index.js";
import { eventually } from "../../support/index.js";
import { connectH2, grpcFrame, startRawH2, type RawH2Response } from "../../support/raw-h2.js";
import { chain, removed, startRelay, type RelayServer } from "./support.js";

const SUBSCRIBE = "/dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPool";
const SUBSCRIBE_DECODED = "/mmgate.kvrelay.v1.DecodedRelayService/SubscribeKvPoolDecoded";
const HEALTH_CHECK = "/grpc.health.v1.Health/Check";

function grpcHeaders(path: string): http2.OutgoingHttpHeaders {
  return { ":method": "POST", ":path": path, "content-type": "application/grpc", te: "trailers" };
}

function subscribeRequest(server: RelayServer, subscriberId: string) {
  return create(SubscribeKvPoolRequestSchema, { subscriberId, expectedProducer: producerToWire(server.relay.pool("default")!.producer), contractMarker: RELAY_CONTRACT_MARKER });
}

function subscribeBody(server: RelayServer, subscriberId: string): Buffer {
  return grpcFrame(toBinary(SubscribeKvPoolRequestSchema, subscribeRequest(server, subscriberId)));
}

function decodedBody(server: RelayServer, subscriberId: string, sparse = true): Buffer {
  const request = create(SubscribeKvPoolDecodedRequestSchema, { request: subscribeRequest(server, subscriberId), sparse });
  return grpcFrame(toBinary(SubscribeKvPoolDecodedRequestSchema, request));
}

/** The status of a response: its trailers', or its headers' for a trailers-only one. */
function statusOf(res: { headers: http2.IncomingHttpHeaders | undefined; trailers: http2.IncomingHttpHeaders | undefined }) {
  const from = res.trailers ?? res.headers;
  const text = (name: string) => {
    const value = from?.[name];
    return typeof value === "string" ? value : undefined;
  };
  const message = text("grpc-message");
  return { code: text("grpc-status"), reason: text("kv-relay-error-reason"), message: message === undefined ? undefined : decodeURIComponent(message) };
}

/**
 * A subscription whose client reads nothing until `read()`: no 'data'
 * listener, so its flow-control window is not reopened and the relay's
 * frames back up on the server.
 */
interface StalledCall {
  readonly stream: http2.ClientHttp2Stream;
  /** Starts reading: resolves once the stream closed, with its status. */
  read(): Promise<ReturnType<typeof statusOf> & { rstCode: number }>;
}

function stalled(session: http2.ClientHttp2Session, path: string, body: Buffer): StalledCall {
  const stream = session.request(grpcHeaders(path));
  let headers: http2.IncomingHttpHeaders | undefined;
  let trailers: http2.IncomingHttpHeaders | undefined;
  stream.on("response", (h) => (headers = h));
  stream.on("trailers", (t) => (trailers = t));
  stream.on("error", () => undefined);
  const closed = new Promise<void>((resolve) => stream.once("close", resolve));
  stream.end(body);
  return {
    stream,
    async read() {
      stream.resume();
      await closed;
      return { ...statusOf({ headers, trailers }), rstCode: stream.rstCode ?? 0 };
    },
  };
}

/** Subscribes on `session` and waits for the first DATA frame (admitted) or the end of the stream (refused). */
async function firstData(session: http2.ClientHttp2Session, path: string, body: Buffer): Promise<{ admitted: boolean; status: ReturnType<typeof statusOf> }> {
  const call = startRawH2(session, { headers: grpcHeaders(path), body, timeoutMs: 10_000 });
  const admitted = await Promise.race([new Promise<boolean>((resolve) => call.stream.once("data", () => resolve(true))), call.response.then(() => false)]);
  if (admitted) call.stream.close(http2.constants.NGHTTP2_CANCEL);
  const res: RawH2Response = await call.response;
  return { admitted, status: statusOf(res) };
}

async function publish(server: RelayServer, events: WireRouterEvent[]): Promise<void> {
  await createClient(KvEventService, server.connectTransport).publish(
    (async function* () {
      yield create(PublishRequestSchema, { pool: "default", events });
    })(),
  );
}

describe("relay pool streams and the transport's backlog", function () {
  this.timeout(30_000);
  let server: RelayServer | undefined;
  const sessions: http2.ClientHttp2Session[] = [];
  const connect = async (): Promise<http2.ClientHttp2Session> => {
    const session = await connectH2(server!.addr);
    sessions.push(session);
    return session;
  };
  afterEach(async () => {
    for (const session of sessions.splice(0)) session.destroy();
    await server?.close();
    server = undefined;
  });

  it("subscribers that stop reading end SUBSCRIBER_LAGGED and free their total slot before their client reads again", async () => {
    // A 16 KiB snapshot fits the client's window; deltas of a few KiB then fill it.
    server = await startRelay({
      pools: [{ name: "default", expectedBlocks: 4096 }],
      publicationQueueCapacity: 2,
      maxPoolStreamsTotal: 4,
      maxPoolStreamsPerConnection: 4,
    });
    const pool = server.relay.pool("default")!;
    const a = await connect();
    const calls = [0, 1, 2, 3].map((i) => stalled(a, SUBSCRIBE, subscribeBody(server!, `stalled-${i}`)));
    await eventually(() => expect(pool.hub?.stats().subscribers).to.equal(4));
    const blocks = Array.from({ length: 200 }, (_, i) => 1000n + BigInt(i));
    for (let i = 0; i < 2000 && (pool.hub?.stats().ended.lagged ?? 0) < 4; i++) {
      await publish(server, [i % 2 === 0 ? chain(1n, 1000n, 200) : removed(1n, blocks)]);
    }
    await eventually(() => expect(pool.hub?.stats().ended.lagged).to.equal(4));
    // Nobody read anything: the total slots are free all the same ...
    const b = await connect();
    const other = await firstData(b, SUBSCRIBE, subscribeBody(server, "other"));
    expect(other, "a subscriber on another connection").to.deep.include({ admitted: true });
    // ... while the lagged streams, their ends unread, still count against their own connection.
    const same = await firstData(a, SUBSCRIBE, subscribeBody(server, "same"));
    expect(same.status).to.deep.equal({ code: "8", reason: "RELAY_ERROR_REASON_RESOURCE_LIMIT", message: "Relay per-connection pool stream limit 4 reached" });
    for (const call of calls) {
      const end = await call.read();
      expect({ code: end.code, reason: end.reason, rstCode: end.rstCode }).to.deep.equal({ code: "8", reason: "RELAY_ERROR_REASON_SUBSCRIBER_LAGGED", rstCode: 0 });
    }
    // Their ends read, the connection's slots are back.
    await eventually(async () => expect(await firstData(a, SUBSCRIBE, subscribeBody(server!, "again"))).to.deep.include({ admitted: true }));
  });

  it("a snapshot the client does not read ends SNAPSHOT_PROGRESS_TIMEOUT after the progress timeout and frees its slot", async () => {
    // A 1 MiB chunk (128 KiB decoded densely, a byte per empty word): more than the client's 64 KiB window.
    server = await startRelay({ pools: [{ name: "default", expectedBlocks: 262_144 }], snapshotProgressTimeoutMs: 200, maxPoolStreamsTotal: 2, maxPoolStreamsPerConnection: 2 });
    const a = await connect();
    const calls = [stalled(a, SUBSCRIBE, subscribeBody(server, "s0")), stalled(a, SUBSCRIBE_DECODED, decodedBody(server, "s1", false))];
    const b = await connect();
    await eventually(async () => expect(await firstData(b, SUBSCRIBE, subscribeBody(server!, "other"))).to.deep.include({ admitted: true }), { timeoutMs: 10_000 });
    // One stream timing out is enough for that; the other may have moved a window's worth later, which restarts its
    // clock (progress is per frame). Read before it too timed out, its snapshot would simply finish: wait for both ends.
    await eventually(() => expect(server!.relay.pool("default")!.hub?.stats().subscribers).to.equal(0), { timeoutMs: 10_000 });
    // Both read at once: the two streams share the connection's 64 KiB window, and a stream left paused while the
    // other is read would keep the window filled with its own unread data, and the other's end would never arrive.
    const ends = await Promise.all(calls.map((call) => call.read()));
    for (const end of ends) {
      expect({ code: end.code, reason: end.reason }).to.deep.equal({ code: "8", reason: "RELAY_ERROR_REASON_SNAPSHOT_PROGRESS_TIMEOUT" });
    }
  });

  it("one connection, and one client address, hold at most their caps of pool streams, the decoded ones included", async () => {
    server = await startRelay({ pools: [{ name: "default", expectedBlocks: 64 }], maxPoolStreamsTotal: 8, maxPoolStreamsPerConnection: 2, maxPoolStreamsPerPeer: 3 });
    const a = await connect();
    const b = await connect();
    const open = [stalled(a, SUBSCRIBE, subscribeBody(server, "a0")), stalled(a, SUBSCRIBE_DECODED, decodedBody(server, "a1"))];
    await eventually(() => expect(server!.relay.pool("default")!.hub?.stats().subscribers).to.equal(2));
    const perConnection = await firstData(a, SUBSCRIBE_DECODED, decodedBody(server, "a2"));
    expect(perConnection.status).to.deep.equal({ code: "8", reason: "RELAY_ERROR_REASON_RESOURCE_LIMIT", message: "Relay per-connection pool stream limit 2 reached" });
    open.push(stalled(b, SUBSCRIBE, subscribeBody(server, "b0")));
    await eventually(() => expect(server!.relay.pool("default")!.hub?.stats().subscribers).to.equal(3));
    const perPeer = await firstData(b, SUBSCRIBE, subscribeBody(server, "b1"));
    expect(perPeer.status).to.deep.equal({ code: "8", reason: "RELAY_ERROR_REASON_RESOURCE_LIMIT", message: "Relay per-peer pool stream limit 3 reached" });
    // A stream cancelled gives its slots back.
    open[0]!.stream.close(http2.constants.NGHTTP2_CANCEL);
    await eventually(async () => expect(await firstData(b, SUBSCRIBE, subscribeBody(server!, "b2"))).to.deep.include({ admitted: true }));
  });

  it("200 subscriptions cancelled after their first DATA frame leave the connection usable: Health/Check answers on it", async () => {
    // A 1 MiB snapshot chunk; 64 of them left queued would exhaust the session's 64 MB.
    server = await startRelay({ pools: [{ name: "default", expectedBlocks: 262_144 }] });
    const session = await connect();
    const body = subscribeBody(server, "cancel");
    let withData = 0;
    for (let round = 0; round < 200; round++) {
      const call = startRawH2(session, { headers: grpcHeaders(SUBSCRIBE), body, timeoutMs: 10_000 });
      const data = await Promise.race([new Promise<boolean>((resolve) => call.stream.once("data", () => resolve(true))), call.response.then(() => false)]);
      if (data) withData += 1;
      call.stream.close(http2.constants.NGHTTP2_CANCEL);
      await call.response;
    }
    expect(withData, "rounds that got a DATA frame").to.equal(200);
    const health = await startRawH2(session, { headers: grpcHeaders(HEALTH_CHECK), body: grpcFrame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema, {}))) }).response;
    expect({ status: health.status, rstCode: health.rstCode, code: statusOf(health).code }).to.deep.equal({ status: 200, rstCode: 0, code: "0" });
  });
});
