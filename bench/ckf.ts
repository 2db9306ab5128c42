/**
 * CKF benchmark: the packed lane (src/kv/ckf) against the npm package
 * bloom-filters' CuckooFilter, built equivalently and measured in the same run:
 * inserts/s, lookups/s (hits and misses) and bytes per key at 1,048,576 keys.
 *
 * - Equivalent construction: `new CuckooFilter(524288, 4, 4, 500)`, i.e. the
 *   same bucket count as ours (bucketCount(2^20) = 2^19), 4 slots per bucket,
 *   4-hex-character (16-bit) fingerprints and 500 kicks. (Its `create(n, rate)`
 *   would size the table from an error rate instead; the constructor lets us
 *   match the bucket count exactly.)
 * - Keys: the same random u64s, given to ours as (hi, lo) u32 pairs and to the
 *   peer as 16-character hex strings (it takes string | ArrayBuffer | Buffer
 *   and hashes its input with a pure-JS 64-bit XXH64 twice per operation; the
 *   strings are built before timing).
 * - Rounds: both filters are filled to 1 Mi keys in BENCH_ROUNDS slices; each
 *   slice is one round, the contenders alternate order (A B, then B A), and
 *   ratios are taken within a round, so both see the same load and the same
 *   machine noise. Then the same for lookups of inserted keys (hits) and of
 *   fresh keys (misses), BENCH_LOOKUPS of each spread over the rounds.
 *   Filter construction is outside the timings.
 * - Memory: ours is the lane's bytes (8 per bucket; the 256 KiB
 *   fingerprint -> delta table is shared by every lane of one seed and bucket
 *   count, and shown separately); the peer's is the growth of the JS heap
 *   across its fill, after a full GC.
 * - The producer state's event path (DcCkfState.applyEvent, Stored events of
 *   16 new blocks: the shape check, the chain hash, the ownership and lineage
 *   tables, the lane and the dirty window, a publication every 16 events), a
 *   fresh state per round after one untimed warm-up round; no peer; target
 *   >= 1 M blocks/s. Also CPU time per block (user + system of the process
 *   over the round), steadier than the rate on a shared machine.
 *
 * Env: BENCH_ONLY (sections, comma-separated: lane,producer; both by
 * default), BENCH_ROUNDS (8), BENCH_LOOKUPS (262144); for the producer:
 * BENCH_BLOCKS (blocks per event, 16), BENCH_WORKERS (workers the events
 * rotate over, 8), BENCH_STATE_BLOCKS (blocks per round, 65536),
 * BENCH_STATE_ROUNDS (5).
 * Run: node --import tsx bench/ckf.ts
 * e.g. BENCH_ONLY=producer BENCH_BLOCKS=4 node --import tsx bench/ckf.ts
 */
import { randomFillSync } from "node:crypto";
import { performance } from "node:perf_hooks";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import bloomFilters from "bloom-filters";
import { bucketCount, CkfLane, DcCkfState, DEFAULT_CKF_CONFIG, type RouterEvent } from "../src/kv/ckf/index.js";
import { median, ratios, summary } from "./_stats.js";
import { selected } from "./_wire.js";

const KEYS = 1 << 20;
const ROUNDS = Math.max(2, Number(process.env.BENCH_ROUNDS ?? 8));
const LOOKUPS = Math.min(KEYS, Math.max(ROUNDS, Number(process.env.BENCH_LOOKUPS ?? 262_144)));
const BUCKETS = bucketCount(KEYS);
const SEED = DEFAULT_CKF_CONFIG.seed;
const SECTIONS = selected("BENCH_ONLY", ["lane", "producer"] as const);
const BLOCKS_PER_EVENT = Math.max(1, Number(process.env.BENCH_BLOCKS ?? 16));
const WORKERS = Math.max(1, Number(process.env.BENCH_WORKERS ?? 8));
const STATE_BLOCKS = Math.max(BLOCKS_PER_EVENT, Number(process.env.BENCH_STATE_BLOCKS ?? 65_536));
const STATE_ROUNDS = Math.max(1, Number(process.env.BENCH_STATE_ROUNDS ?? 5));

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;
const heap = () => {
  gc();
  gc();
  const m = process.memoryUsage();
  return { js: m.heapUsed, buffers: m.arrayBuffers };
};

