import { expect } from "chai";
import { create } from "@bufbuild/protobuf";
import { FilterUpdateKind, RelayIdentitySchema, type FilterUpdate } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { xxh3Low32 } from "../../../src/bytes/index.js";
import type { ProducerIdentity } from "../../../src/kv/index.js";
import {
  ConsumerError,
  encodeDelta,
  encodeSnapshotChunk,
  FilterFormat,
  LaneMirror,
  SNAPSHOT_CHUNK_BUCKETS,
  type ConsumerErrorCode,
} from "../../../src/relay/index.js";
import { producerToWire } from "../../../src/relay/wire/index.js";
import { FakeClock } from "../../support/clock.js";
import {
  applyImages,
  deltaUpdate,
  filterFormat,
  heartbeatUpdate,
  prng,
  producer,
  randomImages,
  randomWord,
  sameBytes,
  snapshotUpdates,
  update,
} from "./mirror-helpers.js";

const ID = producer();
const BIG = producer({ bucketCount: 1 << 20 });
const SEQ = 5n;

function wordsOf(bucketCount: number, seed: number): BigUint64Array {
  const random = prng(seed);
  const words = new BigUint64Array(bucketCount);
  for (let i = 0; i < bucketCount; i++) words[i] = random() < 0.6 ? randomWord(random) : 0n;
  return words;
}

const SOURCE = wordsOf(16, 1);

/** A mirror of ID, ready at SEQ with SOURCE. */
function readyMirror(clock = new FakeClock()): LaneMirror {
  const mirror = new LaneMirror(ID, { now: clock.now });
  for (const u of snapshotUpdates(ID, SEQ, SOURCE)) mirror.apply(u);
  expect(mirror.state).to.equal("ready");
  return mirror;
}

function codeOf(f: () => unknown): ConsumerErrorCode {
  try {
    f();
  } catch (error) {
    expect(error).to.be.instanceOf(ConsumerError);
    return (error as ConsumerError).code;
  }
  return expect.fail("expected a ConsumerError");
}

/** A delta frame whose first image's bucket is patched to `bucket`, checksum fixed up (the encoder refuses it). */
function deltaWithBucket(id: ProducerIdentity, base: bigint, bucket: number): FilterUpdate {
  const payload = encodeDelta(filterFormat(id), id.poolId.dcId, base, base + 1n, [{ bucket: 0, value: 9n }]);
  const view = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  view.setUint32(48 + 12, bucket, true);
  view.setUint32(44, xxh3Low32(payload.subarray(48), 0n), true);
  return update(id, { kind: FilterUpdateKind.DELTA, baseSequence: base, sequence: base + 1n, payload });
}

const OTHER_RELAY = create(RelayIdentitySchema, { drtInstanceId: 1n, relayIncarnation: 0xdefn });
const OTHER_FORMAT = new FilterFormat(0xbadn, 16);

interface Case {
  readonly name: string;
  /** The mirror's state when the bad update arrives. */
  readonly from: "assembling" | "ready";
  /** Mirror the 2^20-bucket producer instead of the 16-bucket one (assembling cases only). */
  readonly big?: boolean;
  /** Updates that go in first (and are accepted). */
  readonly before?: () => FilterUpdate[];
  readonly bad: () => FilterUpdate;
  readonly code: ConsumerErrorCode;
}

const chunk = (init: Partial<Omit<FilterUpdate, "$typeName">> = {}) => snapshotUpdates(ID, SEQ, SOURCE, init)[0]!;
const delta = (init: Partial<Omit<FilterUpdate, "$typeName">> = {}) => deltaUpdate(ID, SEQ, [{ bucket: 3, value: 7n }], init);

