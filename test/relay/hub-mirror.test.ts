import { expect } from "chai";
import { laneLease } from "../../src/kv/index.js";
import { FRAME_ENVELOPE_HEADROOM_BYTES, HubError, HubMirror, publicationFrame, type HubErrorCode } from "../../src/relay/hub/index.js";
import { BUCKETS, delta, ID, identity, LEASE, snapshot } from "./hub-helpers.js";

function codeOf(f: () => unknown): HubErrorCode {
  try {
    f();
  } catch (error) {
    expect(error).to.be.instanceOf(HubError);
    return (error as HubError).code;
  }
  return expect.fail("expected a HubError");
}

/** The mirror's observable state, as plain values. */
function observe(mirror: HubMirror): { sequence: bigint; words: bigint[]; buffer: ArrayBufferLike } {
  const pin = mirror.pin();
  const state = { sequence: pin.snapshot.sequence, words: [...pin.snapshot.buckets], buffer: pin.snapshot.buckets.buffer };
  pin.release();
  return state;
}

describe("relay hub: HubMirror (B.7)", () => {
  it("installs a copy of the snapshot, so the producer's array and the mirror never alias", () => {
    const source = snapshot(5n, 3n);
    const mirror = new HubMirror(source);
    source.buckets[0] = 99n;
    const pin = mirror.pin();
    expect(pin.snapshot.buckets[0]).to.equal(3n);
    expect(pin.snapshot.buckets.buffer).to.not.equal(source.buckets.buffer);
    expect(pin.snapshot.sequence).to.equal(5n);
    expect(pin.snapshot.identity).to.equal(ID);
    expect(pin.snapshot.lease).to.equal(LEASE);
    pin.release();
  });

  it("refuses a snapshot whose word count is not its format's bucket count", () => {
    const bad = { ...snapshot(), buckets: new BigUint64Array(BUCKETS - 1) };
    expect(codeOf(() => new HubMirror(bad))).to.equal("SnapshotBucketCount");
  });

  it("applies a delta: overwrites the words and advances the sequence by one", () => {
    const mirror = new HubMirror(snapshot(5n));
    mirror.applyDelta(delta(5n, [{ bucket: 0, value: 7n }, { bucket: BUCKETS - 1, value: 2n ** 64n - 1n }]));
    mirror.applyDelta(delta(6n, [{ bucket: 0, value: 0n }]));
    const state = observe(mirror);
    expect(state.sequence).to.equal(7n);
    expect(state.words[0]).to.equal(0n);
    expect(state.words[BUCKETS - 1]).to.equal(2n ** 64n - 1n);
  });

  it("applies a delta's columns as it applies its images, a held lane copied first", () => {
    const images = [{ bucket: 0, value: 7n }, { bucket: BUCKETS - 1, value: 2n ** 64n - 1n }, { bucket: 3, value: 0x8000_0000_0000_0001n }];
    const columns = { buckets: Uint32Array.from(images.map((i) => i.bucket)), values: BigUint64Array.from(images.map((i) => i.value)) };
    const a = new HubMirror(snapshot(5n, 1n));
    const b = new HubMirror(snapshot(5n, 1n));
    const held = b.pin();
    a.applyDelta(delta(5n, images));
    b.applyDelta({ ...delta(5n, []), columns });
    expect(observe(b)).to.deep.include({ sequence: 6n, words: observe(a).words });
    expect([...held.snapshot.buckets].every((w) => w === 1n)).to.equal(true);
    held.release();
  });

  describe("rejects, leaving the mirror exactly as it was", () => {
    const cases: { name: string; code: HubErrorCode; make: () => ReturnType<typeof delta> }[] = [
      { name: "another producer generation", code: "IdentityChanged", make: () => delta(5n, undefined, { identity: identity(1, 12n) }) },
      { name: "another pool", code: "IdentityChanged", make: () => delta(5n, undefined, { identity: identity(9) }) },
      {
        name: "another lease",
        code: "LeaseChanged",
        make: () => delta(5n, undefined, { lease: laneLease({ consumerInstance: 11n, physicalLane: 0, assignmentEpoch: 2n }) }),
      },
      { name: "a base behind the mirror", code: "SequenceGap", make: () => delta(4n) },
      { name: "a base ahead of the mirror", code: "SequenceGap", make: () => delta(6n) },
      { name: "a step of two", code: "SequenceGap", make: () => ({ ...delta(5n), sequence: 7n }) },
      { name: "a step of zero", code: "SequenceGap", make: () => ({ ...delta(5n), sequence: 5n }) },
      { name: "a bucket at the lane's length (after valid images)", code: "BucketOutOfRange", make: () => delta(5n, [{ bucket: 1, value: 1n }, { bucket: BUCKETS, value: 1n }]) },
      { name: "a negative bucket", code: "BucketOutOfRange", make: () => delta(5n, [{ bucket: -1, value: 1n }]) },
      { name: "a fractional bucket", code: "BucketOutOfRange", make: () => delta(5n, [{ bucket: 1.5, value: 1n }]) },
      { name: "a value over u64", code: "InvalidImage", make: () => delta(5n, [{ bucket: 2, value: 1n }, { bucket: 3, value: 2n ** 64n }]) },
      { name: "a negative value", code: "InvalidImage", make: () => delta(5n, [{ bucket: 3, value: -1n }]) },
      {
        name: "a column bucket at the lane's length",
        code: "BucketOutOfRange",
        make: () => ({ ...delta(5n, []), columns: { buckets: Uint32Array.of(1, BUCKETS), values: BigUint64Array.of(1n, 1n) } }),
      },
      {
        name: "columns of different lengths",
        code: "InvalidImage",
        make: () => ({ ...delta(5n, []), columns: { buckets: Uint32Array.of(1, 2), values: BigUint64Array.of(1n) } }),
      },
    ];
    for (const { name, code, make } of cases) {
      it(`${code}: ${name}`, () => {
        const mirror = new HubMirror(snapshot(5n, 1n));
        const before = observe(mirror);
        expect(codeOf(() => mirror.applyDelta(make()))).to.equal(code);
        const after = observe(mirror);
        expect(after.sequence).to.equal(before.sequence);
        expect(after.words).to.deep.equal(before.words);
        expect(after.buffer).to.equal(before.buffer);
        expect(mirror.laneCopies).to.equal(0);
        // And it still takes the right delta.
        mirror.applyDelta(delta(5n));
        expect(mirror.sequence).to.equal(6n);
      });
    }

    it("SequenceGap carries current, base and next", () => {
      const mirror = new HubMirror(snapshot(5n));
      try {
        mirror.applyDelta({ ...delta(8n), sequence: 10n });
        expect.fail("expected SequenceGap");
      } catch (error) {
        expect((error as HubError).code).to.equal("SequenceGap");
        expect((error as HubError).details).to.deep.equal({ current: 5n, base: 8n, next: 10n });
      }
    });

    it("checks identity before lease before sequence", () => {
      const mirror = new HubMirror(snapshot(5n));
      const otherLease = laneLease({ consumerInstance: 1n, physicalLane: 0, assignmentEpoch: 1n });
      expect(codeOf(() => mirror.applyDelta(delta(9n, undefined, { identity: identity(3), lease: otherLease })))).to.equal("IdentityChanged");
      expect(codeOf(() => mirror.applyDelta(delta(9n, [{ bucket: 99, value: 0n }], { lease: otherLease })))).to.equal("LeaseChanged");
      expect(codeOf(() => mirror.applyDelta(delta(9n, [{ bucket: 99, value: 0n }])))).to.equal("SequenceGap");
    });
  });

  describe("copy-on-write", () => {
    it("a held snapshot is unchanged after a delta; the mirror moves on with a copy", () => {
      const mirror = new HubMirror(snapshot(5n, 1n));
      const held = mirror.pin();
      const words = [...held.snapshot.buckets];
      mirror.applyDelta(delta(5n, [{ bucket: 0, value: 42n }]));
      mirror.applyDelta(delta(6n, [{ bucket: 1, value: 43n }]));
      expect(held.snapshot.sequence).to.equal(5n);
      expect([...held.snapshot.buckets]).to.deep.equal(words);
      expect(mirror.laneCopies).to.equal(1); // the copy is unpinned, so the second delta wrote it in place
      const now = observe(mirror);
      expect(now.buffer).to.not.equal(held.snapshot.buckets.buffer);
      expect(now.words.slice(0, 2)).to.deep.equal([42n, 43n]);
      expect(now.sequence).to.equal(7n);
      held.release();
    });

    it("an unheld lane is written in place: the same buffer before and after", () => {
      const mirror = new HubMirror(snapshot(5n));
      const before = observe(mirror); // pinned, then released
      mirror.applyDelta(delta(5n, [{ bucket: 4, value: 9n }]));
      const after = observe(mirror);
      expect(after.buffer).to.equal(before.buffer);
      expect(after.words[4]).to.equal(9n);
      expect(mirror.laneCopies).to.equal(0);
    });

    it("copies once per held lane, and a pin on an old lane does not hold the new one", () => {
      const mirror = new HubMirror(snapshot(5n));
      const a = mirror.pin();
      const b = mirror.pin();
      mirror.applyDelta(delta(5n)); // copies: a and b hold lane 1
      const lane2 = observe(mirror).buffer;
      a.release();
      mirror.applyDelta(delta(6n)); // b still holds lane 1, not lane 2: in place
      expect(observe(mirror).buffer).to.equal(lane2);
      expect(mirror.laneCopies).to.equal(1);
      expect(mirror.pinned).to.equal(1);
      b.release();
      b.release(); // idempotent
      expect(mirror.pinned).to.equal(0);
    });
  });
});

