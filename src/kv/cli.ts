import { Code } from "@connectrpc/connect";
import { Command, InvalidArgumentError, Option } from "commander";
import { CliError, reportError, snakeCodeName, withExitCodes } from "../rpc/index.js";
import { DEFAULT_CKF_CONFIG, locateKey, MAX_RELAY_BUCKET_COUNT } from "./ckf/index.js";
import { computeBlockHashForSeq, computeSaltHash, computeSeqHashForBlock, KvHashError } from "./hash/index.js";

/** Where the kv commands write; the process's streams by default. */
export interface KvCliIo {
  readonly out: { write(text: string): unknown };
  readonly err: { write(text: string): unknown };
}

const U64_MAX = (1n << 64n) - 1n;

/** A u64 written in decimal or 0x-hex, parsed without going through a double. */
export function parseU64(text: string, what: string): bigint {
  if (!/^(0x[0-9a-fA-F]{1,16}|[0-9]{1,20})$/.test(text)) throw new InvalidArgumentError(`${what} must be a u64 in decimal or 0x-hex, not "${text}"`);
  const value = BigInt(text);
  if (value > U64_MAX) throw new InvalidArgumentError(`${what} ${text} is past 2^64 - 1`);
  return value;
}

function parseCount(what: string, min: number, max: number) {
  return (text: string): number => {
    if (!/^[0-9]{1,10}$/.test(text) || Number(text) < min || Number(text) > max) {
      throw new InvalidArgumentError(`${what} must be an integer from ${min} to ${max}, not "${text}"`);
    }
    return Number(text);
  };
}

function parseToken(text: string, previous: number[] | undefined): number[] {
  if (!/^[0-9]{1,10}$/.test(text) || Number(text) > 0xffff_ffff) throw new InvalidArgumentError(`token "${text}" is not a u32`);
  // Appended in place: a prompt has tens of thousands of tokens, and a copy per token would be quadratic.
  const tokens = previous ?? [];
  tokens.push(Number(text));
  return tokens;
}

interface HashOptions {
  blockSize: number;
  lora?: string;
  namespace?: string;
  eagle?: boolean;
  json?: boolean;
}

interface LocateOptions {
  seed: bigint;
  buckets: number;
  json?: boolean;
}

/**
 * `mmgate kv`: what a router computes for a prompt, for people explaining a
 * routing decision. `hash` prints a token sequence's block hashes and
 * sequence hashes; `locate` prints where a sequence hash sits in a Cuckoo
 * filter. u64 values print in decimal (as decimal strings with --json, so
 * that no JSON reader rounds them). Exit codes: 0 done, 1 input the hash
 * refuses, 2 a usage error (a malformed token, block size, bucket count or key).
 */
export function kvCommand(io: KvCliIo = { out: process.stdout, err: process.stderr }): Command {
  const kv = new Command("kv").description("KV routing by hand: block and sequence hashes, where a key sits in the Cuckoo filter, and replaying router events into a relay pool");
  const hash = kv.command("hash")
    .description("print the block hashes and the sequence hashes of a token sequence (complete blocks only)")
    .requiredOption("--block-size <n>", "tokens per KV block", parseCount("--block-size", 1, 0xffff_ffff))
    .option("--lora <name>", "the canonical LoRA adapter name that salts the hashes (never an alias)")
    .option("--namespace <ns>", "the cache namespace (cache_salt) that salts the hashes")
    .option("--eagle", "Eagle windows: block size + 1 tokens, stride block size")
    .option("--json", "one JSON object; u64 values as decimal strings")
    .argument("<token...>", "token ids, u32 each", parseToken)
    .action((tokens: number[], o: HashOptions) => {
      const options = { ...(o.lora !== undefined ? { loraName: o.lora } : {}), ...(o.namespace !== undefined ? { cacheNamespace: o.namespace } : {}), isEagle: o.eagle === true };
      let blocks: bigint[];
      try {
        blocks = computeBlockHashForSeq(tokens, o.blockSize, options);
      } catch (err) {
        if (!(err instanceof KvHashError)) throw err;
        process.exitCode = reportError(io.err, "kv hash", new CliError(snakeCodeName(Code.InvalidArgument), err.message, { cause: err }));
        return;
      }
      const sequence = computeSeqHashForBlock(blocks);
      const window = o.eagle === true ? o.blockSize + 1 : o.blockSize;
      const rows = blocks.map((blockHash, index) => ({ index, first: index * o.blockSize, last: index * o.blockSize + window - 1, blockHash, sequenceHash: sequence[index]! }));
      const salt = computeSaltHash(options);
      if (o.json === true) {
        io.out.write(
          `${JSON.stringify({
            blockSize: o.blockSize,
            format: o.eagle === true ? "DYNAMO_EAGLE_V1" : "DYNAMO_STANDARD_V1",
            seed: String(salt),
            tokens: tokens.length,
            blocks: rows.map((r) => ({ index: r.index, tokens: [r.first, r.last], blockHash: String(r.blockHash), sequenceHash: String(r.sequenceHash) })),
          })}\n`,
        );
        return;
      }
      io.out.write(
        `${tokens.length} tokens, block size ${o.blockSize}${o.eagle === true ? " (Eagle windows)" : ""}, seed ${salt}: ${rows.length} complete block${rows.length === 1 ? "" : "s"}\n`,
      );
      if (rows.length === 0) return;
      io.out.write(`${"block".padEnd(6)}${"tokens".padEnd(14)}${"block hash".padEnd(22)}sequence hash\n`);
      for (const r of rows) io.out.write(`${String(r.index).padEnd(6)}${`${r.first}..${r.last}`.padEnd(14)}${String(r.blockHash).padEnd(22)}${r.sequenceHash}\n`);
    });
  withExitCodes(hash, { 1: "the hash refuses the input" });
  kv.command("locate")
    .description("print where a sequence hash sits in a Cuckoo filter: the mixed hash, its fingerprint and its two buckets")
    .requiredOption("--buckets <n>", "the filter's bucket count (a power of two from 2)", (text) => {
      const n = parseCount("--buckets", 2, MAX_RELAY_BUCKET_COUNT)(text);
      if ((n & (n - 1)) !== 0) throw new InvalidArgumentError(`--buckets must be a power of two, not ${n}`);
      return n;
    })
    // A bigint default needs its text: help would otherwise fail to print it.
    .addOption(
      new Option("--seed <u64>", "the filter's seed")
        .default(DEFAULT_CKF_CONFIG.seed, `0x${DEFAULT_CKF_CONFIG.seed.toString(16).toUpperCase()}`)
        .argParser((text) => parseU64(text, "--seed")),
    )
    .option("--json", "one JSON object; u64 values as decimal strings")
    .argument("<key>", "the sequence hash (u64, decimal or 0x-hex)", (text) => parseU64(text, "the key"))
    .action((key: bigint, o: LocateOptions) => {
      const at = locateKey(key, { seed: o.seed, bucketCount: o.buckets });
      if (o.json === true) {
        io.out.write(
          `${JSON.stringify({ key: String(key), seed: String(o.seed), buckets: o.buckets, mixed: String(at.mixed), fingerprint: at.fingerprint, bucketA: at.bucketA, bucketB: at.bucketB })}\n`,
        );
        return;
      }
      io.out.write(`key          ${key}\nseed         ${o.seed}\nbuckets      ${o.buckets}\nmixed        ${at.mixed}\nfingerprint  ${at.fingerprint} (0x${at.fingerprint.toString(16).padStart(4, "0")})\nbucket_a     ${at.bucketA}\nbucket_b     ${at.bucketB}\n`);
    });
  return kv;
}