const CASES: readonly Case[] = [
  // the envelope, in either state
  { name: "a wrong contract marker", from: "assembling", bad: () => chunk({ contractMarker: 0x4b565232 }), code: "ContractMarker" },
  { name: "a zero contract marker on a heartbeat", from: "ready", bad: () => heartbeatUpdate(ID, SEQ, { contractMarker: 0 }), code: "ContractMarker" },
  { name: "protocol version 2", from: "assembling", bad: () => chunk({ protocolVersion: 2 }), code: "ProtocolVersion" },
  { name: "protocol version 0 on a delta", from: "ready", bad: () => delta({ protocolVersion: 0 }), code: "ProtocolVersion" },
  { name: "no relay identity", from: "assembling", bad: () => chunk({ relay: undefined }), code: "MalformedEnvelope" },
  { name: "no producer", from: "assembling", bad: () => chunk({ producer: undefined }), code: "MalformedEnvelope" },
  {
    name: "a producer with layout generation 0",
    from: "ready",
    bad: () => heartbeatUpdate(ID, SEQ, { producer: { ...producerToWire(ID), layoutGeneration: 0n } }),
    code: "MalformedEnvelope",
  },
  { name: "another producer incarnation", from: "assembling", bad: () => chunk({ producer: producerToWire(producer({ incarnation: 12n })) }), code: "ProducerDrift" },
  { name: "another layout generation", from: "ready", bad: () => delta({ producer: producerToWire(producer({ layoutGeneration: 2n })) }), code: "ProducerDrift" },
  { name: "another pool", from: "ready", bad: () => heartbeatUpdate(ID, SEQ, { producer: producerToWire(producer({ pool: 2 })) }), code: "ProducerDrift" },
  { name: "another CKF seed", from: "assembling", bad: () => chunk({ producer: producerToWire(producer({ seed: 0xbadn })) }), code: "ProducerDrift" },
  { name: "another relay incarnation mid-stream", from: "ready", bad: () => heartbeatUpdate(ID, SEQ, { relay: OTHER_RELAY }), code: "RelayDrift" },
  {
    name: "another relay between two snapshot chunks",
    from: "assembling",
    before: () => snapshotUpdates(BIG, SEQ, new BigUint64Array(1 << 20)).slice(0, 1),
    bad: () => snapshotUpdates(BIG, SEQ, new BigUint64Array(1 << 20), { relay: OTHER_RELAY })[1]!,
    code: "RelayDrift",
  },
  // kinds
  { name: "kind UNSPECIFIED", from: "assembling", bad: () => chunk({ kind: FilterUpdateKind.UNSPECIFIED }), code: "UnknownKind" },
  { name: "an unknown kind", from: "ready", bad: () => delta({ kind: 9 as FilterUpdateKind }), code: "UnknownKind" },
  { name: "a heartbeat while assembling", from: "assembling", bad: () => heartbeatUpdate(ID, SEQ), code: "UnexpectedKind" },
  { name: "a delta while assembling", from: "assembling", bad: () => delta(), code: "UnexpectedKind" },
  { name: "a snapshot chunk while ready", from: "ready", bad: () => snapshotUpdates(ID, SEQ + 1n, SOURCE)[0]!, code: "UnexpectedKind" },
  // sequences
  { name: "a snapshot chunk with base != sequence", from: "assembling", bad: () => chunk({ baseSequence: SEQ - 1n }), code: "SequenceGap" },
  { name: "a delta past a gap", from: "ready", bad: () => deltaUpdate(ID, SEQ + 1n, [{ bucket: 1, value: 1n }]), code: "SequenceGap" },
  { name: "a delta skipping a sequence", from: "ready", bad: () => delta({ sequence: SEQ + 2n }), code: "SequenceGap" },
  { name: "a stale delta", from: "ready", bad: () => deltaUpdate(ID, SEQ - 1n, [{ bucket: 1, value: 1n }]), code: "SequenceGap" },
  { name: "a heartbeat ahead of the installed sequence", from: "ready", bad: () => heartbeatUpdate(ID, SEQ + 1n), code: "SequenceGap" },
  { name: "a heartbeat with base != sequence", from: "ready", bad: () => heartbeatUpdate(ID, SEQ, { baseSequence: SEQ - 1n }), code: "SequenceGap" },
  // CBI1 payloads
  { name: "a truncated snapshot chunk", from: "assembling", bad: () => chunk({ payload: new Uint8Array(40) }), code: "MalformedFrame" },
  {
    name: "a snapshot chunk with a bad checksum",
    from: "assembling",
    bad: () => {
      const u = chunk();
      const payload = u.payload.slice();
      payload[payload.length - 1]! ^= 1;
      return chunk({ payload });
    },
    code: "MalformedFrame",
  },
  { name: "a delta with an empty payload", from: "ready", bad: () => delta({ payload: new Uint8Array(0) }), code: "MalformedFrame" },
  { name: "a delta naming a bucket past the lane", from: "ready", bad: () => deltaWithBucket(ID, SEQ, 16), code: "MalformedFrame" },
  { name: "a heartbeat with a payload", from: "ready", bad: () => heartbeatUpdate(ID, SEQ, { payload: new Uint8Array(1) }), code: "MalformedFrame" },
  {
    name: "a snapshot chunk of another CKF seed",
    from: "assembling",
    bad: () => chunk({ payload: encodeSnapshotChunk(OTHER_FORMAT, 7n, SEQ, 0, 1, SOURCE) }),
    code: "FormatMismatch",
  },
  {
    name: "a delta of another bucket count",
    from: "ready",
    bad: () => delta({ payload: encodeDelta(new FilterFormat(0x5eedn, 32), 7n, SEQ, SEQ + 1n, [{ bucket: 1, value: 1n }]) }),
    code: "FormatMismatch",
  },
  { name: "a SNAPSHOT_CHUNK carrying a delta", from: "assembling", bad: () => chunk({ payload: encodeDelta(filterFormat(ID), 7n, SEQ, SEQ, [{ bucket: 1, value: 1n }]) }), code: "KindMismatch" },
  { name: "a DELTA carrying a snapshot chunk", from: "ready", bad: () => delta({ payload: encodeSnapshotChunk(filterFormat(ID), 7n, SEQ + 1n, 0, 1, SOURCE) }), code: "KindMismatch" },
  // chunk order
  {
    name: "chunk 1 first",
    from: "assembling",
    big: true,
    bad: () => snapshotUpdates(BIG, SEQ, new BigUint64Array(1 << 20))[1]!,
    code: "ChunkSequence",
  },
  {
    name: "chunk 0 twice (a restart mid-stream)",
    from: "assembling",
    before: () => snapshotUpdates(BIG, SEQ, new BigUint64Array(1 << 20)).slice(0, 1),
    bad: () => snapshotUpdates(BIG, SEQ, new BigUint64Array(1 << 20))[0]!,
    code: "ChunkSequence",
  },
  {
    name: "a chunk of another snapshot sequence",
    from: "assembling",
    before: () => snapshotUpdates(BIG, SEQ, new BigUint64Array(1 << 20)).slice(0, 1),
    bad: () => snapshotUpdates(BIG, SEQ + 1n, new BigUint64Array(1 << 20))[1]!,
    code: "ChunkSequence",
  },
  {
    name: "a chunk count other than ceil(B / 524,288)",
    from: "assembling",
    bad: () => chunk({ payload: encodeSnapshotChunk(filterFormat(ID), 7n, SEQ, 0, 2, SOURCE) }),
    code: "ChunkSequence",
  },
  {
    name: "a last chunk that leaves buckets uncovered",
    from: "assembling",
    before: () => snapshotUpdates(BIG, SEQ, new BigUint64Array(1 << 20)).slice(0, 1),
    bad: () =>
      update(BIG, {
        kind: FilterUpdateKind.SNAPSHOT_CHUNK,
        baseSequence: SEQ,
        sequence: SEQ,
        payload: encodeSnapshotChunk(filterFormat(BIG), 7n, SEQ, 1, 2, new BigUint64Array(SNAPSHOT_CHUNK_BUCKETS - 1)),
      }),
    code: "ChunkSequence",
  },
  // epochs and the datacenter
  {
    name: "a snapshot chunk whose epoch is not its sequence",
    from: "assembling",
    bad: () => chunk({ payload: encodeSnapshotChunk(filterFormat(ID), 7n, SEQ + 1n, 0, 1, SOURCE) }),
    code: "EpochMismatch",
  },
  {
    name: "a delta whose epoch is not its sequence",
    from: "ready",
    bad: () => delta({ payload: encodeDelta(filterFormat(ID), 7n, SEQ, SEQ + 2n, [{ bucket: 1, value: 1n }]) }),
    code: "EpochMismatch",
  },
  {
    name: "a delta whose base epoch is not its base sequence",
    from: "ready",
    bad: () => delta({ payload: encodeDelta(filterFormat(ID), 7n, SEQ - 1n, SEQ + 1n, [{ bucket: 1, value: 1n }]) }),
    code: "EpochMismatch",
  },
  { name: "a snapshot chunk from another datacenter", from: "assembling", bad: () => chunk({ payload: encodeSnapshotChunk(filterFormat(ID), 8n, SEQ, 0, 1, SOURCE) }), code: "DcMismatch" },
  {
    name: "a delta from another datacenter",
    from: "ready",
    bad: () => delta({ payload: encodeDelta(filterFormat(ID), 8n, SEQ, SEQ + 1n, [{ bucket: 1, value: 1n }]) }),
    code: "DcMismatch",
  },
  // B.9's delta rules
  { name: "an empty delta", from: "ready", bad: () => deltaUpdate(ID, SEQ, []), code: "EmptyDelta" },
  {
    name: "a delta naming a bucket twice",
    from: "ready",
    bad: () => deltaUpdate(ID, SEQ, [{ bucket: 3, value: 1n }, { bucket: 9, value: 2n }, { bucket: 3, value: 4n }]),
    code: "DuplicateBucket",
  },
];

