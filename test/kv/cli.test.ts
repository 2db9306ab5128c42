import { expect } from "chai";
import { xxh3 } from "@node-rs/xxhash";
import { runMmgate } from "../support/index.js";

/** Runs `mmgate kv ARGS` in process, as the executable does; its output, error output and exit code. */
async function kv(...args: string[]): Promise<{ out: string; err: string; code: number }> {
  const { stdout, stderr, code } = await runMmgate(["kv", ...args]);
  return { out: stdout, err: stderr, code };
}

const le32 = (tokens: number[]) => {
  const bytes = new Uint8Array(tokens.length * 4);
  const view = new DataView(bytes.buffer);
  tokens.forEach((t, i) => view.setUint32(i * 4, t, true));
  return bytes;
};
const le64 = (...values: bigint[]) => {
  const bytes = new Uint8Array(values.length * 8);
  const view = new DataView(bytes.buffer);
  values.forEach((v, i) => view.setBigUint64(i * 8, v, true));
  return bytes;
};

describe("mmgate kv", () => {
  it("hash prints each complete block's hash and the chained sequence hash", async () => {
    const { out, code } = await kv("hash", "--block-size", "4", "--json", "0", "1", "2", "3", "4", "5", "6", "7", "8");
    expect(code).to.equal(0);
    const parsed = JSON.parse(out) as { seed: string; blocks: { index: number; tokens: number[]; blockHash: string; sequenceHash: string }[] };
    // Independent of src/kv: XXH3 over the tokens as u32 LE, seed 1337; the chain over 16 bytes, seed 1337.
    const b0 = xxh3.xxh64(le32([0, 1, 2, 3]), 1337n);
    const b1 = xxh3.xxh64(le32([4, 5, 6, 7]), 1337n);
    const s1 = xxh3.xxh64(le64(b0, b1), 1337n);
    expect(parsed.seed).to.equal("1337");
    expect(parsed.blocks).to.deep.equal([
      { index: 0, tokens: [0, 3], blockHash: String(b0), sequenceHash: String(b0) },
      { index: 1, tokens: [4, 7], blockHash: String(b1), sequenceHash: String(s1) },
    ]);
  });

  it("hash salts with the LoRA name and the namespace, and takes Eagle windows", async () => {
    const seed = (1337n + xxh3.xxh64(new TextEncoder().encode("tenant-a"), 0n) + xxh3.xxh64(new TextEncoder().encode("ns"), 1n)) & ((1n << 64n) - 1n);
    const { out } = await kv("hash", "--block-size", "2", "--lora", "tenant-a", "--namespace", "ns", "--eagle", "--json", "0", "1", "2", "3", "4", "5");
    const parsed = JSON.parse(out) as { seed: string; format: string; blocks: { tokens: number[]; blockHash: string }[] };
    expect(parsed.seed).to.equal(String(seed));
    expect(parsed.format).to.equal("DYNAMO_EAGLE_V1");
    expect(parsed.blocks.map((b) => b.tokens)).to.deep.equal([
      [0, 2],
      [2, 4],
    ]);
    expect(parsed.blocks[1]!.blockHash).to.equal(String(xxh3.xxh64(le32([2, 3, 4]), seed)));
  });

  it("hash in text: a header line and one row per block; none for a sequence shorter than a block", async () => {
    const { out } = await kv("hash", "--block-size", "4", "0", "1", "2", "3", "4");
    const lines = out.trimEnd().split("\n");
    expect(lines[0]).to.equal("5 tokens, block size 4, seed 1337: 1 complete block");
    expect(lines).to.have.length(3);
    expect(lines[2]).to.match(/^0\s+0\.\.3\s+\d+\s+\d+$/);
    expect((await kv("hash", "--block-size", "4", "0", "1")).out.trimEnd()).to.equal("2 tokens, block size 4, seed 1337: 0 complete blocks");
  });

  it("locate prints the mixed hash, the fingerprint and both buckets, from an independent XXH3", async () => {
    const key = 13226331709069118873n;
    const seed = 0x5deece66d1b54a33n;
    const { out, code } = await kv("locate", "--buckets", "1024", "--json", String(key));
    expect(code).to.equal(0);
    const mixed = xxh3.xxh64(le64(key), seed);
    const fingerprint = Number(mixed & 0xffffn) || 1;
    const bucketA = Number((mixed >> 16n) & 1023n);
    const delta = Number(xxh3.xxh64(Uint8Array.of(fingerprint & 0xff, fingerprint >> 8), seed ^ 0x9e3779b97f4a7c15n) & 1023n) || 1;
    expect(JSON.parse(out)).to.deep.equal({ key: String(key), seed: String(seed), buckets: 1024, mixed: String(mixed), fingerprint, bucketA, bucketB: bucketA ^ delta });
    // Hex keys and seeds parse to the same values.
    const hex = await kv("locate", "--buckets", "1024", "--seed", `0x${seed.toString(16)}`, "--json", `0x${key.toString(16)}`);
    expect(hex.out).to.equal(out);
  });

  it("hash reads a long prompt (40,000 tokens) as it reads a short one", async () => {
    const tokens = Array.from({ length: 40_000 }, (_, i) => String(i % 32_000));
    const { out, code } = await kv("hash", "--block-size", "16", "--json", ...tokens);
    expect(code).to.equal(0);
    const parsed = JSON.parse(out) as { tokens: number; blocks: { blockHash: string }[] };
    expect(parsed.tokens).to.equal(40_000);
    expect(parsed.blocks).to.have.length(2_500);
    expect(parsed.blocks[2_499]!.blockHash).to.equal(String(xxh3.xxh64(le32(Array.from({ length: 16 }, (_, i) => (39_984 + i) % 32_000)), 1337n)));
  });

  for (const [name, args, message] of [
    ["a token past u32", ["hash", "--block-size", "4", "4294967296"], /token "4294967296" is not a u32/],
    ["a token that is no number", ["hash", "--block-size", "4", "x"], /token "x" is not a u32/],
    ["block size 0", ["hash", "--block-size", "0", "1"], /--block-size must be an integer from 1/],
    ["a block size past u32", ["hash", "--block-size", "4294967296", "1"], /--block-size must be an integer from 1 to 4294967295/],
    ["a bucket count that is no power of two", ["locate", "--buckets", "1000", "1"], /--buckets must be a power of two/],
    ["a key past 2^64 - 1", ["locate", "--buckets", "1024", "18446744073709551616"], /past 2\^64 - 1/],
    ["a negative key", ["locate", "--buckets", "1024", "--", "-1"], /must be a u64/],
  ] as const) {
    it(`refuses ${name} as a usage error (exit 2) in the one format`, async () => {
      const { out, err, code } = await kv(...args);
      expect(code).to.equal(2);
      expect(err).to.match(/^mmgate kv (hash|locate): \[usage\] /);
      expect(err).to.match(message);
      expect(out).to.equal("");
    });
  }
});
