import { expect } from "chai";
import { xxh3 } from "@node-rs/xxhash";
import {
  computeBlockHash,
  computeBlockHashForSeq,
  computeSaltHash,
  KvHashError,
  tokenBytesLe,
  XXH3_SEED,
  type BlockExtraInfo,
  type BlockHashOptions,
  type KvHashErrorCode,
} from "../../src/kv/hash/index.js";

// The peer throughout is @node-rs/xxhash called directly on bytes built here
// with DataView, so neither the project's XXH3 helpers nor its token
// serialization vouch for themselves.

const U64 = 1n << 64n;
const utf8 = new TextEncoder();

function peer(bytes: Uint8Array, seed: bigint): bigint {
  return xxh3.xxh64(bytes, seed);
}

/** u32 tokens, then u64 extras, all little-endian. */
function leBytes(tokens: readonly number[], extras: readonly bigint[] = []): Uint8Array {
  const out = new Uint8Array(tokens.length * 4 + extras.length * 8);
  const view = new DataView(out.buffer);
  tokens.forEach((t, i) => view.setUint32(i * 4, t, true));
  extras.forEach((e, i) => view.setBigUint64(tokens.length * 4 + i * 8, e, true));
  return out;
}

function range(n: number, from = 0): number[] {
  return Array.from({ length: n }, (_, i) => from + i);
}

/** Deterministic tokens spread over the whole u32 range. */
function spreadTokens(n: number): number[] {
  return Array.from({ length: n }, (_, i) => Math.imul(i + 1, 0x9e37_79b1) >>> 0);
}

function expectCode(fn: () => unknown, code: KvHashErrorCode): void {
  expect(fn).to.throw(KvHashError).with.property("code", code);
}

describe("KV block hashing: computeBlockHash", () => {
  it('hashes b"test data" to the reference vector 13226331709069118873 with the default seed 1337', () => {
    const bytes = utf8.encode("test data");
    expect(computeBlockHash(bytes)).to.equal(13226331709069118873n);
    expect(computeBlockHash(bytes, 1337n)).to.equal(13226331709069118873n);
    expect(XXH3_SEED).to.equal(1337n);
  });

  it("uses the seed it is given", () => {
    const bytes = utf8.encode("test data");
    expect(computeBlockHash(bytes, 0n)).to.equal(peer(bytes, 0n));
    expect(computeBlockHash(bytes, 0n)).not.to.equal(13226331709069118873n);
  });

  it("refuses a seed outside u64 with INVALID_U64", () => {
    expectCode(() => computeBlockHash(new Uint8Array(4), -1n), "INVALID_U64");
    expectCode(() => computeBlockHash(new Uint8Array(4), U64), "INVALID_U64");
  });
});

describe("KV block hashing: tokenBytesLe", () => {
  it("writes each token as 4 little-endian bytes", () => {
    expect(Array.from(tokenBytesLe([0x0102_0304, 0xffff_ffff, 0]))).to.deep.equal([4, 3, 2, 1, 255, 255, 255, 255, 0, 0, 0, 0]);
    expect(tokenBytesLe([])).to.have.length(0);
  });

  it("views a Uint32Array's own bytes instead of copying them", () => {
    const backing = new Uint32Array([9, 0x0102_0304, 7]);
    const bytes = tokenBytesLe(backing.subarray(1, 2));
    expect(bytes.buffer).to.equal(backing.buffer);
    expect(bytes.byteOffset).to.equal(4);
    expect(Array.from(bytes)).to.deep.equal([4, 3, 2, 1]);
  });

  it("refuses a token that is not a u32 with INVALID_TOKEN", () => {
    expectCode(() => tokenBytesLe([1, -1]), "INVALID_TOKEN");
  });
});

