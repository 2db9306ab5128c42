/**
 * An independent model of the lane's insert / eviction / rollback / remove
 * (spec B.2, B.3), written the plain way: BigInt arithmetic, the library's
 * XXH3 called directly, an array of slots, a log of every write. A CkfLane
 * with the same seed, bucket count, maxKicks and lane index must stay in
 * lockstep with it over thousands of operations: the same answer, the same
 * whole slot array and the same reported writes after every operation. Small
 * bucket counts keep the lanes crowded, so eviction walks, failed (rolled
 * back) inserts and removals all happen many times.
 *
 * Nothing here comes from src/kv/ckf: if the fast path's addressing, RNG, walk
 * or rollback drifts from the spec, the slot arrays part.
 */
import { xxh3 } from "@node-rs/xxhash";
import { expect } from "chai";
import { CkfLane } from "../../src/kv/ckf/index.js";

const MASK64 = (1n << 64n) - 1n;
const GAMMA = 0x9e37_79b9_7f4a_7c15n;

/** `value` as `bytes` little-endian bytes. */
function le(value: bigint, bytes: number): Uint8Array {
  const out = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i++) out[i] = Number((value >> BigInt(8 * i)) & 0xffn);
  return out;
}

/** SplitMix64 (B.3), BigInt. */
class ModelRng {
  constructor(private state: bigint) {}

  next(): bigint {
    this.state = (this.state + GAMMA) & MASK64;
    let z = this.state;
    z = ((z ^ (z >> 30n)) * 0xbf58_476d_1ce4_e5b9n) & MASK64;
    z = ((z ^ (z >> 27n)) * 0x94d0_49bb_1331_11ebn) & MASK64;
    return z ^ (z >> 31n);
  }
}

/** One write as an observer sees it: the bucket and its four slots just before the write. */
interface Write {
  readonly bucket: number;
  readonly before: readonly number[];
}

class ModelLane {
  readonly slots: number[];
  /** Writes of the current operation (a rollback's restores are not writes anyone is told about). */
  writes: Write[] = [];
  private readonly mask: bigint;
  private readonly rng: ModelRng;
  private readonly deltas = new Map<number, number>();

  constructor(
    private readonly seed: bigint,
    bucketCount: number,
    private readonly maxKicks: number,
    lane: number,
  ) {
    this.slots = new Array<number>(bucketCount * 4).fill(0);
    this.mask = BigInt(bucketCount - 1);
    // The lane's RNG starts at next_random(seed ^ ((lane + 1) * gamma)): one step from that state.
    this.rng = new ModelRng(new ModelRng(seed ^ ((BigInt(lane + 1) * GAMMA) & MASK64)).next());
  }

  /** delta(fp) = XXH3_64(le_u16(fp), seed ^ gamma) & mask, or 1 when that is 0. */
  private delta(fp: number): number {
    let delta = this.deltas.get(fp);
    if (delta === undefined) {
      delta = Number(xxh3.xxh64(le(BigInt(fp), 2), this.seed ^ GAMMA) & this.mask) || 1;
      this.deltas.set(fp, delta);
    }
    return delta;
  }

  private probe(key: bigint): { fp: number; a: number; b: number } {
    const mixed = xxh3.xxh64(le(key, 8), this.seed);
    const fp = Number(mixed & 0xffffn) || 1;
    const a = Number((mixed >> 16n) & this.mask);
    return { fp, a, b: a ^ this.delta(fp) };
  }

  private write(index: number, value: number): void {
    const bucket = index >> 2;
    this.writes.push({ bucket, before: this.slots.slice(bucket * 4, bucket * 4 + 4) });
    this.slots[index] = value;
  }

  /** The lowest empty slot of `bucket` takes fp. */
  private place(bucket: number, fp: number): boolean {
    for (let i = 0; i < 4; i++) {
      if (this.slots[bucket * 4 + i] === 0) {
        this.write(bucket * 4 + i, fp);
        return true;
      }
    }
    return false;
  }

  insert(key: bigint): boolean {
    this.writes = [];
    const { fp: home, a, b } = this.probe(key);
    if (this.place(a, home) || this.place(b, home)) return true;
    if (this.maxKicks === 0) return false;
    let bucket = (this.rng.next() & 1n) === 0n ? a : b;
    let fp = home;
    const undo: [number, number][] = [];
    for (let kick = 0; kick < this.maxKicks; kick++) {
      const index = bucket * 4 + Number(this.rng.next() & 3n);
      const displaced = this.slots[index]!;
      undo.push([index, displaced]);
      this.write(index, fp);
      fp = displaced;
      bucket ^= this.delta(fp);
      if (this.place(bucket, fp)) return true;
    }
    for (let i = undo.length - 1; i >= 0; i--) this.slots[undo[i]![0]] = undo[i]![1];
    return false;
  }

  /** The first slot holding the fingerprint, in bucketA then bucketB; false when neither has it. */
  remove(key: bigint): boolean {
    this.writes = [];
    const { fp, a, b } = this.probe(key);
    for (const bucket of [a, b]) {
      for (let i = 0; i < 4; i++) {
        if (this.slots[bucket * 4 + i] === fp) {
          this.write(bucket * 4 + i, 0);
          return true;
        }
      }
    }
    return false;
  }
}

