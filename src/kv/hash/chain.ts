import { xxh3_64 } from "../../bytes/index.js";
import { checkU64 } from "./errors.js";

/** The XXH3 seed of the chain recurrence; the LoRA/namespace salt never enters it. */
export const CHAIN_XXH3_SEED = 1337n;

// One 16-byte scratch for every call: hashing is synchronous, so no two calls overlap.
const pair = new Uint8Array(16);
const pairView = new DataView(pair.buffer);

function next(parent: bigint, block: bigint): bigint {
  pairView.setBigUint64(0, parent, true);
  pairView.setBigUint64(8, block, true);
  return xxh3_64(pair, CHAIN_XXH3_SEED);
}

/**
 * The sequence hash of a block whose prefix hashes to `parent`:
 * XXH3-64(le64(parent) ‖ le64(block), 1337). A block's sequence hash thus
 * names the whole prefix up to it, which is what the CKF stores.
 */
export function computeNextSeqHash(parent: bigint, block: bigint): bigint {
  return next(checkU64(parent, "parent sequence hash"), checkU64(block, "block hash"));
}

/** The sequence hash of every block: the first is its block hash, each next one chains from it. */
export function computeSeqHashForBlock(blockHashes: readonly bigint[]): bigint[] {
  const out = new Array<bigint>(blockHashes.length);
  for (let i = 0; i < blockHashes.length; i++) {
    const block = checkU64(blockHashes[i]!, `block hash ${i}`);
    out[i] = i === 0 ? block : next(out[i - 1]!, block);
  }
  return out;
}
