/**
 * Fuzzing of the CBI1 decoder: random and mutated frames never raise
 * anything but Cbi1Error, what decodes re-encodes to the same bytes, and a
 * model of the spec's check order (A.6) predicts the reported error.
 *
 * Runs: 100,000 frames in total by default (30k random, 40k mutated, 30k
 * model), about 2-3 s; CBI1_FUZZ_SCALE multiplies them (e.g. 10 for a
 * longer soak).
 */
import { expect } from "chai";
import fc from "fast-check";
import {
  Cbi1Error,
  decode,
  encodeDelta,
  encodeSnapshotChunk,
  FilterFormat,
  MAX_DELTA_IMAGES,
  peekFormat,
  SnapshotAssembly,
  SNAPSHOT_CHUNK_BUCKETS,
  type Cbi1ErrorCode,
  type FormatErrorKind,
} from "../../src/relay/cbi1/index.js";
import { build, chunkBody, deltaBody, recipe, repatch, SEED, type Recipe } from "./cbi1-helpers.js";

const SCALE = Math.max(0.01, Number(process.env.CBI1_FUZZ_SCALE ?? 1));
const runs = (n: number) => Math.max(1, Math.round(n * SCALE));
const FORMAT = new FilterFormat(SEED, 1024);

/** Decodes (and peeks, and absorbs what decoded); rethrows anything that is not a Cbi1Error. */
function attempt(frame: Uint8Array): ReturnType<typeof decode> | Cbi1Error {
  const fns = [() => peekFormat(frame), () => decode(FORMAT, frame)];
  let result: ReturnType<typeof decode> | Cbi1Error = new Cbi1Error("Truncated", "not reached");
  for (const fn of fns) {
    try {
      const out = fn();
      if (!(out instanceof FilterFormat)) result = out;
    } catch (error) {
      if (!(error instanceof Cbi1Error)) throw error;
      if (fn === fns[1]) result = error;
    }
  }
  if (!(result instanceof Cbi1Error)) {
    try {
      new SnapshotAssembly(FORMAT).absorb(result);
    } catch (error) {
      if (!(error instanceof Cbi1Error)) throw error;
    }
  }
  return result;
}

/** Byte equality without chai's deep walk, which dominated the run time. */
function same(a: Uint8Array, b: Uint8Array): void {
  if (Buffer.compare(a, b) !== 0) expect.fail(`re-encoded ${Buffer.from(a).toString("hex")} != ${Buffer.from(b).toString("hex")}`);
}

/** What decode made of a frame must re-encode to the very same bytes. */
function checkRoundTrip(frame: Uint8Array, result: ReturnType<typeof decode>): void {
  const h = result.header;
  if (result.kind === "delta") {
    same(encodeDelta(FORMAT, h.dcId, result.baseEpoch, h.epoch, result.images.toArray()), frame);
  } else if (result.bucketOffset === result.chunkIndex * SNAPSHOT_CHUNK_BUCKETS) {
    const words = new BigUint64Array(result.wordCount);
    new Uint8Array(words.buffer).set(result.wordBytes);
    same(encodeSnapshotChunk(FORMAT, h.dcId, h.epoch, result.chunkIndex, result.chunkCount, words), frame);
  }
}

const u64 = fc.bigInt({ min: 0n, max: (1n << 64n) - 1n });
const validDelta = fc
  .tuple(u64, u64, u64, fc.array(fc.tuple(fc.nat({ max: 1023 }), u64), { maxLength: 6 }))
  .map(([dc, base, epoch, images]) => encodeDelta(FORMAT, dc, base, epoch, images.map(([bucket, value]) => ({ bucket, value }))));
const validChunk = fc
  .tuple(u64, u64, fc.nat({ max: 40 }))
  .map(([dc, epoch, n]) => encodeSnapshotChunk(FORMAT, dc, epoch, 0, 1, BigUint64Array.from({ length: n }, (_, i) => BigInt(i * 7919) << 13n)));