const { CuckooFilter } = bloomFilters;

/** u64 keys as (hi, lo) pairs, and the same keys as hex strings for the peer. */
function makeKeys(count: number): { pairs: Uint32Array; strings: string[] } {
  const pairs = randomFillSync(new Uint32Array(2 * count));
  const strings = new Array<string>(count);
  for (let i = 0; i < count; i++) {
    strings[i] = pairs[2 * i]!.toString(16).padStart(8, "0") + pairs[2 * i + 1]!.toString(16).padStart(8, "0");
  }
  return { pairs, strings };
}

/**
 * Runs each contender once per round, forward on even rounds and reversed on
 * odd ones (as _stats.interleave does), but each contender times only its own
 * work and returns the milliseconds, so that setup stays out of the figures.
 */
function interleaveTimed(contenders: ((round: number) => number)[], rounds: number): number[][] {
  const times = contenders.map(() => [] as number[]);
  for (let round = 0; round < rounds; round++) {
    const order = contenders.map((_, i) => i);
    if (round % 2 !== 0) order.reverse();
    for (const i of order) times[i]!.push(contenders[i]!(round));
  }
  return times;
}

const mops = (count: number, ms: number[]) => ms.map((t) => count / t / 1000);
const rate = (xs: number[]) => `${summary(xs, 2)} M/s`;
const verdict = (ok: boolean) => (ok ? "met" : "NOT met");

const started = performance.now();
console.log(`ckf bench — node ${process.version}; ${KEYS.toLocaleString("en")} keys, ${BUCKETS.toLocaleString("en")} buckets x 4 slots x 16 bits`);
console.log(`peer: bloom-filters CuckooFilter(${BUCKETS}, 4 hex chars = 16 bits, 4 slots, 500 kicks), string keys`);

