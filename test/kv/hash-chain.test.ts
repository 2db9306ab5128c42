import { expect } from "chai";
import { U64_MAX, xxh3_64 } from "../../src/bytes/index.js";
import {
  CHAIN_XXH3_SEED,
  computeBlockHashForSeq,
  computeNextSeqHash,
  computeSeqHashForBlock,
  KvHashError,
  type KvHashErrorCode,
} from "../../src/kv/hash/index.js";

/** le64(parent) ‖ le64(block), byte by byte. */
function pairBytes(parent: bigint, block: bigint): Uint8Array {
  const out = new Uint8Array(16);
  for (let i = 0; i < 8; i++) {
    out[i] = Number((parent >> BigInt(8 * i)) & 0xffn);
    out[8 + i] = Number((block >> BigInt(8 * i)) & 0xffn);
  }
  return out;
}

function expectedNext(parent: bigint, block: bigint): bigint {
  return xxh3_64(pairBytes(parent, block), 1337n);
}

function expectCode(fn: () => unknown, code: KvHashErrorCode): void {
  expect(fn).to.throw(KvHashError).with.property("code", code);
}

describe("KV sequence (chain) hashes", () => {
  const tokens = Array.from({ length: 40 }, (_, i) => (i * 7919) % 50_000);

  it("uses seed 1337 for the chain", () => {
    expect(CHAIN_XXH3_SEED).to.equal(1337n);
  });

  it("gives nothing for no blocks and the block hash itself for one block", () => {
    expect(computeSeqHashForBlock([])).to.deep.equal([]);
    expect(computeSeqHashForBlock([42n])).to.deep.equal([42n]);
  });

  it("starts with the first block hash and chains XXH3(le(parent) ‖ le(block), 1337) from there", () => {
    const blocks = computeBlockHashForSeq(tokens, 4);
    const seq = computeSeqHashForBlock(blocks);
    expect(seq).to.have.length(10);
    expect(seq[0]).to.equal(blocks[0]);
    for (let i = 1; i < seq.length; i++) expect(seq[i], `seq ${i}`).to.equal(expectedNext(seq[i - 1]!, blocks[i]!));
  });

  const pairs: [string, bigint, bigint][] = [
    ["zeros", 0n, 0n],
    ["all ones", U64_MAX, U64_MAX],
    ["distinct bytes", 0x0102_0304_0506_0708n, 0x1122_3344_5566_7788n],
    ["swapped", 0x1122_3344_5566_7788n, 0x0102_0304_0506_0708n],
  ];
  for (const [name, parent, block] of pairs) {
    it(`computes the next sequence hash of ${name} over the 16 little-endian bytes`, () => {
      expect(computeNextSeqHash(parent, block)).to.equal(expectedNext(parent, block));
    });
  }

  it("is order sensitive: (a, b) and (b, a) chain differently", () => {
    expect(computeNextSeqHash(1n, 2n)).not.to.equal(computeNextSeqHash(2n, 1n));
  });

  it("gives the same chain one block at a time as all at once", () => {
    const blocks = computeBlockHashForSeq(tokens, 8, { isEagle: true });
    const seq = computeSeqHashForBlock(blocks);
    let parent = blocks[0]!;
    const incremental = [parent];
    for (const block of blocks.slice(1)) incremental.push((parent = computeNextSeqHash(parent, block)));
    expect(incremental).to.deep.equal(seq);
  });

  it("carries the salt only through the block hashes, never the chain seed", () => {
    const blocks = computeBlockHashForSeq(tokens, 4, { loraName: "tenant-a", cacheNamespace: "tenant-ns" });
    const seq = computeSeqHashForBlock(blocks);
    expect(seq[1]).to.equal(expectedNext(blocks[0]!, blocks[1]!));
  });

  it("keeps the sequence hashes of a prompt a prefix of those of its extension", () => {
    const short = computeSeqHashForBlock(computeBlockHashForSeq(tokens.slice(0, 22), 4));
    const long = computeSeqHashForBlock(computeBlockHashForSeq(tokens, 4));
    expect(long.slice(0, short.length)).to.deep.equal(short);
  });

  it("refuses hashes outside u64 with INVALID_U64", () => {
    expectCode(() => computeNextSeqHash(-1n, 0n), "INVALID_U64");
    expectCode(() => computeNextSeqHash(0n, U64_MAX + 1n), "INVALID_U64");
    expectCode(() => computeSeqHashForBlock([1n, -2n]), "INVALID_U64");
    expectCode(() => computeSeqHashForBlock([U64_MAX + 1n]), "INVALID_U64");
  });
});
