import { expect } from "chai";
import { digestIdentity, formatIdentity, poolId, producerIdentity, relayLease, type DcCkfDelta } from "../../src/kv/index.js";
import { HubMirror } from "../../src/relay/hub/index.js";

/** 2^21 buckets: above the size the mirror copies in one go. */
const BIG = 1 << 21;
const ID = producerIdentity({
  poolId: poolId({ cacheSemantics: digestIdentity(new Uint8Array(16).fill(1), "Explicit"), routingScope: digestIdentity(new Uint8Array(16).fill(2), "Explicit"), dcId: 7n }),
  producerIncarnation: 11n,
  layoutGeneration: 1n,
  format: formatIdentity(0x5eedn, BIG),
});
const LEASE = relayLease(ID);

function lane(): BigUint64Array {
  const words = new BigUint64Array(BIG);
  for (let i = 0; i < BIG; i += 97) words[i] = BigInt(i) * 0x1_0000_0001n;
  return words;
}

/** Byte-equal lanes (deep.equal over millions of bigints takes seconds). */
function same(a: BigUint64Array, b: BigUint64Array): boolean {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}

function delta(base: bigint, buckets: number[]): DcCkfDelta {
  return { identity: ID, lease: LEASE, baseSequence: base, sequence: base + 1n, images: buckets.map((bucket) => ({ bucket, value: base * 1000n + BigInt(bucket) })) };
}

describe("relay hub: a large pinned lane is copied in steps", () => {
  it("a subscriber's pinned snapshot stays as it was while deltas go to a new lane filled over several turns", async () => {
    const initial = lane();
    const mirror = new HubMirror({ identity: ID, lease: LEASE, sequence: 5n, buckets: initial.slice() });
    const held = mirror.pin();
    // Ahead of the fill and behind it, and one bucket written twice.
    mirror.applyDelta(delta(5n, [0, 1_000_000, BIG - 1]));
    expect(mirror.settled).to.equal(false);
    mirror.applyDelta(delta(6n, [1_000_000, 3]));
    await mirror.whenSettled();
    expect(mirror.settled).to.equal(true);
    expect(mirror.laneCopies).to.equal(1);
    // The held snapshot is the lane at 5, untouched.
    expect(held.snapshot.sequence).to.equal(5n);
    expect(same(held.snapshot.buckets, initial)).to.equal(true);
    held.release();
    const expected = initial.slice();
    for (const d of [delta(5n, [0, 1_000_000, BIG - 1]), delta(6n, [1_000_000, 3])]) for (const image of d.images) expected[image.bucket] = image.value;
    const now = mirror.pin();
    expect(now.snapshot.sequence).to.equal(7n);
    expect(same(now.snapshot.buckets, expected)).to.equal(true);
    now.release();
  });

  it("a subscriber that comes while the fill runs gets the whole lane: the rest is copied then", () => {
    const initial = lane();
    const mirror = new HubMirror({ identity: ID, lease: LEASE, sequence: 1n, buckets: initial.slice() });
    const held = mirror.pin();
    mirror.applyDelta(delta(1n, [7, BIG - 2]));
    expect(mirror.settled).to.equal(false);
    const now = mirror.pin();
    expect(mirror.settled).to.equal(true);
    const expected = initial.slice();
    expected[7] = 1007n;
    expected[BIG - 2] = BigInt(1000 + BIG - 2);
    expect(same(now.snapshot.buckets, expected)).to.equal(true);
    expect(same(held.snapshot.buckets, initial)).to.equal(true);
    now.release();
    held.release();
    mirror.dispose();
  });
});