/** The lane against the peer: inserts, lookups, memory; what the targets read. */
function laneSections(): { insertRatio: number[]; hitRatio: number[]; missRatio: number[]; smaller: number; oursInsert: number[] } {
  const inserted = makeKeys(KEYS);
  const absent = makeKeys(LOOKUPS);

  // Warm both up on throwaway filters and keys (JIT, the seed's delta table).
  {
    const warm = makeKeys(1 << 16);
    const lane = new CkfLane({ seed: SEED, bucketCount: BUCKETS, maxKicks: 500 });
    for (let pass = 0; pass < 4; pass++) {
      for (let i = 0; i < 1 << 16; i++) {
        lane.insert(warm.pairs[2 * i]!, warm.pairs[2 * i + 1]!);
        lane.contains(warm.pairs[2 * i]!, warm.pairs[2 * i + 1]!);
      }
    }
    const peer = new CuckooFilter(BUCKETS, 4, 4, 500);
    for (let i = 0; i < 4096; i++) {
      peer.add(warm.strings[i]!);
      peer.has(warm.strings[i]!);
    }
  }

  const before = heap();
  const ours = new CkfLane({ seed: SEED, bucketCount: BUCKETS, maxKicks: 500 });
  const afterOurs = heap();
  const peer = new CuckooFilter(BUCKETS, 4, 4, 500);

  // --- inserts: fill both to 1 Mi keys, one slice per round --------------------
  let oursFailed = 0;
  let peerFailed = 0;
  const slice = (round: number, total: number) => [Math.floor((round * total) / ROUNDS), Math.floor(((round + 1) * total) / ROUNDS)] as const;
  const [oursInsertMs, peerInsertMs] = interleaveTimed(
    [
      (round) => {
        const [from, to] = slice(round, KEYS);
        const pairs = inserted.pairs;
        const t0 = performance.now();
        for (let i = from; i < to; i++) if (!ours.insert(pairs[2 * i]!, pairs[2 * i + 1]!)) oursFailed++;
        return performance.now() - t0;
      },
      (round) => {
        const [from, to] = slice(round, KEYS);
        const strings = inserted.strings;
        const t0 = performance.now();
        for (let i = from; i < to; i++) if (!peer.add(strings[i]!)) peerFailed++;
        return performance.now() - t0;
      },
    ],
    ROUNDS,
  );
  const afterFill = heap();

  // --- lookups: hits (inserted keys) and misses (fresh keys) -------------------
  let oursHits = 0;
  let peerHits = 0;
  let oursFalse = 0;
  let peerFalse = 0;
  const hitStride = Math.floor(KEYS / LOOKUPS);
  const [oursHitMs, peerHitMs, oursMissMs, peerMissMs] = interleaveTimed(
    [
      (round) => {
        const [from, to] = slice(round, LOOKUPS);
        const pairs = inserted.pairs;
        const t0 = performance.now();
        for (let j = from; j < to; j++) {
          const i = j * hitStride;
          if (ours.contains(pairs[2 * i]!, pairs[2 * i + 1]!)) oursHits++;
        }
        return performance.now() - t0;
      },
      (round) => {
        const [from, to] = slice(round, LOOKUPS);
        const strings = inserted.strings;
        const t0 = performance.now();
        for (let j = from; j < to; j++) if (peer.has(strings[j * hitStride]!)) peerHits++;
        return performance.now() - t0;
      },
      (round) => {
        const [from, to] = slice(round, LOOKUPS);
        const pairs = absent.pairs;
        const t0 = performance.now();
        for (let i = from; i < to; i++) if (ours.contains(pairs[2 * i]!, pairs[2 * i + 1]!)) oursFalse++;
        return performance.now() - t0;
      },
      (round) => {
        const [from, to] = slice(round, LOOKUPS);
        const strings = absent.strings;
        const t0 = performance.now();
        for (let i = from; i < to; i++) if (peer.has(strings[i]!)) peerFalse++;
        return performance.now() - t0;
      },
    ],
    ROUNDS,
  );

  const insertsPerRound = KEYS / ROUNDS;
  const lookupsPerRound = LOOKUPS / ROUNDS;
  const oursInsert = mops(insertsPerRound, oursInsertMs!);
  const peerInsert = mops(insertsPerRound, peerInsertMs!);
  const insertRatio = ratios(peerInsertMs!, oursInsertMs!);
  const hitRatio = ratios(peerHitMs!, oursHitMs!);
  const missRatio = ratios(peerMissMs!, oursMissMs!);

  console.log(`\n# throughput, median (min–max) over ${ROUNDS} interleaved rounds; speed-up = peer time / our time within a round`);
  console.log(`${"".padEnd(26)} ${"ckf lane".padEnd(24)} ${"bloom-filters".padEnd(24)} speed-up`);
  console.log(
    `${`inserts (${(insertsPerRound / 1024).toFixed(0)} Ki / round)`.padEnd(26)} ${rate(oursInsert).padEnd(24)} ${rate(peerInsert).padEnd(24)} ${summary(insertRatio, 1)}x`,
  );
  console.log(
    `${`lookups, hits (${(lookupsPerRound / 1024).toFixed(0)} Ki)`.padEnd(26)} ${rate(mops(lookupsPerRound, oursHitMs!)).padEnd(24)} ${rate(mops(lookupsPerRound, peerHitMs!)).padEnd(24)} ${summary(hitRatio, 1)}x`,
  );
  console.log(
    `${`lookups, misses (${(lookupsPerRound / 1024).toFixed(0)} Ki)`.padEnd(26)} ${rate(mops(lookupsPerRound, oursMissMs!)).padEnd(24)} ${rate(mops(lookupsPerRound, peerMissMs!)).padEnd(24)} ${summary(missRatio, 1)}x`,
  );
  console.log(
    `  failed inserts: ours ${oursFailed}, peer ${peerFailed}; inserted keys found: ours ${oursHits}/${LOOKUPS}, peer ${peerHits}/${LOOKUPS}` +
      `; false positives on ${LOOKUPS} fresh keys: ours ${oursFalse}, peer ${peerFalse}`,
  );

  // --- memory ----------------------------------------------------------------
  const laneBytes = ours.byteLength;
  const tableBytes = ours.addressing.deltas.byteLength;
  const oursMeasured = afterOurs.buffers - before.buffers + (afterOurs.js - before.js);
  const peerBytes = afterFill.js - afterOurs.js;
  const oursPerKey = laneBytes / KEYS;
  const peerPerKey = peerBytes / KEYS;
  console.log(`\n# memory at ${KEYS.toLocaleString("en")} keys`);
  console.log(
    `  ckf lane        ${oursPerKey.toFixed(2)} B/key (${(laneBytes / 2 ** 20).toFixed(2)} MiB lane; ${((laneBytes + tableBytes) / KEYS).toFixed(2)} B/key with the shared ` +
      `${tableBytes / 1024} KiB delta table; measured growth of buffers and heap ${(oursMeasured / 2 ** 20).toFixed(2)} MiB)`,
  );
  console.log(`  bloom-filters   ${peerPerKey.toFixed(2)} B/key (${(peerBytes / 2 ** 20).toFixed(1)} MiB of JS heap)`);
  const smaller = peerPerKey / oursPerKey;
  const smallerWithTable = peerBytes / (laneBytes + tableBytes);
  console.log(`  peer / ours     ${smaller.toFixed(1)}x (${smallerWithTable.toFixed(1)}x counting the delta table)`);
  return { insertRatio, hitRatio, missRatio, smaller, oursInsert };
}

