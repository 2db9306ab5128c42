import { expect } from "chai";
import { CkfLane } from "../../src/kv/ckf/index.js";
import {
  Cbi1Error,
  decode,
  encodeDelta,
  encodeSnapshotChunk,
  encodeSnapshotChunkInto,
  encodeSnapshotChunks,
  FilterFormat,
  IMAGES_MAX_FRAME_BYTES,
  isCbi1Error,
  MAX_DELTA_IMAGES,
  peekFormat,
  SnapshotAssembly,
  SNAPSHOT_CHUNK_BUCKETS,
  sparseImages,
  type Cbi1DeltaFrame,
  type Cbi1ErrorCode,
  type Cbi1Frame,
  type Cbi1SnapshotChunkFrame,
  type FormatErrorKind,
} from "../../src/relay/cbi1/index.js";
import { atOffset, build, chunkBody, deltaBody, peerChecksum, recipe, repatch, SEED, type Recipe } from "./cbi1-helpers.js";

const FORMAT = new FilterFormat(SEED, 1024);
const IMAGES = [
  { bucket: 3, value: 0xaaaa_bbbb_cccc_ddddn },
  { bucket: 1000, value: 42n },
];

/** Runs `fn` and returns the Cbi1Error it throws; fails on anything else. */
function caught(fn: () => unknown): Cbi1Error {
  try {
    fn();
  } catch (error) {
    if (error instanceof Cbi1Error) return error;
    throw new Error(`expected a Cbi1Error, got ${String(error)}`, { cause: error });
  }
  throw new Error("expected a Cbi1Error, nothing was thrown");
}

function expectError(fn: () => unknown, code: Cbi1ErrorCode, formatKind?: FormatErrorKind): Cbi1Error {
  const error = caught(fn);
  expect(error.code, error.message).to.equal(code);
  if (formatKind !== undefined) expect(error.formatKind, error.message).to.equal(formatKind);
  return error;
}

const asDelta = (f: Cbi1Frame): Cbi1DeltaFrame => (f.kind === "delta" ? f : expect.fail("not a delta"));
const asChunk = (f: Cbi1Frame): Cbi1SnapshotChunkFrame => (f.kind === "snapshotChunk" ? f : expect.fail("not a snapshot chunk"));

