/**
 * Prefix overlap of a prompt against one pool's mirrored filter (B.9
 * queries, D): how many leading blocks of the prompt the pool's filter holds.
 *
 * 1. The requested model resolves through the pool's registrations
 *    (canonical id first, then aliases); no match means the pool does not
 *    serve the model and there is no answer for it.
 * 2. The prompt's block hashes follow the pool's query semantics (block size,
 *    standard or Eagle windows) and the registration's salt (a LoRA target
 *    salts with its canonical adapter name, a base model is unsalted), via
 *    blockHashOptionsFor.
 * 3. They chain into sequence hashes (seq[0] = block[0], then
 *    XXH3(seq[i-1] ‖ block[i], 1337)): the keys the filter stores.
 * 4. The search is a linear scan from block 0 that stops at the first key
 *    neither candidate bucket holds (both are probed, B.2); the depth is the
 *    number of keys before it. A cuckoo filter has no false negatives, so
 *    the scan never stops before the end of the prefix the filter really
 *    holds; a false positive (at most 8 / 65,536 per probe, two full buckets
 *    of 16-bit fingerprints) can only extend it. The reference's
 *    verification-window search is not reproduced.
 *
 * Block hashes and the sequence chain are computed once per (block size,
 * windows, salt) for a prompt and shared by every pool with the same
 * semantics (PromptHashes); sequence hashes are chained only as far as a
 * scan asks for them.
 */
import {
  blockHashOptionsFor,
  CkfAddressing,
  slotsHoldKey,
  computeBlockHashForSeq,
  computeNextSeqHash,
  hi32,
  lo32,
  resolveRegistration,
  type BlockExtraInfo,
  type CanonicalModelRegistration,
  type DcCkfFormatIdentity,
  type KvQuerySemantics,
  type ProducerIdentity,
} from "../../kv/index.js";

/** Membership tests against a lane's words, with the filter's own addressing (B.2). */
export class LaneProbe {
  readonly addressing: CkfAddressing;
  /** The lane's 16-bit slots: the same memory as the words (little-endian host), never a copy. */
  private readonly slots: Uint16Array;

  constructor(format: Pick<DcCkfFormatIdentity, "seed" | "bucketCount">, words: BigUint64Array) {
    if (words.length !== format.bucketCount) throw new RangeError(`a lane of ${words.length} words is not the format's ${format.bucketCount} buckets`);
    this.addressing = new CkfAddressing(format.seed, format.bucketCount);
    this.slots = new Uint16Array(words.buffer, words.byteOffset, words.length * 4);
  }

  /** Whether either candidate bucket holds the key's fingerprint. */
  contains(seqHash: bigint): boolean {
    return slotsHoldKey(this.addressing, this.slots, hi32(seqHash), lo32(seqHash));
  }
}

export interface PromptOptions {
  /** The tenant cache namespace the request carries (RoutingHints cache_salt); none by default. */
  readonly cacheNamespace?: string | undefined;
  /** Per block, the multimodal objects in it (see computeBlockHashForSeq). */
  readonly blockMmInfos?: readonly (BlockExtraInfo | null | undefined)[] | undefined;
}

/** One prompt's block hashes and lazily chained sequence hashes, under one hashing of it. */
export class HashedPrompt {
  private readonly seq: bigint[] = [];
  constructor(readonly blocks: readonly bigint[]) {}

  sequenceHash(i: number): bigint {
    const seq = this.seq;
    while (seq.length <= i) {
      const n = seq.length;
      seq.push(n === 0 ? this.blocks[0]! : computeNextSeqHash(seq[n - 1]!, this.blocks[n]!));
    }
    return seq[i]!;
  }
}

/** A prompt, hashed at most once per distinct (block size, windows, salt) the pools ask for. */
export class PromptHashes {
  readonly tokens: ArrayLike<number>;
  readonly options: PromptOptions;
  private readonly hashed = new Map<string, HashedPrompt>();

  constructor(tokens: ArrayLike<number>, options: PromptOptions = {}) {
    this.tokens = tokens;
    this.options = options;
  }

  /** The prompt as `registration` in a pool with `semantics` hashes it. Throws KvHashError for a token that is not a u32. */
  hashedFor(registration: CanonicalModelRegistration, semantics: KvQuerySemantics): HashedPrompt {
    const options = { ...blockHashOptionsFor(registration, semantics, this.options.cacheNamespace), blockMmInfos: this.options.blockMmInfos };
    // JSON of the strings keeps names containing the separator apart.
    const key = JSON.stringify([semantics.kvBlockSize, semantics.isEagle, options.loraName ?? ""]);
    let hashed = this.hashed.get(key);
    if (hashed === undefined) {
      hashed = new HashedPrompt(computeBlockHashForSeq(this.tokens, semantics.kvBlockSize, options));
      this.hashed.set(key, hashed);
    }
    return hashed;
  }
}

/** What a pool must say about itself for an overlap query (a PoolDescriptor has all of it). */
export interface OverlapPool {
  readonly producer: ProducerIdentity;
  readonly registrations: readonly CanonicalModelRegistration[];
  readonly querySemantics: KvQuerySemantics;
}

export type PoolOverlapResult =
  | { readonly served: false }
  | {
      readonly served: true;
      /** The registration the model resolved to; `model` is the canonical id to report. */
      readonly registration: CanonicalModelRegistration;
      /** Leading blocks whose sequence hashes the filter holds, in a row. */
      readonly matchedBlocks: number;
      /** Complete blocks of the prompt at the pool's block size (and windows). */
      readonly totalBlocks: number;
      readonly blockSize: number;
    };

/** The leading keys of `prompt` the probe holds: a linear scan to the first miss. */
export function matchedPrefixBlocks(prompt: HashedPrompt, probe: LaneProbe): number {
  const total = prompt.blocks.length;
  let depth = 0;
  while (depth < total && probe.contains(prompt.sequenceHash(depth))) depth++;
  return depth;
}

/**
 * The prefix overlap of a prompt (tokens, or a PromptHashes shared across
 * pools) for `model` in `pool`, whose ready lane is `lane` (its words, or a
 * LaneProbe over them).
 */
export function poolOverlap(
  prompt: PromptHashes | ArrayLike<number>,
  model: string,
  pool: OverlapPool,
  lane: LaneProbe | BigUint64Array,
): PoolOverlapResult {
  const registration = resolveRegistration(pool.registrations, model);
  if (registration === undefined) return { served: false };
  const hashes = prompt instanceof PromptHashes ? prompt : new PromptHashes(prompt);
  const probe = lane instanceof LaneProbe ? lane : new LaneProbe(pool.producer.format, lane);
  const hashed = hashes.hashedFor(registration, pool.querySemantics);
  return {
    served: true,
    registration,
    matchedBlocks: matchedPrefixBlocks(hashed, probe),
    totalBlocks: hashed.blocks.length,
    blockSize: pool.querySemantics.kvBlockSize,
  };
}