// --- the producer state's event path -----------------------------------------
/** The producer state's event path; the median rate in M blocks/s. */
function producerSection(): number {
  const EVENTS = Math.floor(STATE_BLOCKS / BLOCKS_PER_EVENT);
  const blockCount = EVENTS * BLOCKS_PER_EVENT;
  const tokens = randomFillSync(new Uint32Array(2 * blockCount));
  const events: RouterEvent[] = [];
  for (let e = 0; e < EVENTS; e++) {
    const blocks = [];
    for (let b = 0; b < BLOCKS_PER_EVENT; b++) {
      const i = e * BLOCKS_PER_EVENT + b;
      const tokensHash = (BigInt(tokens[2 * i]!) << 32n) | BigInt(tokens[2 * i + 1]!);
      blocks.push({ blockHash: BigInt(i + 1), tokensHash });
    }
    events.push({ workerId: BigInt(e % WORKERS), dpRank: 0, eventId: BigInt(e), data: { kind: "stored", blocks } });
  }
  const stateMs: number[] = [];
  const cpuNsPerBlock: number[] = [];
  for (let round = -1; round < STATE_ROUNDS; round++) {
    const state = new DcCkfState({ expectedBlocksPerDc: KEYS, publishEveryNEvents: 16 });
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    for (const event of events) state.applyEvent(event);
    state.flush();
    const ms = performance.now() - t0;
    const cpu = process.cpuUsage(cpu0);
    if (round >= 0) {
      stateMs.push(ms);
      cpuNsPerBlock.push(((cpu.user + cpu.system) * 1000) / blockCount);
    }
  }
  const rates = mops(blockCount, stateMs);
  console.log(
    `\n# DcCkfState.applyEvent, Stored events of ${BLOCKS_PER_EVENT} new blocks over ${WORKERS} workers, publication every 16 events: ` +
      `${summary(rates, 2)} M blocks/s; CPU ${summary(cpuNsPerBlock, 0)} ns/block; ${STATE_ROUNDS} rounds of ${blockCount} blocks (no peer)`,
  );
  return median(rates);
}

const lane = SECTIONS.includes("lane") ? laneSections() : undefined;
const stateRate = SECTIONS.includes("producer") ? producerSection() : undefined;

console.log("\n# targets");
if (lane !== undefined) {
  const { insertRatio, hitRatio, missRatio, smaller, oursInsert } = lane;
  console.log(`  inserts >= 5x faster than bloom-filters      ${median(insertRatio).toFixed(1)}x   ${verdict(median(insertRatio) >= 5)}`);
  console.log(`  lookups >= 5x faster (hits / misses)         ${median(hitRatio).toFixed(1)}x / ${median(missRatio).toFixed(1)}x   ${verdict(median(hitRatio) >= 5 && median(missRatio) >= 5)}`);
  console.log(`  >= 4x smaller per key                        ${smaller.toFixed(1)}x   ${verdict(smaller >= 4)}`);
  console.log(`  >= 1M inserts/s                              ${median(oursInsert).toFixed(2)} M/s   ${verdict(median(oursInsert) >= 1)}`);
}
if (stateRate !== undefined) {
  console.log(`  DcCkfState.applyEvent >= 1M blocks/s         ${stateRate.toFixed(2)} M/s   ${verdict(stateRate >= 1)}`);
}
console.log(`\n(${((performance.now() - started) / 1000).toFixed(1)} s)`);
