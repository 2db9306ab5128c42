import { expect } from "chai";
import { raceAbort, untilAborted } from "../../src/util/index.js";
import { eventually, expectRejection } from "../support/index.js";

/** An async source that yields `values`, then waits until `release` resolves. */
function source(values: number[], release: Promise<void>, onReturn: () => void): AsyncIterable<number> {
  return {
    async *[Symbol.asyncIterator]() {
      try {
        yield* values;
        await release;
      } finally {
        onReturn();
      }
    },
  };
}

describe("untilAborted", () => {
  it("passes everything through when the signal never fires", async () => {
    let returned = 0;
    const out: number[] = [];
    for await (const v of untilAborted(source([1, 2, 3], Promise.resolve(), () => returned++), new AbortController().signal)) out.push(v);
    expect(out).to.deep.equal([1, 2, 3]);
    expect(returned).to.equal(1);
  });

  it("ends while the source is waiting, once the signal fires", async () => {
    const controller = new AbortController();
    const out: number[] = [];
    const done = (async () => {
      for await (const v of untilAborted(source([1], new Promise(() => undefined), () => undefined), controller.signal)) out.push(v);
    })();
    // The value is through and the source waits.
    await eventually(() => expect(out).to.deep.equal([1]));
    controller.abort();
    await done;
    expect(out).to.deep.equal([1]);
  });

  it("yields nothing for an already fired signal", async () => {
    const out: number[] = [];
    for await (const v of untilAborted(source([1, 2], Promise.resolve(), () => undefined), AbortSignal.abort())) out.push(v);
    expect(out).to.deep.equal([]);
  });
});

describe("raceAbort", () => {
  it("settles with the work when the signal stays quiet", async () => {
    expect(await raceAbort(Promise.resolve(7), new AbortController().signal)).to.equal(7);
    await expectRejection(raceAbort(Promise.reject(new Error("work failed")), new AbortController().signal), { message: /^work failed$/ });
  });

  it("rejects with the signal's reason while the work still runs", async () => {
    const controller = new AbortController();
    const pending = expectRejection(raceAbort(new Promise(() => undefined), controller.signal), { message: /^gone$/ });
    controller.abort(new Error("gone"));
    await pending;
    await expectRejection(raceAbort(Promise.resolve(1), AbortSignal.abort(new Error("already"))), { message: /^already$/ });
  });
});
