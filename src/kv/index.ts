// KV routing keys: block and sequence hashing (hash/), the per-DC Cuckoo
// filter producer that indexes them (ckf/), and `mmgate kv`.
export * from "./hash/index.js";
export * from "./ckf/index.js";
export { kvCommand, parseU64, type KvCliIo } from "./cli.js";
