/**
 * The seed's publication round trip over the wire: the producer's barrier
 * snapshot goes out as CBI1 snapshot chunks that assemble to exactly its
 * lane, and the continuation's delta frame, applied on top, gives exactly
 * its next barrier snapshot — for the standard and Eagle formats, for a base
 * model and for a LoRA reached through an alias (salted with the canonical
 * adapter name).
 */
import { expect } from "chai";
import {
  blockHashOptionsFor,
  canonicalModelId,
  computeBlockHashForSeq,
  computeSeqHashForBlock,
  createKvQuerySemantics,
  createRegistration,
  createRegistrationWithTarget,
  DcCkfState,
  digestIdentity,
  hashFormatIdentityVersion,
  laneLease,
  loraTarget,
  modelAlias,
  poolId,
  producerIdentity,
  resolveRegistration,
  type DcCkfDelta,
  type KvQueryHashFormat,
} from "../../src/kv/index.js";
import { decode, FilterFormat, SnapshotAssembly } from "../../src/relay/cbi1/index.js";
import { seedStoredEvent } from "../kv/ckf-helpers.js";
import { encodeDeltaFrame, encodeSnapshot, MAX_DELTA_IMAGES, PublicationFrameError, PublicationHub, publishDelta, wireFormat } from "../../src/relay/index.js";

function roundTrip(hashFormat: KvQueryHashFormat, viaLoraAlias: boolean): void {
  const semantics = createKvQuerySemantics(4, hashFormat);
  const base = canonicalModelId("llama");
  const registration = viaLoraAlias
    ? createRegistrationWithTarget(canonicalModelId("tenant-a"), loraTarget(base, canonicalModelId("tenant-a")), [modelAlias("tenant-chat")])
    : createRegistration(base, []);
  const resolved = resolveRegistration([registration], viaLoraAlias ? "tenant-chat" : "llama");
  expect(resolved, "the request resolves through the advertised registration").to.not.equal(undefined);
  const options = blockHashOptionsFor(resolved!, semantics, "tenant-ns");
  expect(options.loraName).to.equal(viaLoraAlias ? "tenant-a" : undefined);

  const initialLocal = computeBlockHashForSeq(Array.from({ length: 13 }, (_, i) => i), semantics.kvBlockSize, options);
  const expandedLocal = computeBlockHashForSeq(Array.from({ length: 21 }, (_, i) => i), semantics.kvBlockSize, options);
  expect(expandedLocal.slice(0, initialLocal.length)).to.deep.equal(initialLocal);
  expect(expandedLocal.length).to.be.greaterThan(initialLocal.length);
  const initialSequence = computeSeqHashForBlock(initialLocal);
  const expandedSequence = computeSeqHashForBlock(expandedLocal);

  const producer = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 1 });
  const initial = producer.applyEvent(seedStoredEvent(1n, undefined, initialLocal, initialSequence));
  expect(initial.firstError).to.equal(undefined);
  expect(initial.publication).to.not.equal(undefined);
  const [, buckets] = producer.barrierSnapshot();

  const seed = hashFormatIdentityVersion(hashFormat) + (viaLoraAlias ? 10 : 0);
  const identity = producerIdentity({
    poolId: poolId({
      cacheSemantics: digestIdentity(new Uint8Array(16).fill(seed), "Explicit"),
      routingScope: digestIdentity(new Uint8Array(16).fill(seed + 1), "Explicit"),
      dcId: 7n,
    }),
    producerIncarnation: 11n,
    layoutGeneration: 1n,
    format: producer.format(),
  });
  const lease = laneLease({ consumerInstance: 13n, physicalLane: 0, assignmentEpoch: 1n });
  const format = new FilterFormat(identity.format.seed, identity.format.bucketCount);

  // The snapshot, chunk by chunk, into a consumer's assembly.
  const frames = encodeSnapshot({ identity, lease, sequence: 1n, buckets });
  const assembly = new SnapshotAssembly(format);
  let assembled: { epoch: bigint; words: BigUint64Array } | undefined;
  let seen = 0;
  for (const frame of frames) {
    seen++;
    expect(frame.identity).to.equal(identity);
    expect(frame.kind).to.equal("snapshot_chunk");
    expect([frame.baseSequence, frame.sequence]).to.deep.equal([1n, 1n]);
    assembled = assembly.absorb(decode(format, frame.payload)) ?? assembled;
  }
  expect(seen).to.equal(frames.count);
  expect(assembled, "every chunk assembled").to.not.equal(undefined);
  expect(assembled!.epoch).to.equal(1n);
  const consumer = assembled!.words.slice();
  expect(Buffer.from(consumer.buffer).equals(Buffer.from(buckets.buffer, buckets.byteOffset, buckets.byteLength))).to.equal(true);

  // The continuation's delta frame, applied on top.
  const continuation = producer.applyEvent(
    seedStoredEvent(2n, initialSequence.at(-1), expandedLocal.slice(initialLocal.length), expandedSequence.slice(initialSequence.length)),
  );
  expect(continuation.firstError).to.equal(undefined);
  const batch = continuation.publication;
  expect(batch, "the publication threshold emits the delta").to.not.equal(undefined);
  const delta: DcCkfDelta = { identity, lease, baseSequence: 1n, sequence: 2n, images: batch!.images };
  const frame = encodeDeltaFrame(delta);
  expect(frame.kind).to.equal("delta");
  const decoded = decode(format, frame.payload);
  if (decoded.kind !== "delta") throw new Error("the delta frame decoded as a snapshot chunk");
  expect(decoded.header.dcId).to.equal(7n);
  expect(decoded.baseEpoch).to.equal(1n);
  expect(decoded.header.epoch).to.equal(2n);
  for (const image of decoded.images) consumer[image.bucket] = image.value;
  const [, expected] = producer.barrierSnapshot();
  expect(Buffer.from(consumer.buffer).equals(Buffer.from(expected.buffer, expected.byteOffset, expected.byteLength))).to.equal(true);
}

