import { getEventListeners } from "node:events";
import { expect } from "chai";
import { linkSignals } from "../../src/util/index.js";

describe("linkSignals", () => {
  it("fires with the reason of the first source that fires, once", () => {
    const a = new AbortController();
    const b = new AbortController();
    const link = linkSignals([a.signal, b.signal]);
    expect(link.signal.aborted).to.equal(false);
    b.abort("b first");
    a.abort("a later");
    expect(link.signal.aborted).to.equal(true);
    expect(link.signal.reason).to.equal("b first");
  });

  it("is aborted at once when a source already is", () => {
    const a = new AbortController();
    a.abort("done");
    const link = linkSignals([new AbortController().signal, a.signal]);
    expect(link.signal.reason).to.equal("done");
  });

  it("times out with a TimeoutError, as AbortSignal.timeout does", async () => {
    const link = linkSignals([new AbortController().signal], { timeoutMs: 5 });
    await new Promise((r) => setTimeout(r, 30));
    expect(link.signal.aborted).to.equal(true);
    expect((link.signal.reason as DOMException).name).to.equal("TimeoutError");
  });

  it("leaves nothing on a long-lived source once disposed, however many calls came and went", () => {
    const server = new AbortController();
    for (let i = 0; i < 1000; i++) {
      const call = new AbortController();
      const link = linkSignals([call.signal, server.signal], { timeoutMs: 60_000 });
      if (i % 2 === 0) call.abort();
      link.dispose();
      expect(getEventListeners(call.signal, "abort")).to.have.length(0);
    }
    expect(getEventListeners(server.signal, "abort")).to.have.length(0);
  });

  it("stops following its sources once disposed", () => {
    const a = new AbortController();
    const link = linkSignals([a.signal]);
    link.dispose();
    a.abort();
    expect(link.signal.aborted).to.equal(false);
  });
});
