import { createHash } from "node:crypto";
import { expect } from "chai";
import { bucketCount, CkfLane, DcCkfState, DEFAULT_CKF_CONFIG, locateKey, type RouterEvent } from "../../src/kv/ckf/index.js";
import { DirtyWindow } from "../../src/kv/ckf/dirty.js";
import { mixU64, OwnerTable } from "../../src/kv/ckf/u64-tables.js";
import { prng } from "../support/index.js";

const SEED = DEFAULT_CKF_CONFIG.seed;
const u32 = (random: () => number) => Math.floor(random() * 0x1_0000_0000);

/**
 * Long Stored events, one member after another: runs without a parent (few
 * tokens hashes, so that members' canonical hashes coincide and are owned
 * several times), runs chained onto the member's last block, repeats of a
 * member's last event (re-offers), some with a block hash remapped far into
 * the event (rejected whole), removals of part of a run and Cleared events.
 */
function longEvents(seed: number, count: number): RouterEvent[] {
  const random = prng(seed);
  const int = (n: number) => Math.floor(random() * n);
  const last = new Map<string, RouterEvent>();
  const chains = new Map<string, bigint[]>();
  const events: RouterEvent[] = [];
  let nextHash = 1n;
  for (let e = 0; e < count; e++) {
    const workerId = BigInt(1 + int(3));
    const dpRank = int(2);
    const member = `${workerId}:${dpRank}`;
    const chain = chains.get(member) ?? [];
    chains.set(member, chain);
    const eventId = BigInt(e);
    const roll = random();
    const previous = last.get(member);
    if (roll < 0.15 && previous !== undefined && previous.data.kind === "stored") {
      const blocks = [...previous.data.blocks];
      // Now and then a block far into the event names a known block hash with other tokens: the event is refused whole.
      if (random() < 0.3 && blocks.length > 40) blocks[blocks.length - 3] = { blockHash: blocks[5]!.blockHash, tokensHash: 99n };
      events.push({ ...previous, eventId, data: { ...previous.data, blocks } });
    } else if (roll < 0.75) {
      const n = 17 + int(140);
      const parentHash = chain.length > 0 && random() < 0.5 ? chain[chain.length - 1]! : undefined;
      const blocks = Array.from({ length: n }, (_, i) => ({ blockHash: nextHash++, tokensHash: BigInt(1 + ((i + int(2)) % 5)) }));
      chain.push(...blocks.map((b) => b.blockHash));
      const event: RouterEvent = { workerId, dpRank, eventId, data: { kind: "stored", blocks, ...(parentHash === undefined ? {} : { parentHash }) } };
      last.set(member, event);
      events.push(event);
    } else if (roll < 0.95) {
      const blockHashes = Array.from({ length: 1 + int(120) }, () => (chain.length > 0 && random() < 0.9 ? chain[int(chain.length)]! : nextHash + 7n));
      events.push({ workerId, dpRank, eventId, data: { kind: "removed", blockHashes } });
    } else {
      chain.length = 0;
      last.delete(member);
      events.push({ workerId, dpRank, eventId, data: { kind: "cleared" } });
    }
  }
  return events;
}

/**
 * SHA-256 over every event's outcome (first error's code and message, the
 * images of the batch it drained), the stats and the final lane bytes, for
 * longEvents: Stored events longer than the check's read-ahead window and
 * than a short event. Computed with DcCkfState as it was before it read table
 * lines ahead of the blocks; paused or not, it must give the same.
 */
const BEFORE_READ_AHEAD: Readonly<Record<number, string>> = {
  64: "2a9e3eec115bb1be21944de40d6061ca69e27aaa456b2716c94d7d966c91351c",
  4096: "0f96c502f265cd217d14be9bbb369a328a51bdf56c208159cc68b3eca9815385",
};

function digestRun(expectedBlocksPerDc: number, every: number | undefined): string {
  const state = new DcCkfState({ expectedBlocksPerDc, publishEveryNEvents: 5 }, { maxOwners: 3 });
  const hash = createHash("sha256");
  let n = 0;
  const pause = () => every !== undefined && ++n % every === 0;
  for (const event of longEvents(0x4ead, 600)) {
    let outcome = state.applyEventUntil(event, pause);
    while (outcome === undefined) outcome = state.continueEvent(pause);
    const images = outcome.publication?.images.map((i) => `${i.bucket}:${i.value}`).join(",");
    hash.update(`${outcome.firstError?.code}|${outcome.firstError?.message}|${images}\n`);
  }
  hash.update(JSON.stringify(state.stats()));
  const words = state.words();
  hash.update(new Uint8Array(words.buffer, words.byteOffset, words.byteLength));
  return hash.digest("hex");
}

describe("DcCkfState: tables read ahead of the blocks", () => {
  for (const expected of [64, 4096]) {
    // The small filter's failing inserts walk all their kicks: slower, so fewer pause patterns.
    for (const every of expected === 64 ? [undefined, 13] : [undefined, 1, 13, 70]) {
      it(`long Stored events give what they gave before the read-ahead (${expected} expected blocks, ${every === undefined ? "no pause" : `a pause every ${every}`})`, () => {
        expect(digestRun(expected, every)).to.equal(BEFORE_READ_AHEAD[expected]);
      });
    }
  }
});