describe("relay publication frames: the seed's CBI1 round trip", () => {
  for (const hashFormat of ["DYNAMO_STANDARD_V1", "DYNAMO_EAGLE_V1"] as const) {
    for (const viaLoraAlias of [false, true]) {
      it(`${hashFormat}, ${viaLoraAlias ? "LoRA through an alias" : "base model"}: the snapshot frames assemble to the producer's lane, and the delta gives its next one`, () => {
        roundTrip(hashFormat, viaLoraAlias);
      });
    }
  }
});

describe("relay publication frames: the adapter's errors", () => {
  const producer = new DcCkfState({ expectedBlocksPerDc: 64 });
  const identity = producerIdentity({
    poolId: poolId({ cacheSemantics: digestIdentity(new Uint8Array(16).fill(1), "Explicit"), routingScope: digestIdentity(new Uint8Array(16).fill(2), "Explicit"), dcId: 7n }),
    producerIncarnation: 11n,
    layoutGeneration: 1n,
    format: producer.format(),
  });
  const lease = laneLease({ consumerInstance: 13n, physicalLane: 0, assignmentEpoch: 1n });

  it("refuses a format identity CBI1 cannot carry, naming it", () => {
    for (const change of [{ formatVersion: 2 }, { fingerprintBits: 8 }, { slotsPerBucket: 2 }]) {
      const format = { ...identity.format, ...change } as unknown as typeof identity.format;
      expect(() => wireFormat(format)).to.throw(PublicationFrameError, /unsupported CKF format identity/).with.property("code", "UnsupportedFormatIdentity");
    }
  });

  it("refuses a snapshot whose lane is not the format's size", () => {
    const short = new BigUint64Array(identity.format.bucketCount - 1);
    expect(() => encodeSnapshot({ identity, lease, sequence: 1n, buckets: short })).to.throw(PublicationFrameError).with.property("code", "SnapshotBucketCount");
  });

  it("refuses a delta whose bucket index does not fit the wire's u32", () => {
    const delta: DcCkfDelta = { identity, lease, baseSequence: 1n, sequence: 2n, images: [{ bucket: 2 ** 32, value: 1n }] };
    expect(() => encodeDeltaFrame(delta)).to.throw(PublicationFrameError).with.property("code", "BucketIndexOverflow");
  });

  it("encodes snapshot chunks only as they are taken", () => {
    const frames = encodeSnapshot({ identity, lease, sequence: 3n, buckets: producer.barrierSnapshot()[1] });
    expect(frames.count).to.equal(1);
    const first = frames.next();
    expect(first.done).to.equal(false);
    expect(frames.next().done).to.equal(true);
  });
});

