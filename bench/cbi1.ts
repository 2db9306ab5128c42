/**
 * CBI1 benchmark: a full 2^24-bucket lane (128 MiB, 32 snapshot chunks)
 * encoded, and decoded + reassembled, next to Buffer.copy of the same bytes
 * in the same run.
 *
 * - Encode, two forms of the same frames, timed in the same rounds:
 *   - fresh buffers: encodeSnapshotChunks over the lane's Uint16Array slots;
 *     each chunk is a new 4 MiB allocation, one bulk copy of the words and an
 *     XXH3 of the body.
 *   - into a reused buffer: encodeSnapshotChunkInto, 32 times into one
 *     IMAGES_MAX_FRAME_BYTES buffer (as a sender that writes each frame out
 *     before building the next would); the same copy and XXH3, no allocation.
 *     The 0.5x target is judged on this form: the yardstick copy also writes
 *     into a reused buffer.
 * - Decode + assembly: decode of each of the 32 frames (checksum, header and
 *   body checks) and SnapshotAssembly.absorb (one copy into its buffer).
 * - Copy (the yardstick): Buffer.copy of each chunk's 4 MiB of words into a
 *   preallocated 4 MiB buffer, 32 times: the memory traffic of one pass.
 * - For context, not a target: a fresh 4 MiB Buffer.allocUnsafeSlow + copy per
 *   chunk, the floor of any encoder that hands out frames it owns. Fresh
 *   multi-MiB allocations are mmapped and page-faulted in on first write,
 *   which is where the fresh-buffer encode's time goes, not the copy or the XXH3.
 * - Deltas of 1,000 images: encodeDelta (columns input) + decode reading every
 *   image's bucket and value, per second; a figure, no target. Timed on its
 *   own after the lane rounds, over the same number of rounds.
 * - Rounds interleave the contenders (_stats.interleave, alternating order)
 *   and ratios are taken within a round. Ratio = copy time / our time, so 0.5
 *   means half the copy's speed.
 *
 * Env: BENCH_ROUNDS (6).
 * Run: node --import tsx bench/cbi1.ts
 */
import { randomFillSync } from "node:crypto";
import { performance } from "node:perf_hooks";
import {
  decode,
  encodeDelta,
  encodeSnapshotChunkInto,
  encodeSnapshotChunks,
  FilterFormat,
  IMAGES_MAX_FRAME_BYTES,
  snapshotChunkCount,
  SnapshotAssembly,
  SNAPSHOT_CHUNK_BUCKETS,
} from "../src/relay/cbi1/index.js";
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

const CHUNKS = snapshotChunkCount(BUCKETS);
const frameBuffer = new Uint8Array(IMAGES_MAX_FRAME_BYTES);

const encode = () => {
  for (const frame of encodeSnapshotChunks(format, 7n, 6n, slots)) sink += frame.length;
};
const encodeInto = () => {
  for (let i = 0; i < CHUNKS; i++) {
    const start = i * SNAPSHOT_CHUNK_BUCKETS * 4;
    sink += encodeSnapshotChunkInto(frameBuffer, format, 7n, 6n, i, CHUNKS, slots.subarray(start, Math.min(start + SNAPSHOT_CHUNK_BUCKETS * 4, slots.length)));
  }
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
  // Both encode forms give the same frames.
  for (let i = 0; i < CHUNKS; i++) {
    const start = i * SNAPSHOT_CHUNK_BUCKETS * 4;
    const length = encodeSnapshotChunkInto(frameBuffer, format, 7n, 6n, i, CHUNKS, slots.subarray(start, start + SNAPSHOT_CHUNK_BUCKETS * 4));
    if (Buffer.compare(Buffer.from(frameBuffer.buffer, 0, length), Buffer.from(frames[i]!)) !== 0) throw new Error(`chunk ${i} differs between the encode forms`);
  }
}