describe("CkfLane.address / insertAt / peek", () => {
  const cases = [
    { what: "a roomy lane (home buckets)", keys: 200, buckets: 1024, maxKicks: 500, relocate: true },
    { what: "a full lane (evictions, failures rolled back)", keys: 300, buckets: 64, maxKicks: 20, relocate: true },
    { what: "a full lane without relocation (bucketB, then refusal)", keys: 300, buckets: 64, maxKicks: 20, relocate: false },
    { what: "the smallest lane", keys: 20, buckets: 2, maxKicks: 3, relocate: true },
  ];
  for (const { what, keys, buckets, maxKicks, relocate } of cases) {
    it(`address gives B.2's fingerprint and bucketA, and insertAt does what insert does: ${what}`, () => {
      const random = prng(keys * 7 + buckets);
      const byKey = new CkfLane({ seed: SEED, bucketCount: buckets, maxKicks });
      const byAddress = new CkfLane({ seed: SEED, bucketCount: buckets, maxKicks });
      for (let i = 0; i < keys; i++) {
        const hi = u32(random);
        const lo = u32(random);
        byAddress.address(hi, lo);
        const location = locateKey((BigInt(hi) << 32n) | BigInt(lo), { seed: SEED, bucketCount: buckets });
        expect([byAddress.keyFingerprint, byAddress.keyBucket]).to.deep.equal([location.fingerprint, location.bucketA]);
        const before = byAddress.slots.slice();
        expect(byAddress.peek(byAddress.keyBucket)).to.equal(before[byAddress.keyBucket * 4]);
        const inserted = byAddress.insertAt(byAddress.keyFingerprint, byAddress.keyBucket, relocate);
        expect(inserted).to.equal(byKey.insert(hi, lo, relocate));
        if (inserted) expect(byAddress.lastWrites).to.equal(byKey.lastWrites);
        else expect(byAddress.slots).to.deep.equal(before);
        expect(byAddress.slots).to.deep.equal(byKey.slots);
      }
      expect(byAddress.occupiedSlots()).to.equal(byKey.occupiedSlots());
    });
  }
});

describe("OwnerTable with a caller's hash, across shard sizes", () => {
  // 70,000 keys take the shards past the sizes cut from shared slabs.
  for (const keys of [100, 5_000, 70_000]) {
    it(`find and insert given mixU64 agree with the table's own hashing; peek changes nothing (${keys} keys, then most removed)`, () => {
      const random = prng(keys);
      const given = new OwnerTable();
      const own = new OwnerTable();
      const all: [number, number][] = [];
      let disagreements = 0;
      for (let i = 0; i < keys; i++) {
        const hi = u32(random);
        const lo = u32(random);
        const hash = mixU64(hi, lo);
        given.peek(hash);
        const found = given.find(hi, lo, hash);
        if (found !== own.find(hi, lo)) disagreements++;
        if (found) continue;
        given.insert(hi, lo, hash);
        own.insert(hi, lo);
        given.owners = own.owners = 1 + (i % 3);
        given.resident = own.resident = i % 2 === 0;
        all.push([hi, lo]);
      }
      expect(disagreements).to.equal(0);
      expect(given.size).to.equal(own.size);
      // Removing nine in ten shrinks the shards back through the sizes they grew through.
      for (let i = 0; i < all.length; i++) {
        if (i % 10 === 0) continue;
        const [hi, lo] = all[i]!;
        if (!given.find(hi, lo, mixU64(hi, lo))) disagreements++;
        given.remove();
      }
      for (let i = 0; i < all.length; i++) {
        const [hi, lo] = all[i]!;
        const kept = i % 10 === 0;
        if (given.find(hi, lo) !== kept) disagreements++;
        else if (kept && (!own.find(hi, lo) || given.owners !== own.owners || given.resident !== own.resident)) disagreements++;
      }
      expect(disagreements).to.equal(0);
      expect(given.size).to.equal(Math.ceil(all.length / 10));
    });
  }
});

describe("DirtyWindow: drained columns", () => {
  for (const dirty of [1, 2, 3, 7, 64, 65]) {
    it(`${dirty} changed bucket(s): buckets and values in order, from one buffer without overlap, values 8-aligned`, () => {
      const slots = new Uint16Array(bucketCount(1024) * 4);
      const window = new DirtyWindow(slots);
      const written: number[] = [];
      for (let i = 0; i < dirty; i++) {
        const bucket = (i * 37) % (slots.length / 4);
        expect(window.peek(bucket)).to.be.a("number");
        window.beforeWrite(bucket);
        slots[bucket * 4 + (i % 4)] = 1 + i;
        written.push(bucket);
      }
      const { columns, changed } = window.drain(true);
      expect(changed).to.equal(dirty);
      const { buckets, values } = columns!;
      expect([...buckets]).to.deep.equal(written);
      const words = new BigUint64Array(slots.buffer);
      expect([...values]).to.deep.equal(written.map((b) => words[b]!));
      expect(values.byteOffset % 8).to.equal(0);
      expect(buckets.byteOffset + buckets.byteLength).to.be.at.most(values.byteOffset);
    });
  }
});
