/**
 * CBI1 benchmark: a full 2^24-bucket lane (128 MiB, 32 snapshot chunks)
 * encoded, and decoded + reassembled, next to Buffer.copy of the same bytes
 * in the same run.
 *
 * - Encode: encodeSnapshotChunks over the lane's Uint16Array slots; each chunk
 *   is one allocation, one bulk copy of the words and an XXH3 of the body.
 * - Decode + assembly: decode of each of the 32 frames (checksum, header and
 *   body checks) and SnapshotAssembly.absorb (one copy into its buffer).
 * - Copy (the yardstick): Buffer.copy of each chunk's 4 MiB of words into a
 *   preallocated 4 MiB buffer, 32 times: the memory traffic of one pass.
 * - For context, not a target: a fresh 4 MiB Buffer.allocUnsafeSlow + copy per
 *   chunk, the floor of any encoder that hands out frames it owns. Fresh
 *   multi-MiB allocations are mmapped and page-faulted in on first write,
 *   which is where the encoder's time goes, not the copy or the XXH3.
 * - Rounds interleave the contenders (_stats.interleave, alternating order)
 *   and ratios are taken within a round. Ratio = copy time / our time, so 0.5
 *   means half the copy's speed.
 *
 * Env: BENCH_ROUNDS (6).
 * Run: node --import tsx bench/cbi1.ts
 */
import { randomFillSync } from "node:crypto";
import { performance } from "node:perf_hooks";
import { decode, encodeSnapshotChunks, FilterFormat, SnapshotAssembly, SNAPSHOT_CHUNK_BUCKETS } from "../src/relay/cbi1/index.js";
import { interleave, median, ratios, summary } from "./_stats.js";

const BUCKETS = 1 << 24;
const ROUNDS = Math.max(2, Number(process.env.BENCH_ROUNDS ?? 6));
const MIB = BUCKETS * 8 / 2 ** 20;
const format = new FilterFormat(0x5eedn, BUCKETS);

const started = performance.now();
console.log(`cbi1 bench — node ${process.version}; ${BUCKETS.toLocaleString("en")} buckets (${MIB} MiB), ${BUCKETS / SNAPSHOT_CHUNK_BUCKETS} chunks`);

// A lane about 80% full: random slots, a fifth of them emptied.
const slots = randomFillSync(new Uint16Array(BUCKETS * 4));
for (let i = 0; i < slots.length; i += 5) slots[i] = 0;
const laneBytes = Buffer.from(slots.buffer, slots.byteOffset, slots.byteLength);

const frames = [...encodeSnapshotChunks(format, 7n, 6n, slots)];
const assembly = new SnapshotAssembly(format);
const scratch = Buffer.allocUnsafe(SNAPSHOT_CHUNK_BUCKETS * 8);
let sink = 0;

const encode = () => {
  for (const frame of encodeSnapshotChunks(format, 7n, 6n, slots)) sink += frame.length;
};
const decodeAndAssemble = () => {
  let done;
  for (const frame of frames) done = assembly.absorb(decode(format, frame));
  if (done === undefined || done.words.length !== BUCKETS) throw new Error("assembly did not complete");
};
const allocCopy = () => {
  for (let at = 0; at < laneBytes.length; at += scratch.length) {
    const owned = Buffer.allocUnsafeSlow(scratch.length + 64);
    sink += laneBytes.copy(owned, 64, at, at + scratch.length);
  }
};
const copy = () => {
  for (let at = 0; at < laneBytes.length; at += scratch.length) sink += laneBytes.copy(scratch, 0, at, at + scratch.length);
};

// Correctness once, outside the timings: the assembled lane is the lane.
decodeAndAssemble();
{
  const a = new SnapshotAssembly(format);
  let done;
  for (const frame of frames) done = a.absorb(decode(format, frame));
  if (Buffer.compare(Buffer.from(done!.words.buffer), laneBytes) !== 0) throw new Error("assembled lane differs");
}

const [encodeMs, decodeMs, copyMs, allocCopyMs] = await interleave([encode, decodeAndAssemble, copy, allocCopy], ROUNDS);
const gibs = (ms: number[]) => ms.map((t) => MIB / 1024 / (t / 1000));
const encodeRatio = ratios(copyMs!, encodeMs!);
const decodeRatio = ratios(copyMs!, decodeMs!);
const verdict = (ok: boolean) => (ok ? "met" : "NOT met");

console.log(`\n# one full lane, median (min–max) over ${ROUNDS} interleaved rounds`);
console.log(`  encode (32 chunks)          ${summary(encodeMs!, 1)} ms   ${summary(gibs(encodeMs!), 2)} GiB/s`);
console.log(`  decode + assembly           ${summary(decodeMs!, 1)} ms   ${summary(gibs(decodeMs!), 2)} GiB/s`);
console.log(`  Buffer.copy (yardstick)     ${summary(copyMs!, 1)} ms   ${summary(gibs(copyMs!), 2)} GiB/s`);
console.log(`  allocate 4 MiB + copy, x32   ${summary(allocCopyMs!, 1)} ms   ${summary(gibs(allocCopyMs!), 2)} GiB/s   (what any encoder returning owned frames pays)`);
console.log("\n# targets (copy time / our time, per round)");
console.log(`  encode >= 0.5x copy              ${median(encodeRatio).toFixed(2)}x   ${verdict(median(encodeRatio) >= 0.5)}`);
console.log(`  decode + assembly >= 0.3x copy   ${median(decodeRatio).toFixed(2)}x   ${verdict(median(decodeRatio) >= 0.3)}`);
console.log(`\n(${((performance.now() - started) / 1000).toFixed(1)} s; sink ${sink > 0 ? "ok" : "empty"})`);