type Mutation = { op: "set"; at: number; value: number } | { op: "flip"; at: number; bit: number } | { op: "cut"; at: number } | { op: "grow"; by: number };
const mutation: fc.Arbitrary<Mutation> = fc.oneof(
  fc.record({ op: fc.constant("set" as const), at: fc.nat(), value: fc.nat({ max: 255 }) }),
  fc.record({ op: fc.constant("flip" as const), at: fc.nat(), bit: fc.nat({ max: 7 }) }),
  fc.record({ op: fc.constant("cut" as const), at: fc.nat() }),
  fc.record({ op: fc.constant("grow" as const), by: fc.integer({ min: 1, max: 24 }) }),
);

function mutate(frame: Uint8Array, mutations: Mutation[]): Uint8Array {
  let out = frame.slice();
  for (const m of mutations) {
    if (out.length === 0) break;
    if (m.op === "set") out[m.at % out.length] = m.value;
    else if (m.op === "flip") out[m.at % out.length]! ^= 1 << m.bit;
    else if (m.op === "cut") out = out.slice(0, m.at % (out.length + 1));
    else {
      const grown = new Uint8Array(out.length + m.by);
      grown.set(out);
      out = grown;
    }
  }
  return out;
}

/** The spec's check order (A.6) applied to a recipe: the code and format kind decode must report, or "ok". */
function expected(r: Recipe, length: number): [Cbi1ErrorCode | "ok", FormatErrorKind?] {
  if (length < 48) return ["Truncated"];
  if (r.magic.join() !== "67,66,73,49") return ["Magic"];
  if (r.wireVersion !== 1) return ["WireVersion"];
  if (r.badChecksum) return ["Checksum"];
  if (r.formatVersion !== 1) return ["Format", "Version"];
  if (r.fingerprintBits !== 16) return ["Format", "FingerprintBits"];
  if (r.slotsPerBucket !== 4) return ["Format", "SlotsPerBucket"];
  if (r.seed !== SEED || r.bucketCount !== 1024n) return ["Format", "Mismatch"];
  const body = r.body;
  const v = new DataView(body.buffer, body.byteOffset, body.byteLength);
  if (r.flags === 2) {
    if (body.length < 12) return ["Malformed"];
    const count = v.getUint32(8, true);
    if (count > MAX_DELTA_IMAGES) return ["DeltaImageCount"];
    if (body.length !== 12 + 12 * count) return ["Malformed"];
    for (let i = 0; i < count; i++) if (v.getUint32(12 + 12 * i, true) >= 1024) return ["Malformed"];
    return ["ok"];
  }
  if (r.flags === 1) {
    if (body.length < 16) return ["Malformed"];
    const index = v.getUint32(0, true);
    const count = v.getUint32(4, true);
    if (count === 0 || index >= count) return ["Malformed"];
    if ((body.length - 16) % 8 !== 0) return ["Malformed"];
    if (v.getBigUint64(8, true) + BigInt((body.length - 16) / 8) > 1024n) return ["Malformed"];
    return ["ok"];
  }
  return ["Flags"];
}

