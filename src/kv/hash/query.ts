import type { BlockHashOptions } from "./block.js";
import { targetAdapter, type CanonicalModelRegistration } from "./identity.js";
import type { KvQuerySemantics } from "./semantics.js";

/**
 * The block-hash options of a request served by `registration` in a pool
 * with `semantics`. A LoRA request is salted with the target's canonical
 * adapter name, never with the alias or model name the client sent, so that
 * every name for one adapter lands in one cache space; a base-model request
 * is unsalted. The cache namespace ("" or absent for none) applies to both.
 */
export function blockHashOptionsFor(
  registration: CanonicalModelRegistration,
  semantics: KvQuerySemantics,
  cacheNamespace?: string,
): BlockHashOptions {
  return { loraName: targetAdapter(registration.target), cacheNamespace, isEagle: semantics.isEagle };
}
