/**
 * Media benchmark: canonical content hash throughput against Buffer.copy of
 * the same bytes, decode rate of 2048x2048 JPEG and PNG, and the hash's share
 * of decode time. Run: node --import tsx bench/media.ts
 */
import { randomFillSync } from "node:crypto";
import { performance } from "node:perf_hooks";
import { xxh3 } from "@node-rs/xxhash";
import sharp from "sharp";
import { canonicalContentHash, configureSharp, decodeImage, DEFAULT_MAX_ALLOC } from "../src/media/index.js";

const MiB = 1024 * 1024;

function median(values: number[]): number {
  const s = [...values].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

/** Median milliseconds of `fn` over `reps` runs after `warmup` runs. */
function timeSync(fn: () => void, reps: number, warmup = 3): number {
  for (let i = 0; i < warmup; i++) fn();
  const times: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    fn();
    times.push(performance.now() - t0);
  }
  return median(times);
}

const gbps = (bytes: number, ms: number) => (bytes / (ms / 1000) / 1e9).toFixed(1);

// The settings the media module applies when the server starts it.
configureSharp(Number(process.env.THREADS ?? 0));
console.log(`media bench — node ${process.version}, sharp ${sharp.versions.sharp} (libvips ${sharp.versions.vips}), concurrency ${sharp.concurrency()}`);
console.log("\n# content hash vs Buffer.copy of the same bytes (median)");
console.log("copy = src.copy(reused dst); new copy = Buffer.from(src) (allocation included)");
console.log("size      hash ms  hash GB/s  copy ms  copy GB/s  hash/copy time  new copy GB/s  one-shot xxh64 GB/s");
for (const size of [1 * MiB, 24 * MiB]) {
  const width = Math.floor(size / 3);
  const src = randomFillSync(Buffer.alloc(width * 3));
  const dst = Buffer.alloc(src.length);
  const reps = size > 4 * MiB ? 30 : 300;
  const hashMs = timeSync(() => void canonicalContentHash([1, width, 3], "UINT8", src), reps);
  const copyMs = timeSync(() => void src.copy(dst), reps);
  const newCopyMs = timeSync(() => void Buffer.from(src), reps);
  const oneShotMs = timeSync(() => void xxh3.xxh64(src, 0n), Math.max(5, reps / 10));
  console.log(
    `${String(size / MiB).padStart(2)} MiB  ${hashMs.toFixed(3).padStart(8)}  ${gbps(src.length, hashMs).padStart(9)}  ${copyMs.toFixed(3).padStart(7)}  ${gbps(src.length, copyMs).padStart(9)}  ${(hashMs / copyMs).toFixed(2).padStart(14)}  ${gbps(src.length, newCopyMs).padStart(13)}  ${gbps(src.length, oneShotMs).padStart(19)}`,
  );
}

console.log("\n# decode 2048x2048 to uint8 HWC (decodeImage: header, limits, decode, hash; median)");
const side = 2048;
const base = sharp({ create: { width: side, height: side, channels: 3, background: "#808080", noise: { type: "gaussian", mean: 128, sigma: 40 } } })
  .blur(1.5); // photo-like: noise smoothed so the codecs have structure to work with
const raw = await base.raw().toBuffer();
const inputs: [string, Buffer][] = [
  ["JPEG q90", await sharp(raw, { raw: { width: side, height: side, channels: 3 } }).jpeg({ quality: 90 }).toBuffer()],
  ["PNG", await sharp(raw, { raw: { width: side, height: side, channels: 3 } }).png().toBuffer()],
];
const limits = { maxImageWidth: null, maxImageHeight: null, maxAlloc: DEFAULT_MAX_ALLOC };
console.log("decode = decodeImage (header, limits, decode, hash); sharp raw = sharp(buf).raw().toBuffer(); ms as median (best)");
console.log("input      encoded MiB  decode ms (best)  MP/s  sharp raw ms (best)  hash ms  hash share  share of best");
/** Interleaves the two decoders round by round so machine noise hits both alike. */
async function interleaved(a: () => Promise<unknown>, b: () => Promise<unknown>, rounds: number): Promise<[number, number, number, number]> {
  await a();
  await b();
  const ta: number[] = [];
  const tb: number[] = [];
  for (let i = 0; i < rounds; i++) {
    let t0 = performance.now();
    await a();
    ta.push(performance.now() - t0);
    t0 = performance.now();
    await b();
    tb.push(performance.now() - t0);
  }
  return [median(ta), Math.min(...ta), median(tb), Math.min(...tb)];
}

for (const [name, encoded] of inputs) {
  const [decodeMs, decodeBest, plainMs, plainBest] = await interleaved(
    () => decodeImage(encoded, limits),
    () => sharp(encoded).raw().toBuffer(),
    9,
  );
  const decoded = await decodeImage(encoded, limits);
  const hashMs = timeSync(() => void canonicalContentHash(decoded.tensorInfo.shape, "UINT8", decoded.data), 30);
  const mp = (side * side) / 1e6;
  console.log(
    `${name.padEnd(9)}  ${(encoded.length / MiB).toFixed(2).padStart(11)}  ${`${decodeMs.toFixed(1)} (${decodeBest.toFixed(1)})`.padStart(16)}  ${(mp / (decodeMs / 1000)).toFixed(0).padStart(4)}  ${`${plainMs.toFixed(1)} (${plainBest.toFixed(1)})`.padStart(17)}  ${hashMs.toFixed(2).padStart(8)}  ${((100 * hashMs) / decodeMs).toFixed(2).padStart(9)}%  ${((100 * hashMs) / decodeBest).toFixed(2).padStart(14)}%`,
  );
}