const [encodeMs, encodeIntoMs, decodeMs, copyMs, allocCopyMs] = await interleave([encode, encodeInto, decodeAndAssemble, copy, allocCopy], ROUNDS);
const gibs = (ms: number[]) => ms.map((t) => MIB / 1024 / (t / 1000));
const encodeRatio = ratios(copyMs!, encodeMs!);
const encodeIntoRatio = ratios(copyMs!, encodeIntoMs!);
const decodeRatio = ratios(copyMs!, decodeMs!);
const verdict = (ok: boolean) => (ok ? "met" : "NOT met");

// Deltas of 1,000 images over the 2^24 buckets, encoded from columns and decoded reading every image.
const DELTA_IMAGES = 1000;
const DELTAS_PER_ROUND = 2000;
const deltaColumns = {
  buckets: Uint32Array.from({ length: DELTA_IMAGES }, (_, i) => (i * 16_777_259) % BUCKETS),
  values: BigUint64Array.from({ length: DELTA_IMAGES }, (_, i) => (i % 5 === 0 ? 0n : BigInt(i) * 0x9e37_79b9_7f4a_7c15n & 0xffff_ffff_ffff_ffffn)),
};
const deltaRoundTrip = () => {
  for (let n = 0; n < DELTAS_PER_ROUND; n++) {
    const frame = encodeDelta(format, 7n, BigInt(n), BigInt(n + 1), deltaColumns);
    const d = decode(format, frame);
    if (d.kind !== "delta") throw new Error("not a delta");
    const images = d.images;
    for (let i = 0; i < images.length; i++) sink += images.bucket(i) + Number(images.value(i) & 1n);
  }
};
{
  const d = decode(format, encodeDelta(format, 7n, 0n, 1n, deltaColumns));
  if (d.kind !== "delta" || d.images.length !== DELTA_IMAGES || d.images.value(3) !== deltaColumns.values[3]) throw new Error("delta round trip differs");
}
const [deltaMs] = await interleave([deltaRoundTrip], ROUNDS);
const deltasPerSecond = deltaMs!.map((t) => DELTAS_PER_ROUND / (t / 1000));

console.log(`\n# one full lane, median (min–max) over ${ROUNDS} interleaved rounds`);
console.log(`  encode (fresh buffers)         ${summary(encodeMs!, 1)} ms   ${summary(gibs(encodeMs!), 2)} GiB/s`);
console.log(`  encode into a reused buffer    ${summary(encodeIntoMs!, 1)} ms   ${summary(gibs(encodeIntoMs!), 2)} GiB/s`);
console.log(`  decode + assembly              ${summary(decodeMs!, 1)} ms   ${summary(gibs(decodeMs!), 2)} GiB/s`);
console.log(`  Buffer.copy (yardstick)        ${summary(copyMs!, 1)} ms   ${summary(gibs(copyMs!), 2)} GiB/s`);
console.log(`  allocate 4 MiB + copy, x32     ${summary(allocCopyMs!, 1)} ms   ${summary(gibs(allocCopyMs!), 2)} GiB/s   (what any encoder returning owned frames pays)`);
console.log("  The two encodes write the same bytes; the fresh form also allocates a new 4 MiB buffer per chunk and page-faults it in on first write, the cost the allocate + copy line shows on its own.");
console.log(`\n# deltas of ${DELTA_IMAGES.toLocaleString("en")} images, encode + decode (every image read), median (min–max) over ${ROUNDS} rounds of ${DELTAS_PER_ROUND.toLocaleString("en")}`);
console.log(`  ${summary(deltasPerSecond, 0)} deltas/s   (${summary(deltasPerSecond.map((r) => (r * DELTA_IMAGES) / 1e6), 2)} M images/s)`);
console.log("\n# targets (copy time / our time, per round)");
console.log(`  encode into a reused buffer >= 0.5x copy   ${median(encodeIntoRatio).toFixed(2)}x   ${verdict(median(encodeIntoRatio) >= 0.5)}`);
console.log(`  (encode, fresh buffers: ${median(encodeRatio).toFixed(2)}x — not the target's form; see above)`);
console.log(`  decode + assembly >= 0.3x copy             ${median(decodeRatio).toFixed(2)}x   ${verdict(median(decodeRatio) >= 0.3)}`);
console.log(`\n(${((performance.now() - started) / 1000).toFixed(1)} s; sink ${sink > 0 ? "ok" : "empty"})`);
