import { expect } from "chai";
import { xxh3 } from "@node-rs/xxhash";
import { ByteRangeError, ONE_SHOT_MAX_BYTES, U64_MAX, XXH3_IMPLEMENTATION, xxh3_64, xxh3_64Parts, xxh3Low32, Xxh3Stream } from "../../src/bytes/index.js";

const SEEDS = [0n, 1n, 0x9e37_79b9_7f4a_7c15n, 2n ** 63n, U64_MAX];
const SIZES = [0, 1, ONE_SHOT_MAX_BYTES - 1, ONE_SHOT_MAX_BYTES, ONE_SHOT_MAX_BYTES + 1, 1 << 20];

function data(size: number): Uint8Array {
  const out = new Uint8Array(size);
  for (let i = 0; i < size; i++) out[i] = (i * 131 + (i >>> 9) + 7) & 0xff;
  return out;
}

/** The peer: @node-rs/xxhash's one-shot XXH3-64 over a contiguous copy. */
function peer(bytes: Uint8Array, seed: bigint): bigint {
  return xxh3.xxh64(bytes.slice(), seed);
}

/** Split points that straddle XXH3's internal block sizes and the one-shot threshold. */
function splitPoints(size: number): number[] {
  const points = [0, 1, 2, 3, 16, 17, 128, 129, 240, 241, 255, 256, 1023, 1024, 1025, ONE_SHOT_MAX_BYTES - 1, ONE_SHOT_MAX_BYTES, size >> 1, size - 1, size];
  return [...new Set(points.filter((p) => p >= 0 && p <= size))];
}

function chunks(bytes: Uint8Array, chunkSize: number): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (let at = 0; at < bytes.length; at += chunkSize) out.push(bytes.subarray(at, at + chunkSize));
  return out;
}

