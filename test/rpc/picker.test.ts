import { expect } from "chai";
import { StaticResolver } from "../../src/discovery/index.js";
import { RoundRobinPicker } from "../../src/rpc/index.js";

function picks<T>(picker: RoundRobinPicker<T>, n: number): (T | undefined)[] {
  return Array.from({ length: n }, () => picker.pick());
}

/** A small deterministic PRNG (mulberry32), so that a failure replays. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe("rpc: RoundRobinPicker", () => {
  it("returns undefined for an empty list, and after a rebuild to an empty list", () => {
    expect(new RoundRobinPicker<string>([]).pick()).to.equal(undefined);
    const picker = new RoundRobinPicker(["a", "b"]);
    picker.pick();
    expect(picker.rebuild([]).pick()).to.equal(undefined);
    expect(new RoundRobinPicker<string>([]).rebuild(["a"]).pick()).to.equal("a");
  });

  it("spreads N picks evenly, in list order from the start index", () => {
    const members = ["a", "b", "c", "d", "e"];
    const picker = new RoundRobinPicker(members);
    const counts = new Map<string, number>();
    for (const m of picks(picker, 5 * 200)) counts.set(m!, (counts.get(m!) ?? 0) + 1);
    expect([...counts.values()]).to.deep.equal([200, 200, 200, 200, 200]);
    expect(picks(new RoundRobinPicker(members, { start: 3 }), 6)).to.deep.equal(["d", "e", "a", "b", "c", "d"]);
    expect(picks(new RoundRobinPicker(members, { start: -1 }), 2)).to.deep.equal(["e", "a"]);
  });

  it("rebuild continues after the endpoint picked last when it is still listed", () => {
    const picker = new RoundRobinPicker(["a", "b", "c", "d"]);
    expect(picks(picker, 2)).to.deep.equal(["a", "b"]);
    expect(picks(picker.rebuild(["a", "b", "bb", "c", "d"]), 5)).to.deep.equal(["bb", "c", "d", "a", "b"]);
  });

  it("rebuild continues where the rotation was going when the endpoint picked last left", () => {
    const picker = new RoundRobinPicker(["a", "b", "c", "d"]);
    expect(picks(picker, 2)).to.deep.equal(["a", "b"]);
    // b left: c would have come next.
    expect(picks(picker.rebuild(["a", "c", "d"]), 3)).to.deep.equal(["c", "d", "a"]);
    // b and c left: d.
    expect(picks(picker.rebuild(["a", "d"]), 2)).to.deep.equal(["d", "a"]);
  });

  it("rebuild before any pick starts at the endpoint that would have come first", () => {
    const picker = new RoundRobinPicker(["a", "b", "c"], { start: 1 });
    expect(picks(picker.rebuild(["a", "b", "c", "d"]), 2)).to.deep.equal(["b", "c"]);
    expect(picks(picker.rebuild(["a", "c"]), 2)).to.deep.equal(["c", "a"]);
  });

  it("leaves the old picker as it was: its list and its own rotation", () => {
    const list = ["a", "b", "c"];
    const picker = new RoundRobinPicker(list);
    picker.pick();
    const next = picker.rebuild(["a", "c"]);
    next.pick();
    list.push("z"); // the picker holds its own copy
    expect(picker.endpoints).to.deep.equal(["a", "b", "c"]);
    expect(Object.isFrozen(picker.endpoints)).to.equal(true);
    expect(picks(picker, 3)).to.deep.equal(["b", "c", "a"]);
  });

  it("tells endpoints apart by key across rebuilds (new objects for the same members)", () => {
    const of = (...ids: string[]) => ids.map((id) => ({ id }));
    const picker = new RoundRobinPicker(of("a", "b", "c"), { key: (m) => m.id });
    expect(picker.pick()?.id).to.equal("a");
    expect(picks(picker.rebuild(of("a", "b", "c")), 3).map((m) => m?.id)).to.deep.equal(["b", "c", "a"]);
  });

  it("stays fair under churn: never the same member twice in a row, every member once per round between changes", () => {
    const random = rng(20240601);
    const universe = Array.from({ length: 12 }, (_, i) => `m${String(i).padStart(2, "0")}`);
    let members = universe.slice(0, 4);
    let picker = new RoundRobinPicker(members);
    let previous: string | undefined;
    for (let change = 0; change < 500; change++) {
      // Pick one to three rounds' worth, checking each full round of the current list.
      const run = picks(picker, members.length * (1 + Math.floor(random() * 3))) as string[];
      for (const [i, m] of run.entries()) {
        const before = i === 0 ? previous : run[i - 1];
        if (members.length > 1) expect(m, `change ${change}, pick ${i}`).to.not.equal(before);
      }
      for (let round = 0; round + members.length <= run.length; round += members.length) {
        expect([...run.slice(round, round + members.length)].sort()).to.deep.equal([...members].sort());
      }
      previous = run.at(-1) ?? previous;
      // Add and remove a few members (never all), keeping the list sorted as a membership is.
      const next = new Set(members);
      for (const m of universe) if (random() < 0.15) (next.has(m) ? next.delete(m) : next.add(m));
      if (next.size === 0) next.add(universe[Math.floor(random() * universe.length)]!);
      members = [...next].sort();
      picker = picker.rebuild(members);
    }
  });

  it("keeps its rotation over discovery members, which are new objects in every committed membership", () => {
    const three = [{ address: "10.0.0.1:1" }, { address: "10.0.0.2:1" }, { address: "10.0.0.3:1" }];
    const resolver = new StaticResolver(three);
    let picker = new RoundRobinPicker(resolver.current().members);
    const picks: string[] = [];
    for (let i = 0; i < 6; i++) {
      picks.push(picker.pick()!.id);
      // A metadata change elsewhere commits a new generation with new member objects.
      const view = resolver.update([...three, { address: "10.0.0.9:1", metadata: { n: String(i) } }]);
      picker = picker.rebuild(view.members.slice(0, 3));
    }
    expect(picks).to.deep.equal(["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"]);
  });
});
