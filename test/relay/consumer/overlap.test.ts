import { expect } from "chai";
import {
  canonicalModelId,
  computeBlockHashForSeq,
  computeSeqHashForBlock,
  createRegistration,
  createRegistrationWithTarget,
  DcCkfState,
  loraTarget,
  modelAlias,
  type BlockHashOptions,
  type CanonicalModelRegistration,
  type KvQueryHashFormat,
  type RouterEvent,
} from "../../../src/kv/index.js";
import { LaneMirror, LaneProbe, poolOverlap, PromptHashes } from "../../../src/relay/index.js";
import { descriptor, MODEL, prng, producer, snapshotUpdates } from "./mirror-helpers.js";

const BLOCK = 4;
/** 42 tokens: 10 standard blocks (2 tokens left over), 10 Eagle windows. */
const PROMPT = Array.from({ length: 42 }, (_, i) => (i * 7919 + 13) % 50_000);
const STORED_BLOCKS = 6;

let eventId = 1n;

/**
 * A producer's filter holding the first `blocks` blocks of `tokens` hashed
 * with `options`, as a worker would report them (tokens_hash = the local
 * block hash), and a consumer's mirror of it built from its snapshot.
 */
function mirroredFilter(tokens: readonly number[], blocks: number, options: BlockHashOptions) {
  const state = new DcCkfState({ expectedBlocksPerDc: 256 });
  const hashes = computeBlockHashForSeq(tokens, BLOCK, options).slice(0, blocks);
  const event: RouterEvent = {
    workerId: 1n,
    dpRank: 0,
    eventId: eventId++,
    data: { kind: "stored", blocks: hashes.map((tokensHash, i) => ({ blockHash: 10_000n + BigInt(i), tokensHash })) },
  };
  expect(state.applyEvent(event).firstError).to.equal(undefined);
  const format = state.format();
  const id = producer({ seed: format.seed, bucketCount: format.bucketCount });
  const mirror = new LaneMirror(id);
  for (const update of snapshotUpdates(id, 1n, state.words())) mirror.apply(update);
  return { state, id, words: mirror.words! };
}

/** What the filter truly holds: leading sequence hashes the producer's state contains. */
function truth(state: DcCkfState, tokens: readonly number[], options: BlockHashOptions): number {
  const seq = computeSeqHashForBlock(computeBlockHashForSeq(tokens, BLOCK, options));
  let depth = 0;
  while (depth < seq.length && state.contains(seq[depth]!)) depth++;
  return depth;
}

function pool(id: ReturnType<typeof producer>, registrations: readonly CanonicalModelRegistration[], hashFormat: KvQueryHashFormat = "DYNAMO_STANDARD_V1") {
  return descriptor(id, { registrations, blockSize: BLOCK, hashFormat });
}

function matched(result: ReturnType<typeof poolOverlap>): number | undefined {
  return result.served ? result.matchedBlocks : undefined;
}