describe("relay publication frames: a producer delta through the hub", () => {
  const producer = new DcCkfState({ expectedBlocksPerDc: 1 << 21 });
  const identity = producerIdentity({
    poolId: poolId({ cacheSemantics: digestIdentity(new Uint8Array(16).fill(5), "Explicit"), routingScope: digestIdentity(new Uint8Array(16).fill(6), "Explicit"), dcId: 9n }),
    producerIncarnation: 3n,
    layoutGeneration: 1n,
    format: producer.format(),
  });
  const lease = laneLease({ consumerInstance: 3n, physicalLane: 0, assignmentEpoch: 1n });
  const readyHub = () => {
    const hub = new PublicationHub({ identity, lease });
    hub.publishSnapshot({ identity, lease, sequence: 1n, buckets: producer.barrierSnapshot()[1] });
    return hub;
  };

  it("fans a delta that fits one frame out to subscribers", async () => {
    const hub = readyHub();
    const subscriber = hub.subscribe();
    subscriber.takeSnapshot();
    const result = publishDelta(hub, { identity, lease, baseSequence: 1n, sequence: 2n, images: [{ bucket: 5, value: 42n }] });
    expect(result).to.include({ kind: "published", delivered: 1 });
    const read = await subscriber.next();
    expect(read.kind).to.equal("frame");
    hub.retire();
  });

  it("a delta with columns gives the frame and the mirror words the same delta with images gives", () => {
    const images = [
      { bucket: 5, value: 42n },
      { bucket: 0, value: (1n << 64n) - 1n },
      { bucket: identity.format.bucketCount - 1, value: 0x0123_4567_89ab_cdefn },
      { bucket: 7, value: 0n },
    ];
    const columns = { buckets: Uint32Array.from(images.map((i) => i.bucket)), values: BigUint64Array.from(images.map((i) => i.value)) };
    const plain: DcCkfDelta = { identity, lease, baseSequence: 1n, sequence: 2n, images };
    const columnar: DcCkfDelta = { ...plain, columns };
    expect([...encodeDeltaFrame(columnar).payload]).to.deep.equal([...encodeDeltaFrame(plain).payload]);
    const a = readyHub();
    const b = readyHub();
    publishDelta(a, plain);
    publishDelta(b, columnar);
    const words = (hub: PublicationHub) => {
      const subscriber = hub.subscribe();
      const snapshot = subscriber.takeSnapshot();
      return [...snapshot.buckets];
    };
    expect(words(b)).to.deep.equal(words(a));
    a.retire();
    b.retire();
  });

  it("turns a delta with more images than one CBI1 frame carries into snapshot recovery", async () => {
    const hub = readyHub();
    const subscriber = hub.subscribe();
    subscriber.takeSnapshot();
    const images = Array.from({ length: MAX_DELTA_IMAGES + 1 }, (_, i) => ({ bucket: i, value: 1n }));
    // The encoder alone refuses it: it cannot be one frame.
    expect(() => encodeDeltaFrame({ identity, lease, baseSequence: 1n, sequence: 2n, images })).to.throw(/DeltaImageCount|images/);
    const result = publishDelta(hub, { identity, lease, baseSequence: 1n, sequence: 2n, images });
    expect(result).to.include({ kind: "recovery_required", cause: "delta_images", closed: 1 });
    expect(await subscriber.next()).to.deep.equal({ kind: "ended", reason: "recovery" });
    expect(hub.state).to.equal("recovering");
  });
});
