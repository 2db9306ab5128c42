/** Shared helpers of the CKF tests: events, externals, mirrors. */
import { computeNextSeqHash } from "../../src/kv/hash/index.js";
import type { DcCkfBucketImage, DcCkfPublicationBatch, RouterEvent, StoredBlock } from "../../src/kv/ckf/index.js";

export const U64_MAX = (1n << 64n) - 1n;

/** A worker's own id for a block: the canonical hash under a per-member mask, as real workers use their own ids. */
export function external(canonical: bigint, workerId: bigint, dpRank: number): bigint {
  return canonical ^ ((0xc0de_cafe_d15c_0a11n * (workerId + 1n) + BigInt(dpRank) * 0x1_0000_0001n) & U64_MAX);
}

/** Canonical hashes of a chain of token hashes continuing `parent` (or from the root). */
export function chain(tokensHashes: readonly bigint[], parent?: bigint): bigint[] {
  const out: bigint[] = [];
  let previous = parent;
  for (const tokens of tokensHashes) {
    previous = previous === undefined ? tokens : computeNextSeqHash(previous, tokens);
    out.push(previous);
  }
  return out;
}

let nextEventId = 1n;

export function storedEvent(
  workerId: bigint,
  dpRank: number,
  blocks: readonly StoredBlock[],
  extra: { parentHash?: bigint; startPosition?: number; storageTier?: RouterEvent["storageTier"]; residencyDomain?: string } = {},
): RouterEvent {
  const { storageTier, residencyDomain, ...data } = extra;
  return {
    workerId,
    dpRank,
    eventId: nextEventId++,
    data: { kind: "stored", blocks, ...data },
    ...(storageTier === undefined ? {} : { storageTier }),
    ...(residencyDomain === undefined ? {} : { residencyDomain }),
  };
}

/** The seed test's mask between a sequence hash and the worker's external block id. */
export const SEED_EXTERNAL_MASK = 0xc0de_cafe_d15c_0a11n;

/**
 * The seed test's Stored event from worker 1, rank 0: each block's external
 * id is its sequence hash masked, its tokens hash the block's local hash.
 */
export function seedStoredEvent(eventId: bigint, parentSequence: bigint | undefined, local: readonly bigint[], sequence: readonly bigint[]): RouterEvent {
  return {
    workerId: 1n,
    dpRank: 0,
    eventId,
    data: {
      kind: "stored",
      parentHash: parentSequence === undefined ? undefined : parentSequence ^ SEED_EXTERNAL_MASK,
      blocks: local.map((tokensHash, i) => ({ blockHash: sequence[i]! ^ SEED_EXTERNAL_MASK, tokensHash })),
    },
  };
}

/** A Stored event whose externals follow `external()` for the member; returns the event and the canonicals. */
export function storedChain(workerId: bigint, dpRank: number, tokensHashes: readonly bigint[], parentCanonical?: bigint) {
  const canonicals = chain(tokensHashes, parentCanonical);
  const blocks = tokensHashes.map((tokensHash, i) => ({ blockHash: external(canonicals[i]!, workerId, dpRank), tokensHash }));
  const extra = parentCanonical === undefined ? {} : { parentHash: external(parentCanonical, workerId, dpRank) };
  return { event: storedEvent(workerId, dpRank, blocks, extra), canonicals };
}

export function removedEvent(workerId: bigint, dpRank: number, blockHashes: readonly bigint[]): RouterEvent {
  return { workerId, dpRank, eventId: nextEventId++, data: { kind: "removed", blockHashes } };
}

export function clearedEvent(workerId: bigint, dpRank: number): RouterEvent {
  return { workerId, dpRank, eventId: nextEventId++, data: { kind: "cleared" } };
}

/** Applies a batch's images to a consumer's copy of the lane, as the hub and consumers do. */
export function applyImages(words: BigUint64Array, batch: DcCkfPublicationBatch | { images: readonly DcCkfBucketImage[] } | undefined): void {
  if (batch === undefined) return;
  for (const image of batch.images) words[image.bucket] = image.value;
}

export function sameWords(a: BigUint64Array, b: BigUint64Array): boolean {
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}
