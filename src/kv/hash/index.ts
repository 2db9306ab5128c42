// KV block hashing as the reference router computes it (local block hashes,
// LoRA/namespace salt, Eagle windows, multimodal blocks, chained sequence
// hashes) and the model identity that picks a request's salt.
export { KvHashError, type KvHashErrorCode } from "./errors.js";
export { tokenBytesLe } from "./tokens.js";
export { computeSaltHash, XXH3_SEED, type SaltInputs } from "./salt.js";
export {
  hashMmIdentifier,
  MM_PAD_HASH_MASK,
  MM_PAD_SHIFT_VALUE,
  padValueForMmHash,
  type BlockExtraInfo,
  type BlockMmObjectInfo,
} from "./mm.js";
export { computeBlockHash, computeBlockHashForSeq, type BlockHashOptions } from "./block.js";
export { CHAIN_XXH3_SEED, computeNextSeqHash, computeSeqHashForBlock } from "./chain.js";
export {
  baseTarget,
  canonicalModelId,
  createRegistration,
  createRegistrationWithTarget,
  loraTarget,
  modelAlias,
  resolveRegistration,
  targetAdapter,
  type CanonicalModelId,
  type CanonicalModelRegistration,
  type ModelAlias,
  type ModelTarget,
} from "./identity.js";
export {
  createKvQuerySemantics,
  hashFormatIdentityVersion,
  isEagleHashFormat,
  KV_QUERY_HASH_FORMATS,
  kvQueryHashFormatFromEagle,
  parseKvQueryHashFormat,
  type KvQueryHashFormat,
  type KvQuerySemantics,
} from "./semantics.js";
export { blockHashOptionsFor } from "./query.js";