describe("relay hub: publicationFrame", () => {
  it("counts payload plus the envelope headroom, and freezes the frame", () => {
    const payload = new Uint8Array(100);
    const frame = publicationFrame({ identity: ID, baseSequence: 3n, sequence: 4n, kind: "delta", payload });
    expect(frame.queuedBytes).to.equal(100 + FRAME_ENVELOPE_HEADROOM_BYTES);
    expect(FRAME_ENVELOPE_HEADROOM_BYTES).to.equal(256);
    expect(frame.payload).to.equal(payload); // not copied
    expect(Object.isFrozen(frame)).to.equal(true);
    const chunk = publicationFrame({ identity: ID, baseSequence: 3n, sequence: 3n, kind: "snapshot_chunk", payload: new Uint8Array(0) });
    expect(chunk.queuedBytes).to.equal(256);
  });

  it("refuses sequences that do not fit the kind, or are not u64s", () => {
    const payload = new Uint8Array(1);
    expect(codeOf(() => publicationFrame({ identity: ID, baseSequence: 3n, sequence: 3n, kind: "delta", payload }))).to.equal("InvalidFrame");
    expect(codeOf(() => publicationFrame({ identity: ID, baseSequence: 3n, sequence: 4n, kind: "snapshot_chunk", payload }))).to.equal("InvalidFrame");
    expect(codeOf(() => publicationFrame({ identity: ID, baseSequence: 2n ** 64n - 1n, sequence: 2n ** 64n, kind: "delta", payload }))).to.equal("InvalidFrame");
    expect(codeOf(() => publicationFrame({ identity: ID, baseSequence: -1n, sequence: 0n, kind: "delta", payload }))).to.equal("InvalidFrame");
  });
});
