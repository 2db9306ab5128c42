import { expect } from "chai";
import { AcquireError, Semaphore } from "../../src/util/index.js";
import { expectRejection } from "../support/index.js";

const failure = (promise: Promise<unknown>) => expectRejection(promise, { type: AcquireError });

describe("Semaphore", () => {
  it("grants up to its size at once and queues the rest in order", async () => {
    const sem = new Semaphore(2);
    const a = await sem.acquire();
    const b = await sem.acquire();
    expect(sem.inUse).to.equal(2);
    const order: string[] = [];
    const c = sem.acquire().then((p) => (order.push("c"), p));
    const d = sem.acquire().then((p) => (order.push("d"), p));
    expect(sem.waiting).to.equal(2);
    a.release();
    a.release(); // a second release is harmless
    (await c).release();
    b.release();
    (await d).release();
    expect(order).to.deep.equal(["c", "d"]);
    expect(sem.inUse).to.equal(0);
  });

  it("lets a waiter give up on abort, without losing the permit", async () => {
    const sem = new Semaphore(1);
    const held = await sem.acquire();
    const giveUp = new AbortController();
    const waiting = sem.acquire(giveUp.signal);
    giveUp.abort();
    expect((await failure(waiting)).reason).to.equal("aborted");
    expect(sem.waiting).to.equal(0);
    const next = sem.acquire();
    held.release();
    (await next).release();
    expect(sem.inUse).to.equal(0);
  });

  it("fails a wait at its deadline and an already aborted signal at once", async () => {
    const sem = new Semaphore(1);
    const held = await sem.acquire();
    expect((await failure(sem.acquire(undefined, Date.now() + 20))).reason).to.equal("deadline");
    expect((await failure(sem.acquire(undefined, Date.now() - 1))).reason).to.equal("deadline");
    expect((await failure(sem.acquire(AbortSignal.abort()))).reason).to.equal("aborted");
    held.release();
  });

  it("reports a wait ended by a timeout signal, or by any signal past the deadline, as deadline", async () => {
    const sem = new Semaphore(1);
    const held = await sem.acquire();
    // The caller's signal carries the deadline too, and fires first.
    expect((await failure(sem.acquire(AbortSignal.timeout(10), Date.now() + 60_000))).reason).to.equal("deadline");
    const ended = new AbortController();
    ended.abort();
    expect((await failure(sem.acquire(ended.signal, Date.now() - 1))).reason).to.equal("deadline");
    held.release();
  });

  it("fails every waiter and later acquire once closed; held permits stay valid", async () => {
    const sem = new Semaphore(1);
    const held = await sem.acquire();
    const waiting = sem.acquire();
    sem.close();
    expect((await failure(waiting)).reason).to.equal("closed");
    expect((await failure(sem.acquire())).reason).to.equal("closed");
    held.release();
    expect(sem.inUse).to.equal(0);
  });
});