/** Mulberry32: which operation comes next, independent of everything under test. */
function chooser(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b_79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

function sameSlots(actual: Uint16Array, expected: readonly number[]): boolean {
  if (actual.length !== expected.length) return false;
  for (let i = 0; i < actual.length; i++) if (actual[i] !== expected[i]) return false;
  return true;
}

function sameWrites(actual: readonly Write[], expected: readonly Write[]): boolean {
  if (actual.length !== expected.length) return false;
  for (let i = 0; i < actual.length; i++) {
    const [x, y] = [actual[i]!, expected[i]!];
    if (x.bucket !== y.bucket || x.before.some((slot, j) => slot !== y.before[j])) return false;
  }
  return true;
}

interface Config {
  readonly seed: bigint;
  readonly bucketCount: number;
  readonly maxKicks: number;
  readonly lane: number;
  readonly operations: number;
}

const CONFIGS: readonly Config[] = [
  { seed: 0x5dee_ce66_d1b5_4a33n, bucketCount: 2, maxKicks: 0, lane: 0, operations: 2000 },
  { seed: 0xfedc_ba98_7654_3210n, bucketCount: 4, maxKicks: 500, lane: 0, operations: 2500 },
  { seed: 0x8000_0000_0000_0001n, bucketCount: 16, maxKicks: 500, lane: 5, operations: 3000 },
  { seed: MASK64, bucketCount: 64, maxKicks: 500, lane: 15, operations: 4000 },
];

describe("CKF lane against an independent BigInt model of B.2 / B.3", () => {
  for (const config of CONFIGS) {
    const { seed, bucketCount, maxKicks, lane: laneIndex, operations } = config;
    it(`stays in lockstep: seed ${seed.toString(16)}, ${bucketCount} buckets, maxKicks ${maxKicks}, lane ${laneIndex}`, () => {
      const lane = new CkfLane({ seed, bucketCount, maxKicks, lane: laneIndex });
      const model = new ModelLane(seed, bucketCount, maxKicks, laneIndex);
      let reported: Write[] = [];
      lane.observer = { beforeWrite: (bucket) => reported.push({ bucket, before: Array.from(lane.slots.subarray(bucket * 4, bucket * 4 + 4)) }) };
      const random = chooser(bucketCount * 7919 + maxKicks);
      const present: bigint[] = [];
      let fresh = seed;
      const nextKey = () => {
        // Keys all over u64 (high bits included): a SplitMix64-style walk with its own increment.
        fresh = (fresh + 0xd1b5_4a32_d192_ed03n) & MASK64;
        let z = fresh;
        z = ((z ^ (z >> 33n)) * 0xff51_afd7_ed55_8ccdn) & MASK64;
        return z ^ (z >> 29n);
      };
      const counts = { inserts: 0, walks: 0, failed: 0, removals: 0, missing: 0 };

      for (let op = 0; op < operations; op++) {
        const r = random();
        const pick = () => Math.floor(random() * present.length);
        let key: bigint;
        let ok: boolean;
        reported = [];
        if (r < 0.4 && present.length > 0) {
          // Remove a key inserted earlier (or, now and then, one never inserted).
          const at = pick();
          const absent = r < 0.02;
          key = absent ? nextKey() : present[at]!;
          if (!absent) present.splice(at, 1);
          const expected = model.remove(key);
          try {
            lane.remove(Number(key >> 32n), Number(key & 0xffff_ffffn));
            ok = true;
          } catch {
            ok = false;
          }
          expect(ok, `op ${op}: remove ${key}`).to.equal(expected);
          if (ok) counts.removals++;
          else counts.missing++;
        } else {
          // Insert a fresh key, or another copy of a present one.
          key = r < 0.5 && present.length > 0 ? present[pick()]! : nextKey();
          const expected = model.insert(key);
          ok = lane.insert(Number(key >> 32n), Number(key & 0xffff_ffffn));
          expect(ok, `op ${op}: insert ${key}`).to.equal(expected);
          if (ok) {
            present.push(key);
            counts.inserts++;
            if (model.writes.length > 1) counts.walks++;
            expect(lane.lastWrites, `op ${op}: writes`).to.equal(model.writes.length);
          } else {
            counts.failed++;
          }
        }
        // Compared cheaply first; chai's deep diff only when they differ (a failed walk logs 500 writes).
        if (!sameSlots(lane.slots, model.slots)) {
          expect(Array.from(lane.slots), `op ${op}: slots after ${ok ? "" : "failed "}operation on ${key}`).to.deep.equal(model.slots);
        }
        // Every write reported before it happened, with the bucket as it was then (rolled-back ones included).
        if (!sameWrites(reported, model.writes)) expect(reported, `op ${op}: reported writes`).to.deep.equal(model.writes);
        expect(lane.occupiedSlots()).to.equal(model.slots.filter((s) => s !== 0).length);
      }

      expect(counts.inserts, "successful inserts").to.be.greaterThan(operations / 4);
      expect(counts.removals, "removals").to.be.greaterThan(operations / 10);
      expect(counts.failed, "failed inserts").to.be.greaterThan(10);
      if (maxKicks > 0) expect(counts.walks, "successful eviction walks").to.be.greaterThan(10);
      else expect(counts.walks).to.equal(0);
    });
  }
});