describe("KV block hashing: computeBlockHashForSeq windows", () => {
  const counts: [bs: number, length: number, blocks: number][] = [];
  for (const bs of [11, 32, 64]) counts.push([bs, bs, 1], [bs, bs + 1, 1], [bs, 2 * bs + 1, 2]);
  for (const [bs, length, blocks] of counts) {
    it(`hashes ${blocks} complete block(s) of ${bs} from ${length} tokens, dropping the partial tail`, () => {
      const tokens = range(length);
      const hashes = computeBlockHashForSeq(tokens, bs);
      expect(hashes).to.have.length(blocks);
      hashes.forEach((h, i) => expect(h, `block ${i}`).to.equal(peer(leBytes(tokens.slice(i * bs, (i + 1) * bs)), 1337n)));
    });
  }

  const eagleCounts: [bs: number, length: number, blocks: number][] = [
    [4, 0, 0],
    [4, 4, 0],
    [4, 5, 1],
    [4, 8, 1],
    [4, 9, 2],
    [1, 1, 0],
    [1, 2, 1],
    [1, 5, 4],
  ];
  for (const [bs, length, blocks] of eagleCounts) {
    it(`hashes ${blocks} Eagle window(s) of ${bs}+1 from ${length} tokens ((len - 1) / bs)`, () => {
      expect(computeBlockHashForSeq(range(length), bs, { isEagle: true })).to.have.length(blocks);
    });
  }

  it("gives 3 default but 2 Eagle hashes for tokens 0..5 at block size 2, the Eagle ones being the hashes of [0,1,2] and [2,3,4]", () => {
    const tokens = range(6);
    const standard = computeBlockHashForSeq(tokens, 2);
    const eagle = computeBlockHashForSeq(tokens, 2, { isEagle: true });
    expect(standard).to.have.length(3);
    expect(eagle).to.have.length(2);
    expect(eagle).to.deep.equal([computeBlockHashForSeq([0, 1, 2], 3)[0], computeBlockHashForSeq([2, 3, 4], 3)[0]]);
    expect(eagle).to.deep.equal([peer(leBytes([0, 1, 2]), 1337n), peer(leBytes([2, 3, 4]), 1337n)]);
    expect(eagle[0]).not.to.equal(standard[0]);
  });

  it("treats isEagle false like no isEagle", () => {
    expect(computeBlockHashForSeq(range(9), 4, { isEagle: false })).to.deep.equal(computeBlockHashForSeq(range(9), 4));
  });

  it("serializes tokens as u32 little-endian, across the whole u32 range", () => {
    const tokens = [0x0102_0304, 0xffff_ffff, 0, 0x8000_0000];
    expect(computeBlockHashForSeq(tokens, 4)).to.deep.equal([peer(Uint8Array.of(4, 3, 2, 1, 255, 255, 255, 255, 0, 0, 0, 0, 0, 0, 0, 128), 1337n)]);
  });

  for (const [bs, length] of [
    [16, 1000],
    [600, 1900], // 2400-byte windows: past the one-shot threshold, on the streaming hasher
    [1, 37],
  ] as const) {
    it(`matches the peer block by block for ${length} spread tokens at block size ${bs}, standard and Eagle`, () => {
      const tokens = spreadTokens(length);
      const standard = computeBlockHashForSeq(tokens, bs);
      expect(standard).to.have.length(Math.floor(length / bs));
      standard.forEach((h, i) => expect(h, `block ${i}`).to.equal(peer(leBytes(tokens.slice(i * bs, (i + 1) * bs)), 1337n)));
      const eagle = computeBlockHashForSeq(tokens, bs, { isEagle: true });
      expect(eagle).to.have.length(Math.floor((length - 1) / bs));
      eagle.forEach((h, i) => expect(h, `Eagle block ${i}`).to.equal(peer(leBytes(tokens.slice(i * bs, (i + 1) * bs + 1)), 1337n)));
    });
  }

  it("gives the same hashes for a number[], a Uint32Array and a Uint32Array view at an offset", () => {
    const tokens = spreadTokens(50);
    const want = computeBlockHashForSeq(tokens, 8);
    expect(computeBlockHashForSeq(Uint32Array.from(tokens), 8)).to.deep.equal(want);
    const backing = new Uint32Array(60);
    backing.set(tokens, 7);
    expect(computeBlockHashForSeq(backing.subarray(7, 57), 8)).to.deep.equal(want);
  });

  it("does not write to the tokens it is given", () => {
    const tokens = Uint32Array.from(spreadTokens(20));
    const before = Array.from(tokens);
    computeBlockHashForSeq(tokens, 4, { isEagle: true, loraName: "a", cacheNamespace: "b" });
    expect(Array.from(tokens)).to.deep.equal(before);
  });

  it("gives no blocks for block size 0, standard and Eagle, whatever the tokens", () => {
    expect(computeBlockHashForSeq(range(100), 0)).to.deep.equal([]);
    expect(computeBlockHashForSeq(range(100), 0, { isEagle: true, loraName: "x" })).to.deep.equal([]);
    expect(computeBlockHashForSeq([], 0)).to.deep.equal([]);
  });

  it("gives no blocks for an empty sequence or one shorter than a window", () => {
    expect(computeBlockHashForSeq([], 4)).to.deep.equal([]);
    expect(computeBlockHashForSeq(range(3), 4)).to.deep.equal([]);
    expect(computeBlockHashForSeq(range(4), 4, { isEagle: true })).to.deep.equal([]);
  });

  for (const bad of [-1, 1.5, Number.NaN, 2 ** 32, Number.POSITIVE_INFINITY]) {
    it(`refuses block size ${bad} with INVALID_BLOCK_SIZE`, () => {
      expectCode(() => computeBlockHashForSeq(range(8), bad), "INVALID_BLOCK_SIZE");
    });
  }

  for (const bad of [-1, 2 ** 32, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
    it(`refuses token ${bad} with INVALID_TOKEN naming its index`, () => {
      const tokens = [1, 2, 3, bad, 5];
      expect(() => computeBlockHashForSeq(tokens, 2)).to.throw(KvHashError, /token 3 /).with.property("code", "INVALID_TOKEN");
    });
  }

  it("refuses a bad token in the dropped partial tail and at block size 0 too", () => {
    expectCode(() => computeBlockHashForSeq([1, 2, 3, 4, -7], 4), "INVALID_TOKEN");
    expectCode(() => computeBlockHashForSeq([1, 2, 0.5], 0), "INVALID_TOKEN");
  });

  it("keeps the hashes of a prompt a prefix of the hashes of its extension", () => {
    for (const isEagle of [false, true]) {
      const short = computeBlockHashForSeq(spreadTokens(45), 8, { isEagle, cacheNamespace: "ns" });
      const long = computeBlockHashForSeq(spreadTokens(100), 8, { isEagle, cacheNamespace: "ns" });
      expect(long.slice(0, short.length), `isEagle ${isEagle}`).to.deep.equal(short);
      expect(long.length).to.be.greaterThan(short.length);
    }
  });
});

describe("KV block hashing: LoRA and namespace salt", () => {
  const tokens = range(12);
  const base = computeBlockHashForSeq(tokens, 4);

  /** The salt as D.2 states it, computed here from the peer. */
  function expectedSalt(lora: string | undefined, namespace: string | undefined): bigint {
    let seed = 1337n;
    if (lora) seed += peer(utf8.encode(lora), 0n);
    if (namespace) seed += peer(utf8.encode(namespace), 1n);
    return seed % U64;
  }

  it("salts a LoRA request with 1337 + XXH3(lora, 0), the same as hashing each block with that seed", () => {
    const salt = computeSaltHash({ loraName: "tenant-a" });
    expect(salt).to.equal(expectedSalt("tenant-a", undefined));
    const lora = computeBlockHashForSeq(tokens, 4, { loraName: "tenant-a" });
    expect(lora).to.deep.equal([0, 1, 2].map((i) => computeBlockHash(leBytes(tokens.slice(i * 4, i * 4 + 4)), salt)));
    lora.forEach((h, i) => expect(h).not.to.equal(base[i]));
  });

  it("salts a namespace with 1337 + XXH3(namespace, 1), and both together with the wrapping sum of the two", () => {
    expect(computeSaltHash({ cacheNamespace: "tenant-ns" })).to.equal(expectedSalt(undefined, "tenant-ns"));
    expect(computeSaltHash({ loraName: "tenant-a", cacheNamespace: "tenant-ns" })).to.equal(expectedSalt("tenant-a", "tenant-ns"));
    const both = computeBlockHashForSeq(tokens, 4, { loraName: "tenant-a", cacheNamespace: "tenant-ns" });
    expect(both[0]).to.equal(peer(leBytes(tokens.slice(0, 4)), expectedSalt("tenant-a", "tenant-ns")));
  });

  it("wraps the salt at 2^64 rather than growing past it", () => {
    // Find names whose unwrapped salt passes 2^64 (about half of all pairs do).
    const names = range(32).map((i) => `name-${i}`);
    const pair = names
      .flatMap((lora) => names.map((ns) => [lora, ns] as const))
      .find(([lora, ns]) => 1337n + peer(utf8.encode(lora), 0n) + peer(utf8.encode(ns), 1n) >= U64);
    expect(pair, "a pair whose salt wraps").not.to.equal(undefined);
    const [lora, ns] = pair!;
    const salt = computeSaltHash({ loraName: lora, cacheNamespace: ns });
    expect(salt).to.equal(1337n + peer(utf8.encode(lora), 0n) + peer(utf8.encode(ns), 1n) - U64);
    expect(computeBlockHashForSeq(tokens, 4, { loraName: lora, cacheNamespace: ns })[0]).to.equal(peer(leBytes(tokens.slice(0, 4)), salt));
  });

  const baseLike: [string, BlockHashOptions][] = [
    ["no options", {}],
    ['lora ""', { loraName: "" }],
    ['namespace ""', { cacheNamespace: "" }],
    ['lora "" and namespace ""', { loraName: "", cacheNamespace: "" }],
    ["explicit undefined", { loraName: undefined, cacheNamespace: undefined, blockMmInfos: undefined }],
  ];
  for (const [name, options] of baseLike) {
    it(`hashes ${name} exactly like the base model`, () => {
      expect(computeSaltHash(options)).to.equal(1337n);
      expect(computeBlockHashForSeq(tokens, 4, options)).to.deep.equal(base);
    });
  }

  it('keeps namespace "tenant-a", lora "tenant-a" and both apart from each other and from the base', () => {
    const ns = computeBlockHashForSeq(tokens, 4, { cacheNamespace: "tenant-a" });
    const lora = computeBlockHashForSeq(tokens, 4, { loraName: "tenant-a" });
    const both = computeBlockHashForSeq(tokens, 4, { loraName: "tenant-a", cacheNamespace: "tenant-a" });
    const spaces = [base, ns, lora, both].map((hashes) => hashes[0]);
    expect(new Set(spaces).size).to.equal(4);
  });

  it("hashes a lora name as UTF-8", () => {
    expect(computeSaltHash({ loraName: "ädäpter-🦙" })).to.equal(expectedSalt("ädäpter-🦙", undefined));
  });
});

describe("KV block hashing: multimodal blocks", () => {
  const tokens = range(12);
  const base = computeBlockHashForSeq(tokens, 4);
  const info = (...hashes: bigint[]): BlockExtraInfo => ({ mmObjects: hashes.map((mmHash) => ({ mmHash, offsets: [[0, 4]] as const })) });
  const big = 0xf000_0000_0000_0001n;

  it("appends a block's mm hashes, ascending and little-endian, to that block's tokens only", () => {
    const hashes = computeBlockHashForSeq(tokens, 4, { blockMmInfos: [undefined, info(big, 3n, 2n)] });
    expect(hashes[0]).to.equal(base[0]);
    expect(hashes[1]).to.equal(peer(leBytes(tokens.slice(4, 8), [2n, 3n, big]), 1337n));
    expect(hashes[2]).to.equal(base[2]);
  });

  it("does not depend on the order of a block's mm objects", () => {
    const orders = [
      [1n, 2n, big],
      [big, 2n, 1n],
      [2n, big, 1n],
    ];
    const results = orders.map((order) => computeBlockHashForSeq(tokens, 4, { blockMmInfos: [info(...order)] })[0]);
    expect(new Set(results).size).to.equal(1);
    expect(results[0]).not.to.equal(base[0]);
  });

  it("keeps repeated mm hashes (an image twice is not the image once)", () => {
    const twice = computeBlockHashForSeq(tokens, 4, { blockMmInfos: [info(5n, 5n)] })[0];
    expect(twice).to.equal(peer(leBytes(tokens.slice(0, 4), [5n, 5n]), 1337n));
    expect(twice).not.to.equal(computeBlockHashForSeq(tokens, 4, { blockMmInfos: [info(5n)] })[0]);
  });

  it("treats null, undefined, an empty object list and infos past the last block as no multimodal data", () => {
    const options: BlockHashOptions = { blockMmInfos: [null, undefined, info(), info(9n), info(10n)] };
    expect(computeBlockHashForSeq(tokens, 4, options)).to.deep.equal(base);
  });

  it("salts multimodal blocks like any other and applies infos by Eagle window index", () => {
    const options: BlockHashOptions = { isEagle: true, loraName: "l", blockMmInfos: [undefined, info(7n)] };
    const hashes = computeBlockHashForSeq(tokens, 4, options);
    const salt = computeSaltHash({ loraName: "l" });
    expect(hashes).to.deep.equal([peer(leBytes(tokens.slice(0, 5)), salt), peer(leBytes(tokens.slice(4, 9), [7n]), salt)]);
  });

  it("refuses an mm hash outside u64 with INVALID_U64", () => {
    expectCode(() => computeBlockHashForSeq(tokens, 4, { blockMmInfos: [info(-1n)] }), "INVALID_U64");
    expectCode(() => computeBlockHashForSeq(tokens, 4, { blockMmInfos: [undefined, info(1n, U64)] }), "INVALID_U64");
  });
});
