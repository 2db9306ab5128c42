import { expect } from "chai";
import { observeStream } from "../../src/util/index.js";

async function* source(values: number[], failAt?: number): AsyncGenerator<number> {
  for (const [i, v] of values.entries()) {
    if (i === failAt) throw new Error(`failed at ${i}`);
    yield v;
  }
}

describe("util: observeStream", () => {
  it("passes every message through and reports a normal end once", async () => {
    const events: string[] = [];
    const out: number[] = [];
    for await (const v of observeStream(source([1, 2, 3]), { end: () => events.push("end"), cancel: () => events.push("cancel") })) out.push(v);
    expect(out).to.deep.equal([1, 2, 3]);
    expect(events).to.deep.equal(["end"]);
  });

  it("rethrows what the error observer returns", async () => {
    const stream = observeStream(source([1, 2, 3], 1), { error: (e) => new Error(`mapped: ${(e as Error).message}`) });
    const out: number[] = [];
    let caught: unknown;
    try {
      for await (const v of stream) out.push(v);
    } catch (e) {
      caught = e;
    }
    expect(out).to.deep.equal([1]);
    expect((caught as Error).message).to.equal("mapped: failed at 1");
  });

  it("reports a consumer that stops early, and closes the source", async () => {
    const events: string[] = [];
    let closed = false;
    async function* tracked() {
      try {
        yield* source([1, 2, 3]);
      } finally {
        closed = true;
      }
    }
    for await (const v of observeStream(tracked(), { end: () => events.push("end"), cancel: () => events.push("cancel") })) {
      if (v === 1) break;
    }
    expect(events).to.deep.equal(["cancel"]);
    expect(closed).to.equal(true);
  });
});
