/**
 * Media benchmark, every figure against a peer timed in the same rounds:
 * - canonical content hash of N bytes against `Buffer.copy` of the same bytes
 *   into a preallocated buffer (and `Buffer.from`, a copy into a new buffer,
 *   which is what a receive path does), at 64 KiB, 1 MiB, 24 MiB, 256 MiB;
 * - decodeImage (header, limits, decode, hash) of a 2048x2048 JPEG and PNG
 *   against a plain `sharp(buf).raw().toBuffer()` of the same file, and the
 *   hash of the decoded pixels as a share of the decode.
 *
 * Rounds interleave the contenders (A B C, then C B A, ...), so load elsewhere
 * on the machine falls on all of them alike; ratios are taken within a round
 * and reported as median (min–max) over the rounds.
 *
 * Env: BENCH_SCALE multiplies the number of rounds (default 1); THREADS sets
 * libvips' thread count as the server's decoder.threadsPerDecode does.
 */
import { randomFillSync } from "node:crypto";
import sharp from "sharp";
import { xxh3 } from "@node-rs/xxhash";
import { XXH3_IMPLEMENTATION, xxh3_64 } from "../src/bytes/index.js";
import { canonicalContentHash, configureSharp, decodeImage, DEFAULT_MAX_ALLOC } from "../src/media/index.js";
import { interleave, median, summary } from "./_stats.js";

const KiB = 1024;
const MiB = 1024 * KiB;
const SCALE = Number(process.env.BENCH_SCALE ?? 1);


const gbps = (bytes: number, ms: number) => bytes / (ms / 1000) / 1e9;

// The settings the media module applies when the server starts it.
configureSharp(Number(process.env.THREADS ?? 0));
console.log(`media bench — node ${process.version}, sharp ${sharp.versions.sharp} (libvips ${sharp.versions.vips}), concurrency ${sharp.concurrency()}, XXH3 from ${XXH3_IMPLEMENTATION}`);

console.log(
  "\n# XXH3-64 of N bytes: the helper mmgate hashes with (src/bytes) against @node-rs/xxhash as the helper's fallback uses it above 2 KiB " +
    "(a reused streaming hasher, MMGATE_XXH3=node-rs) and through its one-shot call; GB/s as median (min–max)",
);
console.log(`${"size".padEnd(8)} ${"helper GB/s".padEnd(20)} ${"fallback GB/s".padEnd(20)} ${"one-shot GB/s".padEnd(20)} helper/fallback time`);
for (const [size, label] of [
  [64 * KiB, "64 KiB"],
  [1 * MiB, "1 MiB"],
] as const) {
  const src = randomFillSync(Buffer.alloc(size));
  const reps = Math.max(1, Math.round((32 * MiB) / size));
  const streaming = xxh3.Xxh3.withSeed(7n);
  const [helperMs, peerMs, oneShotMs] = await interleave(
    [
      () => {
        for (let i = 0; i < reps; i++) xxh3_64(src, 7n);
      },
      () => {
        for (let i = 0; i < reps; i++) {
          streaming.reset();
          streaming.update(src).digest();
        }
      },
      () => {
        for (let i = 0; i < reps; i++) xxh3.xxh64(src, 7n);
      },
    ],
    Math.max(3, Math.round(21 * SCALE)),
  );
  const rate = (ms: number[]) => ms.map((t) => gbps(size * reps, t));
  console.log(
    `${label.padEnd(8)} ${summary(rate(helperMs!), 1).padEnd(20)} ${summary(rate(peerMs!), 1).padEnd(20)} ${summary(rate(oneShotMs!), 1).padEnd(20)} ` +
      summary(helperMs!.map((t, i) => t / peerMs![i]!), 2),
  );
}

