import { expect } from "chai";
import { xxh3 } from "@node-rs/xxhash";
import { U64_MAX } from "../../src/bytes/index.js";
import { hashMmIdentifier, KvHashError, MM_PAD_HASH_MASK, MM_PAD_SHIFT_VALUE, padValueForMmHash } from "../../src/kv/hash/index.js";

const utf8 = new TextEncoder();

/** XXH3-64 without a seed, from the peer. */
function unseeded(text: string): bigint {
  return xxh3.xxh64(utf8.encode(text));
}

describe("multimodal identifiers and pad values", () => {
  const digest = "0123456789abcdef" + "f".repeat(48);

  const identifiers: [string, string, bigint | undefined][] = [
    ["a 64-character lowercase hex digest, as its first 16 hex digits", digest, 0x0123_4567_89ab_cdefn],
    ["a 64-character uppercase hex digest", "FEDCBA9876543210" + "0".repeat(48), 0xfedc_ba98_7654_3210n],
    ["a mixed-case hex digest", "aBcDeF0123456789" + "9".repeat(48), 0xabcd_ef01_2345_6789n],
    ["a short opaque identifier, by XXH3 without a seed", "image-1", unseeded("image-1")],
    ["63 hex characters, by XXH3", digest.slice(1), unseeded(digest.slice(1))],
    ["65 hex characters, by XXH3", digest + "0", unseeded(digest + "0")],
    ["64 characters with one non-hex, by XXH3", "g" + digest.slice(1), unseeded("g" + digest.slice(1))],
    ["64 non-ASCII characters, by XXH3 of their UTF-8", "é".repeat(64), unseeded("é".repeat(64))],
    ["the empty string, as no hash", "", undefined],
  ];
  for (const [name, identifier, want] of identifiers) {
    it(`hashes ${name}`, () => {
      expect(hashMmIdentifier(identifier)).to.equal(want);
    });
  }

  it("does not take the hex mapping for opaque identifiers (the digest prefix differs from the XXH3)", () => {
    expect(hashMmIdentifier(digest)).not.to.equal(unseeded(digest));
  });

  const pads: [bigint, number][] = [
    [0n, 1_000_000],
    [1n, 1_000_001],
    [(1n << 30n) - 1n, 1_000_000 + 1_073_741_823],
    [1n << 30n, 1_000_000],
    [0x1234_5678_9abc_def0n, 1_000_000 + 0x1abc_def0],
    [U64_MAX, 1_074_741_823],
  ];
  for (const [hash, pad] of pads) {
    it(`pads mm hash 0x${hash.toString(16)} as ${pad} (1,000,000 + the low 30 bits)`, () => {
      expect(padValueForMmHash(hash)).to.equal(pad);
    });
  }

  it("pins sglang's constants", () => {
    expect(MM_PAD_SHIFT_VALUE).to.equal(1_000_000);
    expect(MM_PAD_HASH_MASK).to.equal(0x3fff_ffffn);
  });

  it("refuses an mm hash outside u64 with INVALID_U64", () => {
    expect(() => padValueForMmHash(-1n)).to.throw(KvHashError).with.property("code", "INVALID_U64");
    expect(() => padValueForMmHash(U64_MAX + 1n)).to.throw(KvHashError).with.property("code", "INVALID_U64");
  });
});