describe("CBI1 codec", () => {
  describe("FilterFormat", () => {
    for (const n of [2, 4, 1024, 1 << 20, 1 << 24]) {
      it(`accepts ${n} buckets`, () => expect(new FilterFormat(1n, n).bucketCount).to.equal(n));
    }
    for (const n of [0, 1, 3, 1000, 1 << 25, 2 ** 40, -2, 1.5, Number.NaN, Infinity]) {
      it(`refuses ${n} buckets with Format(BucketCount)`, () => expectError(() => new FilterFormat(1n, n), "Format", "BucketCount"));
    }
    it("refuses a seed that is not a u64 with InvalidArgument", () => {
      expectError(() => new FilterFormat(-1n, 2), "InvalidArgument");
      expectError(() => new FilterFormat(1n << 64n, 2), "InvalidArgument");
      expectError(() => new FilterFormat(1 as unknown as bigint, 2), "InvalidArgument");
    });
  });

  describe("spec H vectors", () => {
    it("round-trips the delta: format(0x5EED, 1024), dc 7, base 4, epoch 5, two images", () => {
      const frame = encodeDelta(FORMAT, 7n, 4n, 5n, IMAGES);
      expect(frame.length).to.equal(60 + 12 * 2);
      const d = asDelta(decode(FORMAT, frame));
      expect(d.header).to.deep.include({ wireVersion: 1, flags: 2, fingerprintBits: 16, slotsPerBucket: 4, formatVersion: 1, seed: SEED, bucketCount: 1024, dcId: 7n, epoch: 5n });
      expect(d.baseEpoch).to.equal(4n);
      expect(d.images.toArray()).to.deep.equal(IMAGES);
      expect(d.images.length).to.equal(2);
      expect(d.images.bucket(1)).to.equal(1000);
      expect(d.images.value(0)).to.equal(0xaaaa_bbbb_cccc_ddddn);
    });

    it("frame of 4,194,369 zero bytes -> FrameTooLarge", () => {
      const e = expectError(() => decode(FORMAT, new Uint8Array(4_194_369)), "FrameTooLarge");
      expect(e.details).to.deep.equal({ actual: 4_194_369, maximum: 4_194_368 });
    });
    it("47 bytes -> Truncated", () => expectError(() => decode(FORMAT, new Uint8Array(47)), "Truncated"));
    it("one byte appended to an empty delta -> Checksum", () => {
      const empty = encodeDelta(FORMAT, 7n, 4n, 5n, []);
      expect(asDelta(decode(FORMAT, empty)).images.length).to.equal(0);
      const longer = new Uint8Array(empty.length + 1);
      longer.set(empty);
      expectError(() => decode(FORMAT, longer), "Checksum");
    });
    it("seed ^ 1 -> Format(Mismatch)", () => {
      const frame = encodeDelta(FORMAT, 7n, 4n, 5n, IMAGES);
      const v = new DataView(frame.buffer, frame.byteOffset);
      v.setBigUint64(12, v.getBigUint64(12, true) ^ 1n, true);
      const e = expectError(() => decode(FORMAT, frame), "Format", "Mismatch");
      expect(e.details).to.include({ seed: SEED ^ 1n, expectedSeed: SEED });
    });
    it("flags 0x8000 -> Flags(0x8000)", () => {
      const frame = encodeDelta(FORMAT, 7n, 4n, 5n, IMAGES);
      new DataView(frame.buffer, frame.byteOffset).setUint16(6, 0x8000, true);
      expect(expectError(() => decode(FORMAT, frame), "Flags").details).to.deep.equal({ flags: 0x8000 });
    });
    it("format_version + 1 -> Format(Version(2))", () => {
      const frame = encodeDelta(FORMAT, 7n, 4n, 5n, IMAGES);
      const v = new DataView(frame.buffer, frame.byteOffset);
      v.setUint16(10, v.getUint16(10, true) + 1, true);
      expect(expectError(() => decode(FORMAT, frame), "Format", "Version").details).to.deep.equal({ version: 2 });
    });
    it("delta count 349,526 -> DeltaImageCount, on decode (checksum valid) and on encode", () => {
      const frame = build(recipe({ body: deltaBody(4n, [], MAX_DELTA_IMAGES + 1) }));
      expect(expectError(() => decode(FORMAT, frame), "DeltaImageCount").details).to.deep.equal({ actual: 349_526, maximum: 349_525 });
      const columns = { buckets: new Uint32Array(349_526), values: new BigUint64Array(349_526) };
      expectError(() => encodeDelta(FORMAT, 7n, 4n, 5n, columns), "DeltaImageCount");
    });
    it("524,289 words -> SnapshotChunkWordCount on encode (a decoder sees such a frame as FrameTooLarge first)", () => {
      const big = new FilterFormat(SEED, 1 << 20);
      const words = new BigUint64Array(524_289);
      const e = expectError(() => encodeSnapshotChunk(big, 7n, 6n, 0, 2, words), "SnapshotChunkWordCount");
      expect(e.details).to.deep.equal({ actual: 524_289, maximum: 524_288 });
      const frame = build(recipe({ flags: 1, bucketCount: 1n << 20n, body: chunkBody(0, 2, 0n, []), padTo: 64 + 8 * 524_289 }));
      expectError(() => decode(big, frame), "FrameTooLarge");
    });

    describe("assembly: format(0x5EED, 2^20), words[0] = 11, words[524,289] = 22, words[2^20 - 1] = 33, epoch 6", () => {
      const format = new FilterFormat(SEED, 1 << 20);
      const lane = new BigUint64Array(1 << 20);
      lane[0] = 11n;
      lane[524_289] = 22n;
      lane[(1 << 20) - 1] = 33n;
      const frames = [...encodeSnapshotChunks(format, 7n, 6n, lane)];

      it("is 2 chunks, the first full", () => {
        expect(frames).to.have.length(2);
        expect(frames.map((f) => f.length)).to.deep.equal([IMAGES_MAX_FRAME_BYTES, IMAGES_MAX_FRAME_BYTES]);
        const chunks = frames.map((f) => asChunk(decode(format, f)));
        expect(chunks.map((c) => [c.chunkIndex, c.chunkCount, c.bucketOffset, c.wordCount, c.header.epoch])).to.deep.equal([
          [0, 2, 0, 524_288, 6n],
          [1, 2, 524_288, 524_288, 6n],
        ]);
      });
      it("absorbing chunk 1 first -> ChunkSequence", () => {
        const assembly = new SnapshotAssembly(format);
        expectError(() => assembly.absorbBytes(frames[1]!), "ChunkSequence");
        expect(assembly.inProgress).to.equal(false);
      });
      it("in-order assembly rebuilds the exact lane with epoch 6", () => {
        const assembly = new SnapshotAssembly(format);
        expect(assembly.absorbBytes(frames[0]!)).to.equal(undefined);
        expect(assembly.nextChunk).to.equal(1);
        const done = assembly.absorbBytes(frames[1]!)!;
        expect(done.epoch).to.equal(6n);
        expect(Buffer.compare(Buffer.from(done.words.buffer, done.words.byteOffset, done.words.byteLength), Buffer.from(lane.buffer))).to.equal(0);
        expect([...sparseImages(done.words)]).to.deep.equal([
          { bucket: 0, value: 11n },
          { bucket: 524_289, value: 22n },
          { bucket: (1 << 20) - 1, value: 33n },
        ]);
        expect(assembly.inProgress).to.equal(false);
      });
      it("encodes the lane's Uint16Array slots and its BigUint64Array words to the same bytes", () => {
        const ckf = new CkfLane({ seed: SEED, bucketCount: 1 << 20, maxKicks: 0 });
        ckf.loadWords(lane);
        const fromSlots = [...encodeSnapshotChunks(format, 7n, 6n, ckf.slots)];
        const fromWords = [...encodeSnapshotChunks(format, 7n, 6n, ckf.words())];
        for (let i = 0; i < 2; i++) {
          expect(Buffer.compare(Buffer.from(fromSlots[i]!), Buffer.from(frames[i]!))).to.equal(0);
          expect(Buffer.compare(Buffer.from(fromWords[i]!), Buffer.from(frames[i]!))).to.equal(0);
        }
      });
    });
  });

  describe("golden bytes, built field by field from the spec", () => {
    it("a small delta", () => {
      const images: [number, bigint][] = [
        [0, 0n],
        [5, 0x0001_abcd_0000_1234n],
        [1023, 0xffff_ffff_ffff_ffffn],
      ];
      const want = build(recipe({ dcId: 0x0102_0304_0506_0708n, epoch: 9n, body: deltaBody(8n, images) }));
      const got = encodeDelta(FORMAT, 0x0102_0304_0506_0708n, 8n, 9n, images.map(([bucket, value]) => ({ bucket, value })));
      expect([...got]).to.deep.equal([...want]);
      // And the struct-of-arrays input writes the same bytes.
      const columns = { buckets: Uint32Array.from(images.map((i) => i[0])), values: BigUint64Array.from(images.map((i) => i[1])) };
      expect([...encodeDelta(FORMAT, 0x0102_0304_0506_0708n, 8n, 9n, columns)]).to.deep.equal([...want]);
      // Spot-check the layout by absolute offset too.
      expect([...want.subarray(0, 12)]).to.deep.equal([0x43, 0x42, 0x49, 0x31, 1, 0, 2, 0, 16, 4, 1, 0]);
      expect(new DataView(want.buffer).getUint32(44, true)).to.equal(peerChecksum(want.subarray(48)));
      expect([...want.subarray(60 + 12 + 4, 60 + 12 + 12)]).to.deep.equal([0x34, 0x12, 0, 0, 0xcd, 0xab, 1, 0]);
    });
    it("a small snapshot chunk", () => {
      const format = new FilterFormat(0xdead_beef_0000_0001n, 4);
      const words = [0x0001_abcd_0000_1234n, 0n, 1n, 0xffff_0000_ffff_0000n];
      const want = build(recipe({ flags: 1, seed: format.seed, bucketCount: 4n, dcId: 3n, epoch: 77n, body: chunkBody(0, 1, 0n, words) }));
      const got = encodeSnapshotChunk(format, 3n, 77n, 0, 1, BigUint64Array.from(words));
      expect([...got]).to.deep.equal([...want]);
      expect(got.length).to.equal(64 + 8 * 4);
      const slots = new Uint16Array(BigUint64Array.from(words).buffer);
      expect([...slots.subarray(0, 4)]).to.deep.equal([0x1234, 0, 0xabcd, 1]);
      expect([...encodeSnapshotChunk(format, 3n, 77n, 0, 1, slots)]).to.deep.equal([...want]);
    });
  });

  describe("decode hands back views", () => {
    it("delta images are a view of the frame", () => {
      const frame = encodeDelta(FORMAT, 7n, 4n, 5n, IMAGES);
      const d = asDelta(decode(FORMAT, frame));
      expect(d.images.bytes.buffer).to.equal(frame.buffer);
      expect(d.images.bytes.byteOffset).to.equal(frame.byteOffset + 60);
    });
    it("aligned chunk words are a BigUint64Array over the frame; unaligned ones only bytes", () => {
      const words = BigUint64Array.from({ length: 1024 }, (_, i) => BigInt(i) * 0x1_0001n);
      const frame = encodeSnapshotChunk(FORMAT, 7n, 1n, 0, 1, words);
      expect(frame.byteOffset % 8).to.equal(0);
      const c = asChunk(decode(FORMAT, frame));
      expect(c.words!.buffer).to.equal(frame.buffer);
      expect([...c.words!]).to.deep.equal([...words]);
      for (const shift of [1, 3, 4, 7, 8]) {
        const moved = atOffset(frame, shift);
        const m = asChunk(decode(FORMAT, moved));
        expect(m.wordBytes.buffer).to.equal(moved.buffer);
        if (shift % 8 === 0) expect(m.words).to.not.equal(undefined);
        else expect(m.words, `shift ${shift}`).to.equal(undefined);
        const done = new SnapshotAssembly(FORMAT).absorb(m)!;
        expect([...done.words], `shift ${shift}`).to.deep.equal([...words]);
      }
    });
    it("decodes a delta at any byte offset", () => {
      const frame = encodeDelta(FORMAT, 7n, 4n, 5n, IMAGES);
      for (const shift of [1, 2, 5]) expect(asDelta(decode(FORMAT, atOffset(frame, shift))).images.toArray()).to.deep.equal(IMAGES);
    });
  });

  describe("validation order (A.6): with two faults the earlier check reports", () => {
    interface Fault {
      name: string;
      code: Cbi1ErrorCode;
      kind?: FormatErrorKind;
      apply: (r: Recipe) => void;
    }
    // Header faults, in the spec's order; each touches its own field.
    const header: Fault[] = [
      { name: "47 bytes", code: "Truncated", apply: (r) => void (r.truncateTo = 47) },
      { name: "4,194,369 bytes", code: "FrameTooLarge", apply: (r) => void (r.padTo = IMAGES_MAX_FRAME_BYTES + 1) },
      { name: "magic CBI2", code: "Magic", apply: (r) => void (r.magic = [0x43, 0x42, 0x49, 0x32]) },
      { name: "wire version 2", code: "WireVersion", apply: (r) => void (r.wireVersion = 2) },
      { name: "checksum off by one", code: "Checksum", apply: (r) => void (r.badChecksum = true) },
      { name: "format version 0", code: "Format", kind: "Version", apply: (r) => void (r.formatVersion = 0) },
      { name: "fingerprint bits 8", code: "Format", kind: "FingerprintBits", apply: (r) => void (r.fingerprintBits = 8) },
      { name: "slots 2", code: "Format", kind: "SlotsPerBucket", apply: (r) => void (r.slotsPerBucket = 2) },
      { name: "seed ^ 1", code: "Format", kind: "Mismatch", apply: (r) => void (r.seed ^= 1n) },
      { name: "flags 3", code: "Flags", apply: (r) => void (r.flags = 3) },
    ];
    // Body faults of a delta (flags 2) and of a chunk (flags 1); each is alone at its stage.
    const deltaFaults: Fault[] = [
      { name: "delta body of 11 bytes", code: "Malformed", apply: (r) => void (r.body = new Uint8Array(11)) },
      { name: "delta count 349,526", code: "DeltaImageCount", apply: (r) => void (r.body = deltaBody(4n, [[1, 1n]], MAX_DELTA_IMAGES + 1)) },
      { name: "delta count 3 with 2 images", code: "Malformed", apply: (r) => void (r.body = deltaBody(4n, [[1, 1n], [2, 2n]], 3)) },
      { name: "delta bucket 1024", code: "Malformed", apply: (r) => void (r.body = deltaBody(4n, [[1, 1n], [1024, 2n]])) },
    ];
    const chunkFaults: Fault[] = [
      { name: "chunk body of 15 bytes", code: "Malformed", apply: (r) => void (r.body = new Uint8Array(15)) },
      { name: "chunk count 0", code: "Malformed", apply: (r) => void (r.body = chunkBody(0, 0, 0n, [1n])) },
      { name: "chunk index 2 of 2", code: "Malformed", apply: (r) => void (r.body = chunkBody(2, 2, 0n, [1n])) },
      { name: "9 word bytes", code: "Malformed", apply: (r) => void (r.body = chunkBody(0, 1, 0n, [1n, 2n]).slice(0, 16 + 9)) },
      { name: "offset 1020 + 5 words", code: "Malformed", apply: (r) => void (r.body = chunkBody(0, 1, 1020n, [1n, 2n, 3n, 4n, 5n])) },
      { name: "offset 2^64 - 1", code: "Malformed", apply: (r) => void (r.body = chunkBody(0, 1, (1n << 64n) - 1n, [1n])) },
    ];
    const chunkRecipe = () => recipe({ flags: 1, body: chunkBody(0, 1, 0n, [5n, 6n]) });

    const run = (base: () => Recipe, faults: Fault[], expected: Fault) => {
      const r = base();
      for (const f of faults) f.apply(r);
      expectError(() => decode(FORMAT, build(r)), expected.code, expected.kind);
    };

    it("the unbroken delta and chunk recipes decode", () => {
      expect(decode(FORMAT, build(recipe())).kind).to.equal("delta");
      expect(decode(FORMAT, build(chunkRecipe())).kind).to.equal("snapshotChunk");
    });
    for (const [base, body, flagsName] of [
      [recipe, deltaFaults, "delta"],
      [chunkRecipe, chunkFaults, "chunk"],
    ] as const) {
      const all = [...header, ...body];
      for (const f of all) it(`${flagsName}: ${f.name} alone -> ${f.code}${f.kind ? `(${f.kind})` : ""}`, () => run(base, [f], f));
      it(`${flagsName}: every pair of faults reports the earlier (${all.length} faults)`, () => {
        let pairs = 0;
        for (let i = 0; i < all.length; i++) {
          for (let j = i + 1; j < all.length; j++) {
            // Two length faults, or two faults in the same body, replace one another rather than add up.
            if (i < 2 && j < 2) continue;
            if (i >= header.length && j >= header.length) continue;
            run(base, [all[j]!, all[i]!], all[i]!);
            pairs++;
          }
        }
        expect(pairs).to.be.greaterThan(40);
      });
    }
    it("checksum is checked before the delta's body rules, and flags after format", () => {
      expectError(() => decode(FORMAT, build(recipe({ flags: 0x8000, seed: 1n }))), "Format", "Mismatch");
      expectError(() => decode(FORMAT, build(recipe({ flags: 0x8000, badChecksum: true }))), "Checksum");
    });
  });

  describe("frame size boundaries", () => {
    it("a delta of 349,525 images is exactly the largest frame and decodes", () => {
      const big = new FilterFormat(SEED, 1 << 20);
      const buckets = Uint32Array.from({ length: MAX_DELTA_IMAGES }, (_, i) => i);
      const values = BigUint64Array.from({ length: MAX_DELTA_IMAGES }, (_, i) => BigInt(i) << 16n);
      const frame = encodeDelta(big, 1n, 1n, 2n, { buckets, values });
      expect(frame.length).to.equal(60 + 12 * MAX_DELTA_IMAGES);
      expect(frame.length).to.be.at.most(IMAGES_MAX_FRAME_BYTES);
      const d = asDelta(decode(big, frame));
      expect(d.images.length).to.equal(MAX_DELTA_IMAGES);
      expect(d.images.value(MAX_DELTA_IMAGES - 1)).to.equal(BigInt(MAX_DELTA_IMAGES - 1) << 16n);
    });
    it("a frame of exactly IMAGES_MAX_FRAME_BYTES passes the size check, one more byte does not", () => {
      const zeros = new Uint8Array(IMAGES_MAX_FRAME_BYTES);
      expectError(() => decode(FORMAT, zeros), "Magic");
      expectError(() => decode(FORMAT, new Uint8Array(IMAGES_MAX_FRAME_BYTES + 1)), "FrameTooLarge");
      expectError(() => decode(FORMAT, new Uint8Array(48)), "Magic");
      expectError(() => decode(FORMAT, new Uint8Array(0)), "Truncated");
    });
    const cases: [number, number[]][] = [
      [2, [2]],
      [1024, [1024]],
      [SNAPSHOT_CHUNK_BUCKETS, [SNAPSHOT_CHUNK_BUCKETS]],
      [1 << 21, [SNAPSHOT_CHUNK_BUCKETS, SNAPSHOT_CHUNK_BUCKETS, SNAPSHOT_CHUNK_BUCKETS, SNAPSHOT_CHUNK_BUCKETS]],
    ];
    for (const [buckets, sizes] of cases) {
      it(`a lane of ${buckets} buckets is ${sizes.length} chunk(s) that reassemble exactly`, () => {
        const format = new FilterFormat(9n, buckets);
        const lane = new BigUint64Array(buckets);
        for (let i = 0; i < buckets; i += 997) lane[i] = BigInt(i + 1) * 0x0101_0101n;
        lane[buckets - 1] = 0xffff_ffff_ffff_ffffn;
        const assembly = new SnapshotAssembly(format);
        let done;
        const seen: number[] = [];
        for (const frame of encodeSnapshotChunks(format, 2n, 41n, lane)) {
          const c = asChunk(decode(format, frame));
          seen.push(c.wordCount);
          expect(done).to.equal(undefined);
          done = assembly.absorb(c);
        }
        expect(seen).to.deep.equal(sizes);
        expect(done!.epoch).to.equal(41n);
        expect(Buffer.compare(Buffer.from(done!.words.buffer), Buffer.from(lane.buffer))).to.equal(0);
      });
    }
  });

  describe("encoder rules (A.5)", () => {
    it("refuses a bucket >= bucket_count, negative or fractional with BucketIndex", () => {
      for (const bucket of [1024, 1 << 30, -1, 1.5, Number.NaN]) {
        expectError(() => encodeDelta(FORMAT, 7n, 4n, 5n, [{ bucket, value: 1n }]), "BucketIndex");
        expectError(() => encodeDelta(FORMAT, 7n, 4n, 5n, { buckets: [bucket], values: [1n] }), "BucketIndex");
      }
      expectError(() => encodeDelta(FORMAT, 7n, 4n, 5n, { buckets: Uint32Array.of(1024), values: BigUint64Array.of(1n) }), "BucketIndex");
    });
    it("refuses values and ids that are not u64 bigints with InvalidArgument (never wraps)", () => {
      for (const value of [-1n, 1n << 64n, 5 as unknown as bigint]) {
        expectError(() => encodeDelta(FORMAT, 7n, 4n, 5n, [{ bucket: 1, value }]), "InvalidArgument");
      }
      expectError(() => encodeDelta(FORMAT, -7n, 4n, 5n, []), "InvalidArgument");
      expectError(() => encodeDelta(FORMAT, 7n, 4n, 1n << 64n, []), "InvalidArgument");
      expectError(() => encodeDelta(FORMAT, 7n, 4n, 5n, { buckets: [1, 2], values: [1n] }), "InvalidArgument");
      expectError(() => encodeDelta({ seed: 1n, bucketCount: 2 } as FilterFormat, 7n, 4n, 5n, []), "InvalidArgument");
    });
    it("refuses a snapshot whose word count is not the bucket count with SnapshotBucketCount, before iterating", () => {
      const e = expectError(() => encodeSnapshotChunks(FORMAT, 1n, 1n, new BigUint64Array(512)), "SnapshotBucketCount");
      expect(e.details).to.deep.equal({ expected: 1024, actual: 512 });
      expectError(() => encodeSnapshotChunks(FORMAT, 1n, 1n, new Uint16Array(4 * 1025)), "SnapshotBucketCount");
      expectError(() => encodeSnapshotChunks(FORMAT, 1n, 1n, new Uint16Array(4 * 1024 + 1)), "InvalidArgument");
    });
    it("refuses a chunk that does not exist or reaches past the buckets", () => {
      expectError(() => encodeSnapshotChunk(FORMAT, 1n, 1n, 1, 1, new BigUint64Array(2)), "InvalidArgument");
      expectError(() => encodeSnapshotChunk(FORMAT, 1n, 1n, 0, 1, new BigUint64Array(1025)), "BucketIndex");
      expectError(() => encodeSnapshotChunk(FORMAT, 1n, 1n, -1, 1, new BigUint64Array(2)), "InvalidArgument");
    });
    describe("encodeSnapshotChunkInto", () => {
      const format = new FilterFormat(SEED, 1 << 20);
      const lane = BigUint64Array.from({ length: 1 << 20 }, (_, i) => (i % 7 === 0 ? 0n : BigInt(i) * 0x9e37_79b9n));
      const slots = new Uint16Array(lane.buffer);
      // A short last chunk too, so the frame length follows the word count.
      const cases = [
        { name: "full chunk 0, BigUint64Array words", index: 0, words: lane.subarray(0, SNAPSHOT_CHUNK_BUCKETS) as BigUint64Array | Uint16Array },
        { name: "short chunk 1, Uint16Array slots", index: 1, words: slots.subarray(4 * SNAPSHOT_CHUNK_BUCKETS, 4 * (SNAPSHOT_CHUNK_BUCKETS + 1000)) },
      ];
      for (const { name, index, words } of cases) {
        it(`${name}: at byte offsets 0..9 with extra room, the bytes of encodeSnapshotChunk and nothing past them`, () => {
          const want = encodeSnapshotChunk(format, 7n, 6n, index, 2, words);
          const backing = new Uint8Array(want.length + 64);
          for (let offset = 0; offset < 10; offset++) {
            backing.fill(0xa5);
            const target = backing.subarray(offset, offset + want.length + 13 + offset);
            const length = encodeSnapshotChunkInto(target, format, 7n, 6n, index, 2, words);
            expect(length).to.equal(want.length);
            expect(Buffer.compare(Buffer.from(target.buffer, target.byteOffset, length), Buffer.from(want)), `offset ${offset}`).to.equal(0);
            expect(backing.subarray(0, offset).every((b) => b === 0xa5), `before, offset ${offset}`).to.equal(true);
            expect(backing.subarray(offset + length).every((b) => b === 0xa5), `after, offset ${offset}`).to.equal(true);
            const c = asChunk(decode(format, target.subarray(0, length)));
            expect(c.chunkIndex).to.equal(index);
          }
        });
      }
      it("an exactly sized target, and one buffer reused for every chunk of a lane, match encodeSnapshotChunks", () => {
        const frames = [...encodeSnapshotChunks(format, 7n, 6n, slots)];
        const reused = new Uint8Array(IMAGES_MAX_FRAME_BYTES);
        for (let i = 0; i < frames.length; i++) {
          const words = lane.subarray(i * SNAPSHOT_CHUNK_BUCKETS, (i + 1) * SNAPSHOT_CHUNK_BUCKETS);
          const length = encodeSnapshotChunkInto(reused, format, 7n, 6n, i, frames.length, words);
          expect(Buffer.compare(Buffer.from(reused.buffer, 0, length), Buffer.from(frames[i]!))).to.equal(0);
          const exact = new Uint8Array(frames[i]!.length);
          expect(encodeSnapshotChunkInto(exact, format, 7n, 6n, i, frames.length, words)).to.equal(exact.length);
          expect(Buffer.compare(Buffer.from(exact), Buffer.from(frames[i]!))).to.equal(0);
        }
      });
      it("a target over the words' own bytes (frame built in place) still gets the words", () => {
        const words = BigUint64Array.from({ length: 1024 }, (_, i) => BigInt(i + 1) * 0x0101_0101n);
        const want = encodeSnapshotChunk(FORMAT, 1n, 2n, 0, 1, words);
        const shared = new Uint8Array(want.length);
        shared.set(new Uint8Array(words.buffer));
        const inPlace = new BigUint64Array(shared.buffer, 0, 1024);
        expect(encodeSnapshotChunkInto(shared, FORMAT, 1n, 2n, 0, 1, inPlace)).to.equal(want.length);
        expect(Buffer.compare(Buffer.from(shared), Buffer.from(want))).to.equal(0);
      });
      it("a target one byte too small is InvalidArgument and is left unchanged", () => {
        const words = lane.subarray(0, 4096);
        const length = 64 + 8 * 4096;
        const target = new Uint8Array(length - 1).fill(0x5a);
        const e = expectError(() => encodeSnapshotChunkInto(target, format, 7n, 6n, 0, 2, words), "InvalidArgument");
        expect(e.details).to.deep.equal({ what: "target", needed: length, available: length - 1 });
        expect(target.every((b) => b === 0x5a)).to.equal(true);
        expectError(() => encodeSnapshotChunkInto(new Uint8Array(0), format, 7n, 6n, 0, 2, new BigUint64Array(0)), "InvalidArgument");
        expect(encodeSnapshotChunkInto(new Uint8Array(64), format, 7n, 6n, 0, 2, new BigUint64Array(0))).to.equal(64);
      });
      it("checks its other arguments like encodeSnapshotChunk, before writing, whatever the target's size", () => {
        const target = new Uint8Array(IMAGES_MAX_FRAME_BYTES + 8).fill(0x5a);
        expectError(() => encodeSnapshotChunkInto(target, FORMAT, 1n, 1n, 1, 1, new BigUint64Array(2)), "InvalidArgument");
        expectError(() => encodeSnapshotChunkInto(target, FORMAT, 1n, 1n, 0, 1, new BigUint64Array(1025)), "BucketIndex");
        expectError(() => encodeSnapshotChunkInto(target, FORMAT, -1n, 1n, 0, 1, new BigUint64Array(2)), "InvalidArgument");
        expectError(() => encodeSnapshotChunkInto(target, format, 1n, 1n, 0, 2, new BigUint64Array(SNAPSHOT_CHUNK_BUCKETS + 1)), "SnapshotChunkWordCount");
        expectError(() => encodeSnapshotChunkInto(target, FORMAT, 1n, 1n, 0, 1, new Uint16Array(5)), "InvalidArgument");
        expectError(() => encodeSnapshotChunkInto([] as unknown as Uint8Array, FORMAT, 1n, 1n, 0, 1, new BigUint64Array(2)), "InvalidArgument");
        expect(target.every((b) => b === 0x5a)).to.equal(true);
      });
    });
    it("writes a delta's images in the given order, duplicates included (the ingestor refuses those, not the codec)", () => {
      const images = [
        { bucket: 9, value: 1n },
        { bucket: 2, value: 0n },
        { bucket: 9, value: 3n },
      ];
      expect(asDelta(decode(FORMAT, encodeDelta(FORMAT, 1n, 1n, 2n, images))).images.toArray()).to.deep.equal(images);
    });
  });

  describe("SnapshotAssembly (A.7)", () => {
    const format = new FilterFormat(SEED, 1 << 20);
    const lane = BigUint64Array.from({ length: 1 << 20 }, (_, i) => (i % 4099 === 0 ? BigInt(i + 1) : 0n));
    const chunk = (index: number, count: number, epoch = 6n, words = lane.subarray(index * SNAPSHOT_CHUNK_BUCKETS, (index + 1) * SNAPSHOT_CHUNK_BUCKETS)) =>
      asChunk(decode(format, encodeSnapshotChunk(format, 7n, epoch, index, count, words)));
    const c0 = chunk(0, 2);
    const c1 = chunk(1, 2);

    it("a delta is ChunkSequence and leaves the assembly as it was", () => {
      const a = new SnapshotAssembly(format);
      a.absorb(c0);
      const delta = asDelta(decode(format, encodeDelta(format, 7n, 5n, 6n, [])));
      expectError(() => a.absorb(delta), "ChunkSequence");
      expect([a.inProgress, a.nextChunk, a.epoch]).to.deep.equal([true, 1, 6n]);
      expect(a.absorb(c1)!.epoch).to.equal(6n);
    });
    const faults: [string, () => Cbi1SnapshotChunkFrame][] = [
      ["a different epoch", () => chunk(1, 2, 7n)],
      ["a different chunk count", () => ({ ...c1, chunkCount: 3 })],
      ["a skipped chunk (index 2 where 1 is next)", () => ({ ...c1, chunkIndex: 2, chunkCount: 3 })],
      ["a bucket offset other than the next bucket", () => ({ ...c1, bucketOffset: SNAPSHOT_CHUNK_BUCKETS - 1 })],
      ["another bucket count", () => ({ ...c1, header: { ...c1.header, bucketCount: 1 << 21 } })],
      ["chunk index >= chunk count", () => ({ ...c1, chunkIndex: 2 })],
      ["chunk count 0", () => ({ ...c1, chunkCount: 0, chunkIndex: 0 })],
    ];
    for (const [name, make] of faults) {
      it(`after chunk 0, ${name} is ChunkSequence and resets`, () => {
        const a = new SnapshotAssembly(format);
        a.absorb(c0);
        expectError(() => a.absorb(make()), "ChunkSequence");
        expect([a.inProgress, a.nextChunk, a.nextBucket, a.epoch]).to.deep.equal([false, 0, 0, 0n]);
        // The stream is dead until a chunk 0: chunk 1 alone is refused.
        expectError(() => a.absorb(c1), "ChunkSequence");
      });
    }
    it("a chunk 0 at a bucket offset other than 0 is ChunkSequence", () => {
      expectError(() => new SnapshotAssembly(format).absorb({ ...c0, bucketOffset: 8 }), "ChunkSequence");
    });
    it("chunk 0 always restarts, so a fresh snapshot after a partial one completes", () => {
      const a = new SnapshotAssembly(format);
      a.absorb(chunk(0, 2, 3n));
      a.absorb(c0);
      const done = a.absorb(c1)!;
      expect(done.epoch).to.equal(6n);
      expect(Buffer.compare(Buffer.from(done.words.buffer), Buffer.from(lane.buffer))).to.equal(0);
    });
    it("a short last chunk is IncompleteCoverage and resets", () => {
      const a = new SnapshotAssembly(format);
      a.absorb(c0);
      const short = chunk(1, 2, 6n, lane.subarray(SNAPSHOT_CHUNK_BUCKETS, (1 << 20) - 1));
      const e = expectError(() => a.absorb(short), "IncompleteCoverage");
      expect(e.details).to.deep.equal({ covered: (1 << 20) - 1, bucketCount: 1 << 20 });
      expect(a.inProgress).to.equal(false);
      const one = new SnapshotAssembly(FORMAT);
      expectError(() => one.absorbBytes(encodeSnapshotChunk(FORMAT, 1n, 1n, 0, 1, new BigUint64Array(1000))), "IncompleteCoverage");
    });
    it("rebuilds into a caller's buffer when given one, and the same buffer every time", () => {
      const into = new BigUint64Array(1 << 20);
      const a = new SnapshotAssembly(format, { into });
      a.absorb(c0);
      expect(a.absorb(c1)!.words).to.equal(into);
      a.absorb(chunk(0, 2, 8n));
      expect(a.absorb(chunk(1, 2, 8n))!.words).to.equal(into);
      expectError(() => new SnapshotAssembly(format, { into: new BigUint64Array(5) }), "InvalidArgument");
    });
    it("absorbBytes surfaces decode errors as they are", () => {
      expectError(() => new SnapshotAssembly(FORMAT).absorbBytes(new Uint8Array(3)), "Truncated");
    });
  });

  describe("peekFormat", () => {
    it("reads the seed and bucket count without validating the body or checksum", () => {
      const frame = build(recipe({ seed: 0x77n, bucketCount: 1n << 24n, badChecksum: true, flags: 9 }));
      const f = peekFormat(frame);
      expect([f.seed, f.bucketCount]).to.deep.equal([0x77n, 1 << 24]);
    });
    const cases: [string, Uint8Array, Cbi1ErrorCode][] = [
      ["47 bytes", new Uint8Array(47), "Truncated"],
      ["a too-large frame", new Uint8Array(IMAGES_MAX_FRAME_BYTES + 1), "FrameTooLarge"],
      ["a bad magic", build(recipe({ magic: [0, 0, 0, 0] })), "Magic"],
      ["wire version 9", build(recipe({ wireVersion: 9 })), "WireVersion"],
      ["bucket count 3", build(recipe({ bucketCount: 3n })), "Format"],
      ["bucket count 2^64 - 1", build(recipe({ bucketCount: (1n << 64n) - 1n })), "Format"],
      ["bucket count 2^25", build(recipe({ bucketCount: 1n << 25n })), "Format"],
    ];
    for (const [name, frame, code] of cases) it(`${name} -> ${code}`, () => expectError(() => peekFormat(frame), code));
  });

  it("re-patching a mutated frame's checksum gets it past the checksum check (helper sanity)", () => {
    const frame = encodeDelta(FORMAT, 7n, 4n, 5n, IMAGES);
    frame[60] = 0xff; // bucket 3 -> 255
    expectError(() => decode(FORMAT, frame), "Checksum");
    expect(asDelta(decode(FORMAT, repatch(frame))).images.bucket(0)).to.equal(255);
    expect(isCbi1Error(caught(() => decode(FORMAT, new Uint8Array(1))), "Truncated")).to.equal(true);
  });
});
