import { AssertionError, expect } from "chai";
import { eventually, expectRejection, FakeClock, MAX_THREE_PART_LENGTH, splitAtEveryBoundary } from "./index.js";

/** Runs `fn`, which must throw a chai AssertionError, and returns its message. */
async function assertionMessage(fn: () => Promise<unknown>): Promise<string> {
  try {
    await fn();
  } catch (error) {
    if (error instanceof AssertionError) return error.message;
    throw error;
  }
  throw new Error("expected an assertion to fail");
}

describe("test helpers", () => {
  describe("eventually", () => {
    it("retries until the assertion passes and returns its result", async () => {
      let calls = 0;
      const result = await eventually(() => {
        calls += 1;
        expect(calls).to.equal(3);
        return "done";
      }, { intervalMs: 1 });
      expect([result, calls]).to.deep.equal(["done", 3]);
    });

    it("fails with the last error once its time is up", async () => {
      const message = await assertionMessage(() => eventually(() => expect(1).to.equal(2), { timeoutMs: 20, intervalMs: 1 }));
      expect(message).to.match(/^still failing after 20 ms: expected 1 to equal 2/);
    });
  });

  describe("splitAtEveryBoundary", () => {
    const bytes = Uint8Array.of(1, 2, 3);
    const join = (parts: Uint8Array[]) => parts.map((p) => [...p].join("")).join("|");

    it("yields every cut into two parts, empty ends included", () => {
      expect([...splitAtEveryBoundary(bytes)].map(join)).to.deep.equal(["|123", "1|23", "12|3", "123|"]);
    });

    it("yields every cut into three parts", () => {
      const splits = [...splitAtEveryBoundary(bytes, { parts: 3 })].map(join);
      expect(splits).to.have.length(10);
      expect(new Set(splits).size).to.equal(10);
      expect(splits).to.include.members(["||123", "1|2|3", "123||", "|12|3"]);
      for (const s of splits) expect(s.replaceAll("|", "")).to.equal("123");
    });

    it("refuses three parts for a large input", () => {
      expect(() => [...splitAtEveryBoundary(new Uint8Array(MAX_THREE_PART_LENGTH + 1), { parts: 3 })]).to.throw(RangeError);
    });
  });

  describe("expectRejection", () => {
    class CodedError extends Error {
      override readonly name = "CodedError";
      constructor(readonly code: string) {
        super(`failed with ${code}`);
      }
    }

    it("returns the error when the work fails as expected, thrown or rejected", async () => {
      const rejected = await expectRejection(Promise.reject(new CodedError("E1")), { type: CodedError, code: "E1", name: "CodedError", message: /E1$/ });
      expect(rejected.code).to.equal("E1");
      const thrown = await expectRejection(() => {
        throw new CodedError("E2");
      }, { type: CodedError });
      expect(thrown.code).to.equal("E2");
    });

    it("fails when the work succeeds or fails otherwise", async () => {
      expect(await assertionMessage(() => expectRejection(Promise.resolve({ ok: true })))).to.include('expected a failure, got {"ok":true}');
      expect(await assertionMessage(() => expectRejection(Promise.reject(new CodedError("E1")), { code: "E2" }))).to.include("code of CodedError");
      expect(await assertionMessage(() => expectRejection(Promise.reject(new Error("x")), { type: CodedError }))).to.include("CodedError");
      expect(await assertionMessage(() => expectRejection(Promise.reject(new Error("x")), { message: /y/ }))).to.include("to match /y/");
    });
  });

  describe("FakeClock", () => {
    it("fires due timers in time order, each at its own time, as the clock advances", () => {
      const clock = new FakeClock(100);
      const fired: string[] = [];
      clock.setTimeout(() => fired.push(`b@${clock.now()}`), 20);
      clock.setTimeout(() => fired.push(`a@${clock.now()}`), 10);
      const never = clock.setTimeout(() => fired.push("cleared"), 15);
      clock.clearTimeout(never);
      clock.setTimeout(() => fired.push(`late@${clock.now()}`), 50);
      clock.advance(9);
      expect(fired).to.deep.equal([]);
      clock.advance(21);
      expect(fired).to.deep.equal(["a@110", "b@120"]);
      expect([clock.now(), clock.pending]).to.deep.equal([130, 1]);
    });

    it("repeats intervals, and runs timers set by timers within the same advance", () => {
      const clock = new FakeClock();
      const ticks: number[] = [];
      const id = clock.setInterval(() => ticks.push(clock.now()), 10);
      clock.setTimeout(() => clock.setTimeout(() => ticks.push(-clock.now()), 5), 12);
      clock.advance(35);
      expect(ticks).to.deep.equal([10, -17, 20, 30]);
      clock.clearInterval(id);
      clock.advance(100);
      expect(ticks).to.have.length(4);
      expect(() => clock.advance(-1)).to.throw(RangeError);
    });
  });
});