describe("relay consumer: overlap", () => {
  it("matches the leading blocks the filter holds, no more and no fewer", () => {
    const { state, id, words } = mirroredFilter(PROMPT, STORED_BLOCKS, {});
    const desc = pool(id, [createRegistration(MODEL)]);
    expect(truth(state, PROMPT, {})).to.equal(STORED_BLOCKS);
    const result = poolOverlap(PROMPT, MODEL, desc, words);
    expect(result).to.deep.include({ served: true, matchedBlocks: STORED_BLOCKS, totalBlocks: 10, blockSize: BLOCK });

    // A prompt that departs from the stored one inside block 3 matches blocks 0..2 only.
    const departed = PROMPT.slice();
    departed[3 * BLOCK + 1] = 49_999;
    expect(truth(state, departed, {})).to.equal(3);
    expect(matched(poolOverlap(departed, MODEL, desc, words))).to.equal(3);
    // A prompt shorter than the stored prefix: every complete block matches; the partial one is not hashed.
    const short = PROMPT.slice(0, 2 * BLOCK + 3);
    expect(poolOverlap(short, MODEL, desc, words)).to.deep.include({ matchedBlocks: 2, totalBlocks: 2 });
    expect(poolOverlap([], MODEL, desc, words)).to.deep.include({ matchedBlocks: 0, totalBlocks: 0 });
    // Same chain, other first block: nothing (a sequence hash names the whole prefix).
    const otherRoot = PROMPT.slice();
    otherRoot[0] = 1;
    expect(matched(poolOverlap(otherRoot, MODEL, desc, words))).to.equal(0);
  });

  it("agrees with the producer's own membership test on both candidate buckets", () => {
    const { state, id, words } = mirroredFilter(PROMPT, STORED_BLOCKS, {});
    const probe = new LaneProbe(id.format, words);
    const stored = computeSeqHashForBlock(computeBlockHashForSeq(PROMPT, BLOCK)).slice(0, STORED_BLOCKS);
    for (const key of stored) expect(probe.contains(key)).to.equal(true);
    const random = prng(99);
    for (let i = 0; i < 2_000; i++) {
      const key = (BigInt(Math.floor(random() * 2 ** 32)) << 32n) | BigInt(Math.floor(random() * 2 ** 32));
      expect(probe.contains(key)).to.equal(state.contains(key));
    }
  });

  it("resolves aliases to the canonical registration and leaves unknown models unserved", () => {
    const { id, words } = mirroredFilter(PROMPT, STORED_BLOCKS, {});
    const desc = pool(id, [createRegistration(MODEL, [modelAlias("friendly-name")])]);
    const byAlias = poolOverlap(PROMPT, "friendly-name", desc, words);
    expect(byAlias.served && byAlias.registration.model).to.equal(MODEL);
    expect(matched(byAlias)).to.equal(STORED_BLOCKS);
    expect(poolOverlap(PROMPT, "another-model", desc, words)).to.deep.equal({ served: false });
    expect(poolOverlap(PROMPT, "", desc, words)).to.deep.equal({ served: false });
  });

  it("salts a LoRA request with the canonical adapter name, whatever name the client used", () => {
    const adapter = canonicalModelId("adapter-x");
    const { state, id, words } = mirroredFilter(PROMPT, STORED_BLOCKS, { loraName: adapter });
    const lora = createRegistrationWithTarget(canonicalModelId("lora-model"), loraTarget(MODEL, adapter), [modelAlias("my-lora")]);
    const desc = pool(id, [createRegistration(MODEL), lora]);
    expect(truth(state, PROMPT, { loraName: adapter })).to.equal(STORED_BLOCKS);
    expect(matched(poolOverlap(PROMPT, "lora-model", desc, words))).to.equal(STORED_BLOCKS);
    expect(matched(poolOverlap(PROMPT, "my-lora", desc, words))).to.equal(STORED_BLOCKS);
    // The base model is unsalted: its hashes are not the adapter's blocks.
    expect(matched(poolOverlap(PROMPT, MODEL, desc, words))).to.equal(0);
    // Salting with the alias instead would find nothing.
    expect(truth(state, PROMPT, { loraName: "my-lora" })).to.equal(0);
  });

  it("hashes Eagle windows (block size + 1 tokens) for an Eagle pool", () => {
    const { state, id, words } = mirroredFilter(PROMPT, STORED_BLOCKS, { isEagle: true });
    expect(truth(state, PROMPT, { isEagle: true })).to.equal(STORED_BLOCKS);
    const eagle = poolOverlap(PROMPT, MODEL, pool(id, [createRegistration(MODEL)], "DYNAMO_EAGLE_V1"), words);
    // (42 - 1) / 4 = 10 complete Eagle windows.
    expect(eagle).to.deep.include({ served: true, matchedBlocks: STORED_BLOCKS, totalBlocks: 10 });
    const standard = poolOverlap(PROMPT, MODEL, pool(id, [createRegistration(MODEL)], "DYNAMO_STANDARD_V1"), words);
    expect(matched(standard)).to.equal(0);
    // 40 tokens: still 10 standard blocks, but only 9 Eagle windows.
    const shorter = PROMPT.slice(0, 40);
    expect(poolOverlap(shorter, MODEL, pool(id, [createRegistration(MODEL)], "DYNAMO_EAGLE_V1"), words)).to.deep.include({ totalBlocks: 9 });
  });

  it("applies the request's cache namespace to every pool", () => {
    const { id, words } = mirroredFilter(PROMPT, STORED_BLOCKS, { cacheNamespace: "tenant-a" });
    const desc = pool(id, [createRegistration(MODEL)]);
    expect(matched(poolOverlap(new PromptHashes(PROMPT, { cacheNamespace: "tenant-a" }), MODEL, desc, words))).to.equal(STORED_BLOCKS);
    expect(matched(poolOverlap(PROMPT, MODEL, desc, words))).to.equal(0);
  });

  it("hashes a prompt once per (block size, windows, salt)", () => {
    const prompt = new PromptHashes(PROMPT);
    const base = createRegistration(MODEL);
    const other = createRegistration(canonicalModelId("other"));
    const semantics = descriptor(producer(), { blockSize: BLOCK }).querySemantics;
    expect(prompt.hashedFor(base, semantics)).to.equal(prompt.hashedFor(other, semantics));
    const eagle = descriptor(producer(), { blockSize: BLOCK, hashFormat: "DYNAMO_EAGLE_V1" }).querySemantics;
    expect(prompt.hashedFor(base, eagle)).to.not.equal(prompt.hashedFor(base, semantics));
  });

  it("refuses a lane whose length is not the format's", () => {
    expect(() => new LaneProbe({ seed: 1n, bucketCount: 16 }, new BigUint64Array(8))).to.throw(RangeError);
  });
});
