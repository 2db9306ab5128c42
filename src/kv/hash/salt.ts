import { xxh3_64 } from "../../bytes/index.js";

/** The XXH3 seed of every block hash (the reference's XXH3_SEED). */
export const XXH3_SEED = 1337n;

const U64_MASK = (1n << 64n) - 1n;
const utf8 = new TextEncoder();

/** The request-wide identities that select a separate block-hash space. */
export interface SaltInputs {
  /** The LoRA adapter's canonical name (never an alias; see blockHashOptionsFor). */
  readonly loraName?: string | undefined;
  /** The tenant cache namespace (`cache_salt` in the routing hints). */
  readonly cacheNamespace?: string | undefined;
}

/**
 * The XXH3 seed that block hashes use for a request: 1337, plus XXH3(lora, 0)
 * when there is a LoRA name, plus XXH3(namespace, 1) when there is a cache
 * namespace, wrapping at 2^64. An empty string counts as absent, so "" shares
 * the base model's cache. The inner seeds differ (0 vs 1) so that a namespace
 * and an adapter with the same name stay in separate spaces.
 */
export function computeSaltHash(inputs: SaltInputs = {}): bigint {
  let seed = XXH3_SEED;
  const { loraName, cacheNamespace } = inputs;
  if (loraName !== undefined && loraName !== "") seed += xxh3_64(utf8.encode(loraName), 0n);
  if (cacheNamespace !== undefined && cacheNamespace !== "") seed += xxh3_64(utf8.encode(cacheNamespace), 1n);
  return seed & U64_MASK;
}
