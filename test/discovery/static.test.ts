import { expect } from "chai";
import { z } from "zod";
import { StaticResolver, staticDiscoverySchema, type Membership } from "../../src/discovery/index.js";

function issues(raw: unknown): string[] {
  const parsed = staticDiscoverySchema.safeParse(raw);
  return parsed.success ? [] : parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`);
}

const ids = (m: Membership) => m.members.map((x) => x.id);

describe("discovery: staticDiscoverySchema", () => {
  it("defaults ids to addresses and metadata to {}", () => {
    expect(staticDiscoverySchema.parse([{ address: "10.0.0.2:7000" }, { id: "w1", address: "[::1]:7001", metadata: { zone: "a" } }])).to.deep.equal([
      { id: "10.0.0.2:7000", address: "10.0.0.2:7000", metadata: {} },
      { id: "w1", address: "[::1]:7001", metadata: { zone: "a" } },
    ]);
    expect(staticDiscoverySchema.parse(undefined)).to.deep.equal([]);
  });

  it("refuses duplicate ids and duplicate addresses, naming the index", () => {
    expect(issues([{ id: "w1", address: "h:1" }, { id: "w2", address: "h:2" }, { id: "w1", address: "h:3" }])).to.deep.equal([
      '2.id: duplicate id "w1" (also at index 0)',
    ]);
    expect(issues([{ id: "w1", address: "h:1" }, { id: "w2", address: "h:1" }])).to.deep.equal(['1.address: duplicate address "h:1" (also at index 0)']);
    // An address is also the default id.
    expect(issues([{ address: "h:1" }, { id: "h:1", address: "h:2" }])).to.deep.equal(['1.id: duplicate id "h:1" (also at index 0)']);
  });

  it("checks addresses as HOST:PORT and refuses unknown keys", () => {
    expect(issues([{ address: "h:1" }, { address: "no-port" }])).to.have.length(1).and.to.match(/^1\.address: expected HOST:PORT/);
    expect(issues([{ address: "h:70000" }])).to.deep.equal(["0.address: port must be 0..65535"]);
    expect(issues([{ address: "h:1", weight: 2 }])[0]).to.match(/^0: Unrecognized key/);
  });

  it("names the path when nested in a module's section", () => {
    const section = z.strictObject({ members: staticDiscoverySchema });
    const parsed = section.safeParse({ members: [{ address: "h:1" }, { address: "h:1" }] });
    expect(parsed.error?.issues.map((i) => i.path.join("."))).to.deep.equal(["members.1.address"]);
  });
});

describe("discovery: StaticResolver", () => {
  it("commits the configured members, sorted by id, as generation 1", () => {
    const resolver = new StaticResolver([{ id: "b", address: "h:2" }, { id: "a", address: "h:1" }]);
    const view = resolver.current();
    expect(view.generation).to.equal(1n);
    expect(ids(view)).to.deep.equal(["a", "b"]);
    expect(Object.isFrozen(view.members)).to.equal(true);
  });

  it("throws the config error for a bad list", () => {
    expect(() => new StaticResolver([{ address: "h:1" }, { address: "h:1" }])).to.throw(/duplicate address/);
  });

  it("update commits a new generation only when the members changed", () => {
    const resolver = new StaticResolver([{ id: "a", address: "h:1" }, { id: "b", address: "h:2" }]);
    expect(resolver.update([{ id: "b", address: "h:2" }, { id: "a", address: "h:1", metadata: {} }]).generation).to.equal(1n);
    expect(resolver.update([{ id: "a", address: "h:1", metadata: { zone: "z" } }, { id: "b", address: "h:2" }]).generation).to.equal(2n);
    expect(resolver.update([{ id: "a", address: "h:1", metadata: { zone: "z" } }, { id: "b", address: "h:9" }]).generation).to.equal(3n);
    const view = resolver.update([{ id: "c", address: "h:3" }]);
    expect([view.generation, ids(view)]).to.deep.equal([4n, ["c"]]);
    expect(resolver.current()).to.equal(view);
  });

  it("watch yields the current view first, then each committed change", async () => {
    const resolver = new StaticResolver([{ id: "a", address: "h:1" }]);
    const controller = new AbortController();
    const it = resolver.watch(controller.signal)[Symbol.asyncIterator]();
    const first = await it.next();
    expect([first.value?.generation, ids(first.value!)]).to.deep.equal([1n, ["a"]]);
    const second = it.next();
    resolver.update([{ id: "a", address: "h:1" }]); // no change: no view
    resolver.update([{ id: "a", address: "h:1" }, { id: "b", address: "h:2" }]);
    const got = await second;
    expect([got.value?.generation, ids(got.value!)]).to.deep.equal([2n, ["a", "b"]]);
    controller.abort();
    expect((await it.next()).done).to.equal(true);
  });

  it("a slow watcher skips to the newest view", async () => {
    const resolver = new StaticResolver([{ id: "a", address: "h:1" }]);
    const it = resolver.watch(new AbortController().signal)[Symbol.asyncIterator]();
    expect((await it.next()).value?.generation).to.equal(1n);
    resolver.update([{ id: "b", address: "h:2" }]);
    resolver.update([{ id: "c", address: "h:3" }]);
    resolver.update([{ id: "d", address: "h:4" }]);
    const latest = await it.next();
    expect([latest.value?.generation, ids(latest.value!)]).to.deep.equal([4n, ["d"]]);
    await resolver.close();
    expect((await it.next()).done).to.equal(true);
  });

  it("every watcher sees each change, and close() ends the watches waiting for one", async () => {
    const resolver = new StaticResolver([{ id: "a", address: "h:1" }]);
    const signal = new AbortController().signal;
    const collect = async () => {
      const seen: bigint[] = [];
      for await (const view of resolver.watch(signal)) {
        seen.push(view.generation);
        if (view.generation === 2n) break;
      }
      return seen;
    };
    const one = collect();
    const two = collect();
    await new Promise((r) => setImmediate(r));
    resolver.update([{ id: "b", address: "h:2" }]);
    expect(await Promise.all([one, two])).to.deep.equal([
      [1n, 2n],
      [1n, 2n],
    ]);
    const waiting = resolver.watch(signal)[Symbol.asyncIterator]();
    await waiting.next();
    const pending = waiting.next();
    await resolver.close();
    expect((await pending).done).to.equal(true);
    expect((await resolver.watch(signal)[Symbol.asyncIterator]().next()).done).to.equal(true);
    expect(resolver.current().generation).to.equal(2n);
  });
});