describe("relay consumer: LaneMirror", () => {
  describe("happy paths", () => {
    it("assembles a two-chunk snapshot (2^20 buckets) into the exact lane, then follows deltas byte for byte", () => {
      const source = new BigUint64Array(1 << 20);
      const random = prng(7);
      for (let i = 0; i < 4096; i++) source[Math.floor(random() * source.length)] = randomWord(random);
      source[0] = 11n;
      source[524_289] = 22n;
      source[(1 << 20) - 1] = 33n;
      const clock = new FakeClock(1_000);
      const mirror = new LaneMirror(BIG, { now: clock.now });
      expect(mirror.progress).to.deep.equal({ chunksReceived: 0, chunksExpected: 2 });
      const [first, second] = snapshotUpdates(BIG, 6n, source);
      expect(mirror.apply(first!)).to.deep.equal({ kind: "chunk", chunkIndex: 0, chunksReceived: 1, chunksExpected: 2 });
      expect(mirror.state).to.equal("assembling");
      expect(mirror.words, "a partial snapshot is never exposed").to.equal(undefined);
      expect(mirror.installedSequence).to.equal(undefined);
      expect(mirror.progress).to.deep.equal({ chunksReceived: 1, chunksExpected: 2 });
      clock.advance(5);
      expect(mirror.apply(second!)).to.deep.equal({ kind: "ready", sequence: 6n, chunksExpected: 2 });
      expect(mirror.state).to.equal("ready");
      expect(mirror.installedSequence).to.equal(6n);
      expect(mirror.progress).to.deep.equal({ chunksReceived: 2, chunksExpected: 2 });
      expect(mirror.lastFrameAt).to.equal(1_005);
      expect(sameBytes(mirror.words, source)).to.equal(true);

      for (let sequence = 6n; sequence < 16n; sequence++) {
        const images = randomImages(random, source.length, 1 + Math.floor(random() * 50));
        applyImages(source, images);
        expect(mirror.apply(deltaUpdate(BIG, sequence, images))).to.deep.equal({ kind: "delta", sequence: sequence + 1n, images: images.length });
      }
      expect(mirror.installedSequence).to.equal(16n);
      expect(sameBytes(mirror.words, source)).to.equal(true);
      expect(mirror.frames).to.equal(12);
    });

    it("installs a one-chunk snapshot at once, zeros included, and takes heartbeats as liveness only", () => {
      const clock = new FakeClock(50);
      const mirror = new LaneMirror(ID, { now: clock.now });
      const [only] = snapshotUpdates(ID, SEQ, SOURCE, { sendTsUs: 111n });
      expect(mirror.apply(only!)).to.deep.equal({ kind: "ready", sequence: SEQ, chunksExpected: 1 });
      expect(sameBytes(mirror.words, SOURCE)).to.equal(true);
      expect(mirror.lastSendTsUs).to.equal(111n);
      expect(mirror.relayIdentity).to.deep.equal({ drtInstanceId: 1n, relayIncarnation: 0xabcn });
      clock.advance(10_000);
      expect(mirror.apply(heartbeatUpdate(ID, SEQ, { sendTsUs: 222n }))).to.deep.equal({ kind: "heartbeat", sequence: SEQ, sendTsUs: 222n });
      expect(mirror.lastFrameAt).to.equal(10_050);
      expect(mirror.lastSendTsUs).to.equal(222n);
      expect(mirror.installedSequence).to.equal(SEQ);
      expect(sameBytes(mirror.words, SOURCE)).to.equal(true);
      // A delta that empties a bucket (value 0) is a change like any other.
      const images = [{ bucket: 2, value: 0n }, { bucket: 15, value: 0xffff_0000_0000_0001n }];
      mirror.apply(deltaUpdate(ID, SEQ, images));
      const expected = SOURCE.slice();
      applyImages(expected, images);
      expect(sameBytes(mirror.words, expected)).to.equal(true);
    });

    it("accepts a snapshot at sequence 0 and the delta 0 -> 1", () => {
      const mirror = new LaneMirror(ID);
      for (const u of snapshotUpdates(ID, 0n, SOURCE)) mirror.apply(u);
      expect(mirror.installedSequence).to.equal(0n);
      mirror.apply(deltaUpdate(ID, 0n, [{ bucket: 0, value: 1n }]));
      expect(mirror.installedSequence).to.equal(1n);
    });

    it("gives every mirror a lane of its own", () => {
      const a = readyMirror();
      const b = readyMirror();
      a.apply(deltaUpdate(ID, SEQ, [{ bucket: 0, value: 5n }]));
      expect(b.words![0]).to.equal(SOURCE[0]);
      expect(a.words).to.not.equal(b.words);
    });
  });

  describe("violations: each throws its code and leaves the mirror unusable", () => {
    for (const c of CASES) {
      it(`${c.code}: ${c.name}`, () => {
        const mirror = c.from === "ready" ? readyMirror() : new LaneMirror(c.big === true || c.before !== undefined ? BIG : ID);
        for (const u of c.before?.() ?? []) mirror.apply(u);
        expect(mirror.state).to.equal(c.from);
        const bad = c.bad();
        expect(codeOf(() => mirror.apply(bad))).to.equal(c.code);
        expect(mirror.state).to.equal("failed");
        expect(mirror.failure?.code).to.equal(c.code);
        expect(mirror.words).to.equal(undefined);
        expect(mirror.installedSequence).to.equal(undefined);
        // Nothing after a violation is applied: not the frame that would have
        // continued the stream, not a fresh snapshot on the same mirror.
        const next = c.from === "ready" ? deltaUpdate(ID, SEQ, [{ bucket: 1, value: 1n }]) : snapshotUpdates(ID, SEQ, SOURCE)[0]!;
        expect(codeOf(() => mirror.apply(next))).to.equal("Invalidated");
        expect(codeOf(() => mirror.apply(snapshotUpdates(ID, SEQ, SOURCE)[0]!))).to.equal("Invalidated");
      });
    }

    it("never buffers across a gap: the missing delta after the gap is refused too", () => {
      const mirror = readyMirror();
      expect(codeOf(() => mirror.apply(deltaUpdate(ID, SEQ + 1n, [{ bucket: 1, value: 1n }])))).to.equal("SequenceGap");
      expect(codeOf(() => mirror.apply(deltaUpdate(ID, SEQ, [{ bucket: 2, value: 2n }])))).to.equal("Invalidated");
    });

    it("keeps the codec's error as the cause", () => {
      const mirror = new LaneMirror(ID);
      try {
        mirror.apply(chunk({ payload: new Uint8Array(10) }));
        expect.fail("expected a violation");
      } catch (error) {
        expect((error as ConsumerError).details).to.deep.equal({ cbi1: "Truncated" });
        expect((error as Error).cause).to.have.property("code", "Truncated");
      }
    });
  });
});
