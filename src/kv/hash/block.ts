import { xxh3_64, xxh3_64Parts } from "../../bytes/index.js";
import { checkU64, KvHashError } from "./errors.js";
import type { BlockExtraInfo } from "./mm.js";
import { computeSaltHash, XXH3_SEED } from "./salt.js";
import { checkTokens, tokenBytesLe } from "./tokens.js";

/** What besides the tokens decides a request's block hashes. */
export interface BlockHashOptions {
  /** The LoRA adapter's canonical name; "" or absent means the base model. */
  readonly loraName?: string | undefined;
  /** The tenant cache namespace; "" or absent means none. */
  readonly cacheNamespace?: string | undefined;
  /** Eagle windows: block_size + 1 tokens, still striding by block_size. */
  readonly isEagle?: boolean | undefined;
  /** Per block (by block index), the multimodal objects in it; null and undefined mean none. */
  readonly blockMmInfos?: readonly (BlockExtraInfo | null | undefined)[] | undefined;
}

/** XXH3-64 of `bytes` with `seed` (default 1337): one block's local hash. */
export function computeBlockHash(bytes: Uint8Array, seed: bigint = XXH3_SEED): bigint {
  return xxh3_64(bytes, checkU64(seed, "block hash seed"));
}

function checkBlockSize(kvBlockSize: number): void {
  if (kvBlockSize >>> 0 !== kvBlockSize) {
    throw new KvHashError("INVALID_BLOCK_SIZE", `kv block size ${String(kvBlockSize)} is not an integer in 0..4294967295`);
  }
}

/** The block's mm hashes, ascending (so the objects' order does not matter), as u64 LE. */
function mmHashBytes(info: BlockExtraInfo, blockIndex: number): Uint8Array {
  const objects = info.mmObjects;
  const hashes = new BigUint64Array(objects.length);
  for (let i = 0; i < objects.length; i++) hashes[i] = checkU64(objects[i]!.mmHash, `mm hash ${i} of block ${blockIndex}`);
  hashes.sort();
  const out = new Uint8Array(hashes.length * 8);
  const view = new DataView(out.buffer);
  for (let i = 0; i < hashes.length; i++) view.setBigUint64(i * 8, hashes[i]!, true);
  return out;
}

/**
 * The local hash of every complete block of `tokens` (u32 each; anything else
 * is KvHashError INVALID_TOKEN). Blocks start every `kvBlockSize` tokens and
 * hold `kvBlockSize` tokens, or one more for Eagle; a trailing partial block
 * is not hashed, so the hashes of a prompt are a prefix of the hashes of any
 * prompt that extends it. A block with multimodal info hashes its tokens
 * followed by its objects' mm hashes. Block size 0 gives no blocks.
 */
export function computeBlockHashForSeq(tokens: ArrayLike<number>, kvBlockSize: number, options: BlockHashOptions = {}): bigint[] {
  checkBlockSize(kvBlockSize);
  if (kvBlockSize === 0) {
    checkTokens(tokens);
    return [];
  }
  const seed = computeSaltHash(options);
  const stride = kvBlockSize;
  const window = options.isEagle === true ? stride + 1 : stride;
  const bytes = tokenBytesLe(tokens);
  const count = tokens.length >= window ? Math.floor((tokens.length - window) / stride) + 1 : 0;
  const mmInfos = options.blockMmInfos;
  const hashes = new Array<bigint>(count);
  for (let block = 0; block < count; block++) {
    const start = block * stride * 4;
    const tokenView = bytes.subarray(start, start + window * 4);
    const info = mmInfos?.[block];
    hashes[block] = info == null ? xxh3_64(tokenView, seed) : xxh3_64Parts([tokenView, mmHashBytes(info, block)], seed);
  }
  return hashes;
}
