import { expect } from "chai";
import { pino } from "pino";
import { Registry } from "prom-client";
import { restartBackoffMs, Supervisor } from "../../src/server/supervisor.js";

const policy = { minBackoffMs: 100, maxBackoffMs: 30_000, resetAfterMs: 60_000 };

describe("supervisor", () => {
  describe("restart backoff: exponential from the minimum, capped, jittered (the one backoff, src/util)", () => {
    const table: [failures: number, low: number, high: number][] = [
      [1, 100, 200],
      [2, 200, 400],
      [3, 400, 800],
      [8, 12_800, 25_600],
      [9, 15_000, 30_000],
      [1000, 15_000, 30_000],
    ];
    for (const [failures, low, high] of table) {
      it(`failure ${failures}: ${low}..${high} ms`, () => {
        expect(restartBackoffMs(failures, policy, () => 0)).to.equal(low);
        expect(restartBackoffMs(failures, policy, () => 1)).to.equal(high);
        const middle = restartBackoffMs(failures, policy, () => 0.5);
        expect(middle).to.be.within(low, high);
      });
    }
  });

  it("does not start a task once stopped, and a stop waits for running tasks to return", async () => {
    const supervisor = new Supervisor("m", pino({ level: "silent" }), new Registry());
    let returned = false;
    supervisor.run("loop", async (signal) => {
      await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
      await new Promise((r) => setImmediate(r));
      returned = true;
    });
    expect(supervisor.running()).to.deep.equal(["loop"]);
    await supervisor.stop(5000);
    expect(returned).to.equal(true);
    expect(supervisor.running()).to.deep.equal([]);
    let ran = false;
    supervisor.run("late", async () => {
      ran = true;
    });
    expect(ran).to.equal(false);
  });

  it("a task that returns is done and is not restarted", async () => {
    const supervisor = new Supervisor("m", pino({ level: "silent" }), new Registry());
    let runs = 0;
    supervisor.run("once", async () => {
      runs++;
    });
    await new Promise((r) => setImmediate(r));
    expect(runs).to.equal(1);
    expect(supervisor.running()).to.deep.equal([]);
    await supervisor.stop(1000);
  });
});
