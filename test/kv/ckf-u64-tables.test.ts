import { expect } from "chai";
import { EventScratchMap, LineageMap, OwnerTable } from "../../src/kv/ckf/u64-tables.js";
import { prng } from "../support/index.js";

const key = (k: bigint): [number, number] => [Number(k >> 32n), Number(k & 0xffff_ffffn)];

describe("u64 tables (hi, lo keys)", () => {
  it("LineageMap behaves as a Map of u64 keys, insertion order included, through growth, deletes and compaction", () => {
    const random = prng(0x11);
    const model = new Map<bigint, bigint>();
    const map = new LineageMap();
    for (let i = 0; i < 20_000; i++) {
      // Few distinct keys, high bits in use: collisions in the halves, deletes and re-adds.
      const k = (BigInt(Math.floor(random() * 3000)) << 40n) | BigInt(Math.floor(random() * 7));
      const [hi, lo] = key(k);
      const roll = random();
      if (roll < 0.55) {
        const v = BigInt(i) * 0x1_0000_0001n;
        model.set(k, v);
        map.set(hi, lo, Number(v >> 32n), Number(v & 0xffff_ffffn));
      } else if (roll < 0.95) {
        expect(map.delete(hi, lo)).to.equal(model.delete(k));
      } else {
        map.compactIfSparse();
      }
      expect(map.size).to.equal(model.size);
    }
    const order: bigint[] = [];
    for (let p = 0; p < map.end; p++) if (map.isLive(p)) order.push((BigInt(map.keyHi(p)) << 32n) | BigInt(map.keyLo(p)));
    expect(order).to.deep.equal([...model.keys()]);
    for (const [k, v] of model) {
      const [hi, lo] = key(k);
      expect(map.find(hi, lo)).to.equal(true);
      expect((BigInt(map.valueHi) << 32n) | BigInt(map.valueLo)).to.equal(v);
    }
    expect(map.find(0xdead, 0xbeef)).to.equal(false);
  });

  it("OwnerTable keeps owners and residency per key through inserts, removals and shard resizes", () => {
    const random = prng(0x22);
    const model = new Map<bigint, { owners: number; resident: boolean }>();
    const table = new OwnerTable();
    for (let i = 0; i < 60_000; i++) {
      const k = BigInt(Math.floor(random() * 20_000)) * 0x9e37_79b9n;
      const [hi, lo] = key(k);
      const found = table.find(hi, lo);
      expect(found).to.equal(model.has(k));
      if (!found) {
        table.insert(hi, lo);
        table.owners = 1;
        table.resident = random() < 0.5;
        model.set(k, { owners: 1, resident: table.resident });
      } else if (random() < 0.5) {
        expect(table.owners).to.equal(model.get(k)!.owners);
        expect(table.resident).to.equal(model.get(k)!.resident);
        table.remove();
        model.delete(k);
      } else {
        table.owners = table.owners + 1;
        model.get(k)!.owners += 1;
      }
      expect(table.size).to.equal(model.size);
    }
    let nonResident = 0;
    for (const [k, entry] of model) {
      const [hi, lo] = key(k);
      expect(table.find(hi, lo)).to.equal(true);
      expect(table.owners).to.equal(entry.owners);
      if (!entry.resident) nonResident += 1;
    }
    expect(table.countNonResident()).to.equal(nonResident);
  });

  it("EventScratchMap forgets everything at reset, and holds what it is given until then", () => {
    const map = new EventScratchMap();
    map.reset(3);
    map.set(1, 2, 3, 4);
    map.set(1, 2, 5, 6);
    expect(map.find(1, 2)).to.equal(true);
    expect([map.valueHi, map.valueLo]).to.deep.equal([5, 6]);
    map.reset(100);
    expect(map.find(1, 2)).to.equal(false);
    for (let i = 0; i < 100; i++) map.set(i, i, i, i + 1);
    for (let i = 0; i < 100; i++) expect(map.find(i, i) && map.valueLo === i + 1).to.equal(true);
    map.reset(1);
    expect(map.find(5, 5)).to.equal(false);
  });
});
