import { expect } from "chai";
import { getEventListeners } from "node:events";
import { BoundedQueue } from "../../src/util/index.js";

/** Lets every pending callback run (promise jobs, then one macrotask turn). */
function flush(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/** Follows a promise's state without awaiting it. */
function track<T>(promise: Promise<T>): { settled: boolean; value?: T; error?: unknown; promise: Promise<T> } {
  const state: { settled: boolean; value?: T; error?: unknown; promise: Promise<T> } = { settled: false, promise };
  promise.then(
    (value) => Object.assign(state, { settled: true, value }),
    (error: unknown) => Object.assign(state, { settled: true, error }),
  );
  return state;
}

function listeners(signal: AbortSignal): number {
  return getEventListeners(signal, "abort").length;
}

async function drain<T>(queue: BoundedQueue<T>): Promise<T[]> {
  const out: T[] = [];
  for (let r = await queue.next(); !r.done; r = await queue.next()) out.push(r.value);
  return out;
}

const byLength = (s: string): number => s.length;

describe("BoundedQueue", () => {
  it("bounds the item count: tryPush reports full, and room returns as items are read", async () => {
    const q = new BoundedQueue<number>({ maxItems: 3 });
    expect([q.tryPush(1), q.tryPush(2), q.tryPush(3), q.tryPush(4)]).to.deep.equal([true, true, true, false]);
    expect(q.length).to.equal(3);
    expect(await q.next()).to.deep.equal({ value: 1, done: false });
    expect(q.tryPush(4)).to.equal(true);
    q.close();
    expect(await drain(q)).to.deep.equal([2, 3, 4]);
  });

  it("bounds the bytes", async () => {
    const q = new BoundedQueue<string>({ maxItems: 100, maxBytes: 10, sizeOf: byLength });
    expect(q.tryPush("aaaa")).to.equal(true);
    expect(q.tryPush("bbbb")).to.equal(true);
    expect(q.tryPush("ccc")).to.equal(false);
    expect(q.tryPush("cc")).to.equal(true);
    expect([q.length, q.bytes]).to.deep.equal([3, 10]);
    expect(q.tryPush("")).to.equal(true);
    await q.next();
    expect(q.bytes).to.equal(6);
    expect(q.tryPush("dddd")).to.equal(true);
    expect(q.bytes).to.equal(10);
  });

  it("accepts an item bigger than maxBytes only into an empty queue", async () => {
    const q = new BoundedQueue<string>({ maxItems: 10, maxBytes: 5, sizeOf: byLength });
    expect(q.tryPush("a")).to.equal(true);
    expect(q.tryPush("0123456789")).to.equal(false);
    const big = track(q.push("0123456789"));
    await flush();
    expect(big.settled).to.equal(false);
    expect((await q.next()).value).to.equal("a");
    await flush();
    expect(big.value).to.equal(true);
    expect([q.length, q.bytes]).to.deep.equal([1, 10]);
    expect(q.tryPush("b")).to.equal(false);
    expect((await q.next()).value).to.equal("0123456789");
    expect(q.tryPush("b")).to.equal(true);
  });

  it("releases a blocked push when the reader takes an item", async () => {
    const q = new BoundedQueue<number>({ maxItems: 1 });
    expect(await q.push(1)).to.equal(true);
    const second = track(q.push(2));
    await flush();
    expect(second.settled).to.equal(false);
    expect(q.tryPush(3)).to.equal(false);
    expect((await q.next()).value).to.equal(1);
    expect(await second.promise).to.equal(true);
    expect((await q.next()).value).to.equal(2);
  });

  it("tryPush does not overtake producers that wait", async () => {
    const q = new BoundedQueue<string>({ maxItems: 10, maxBytes: 4, sizeOf: byLength });
    q.tryPush("aaa");
    const waiting = track(q.push("bbbb"));
    expect(q.tryPush("c")).to.equal(false);
    expect((await q.next()).value).to.equal("aaa");
    expect(await waiting.promise).to.equal(true);
    q.close();
    expect(await drain(q)).to.deep.equal(["bbbb"]);
  });

  it("releases a blocked push with false on close; the reader drains, then ends", async () => {
    const q = new BoundedQueue<number>({ maxItems: 2 });
    q.tryPush(1);
    q.tryPush(2);
    const blocked = track(q.push(3));
    q.close();
    expect(await blocked.promise).to.equal(false);
    expect(q.closed).to.equal(true);
    expect(q.tryPush(4)).to.equal(false);
    expect(await q.push(4)).to.equal(false);
    expect(await drain(q)).to.deep.equal([1, 2]);
    expect(await q.next()).to.deep.equal({ value: undefined, done: true });
  });

  it("ends a waiting reader on close", async () => {
    const q = new BoundedQueue<number>({ maxItems: 2 });
    const reading = q.next();
    q.close();
    expect(await reading).to.deep.equal({ value: undefined, done: true });
  });

  it("hands a pushed item to a waiting reader", async () => {
    const q = new BoundedQueue<number>({ maxItems: 2 });
    const reading = q.next();
    expect(q.tryPush(7)).to.equal(true);
    expect(await reading).to.deep.equal({ value: 7, done: false });
    expect(q.length).to.equal(0);
  });

  it("rejects a waiting push with the signal's reason, queues nothing and stops listening", async () => {
    const q = new BoundedQueue<number>({ maxItems: 1 });
    q.tryPush(1);
    const controller = new AbortController();
    const reason = new Error("stop");
    const pushing = track(q.push(2, controller.signal));
    expect(listeners(controller.signal)).to.equal(1);
    controller.abort(reason);
    await flush();
    expect(pushing.error).to.equal(reason);
    expect(listeners(controller.signal)).to.equal(0);
    q.close();
    expect(await drain(q)).to.deep.equal([1]);
  });

  it("lets the next producer in when an aborted one was blocking the head", async () => {
    const q = new BoundedQueue<string>({ maxItems: 10, maxBytes: 4, sizeOf: byLength });
    q.tryPush("aa");
    const controller = new AbortController();
    const big = track(q.push("bbbb", controller.signal));
    const small = track(q.push("c"));
    await flush();
    expect([big.settled, small.settled]).to.deep.equal([false, false]);
    controller.abort();
    await flush();
    expect(big.error).to.be.instanceOf(Error);
    expect(small.value).to.equal(true);
    q.close();
    expect(await drain(q)).to.deep.equal(["aa", "c"]);
  });

  it("rejects a push whose signal already fired, and a next that would have to wait", async () => {
    const q = new BoundedQueue<number>({ maxItems: 1 });
    const reason = new Error("already");
    const signal = AbortSignal.abort(reason);
    let pushError: unknown;
    await q.push(1, signal).catch((error: unknown) => (pushError = error));
    expect(pushError).to.equal(reason);
    expect(q.length).to.equal(0);
    let nextError: unknown;
    await q.next(signal).catch((error: unknown) => (nextError = error));
    expect(nextError).to.equal(reason);
  });

  it("hands out an item already queued even when the signal has fired: the signal stops a wait, it drops nothing", async () => {
    const q = new BoundedQueue<number>({ maxItems: 1 });
    const signal = AbortSignal.abort(new Error("already"));
    q.tryPush(7);
    expect(await q.next(signal)).to.deep.equal({ value: 7, done: false });
    expect(q.length).to.equal(0);
  });

  it("rejects a waiting next with the signal's reason and stops listening; a later next still works", async () => {
    const q = new BoundedQueue<number>({ maxItems: 1 });
    const controller = new AbortController();
    const reason = new Error("gone");
    const reading = track(q.next(controller.signal));
    controller.abort(reason);
    await flush();
    expect(reading.error).to.equal(reason);
    expect(listeners(controller.signal)).to.equal(0);
    q.tryPush(5);
    expect(await q.next()).to.deep.equal({ value: 5, done: false });
  });

  it("stops listening on a signal once its push or next succeeds", async () => {
    const q = new BoundedQueue<number>({ maxItems: 1 });
    const controller = new AbortController();
    q.tryPush(1);
    const pushing = q.push(2, controller.signal);
    expect(listeners(controller.signal)).to.equal(1);
    await q.next(controller.signal);
    expect(await pushing).to.equal(true);
    await q.next(controller.signal);
    const reading = q.next(controller.signal);
    expect(listeners(controller.signal)).to.equal(1);
    q.tryPush(3);
    expect((await reading).value).to.equal(3);
    expect(listeners(controller.signal)).to.equal(0);
  });

  it("has one consumer: a second waiting next is rejected", async () => {
    const q = new BoundedQueue<number>({ maxItems: 1 });
    const first = q.next();
    let error: unknown;
    await q.next().catch((e: unknown) => (error = e));
    expect(error).to.be.instanceOf(Error);
    q.tryPush(1);
    expect((await first).value).to.equal(1);
  });

  it("replace discards what is queued and queues the one item", async () => {
    const q = new BoundedQueue<string>({ maxItems: 2, maxBytes: 4, sizeOf: byLength });
    q.tryPush("a");
    q.tryPush("bb");
    const waiting = track(q.push("ccc"));
    expect(q.replace("zzzzzz")).to.equal(true);
    expect(await waiting.promise).to.equal(true);
    expect([q.length, q.bytes]).to.deep.equal([1, 6]);
    expect(q.replace("y")).to.equal(true);
    q.close();
    expect(q.replace("x")).to.equal(false);
    expect(await drain(q)).to.deep.equal(["y"]);
  });

  it("replace wakes a waiting reader", async () => {
    const q = new BoundedQueue<number>({ maxItems: 1 });
    const reading = q.next();
    q.replace(9);
    expect(await reading).to.deep.equal({ value: 9, done: false });
  });

  it("fail lets the reader drain, then rejects its next with the error, every time", async () => {
    const q = new BoundedQueue<number>({ maxItems: 3 });
    q.tryPush(1);
    q.tryPush(2);
    const error = new Error("upstream broke");
    q.fail(error);
    q.close();
    expect(q.tryPush(3)).to.equal(false);
    expect((await q.next()).value).to.equal(1);
    expect((await q.next()).value).to.equal(2);
    for (let i = 0; i < 2; i++) {
      let caught: unknown;
      await q.next().catch((e: unknown) => (caught = e));
      expect(caught).to.equal(error);
    }
  });

  it("fail rejects a reader already waiting, and a for await sees the error", async () => {
    const q = new BoundedQueue<number>({ maxItems: 3 });
    const error = new Error("boom");
    const seen: number[] = [];
    const loop = (async () => {
      for await (const v of q) seen.push(v);
    })();
    q.tryPush(1);
    await flush();
    q.fail(error);
    let caught: unknown;
    await loop.catch((e: unknown) => (caught = e));
    expect(caught).to.equal(error);
    expect(seen).to.deep.equal([1]);
  });

  it("ending an iteration early closes the queue and releases waiting producers", async () => {
    const q = new BoundedQueue<number>({ maxItems: 1 });
    q.tryPush(1);
    const waiting = [track(q.push(2)), track(q.push(3)), track(q.push(4))];
    for await (const v of q) {
      expect(v).to.equal(1);
      break;
    }
    await flush();
    // Reading 1 made room for 2 (then discarded by the early end); the others are released unqueued.
    expect(waiting.map((w) => w.value)).to.deep.equal([true, false, false]);
    expect(q.closed).to.equal(true);
    expect(q.length).to.equal(0);
    expect(q.tryPush(4)).to.equal(false);
  });

  it("admits many waiting producers in FIFO order", async () => {
    const q = new BoundedQueue<number>({ maxItems: 1 });
    q.tryPush(0);
    const pushes = Array.from({ length: 200 }, (_, i) => q.push(i + 1));
    const reader = drain(q);
    expect(await Promise.all(pushes)).to.deep.equal(pushes.map(() => true));
    q.close();
    expect(await reader).to.deep.equal(Array.from({ length: 201 }, (_, i) => i));
  });

  it("keeps FIFO under the byte bound: a big waiting item holds back smaller ones behind it", async () => {
    const q = new BoundedQueue<string>({ maxItems: 10, maxBytes: 4, sizeOf: byLength });
    q.tryPush("aaa");
    const order: string[] = [];
    const pushes = ["bbbb", "c", "d"].map((s) => q.push(s).then(() => order.push(s)));
    await flush();
    expect(order).to.deep.equal([]);
    expect((await q.next()).value).to.equal("aaa");
    await flush();
    expect(order).to.deep.equal(["bbbb"]);
    expect((await q.next()).value).to.equal("bbbb");
    await Promise.all(pushes);
    expect(order).to.deep.equal(["bbbb", "c", "d"]);
  });

  it("keeps order through ring wrap-around and growth", async () => {
    const q = new BoundedQueue<number>({ maxItems: 5000 });
    const out: number[] = [];
    let next = 0;
    for (let round = 0; round < 50; round++) {
      for (let i = 0; i < 37; i++) expect(q.tryPush(next++)).to.equal(true);
      for (let i = 0; i < 29; i++) out.push((await q.next()).value as number);
    }
    for (let i = 0; i < 3000; i++) q.tryPush(next++);
    q.close();
    out.push(...(await drain(q)));
    expect(out).to.deep.equal(Array.from({ length: next }, (_, i) => i));
  });

  it("refuses invalid bounds and sizes", async () => {
    for (const maxItems of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => new BoundedQueue({ maxItems }), `maxItems ${maxItems}`).to.throw(RangeError);
    }
    for (const maxBytes of [-1, Number.NaN]) {
      expect(() => new BoundedQueue({ maxItems: 1, maxBytes }), `maxBytes ${maxBytes}`).to.throw(RangeError);
    }
    for (const size of [-1, Number.NaN, Number.POSITIVE_INFINITY]) {
      const q = new BoundedQueue<number>({ maxItems: 2, sizeOf: () => size });
      expect(() => q.tryPush(1)).to.throw(RangeError);
      let caught: unknown;
      await q.push(1).catch((e: unknown) => (caught = e));
      expect(caught).to.be.instanceOf(RangeError);
      expect(q.length).to.equal(0);
    }
  });
});