/** Header fields drawn mostly valid, sometimes off, so that faults come alone and in combinations. */
const pick = <T>(good: T, bad: fc.Arbitrary<T>) => fc.oneof({ weight: 4, arbitrary: fc.constant(good) }, { weight: 1, arbitrary: bad });
const small = fc.nat({ max: 1100 });
const recipeArb: fc.Arbitrary<Recipe> = fc
  .record({
    magic: pick<[number, number, number, number]>([0x43, 0x42, 0x49, 0x31], fc.tuple(fc.nat(255), fc.nat(255), fc.nat(255), fc.nat(255))),
    wireVersion: pick(1, fc.nat(0xffff)),
    flags: fc.oneof(fc.constant(1), fc.constant(2), fc.nat(0xffff)),
    fingerprintBits: pick(16, fc.nat(255)),
    slotsPerBucket: pick(4, fc.nat(255)),
    formatVersion: pick(1, fc.nat(0xffff)),
    seed: pick(SEED, u64),
    bucketCount: pick(1024n, fc.oneof(u64, fc.constant(2048n))),
    dcId: u64,
    epoch: u64,
    badChecksum: fc.boolean(),
    bodyKind: fc.constantFrom("delta", "chunk", "raw"),
    images: fc.array(fc.tuple(small, u64), { maxLength: 4 }),
    countDelta: pick(0, fc.oneof(fc.integer({ min: -2, max: 2 }), fc.constant(MAX_DELTA_IMAGES + 1 - 4))),
    chunk: fc.tuple(fc.nat(3), fc.nat(3), pick(0n, fc.oneof(u64, small.map(BigInt))), fc.nat(8), fc.nat(7)),
    raw: fc.uint8Array({ maxLength: 40 }),
  })
  .map((x) => {
    let body: Uint8Array;
    if (x.bodyKind === "delta") {
      body = deltaBody(9n, x.images, Math.max(0, x.images.length + x.countDelta));
    } else if (x.bodyKind === "chunk") {
      const [index, count, offset, words, ragged] = x.chunk;
      body = chunkBody(index, count, offset, Array.from({ length: words }, (_, i) => BigInt(i)));
      if (ragged !== 0) body = body.slice(0, Math.max(0, body.length - ragged));
    } else {
      body = x.raw;
    }
    return recipe({ ...x, body, truncateTo: undefined, padTo: undefined });
  });

describe("CBI1 fuzzing (fast-check)", function () {
  this.timeout(60_000);

  it(`random byte strings raise only Cbi1Error (${runs(30_000)} runs)`, () => {
    const magicPrefix = fc.uint8Array({ maxLength: 120 }).map((tail) => {
      const frame = new Uint8Array(6 + tail.length);
      frame.set([0x43, 0x42, 0x49, 0x31, 1, 0]);
      frame.set(tail, 6);
      return repatch(frame);
    });
    fc.assert(
      fc.property(fc.oneof(fc.uint8Array({ maxLength: 120 }), magicPrefix), (frame) => {
        const result = attempt(frame);
        if (!(result instanceof Cbi1Error)) checkRoundTrip(frame, result);
      }),
      { numRuns: runs(30_000) },
    );
  });

  it(`mutated valid frames raise only Cbi1Error, and what decodes re-encodes to the same bytes (${runs(40_000)} runs)`, () => {
    fc.assert(
      fc.property(fc.oneof(validDelta, validChunk), fc.array(mutation, { minLength: 1, maxLength: 4 }), fc.boolean(), (frame, mutations, fix) => {
        const mutated = mutate(frame, mutations);
        // Half the time the checksum is made right again, so the mutation reaches the later checks.
        const result = attempt(fix ? repatch(mutated) : mutated);
        if (!(result instanceof Cbi1Error)) checkRoundTrip(mutated, result);
      }),
      { numRuns: runs(40_000) },
    );
  });

  it(`a model of the check order predicts every error (${runs(30_000)} runs)`, () => {
    const seen = new Set<string>();
    fc.assert(
      fc.property(recipeArb, (r) => {
        const frame = build(r);
        const [code, kind] = expected(r, frame.length);
        const result = attempt(frame);
        if (code === "ok") {
          expect(result).to.not.be.instanceOf(Cbi1Error);
          checkRoundTrip(frame, result as ReturnType<typeof decode>);
        } else {
          expect(result, `expected ${code}`).to.be.instanceOf(Cbi1Error);
          const e = result as Cbi1Error;
          expect([e.code, e.formatKind], e.message).to.deep.equal([code, kind]);
        }
        seen.add(kind ?? code);
      }),
      { numRuns: runs(30_000) },
    );
    // The generator must reach every decode outcome, or the model proves little.
    if (SCALE >= 1) {
      expect([...seen].sort()).to.deep.equal(
        ["Checksum", "DeltaImageCount", "FingerprintBits", "Flags", "Magic", "Malformed", "Mismatch", "SlotsPerBucket", "Version", "WireVersion", "ok"].sort(),
      );
    }
  });
});