describe("XXH3-64 helpers", () => {
  const known: [string, Uint8Array, bigint, bigint][] = [
    ["empty, seed 0", new Uint8Array(0), 0n, 0x2d06_8005_38d3_94c2n],
    ["empty, seed 11400714785074694797 (the xxHash sanity-check PRIME64)", new Uint8Array(0), 11_400_714_785_074_694_797n, 0xa8a6_b918_b2f0_364an],
    ['"abc", seed 0', new TextEncoder().encode("abc"), 0n, 0x78af_5f94_892f_3950n],
  ];
  for (const [name, bytes, seed, hash] of known) {
    it(`matches the known vector for ${name}`, () => {
      expect(xxh3_64(bytes, seed)).to.equal(hash);
      expect(xxh3_64Parts([bytes], seed)).to.equal(hash);
      expect(new Xxh3Stream(seed).update(bytes).digest()).to.equal(hash);
      expect(xxh3Low32(bytes, seed)).to.equal(Number(hash & 0xffff_ffffn));
    });
  }

  for (const size of SIZES) {
    it(`gives one digest for ${size} bytes one-shot, streamed, split and chunked, with every seed`, () => {
      const bytes = data(size);
      const chunkSizes = size <= 4096 ? [1, 7, 64, 1000] : [1000, 4096, 65_539];
      for (const seed of SEEDS) {
        const label = `size ${size} seed ${seed}`;
        const want = peer(bytes, seed);
        expect(xxh3_64(bytes, seed), label).to.equal(want);
        const stream = new Xxh3Stream(seed);
        expect(stream.update(bytes).digest(), label).to.equal(want);
        for (const at of splitPoints(size)) {
          const [a, b] = [bytes.subarray(0, at), bytes.subarray(at)];
          expect(stream.reset().update(a).update(b).digest(), `${label} split ${at}`).to.equal(want);
          expect(xxh3_64Parts([a, b], seed), `${label} parts split ${at}`).to.equal(want);
          const mid = (at + size) >> 1;
          const three = [bytes.subarray(0, at), bytes.subarray(at, mid), bytes.subarray(mid)];
          expect(xxh3_64Parts(three, seed), `${label} three parts at ${at}, ${mid}`).to.equal(want);
        }
        for (const chunkSize of chunkSizes) {
          const parts = chunks(bytes, chunkSize);
          stream.reset();
          for (const part of parts) stream.update(part);
          expect(stream.digest(), `${label} chunks of ${chunkSize}`).to.equal(want);
          expect(xxh3_64Parts(parts, seed), `${label} parts of ${chunkSize}`).to.equal(want);
        }
      }
    });
  }

  it("hashes an empty list of parts as the empty input", () => {
    expect(xxh3_64Parts([], 0n)).to.equal(0x2d06_8005_38d3_94c2n);
  });

  it("hashes views at an offset without their surroundings, on both paths", () => {
    const backing = data(10_000);
    for (const [from, to] of [[3, 100], [5, 5 + ONE_SHOT_MAX_BYTES + 10]] as const) {
      const view = backing.subarray(from, to);
      expect(xxh3_64(view, 7n)).to.equal(peer(backing.slice(from, to), 7n));
    }
  });

  it("keeps results right across many seeds in turn (the reused hashers)", () => {
    const bytes = data(ONE_SHOT_MAX_BYTES * 2);
    for (let round = 0; round < 2; round++) {
      for (let seed = 0n; seed < 20n; seed++) expect(xxh3_64(bytes, seed), `seed ${seed}`).to.equal(peer(bytes, seed));
    }
  });

  it("gives the low 32 bits as an unsigned number", () => {
    let highBitSeen = false;
    for (let i = 0; i < 64; i++) {
      const bytes = data(i * 50);
      const low = xxh3Low32(bytes, BigInt(i));
      expect(low).to.equal(Number(peer(bytes, BigInt(i)) & 0xffff_ffffn));
      expect(low).to.be.within(0, 2 ** 32 - 1);
      if (low >= 2 ** 31) highBitSeen = true;
    }
    expect(highBitSeen).to.equal(true);
  });

  it("streams: digest does not end the stream, reset keeps the seed", () => {
    const s = new Xxh3Stream(5n);
    s.update(Uint8Array.of(1, 2));
    expect(s.digest()).to.equal(s.digest());
    s.update(Uint8Array.of(3));
    expect(s.digest()).to.equal(peer(Uint8Array.of(1, 2, 3), 5n));
    expect(s.reset().digest()).to.equal(peer(new Uint8Array(0), 5n));
    expect(s.seed).to.equal(5n);
  });

  it("a stream is not disturbed by one-shot hashing in between", () => {
    const big = data(ONE_SHOT_MAX_BYTES * 3);
    const s = new Xxh3Stream(0n).update(big.subarray(0, 100));
    xxh3_64(big, 0n);
    xxh3_64Parts([big, big], 0n);
    s.update(big.subarray(100));
    expect(s.digest()).to.equal(peer(big, 0n));
  });

  for (const seed of [-1n, 1n << 64n]) {
    it(`refuses the seed ${seed} instead of wrapping it`, () => {
      const bytes = Uint8Array.of(1);
      for (const f of [() => xxh3_64(bytes, seed), () => xxh3_64Parts([bytes], seed), () => xxh3Low32(bytes, seed), () => new Xxh3Stream(seed)]) {
        expect(f).to.throw(ByteRangeError);
      }
    });
  }
});

describe("XXH3-64: the native implementation behind the helpers", () => {
  it("is xxhash-addon where it ships a prebuild (linux, darwin and win32 on x64 and arm64)", function () {
    if (!["linux", "darwin", "win32"].includes(process.platform) || !["x64", "arm64"].includes(process.arch)) this.skip();
    expect(XXH3_IMPLEMENTATION).to.equal("xxhash-addon");
  });

  it("takes any Uint8Array view (odd offsets, shared memory, Buffer pool slices), never only Buffers, with the peer's digests", () => {
    const size = 1 << 16;
    const backing = new ArrayBuffer(size + 7);
    const odd = new Uint8Array(backing, 3, size);
    odd.set(data(size));
    const shared = new Uint8Array(new SharedArrayBuffer(size));
    shared.set(data(size));
    const pooled = Buffer.from(data(4096)).subarray(5, 4001);
    for (const [name, view] of [["odd offset", odd], ["shared", shared], ["pooled slice", pooled]] as const) {
      for (const seed of SEEDS) {
        const expected = peer(view, seed);
        expect(xxh3_64(view, seed), `${name}, seed ${seed}`).to.equal(expected);
        expect(xxh3_64Parts([view.subarray(0, 3000), view.subarray(3000)], seed), `${name} in parts, seed ${seed}`).to.equal(expected);
        expect(new Xxh3Stream(seed).update(view.subarray(0, 100)).update(view.subarray(100)).digest(), `${name} streamed, seed ${seed}`).to.equal(expected);
      }
    }
  });
});