console.log("\n# content hash vs copy of the same bytes; GB/s and time ratios as median (min–max) over interleaved rounds");
console.log("hash = canonicalContentHash([N], UINT8, src); copy = src.copy(preallocated dst); new copy = Buffer.from(src)");
const SAMPLE_BYTES = 32 * MiB;
console.log(`one sample = \`reps\` back-to-back calls (${SAMPLE_BYTES / MiB} MiB of input at least), so small sizes are not timer-bound;`);
console.log("new copy is left out at 256 MiB: there each call maps and faults in 256 MiB of fresh memory, which costs seconds on a busy machine");
console.log(
  `${"size".padEnd(8)} ${"rounds x reps".padEnd(13)} ${"hash GB/s".padEnd(20)} ${"copy GB/s".padEnd(20)} ${"hash/copy time".padEnd(20)} ${"new copy GB/s".padEnd(20)} hash/new copy time`,
);
for (const [size, label, rounds] of [
  [64 * KiB, "64 KiB", 31],
  [1 * MiB, "1 MiB", 31],
  [24 * MiB, "24 MiB", 15],
  [256 * MiB, "256 MiB", 7],
] as const) {
  const src = randomFillSync(Buffer.alloc(size));
  const dst = Buffer.alloc(size);
  const shape = [size];
  const reps = Math.max(1, Math.round(SAMPLE_BYTES / size));
  const n = Math.max(3, Math.round(rounds * SCALE));
  const withNew = size < 256 * MiB;
  const contenders = [
    () => {
      for (let i = 0; i < reps; i++) canonicalContentHash(shape, "UINT8", src);
    },
    () => {
      for (let i = 0; i < reps; i++) src.copy(dst);
    },
  ];
  if (withNew) {
    contenders.push(() => {
      for (let i = 0; i < reps; i++) Buffer.from(src);
    });
  }
  const [hashMs, copyMs, newMs] = await interleave(contenders, n);
  const rate = (ms: number[]) => ms.map((t) => gbps(size * reps, t));
  const hashOverCopy = hashMs!.map((t, i) => t / copyMs![i]!);
  const newCols = newMs
    ? `${summary(rate(newMs), 1).padEnd(20)} ${summary(
        hashMs!.map((t, i) => t / newMs[i]!),
        2,
      )}`
    : "—";
  console.log(
    `${label.padEnd(8)} ${`${n} x ${reps}`.padEnd(13)} ${summary(rate(hashMs!), 1).padEnd(20)} ${summary(rate(copyMs!), 1).padEnd(20)} ${summary(hashOverCopy, 2).padEnd(20)} ${newCols}`,
  );
}

console.log("\n# decode 2048x2048 to uint8 HWC; ms and shares as median (min–max) over interleaved rounds");
console.log("decode = decodeImage (header, limits, decode, hash); sharp raw = sharp(buf).raw().toBuffer(); hash = canonicalContentHash of the decoded pixels");
const side = 2048;
const base = sharp({ create: { width: side, height: side, channels: 3, background: "#808080", noise: { type: "gaussian", mean: 128, sigma: 40 } } })
  .blur(1.5); // photo-like: noise smoothed so the codecs have structure to work with
const raw = await base.raw().toBuffer();
const inputs: [string, Buffer][] = [
  ["JPEG q90", await sharp(raw, { raw: { width: side, height: side, channels: 3 } }).jpeg({ quality: 90 }).toBuffer()],
  ["PNG", await sharp(raw, { raw: { width: side, height: side, channels: 3 } }).png().toBuffer()],
];
const limits = { maxImageWidth: null, maxImageHeight: null, maxAlloc: DEFAULT_MAX_ALLOC };
console.log(
  `${"input".padEnd(9)} ${"enc MiB".padStart(7)}  ${"decode ms".padEnd(20)} ${"decode MP/s".padEnd(12)} ${"sharp raw ms".padEnd(20)} ${"decode/sharp raw".padEnd(20)} ${"hash ms".padEnd(20)} hash share of decode`,
);
const DECODE_ROUNDS = Math.max(3, Math.round(11 * SCALE));
for (const [name, encoded] of inputs) {
  const decoded = await decodeImage(encoded, limits);
  const [decodeMs, plainMs, hashMs] = await interleave(
    [
      () => decodeImage(encoded, limits),
      () => sharp(encoded).raw().toBuffer(),
      () => canonicalContentHash(decoded.tensorInfo.shape, "UINT8", decoded.data),
    ],
    DECODE_ROUNDS,
  );
  const mp = (side * side) / 1e6;
  const overPlain = decodeMs!.map((t, i) => t / plainMs![i]!);
  const share = hashMs!.map((t, i) => (100 * t) / decodeMs![i]!);
  console.log(
    `${name.padEnd(9)} ${(encoded.length / MiB).toFixed(2).padStart(7)}  ${summary(decodeMs!, 1).padEnd(20)} ${(mp / (median(decodeMs!) / 1000)).toFixed(0).padEnd(12)} ${summary(plainMs!, 1).padEnd(20)} ${summary(overPlain, 2).padEnd(20)} ${summary(hashMs!, 2).padEnd(20)} ${summary(share, 2)} %`,
  );
}
