/**
 * A delta's FilterUpdate is serialized once and its bytes shared by every
 * subscriber (written by the hub's fan-out on HTTP/2, server/pre-encoded.ts
 * and direct-delivery.ts): what each subscriber receives must still be the
 * same, correct message, on whichever request path serves it (the suite
 * runs under MMGATE_TEST_RPC_PATH=connect too), and for a Connect JSON
 * subscriber as for protobuf ones.
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { expect } from "chai";
import type * as http2 from "node:http2";
import { FilterUpdateKind, FilterUpdateSchema, KvEventRelay, SubscribeKvPoolRequestSchema, type FilterUpdate } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { KvEventService, PublishRequestSchema } from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { producerToWire, RELAY_CONTRACT_MARKER } from "../../../src/relay/index.js";
import { eventually } from "../../support/index.js";
import { connectH2, grpcFrame, parseGrpcFrames } from "../../support/raw-h2.js";
import { chain, startRelay, TestMirror, type RelayServer } from "./support.js";

const SUBSCRIBE = "/dynamo.kvrelay.v1.KvEventRelay/SubscribeKvPool";

/** A raw HTTP/2 subscriber: every message's bytes, as received. */
function rawSubscriber(session: http2.ClientHttp2Session, server: RelayServer, id: string): { messages: Buffer[]; stream: http2.ClientHttp2Stream } {
  const request = create(SubscribeKvPoolRequestSchema, { subscriberId: id, expectedProducer: producerToWire(server.relay.pool("default")!.producer), contractMarker: RELAY_CONTRACT_MARKER });
  const stream = session.request({ ":method": "POST", ":path": SUBSCRIBE, "content-type": "application/grpc", te: "trailers" });
  stream.on("error", () => undefined);
  stream.end(grpcFrame(toBinary(SubscribeKvPoolRequestSchema, request)));
  const messages: Buffer[] = [];
  let pending = Buffer.alloc(0);
  stream.on("data", (chunk: Buffer) => {
    const { frames, rest } = parseGrpcFrames(Buffer.concat([pending, chunk]));
    for (const frame of frames) {
      expect(frame.flags).to.equal(0);
      messages.push(Buffer.from(frame.payload));
    }
    pending = Buffer.from(rest);
  });
  return { messages, stream };
}

describe("relay pool streams: a delta serialized once for every subscriber", () => {
  let server: RelayServer;
  before(async () => {
    // Threshold 1, no coalescing: one delta per event.
    server = await startRelay({ pools: [{ name: "default", expectedBlocks: 4096, publicationThreshold: 1, coalesceWithinTurn: false }] });
  });
  after(async () => server.close());

  it("every subscriber gets the same bytes for each delta, a well-formed FilterUpdate stamped with its publication time; a Connect JSON subscriber the same fields", async () => {
    const pool = server.relay.pool("default")!;
    const sessions = await Promise.all([0, 1, 2, 3].map(() => connectH2(server.addr)));
    const subscribers = sessions.map((session, i) => rawSubscriber(session, server, `shared-${i}`));
    // Connect's own protocol with JSON: always served by connect, never given the shared bytes.
    const json = createClient(KvEventRelay, createConnectTransport({ baseUrl: `http://${server.addr}`, httpVersion: "2", useBinaryFormat: false }));
    const abort = new AbortController();
    const jsonUpdates: FilterUpdate[] = [];
    const jsonDone = (async () => {
      const request = { subscriberId: "shared-json", expectedProducer: producerToWire(pool.producer), contractMarker: RELAY_CONTRACT_MARKER };
      for await (const update of json.subscribeKvPool(request, { signal: abort.signal })) jsonUpdates.push(update);
    })().catch(() => undefined);
    await eventually(() => expect(pool.stats().subscribers).to.equal(5));
    await eventually(() => expect(subscribers.every((s) => s.messages.length >= 1) && jsonUpdates.length >= 1).to.equal(true));

    const publisher = createClient(KvEventService, server.connectTransport);
    const events = 12;
    for (let i = 0; i < events; i++) await publisher.publish((async function* () {
      yield create(PublishRequestSchema, { pool: "default", events: [chain(BigInt(i % 3) + 1n, 10_000n * BigInt(i + 1), 3)] });
    })());
    const deltasOf = (messages: Buffer[]) => messages.filter((bytes) => fromBinary(FilterUpdateSchema, bytes).kind === FilterUpdateKind.DELTA);
    await eventually(() => expect(subscribers.every((s) => deltasOf(s.messages).length === events) && jsonUpdates.filter((u) => u.kind === FilterUpdateKind.DELTA).length === events).to.equal(true));

    const first = deltasOf(subscribers[0]!.messages);
    for (const subscriber of subscribers.slice(1)) {
      const deltas = deltasOf(subscriber.messages);
      for (let i = 0; i < events; i++) expect(deltas[i]!.equals(first[i]!), `delta ${i}`).to.equal(true);
    }
    const jsonDeltas = jsonUpdates.filter((u) => u.kind === FilterUpdateKind.DELTA);
    let previous = 0n;
    for (let i = 0; i < events; i++) {
      const update = fromBinary(FilterUpdateSchema, first[i]!);
      // The bytes are protobuf's own serialization of the message they carry.
      expect(Buffer.from(toBinary(FilterUpdateSchema, update)).equals(first[i]!)).to.equal(true);
      expect(update.sequence).to.equal(update.baseSequence + 1n);
      expect(update.contractMarker).to.equal(RELAY_CONTRACT_MARKER);
      expect(update.sendTsUs >= previous).to.equal(true);
      previous = update.sendTsUs;
      // The same message for the JSON subscriber: same sequences, payload and publication time.
      expect(jsonDeltas[i]!.sequence).to.equal(update.sequence);
      expect(jsonDeltas[i]!.sendTsUs).to.equal(update.sendTsUs);
      expect(Buffer.from(jsonDeltas[i]!.payload).equals(Buffer.from(update.payload))).to.equal(true);
    }

    // And the frames rebuild the producer's filter.
    const mirror = new TestMirror(pool.producer.format.seed, pool.producer.format.bucketCount);
    for (const bytes of subscribers[0]!.messages) {
      const update = fromBinary(FilterUpdateSchema, bytes);
      const kind = ({ [FilterUpdateKind.SNAPSHOT_CHUNK]: "SNAPSHOT_CHUNK", [FilterUpdateKind.DELTA]: "DELTA", [FilterUpdateKind.HEARTBEAT]: "HEARTBEAT" } as const)[update.kind as 1 | 2 | 3];
      mirror.apply({ kind, baseSequence: update.baseSequence, sequence: update.sequence, payload: update.payload });
    }
    expect(Buffer.from(mirror.words!.buffer).equals(Buffer.from(pool.words().buffer))).to.equal(true);

    abort.abort();
    await jsonDone;
    for (const s of subscribers) s.stream.close();
    for (const session of sessions) session.close();
  });
});
