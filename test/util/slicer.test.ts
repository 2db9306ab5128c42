import { expect } from "chai";
import { SLICE_CLOCK_STEPS, WorkSlicer } from "../../src/util/index.js";

describe("util: WorkSlicer", () => {
  it("due() says a slice is spent after sliceSteps steps, and yieldTurn() lets a callback queued before it run first", async () => {
    const slicer = new WorkSlicer({ sliceMs: 60_000, sliceSteps: 10 });
    let yields = 0;
    for (let i = 0; i < 95; i++) {
      if (!slicer.due()) continue;
      let ran = false;
      setImmediate(() => (ran = true));
      await slicer.yieldTurn();
      expect(ran).to.equal(true);
      yields += 1;
    }
    expect(yields).to.equal(9);
    expect(slicer.stats().yields).to.equal(9);
  });

  it("due() also says so once sliceMs have passed since the slice began: at once for a call of several steps, within SLICE_CLOCK_STEPS one-step calls", () => {
    const busy = (ms: number) => {
      const until = performance.now() + ms;
      while (performance.now() < until) {
        // busy
      }
    };
    const slicer = new WorkSlicer({ sliceMs: 1, sliceSteps: 1e9 });
    expect(slicer.due()).to.equal(false);
    busy(3);
    let calls = 1;
    while (!slicer.due()) calls += 1;
    expect(calls).to.be.at.most(SLICE_CLOCK_STEPS);
    const other = new WorkSlicer({ sliceMs: 1, sliceSteps: 1e9 });
    expect(other.due()).to.equal(false);
    busy(3);
    expect(other.due(2)).to.equal(true);
  });

  it("a slice ends with its turn: the next turn starts a fresh one", async () => {
    const slicer = new WorkSlicer({ sliceMs: 60_000, sliceSteps: 3 });
    expect(slicer.due(2)).to.equal(false);
    await new Promise((resolve) => setImmediate(resolve));
    await new Promise((resolve) => setImmediate(resolve));
    expect(slicer.due(2)).to.equal(false);
    expect(slicer.due(1)).to.equal(true);
  });

  it("finish() answers at once when stepped work never pauses, and gives the loop a turn at each pause", async () => {
    const slicer = new WorkSlicer();
    function* steps(pauses: number): Generator<void, string, void> {
      for (let i = 0; i < pauses; i++) yield;
      return `done after ${pauses}`;
    }
    expect(slicer.finish(steps(0))).to.equal("done after 0");
    let ticks = 0;
    const timer = setInterval(() => (ticks += 1), 0);
    try {
      const pending = slicer.finish(steps(3));
      expect(pending).to.be.instanceOf(Promise);
      expect(await pending).to.equal("done after 3");
    } finally {
      clearInterval(timer);
    }
    expect(slicer.stats().yields).to.equal(3);
  });

  it("exclusive() runs tasks one at a time, in submission order, across their yields; a rejection stays with its task", async () => {
    const slicer = new WorkSlicer({ sliceMs: 60_000, sliceSteps: 1 });
    const log: string[] = [];
    const task = (name: string, steps: number, fail = false) => async () => {
      for (let i = 0; i < steps; i++) {
        log.push(`${name}${i}`);
        if (slicer.due()) await slicer.yieldTurn();
      }
      if (fail) throw new Error(`${name} failed`);
      return name;
    };
    const results = await Promise.allSettled([slicer.exclusive(task("a", 3)), slicer.exclusive(task("b", 2, true)), slicer.exclusive(task("c", 2))]);
    expect(log).to.deep.equal(["a0", "a1", "a2", "b0", "b1", "c0", "c1"]);
    expect(results.map((r) => (r.status === "fulfilled" ? r.value : (r.reason as Error).message))).to.deep.equal(["a", "b failed", "c"]);
    expect(slicer.stats()).to.include({ tasks: 3, waiting: 0 });
  });
});
