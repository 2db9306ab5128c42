/**
 * Per-caller quotas without a server: the token bucket math (refill, burst,
 * a request larger than the bucket, retry-after rounding) on an injected
 * clock, the memory store's bound, the refusal's shape and status, and
 * which caller pays for what.
 */
import { Code } from "@connectrpc/connect";
import { expect } from "chai";
import * as pb from "../../gen/mmgate/images/v1/images_pb.js";
import { imagesConfigSchema, quotaStoreOf } from "../../src/images/config.js";
import { ImageError, breakerVerdictOf } from "../../src/images/core/errors.js";
import { fromRpcError } from "../../src/images/openai-api/errors.js";
import { toConnectError } from "../../src/images/proto-convert.js";
import {
  charge,
  imagesRate,
  requestsRate,
  retryAfterSeconds,
  take,
  tokensAt,
  type BucketLevel,
  type BucketRate,
  type QuotaCost,
  type QuotaLimit,
  type QuotaRates,
} from "../../src/images/quota/bucket.js";
import { decodeQuotaState, encodeQuotaState, quotaKey } from "../../src/images/quota/nats.js";
import { ANONYMOUS_CALLER, ImageQuotas } from "../../src/images/quota/quotas.js";
import { MemoryQuotaStore } from "../../src/images/quota/store.js";
import type { Caller, CallerLabel } from "../../src/server/index.js";
import { FakeClock } from "../support/index.js";
import { rejection } from "./helpers.js";

const ONE: QuotaCost = { requests: 1, images: 1 };
const label: CallerLabel = (name) => name ?? "anonymous";

function caller(name: string, limits?: Caller["limits"]): Caller {
  return { name, scopes: new Set(["images"]), via: "key", ...(limits ? { limits } : {}) };
}

describe("images: quota token buckets", () => {
  describe("rates", () => {
    const cases: [string, BucketRate, BucketRate][] = [
      ["2 requests a second: a burst of 2, a token every 500 ms", requestsRate(2), { capacity: 2, perMs: 0.002 }],
      ["half a request a second: a burst of 1 (never less)", requestsRate(0.5), { capacity: 1, perMs: 0.0005 }],
      ["120 images a minute: a minute's worth", imagesRate(120), { capacity: 120, perMs: 0.002 }],
    ];
    for (const [name, got, want] of cases) it(name, () => expect(got).to.deep.equal(want));
  });

  describe("take, at given times", () => {
    interface Case {
      readonly name: string;
      readonly rate: BucketRate;
      /** Costs taken at these times (ms), in order. */
      readonly takes: readonly (readonly [at: number, cost: number])[];
      /** What each take gives: the tokens left, or the wait in ms, or "never". */
      readonly want: readonly (number | { wait: number } | "never")[];
    }
    const cases: Case[] = [
      {
        name: "a burst of one second's worth, then a wait for the next token",
        rate: requestsRate(2),
        takes: [[0, 1], [0, 1], [0, 1], [499, 1], [500, 1]],
        want: [1, 0, { wait: 500 }, { wait: 1 }, 0],
      },
      {
        name: "refills at the rate, never above the burst",
        rate: requestsRate(2),
        takes: [[0, 1], [0, 1], [10_000, 1], [10_000, 1], [10_000, 1]],
        want: [1, 0, 1, 0, { wait: 500 }],
      },
      {
        name: "images cost n; a request of n waits for n tokens",
        rate: imagesRate(6),
        takes: [[0, 4], [0, 3], [10_000, 3], [10_000, 2]],
        want: [2, { wait: 10_000 }, 0, { wait: 20_000 }],
      },
      {
        name: "a request larger than the whole bucket never fits",
        rate: imagesRate(5),
        takes: [[0, 6], [3_600_000, 6], [3_600_000, 5]],
        want: ["never", "never", 0],
      },
      {
        name: "a rate below one a second: one request, then a minute",
        rate: requestsRate(1 / 60),
        takes: [[0, 1], [0, 1], [59_999, 1], [60_000, 1]],
        want: [0, { wait: 60_000 }, { wait: 1 }, 0],
      },
      {
        name: "a level written later than now (a clock ahead) counts as written now",
        rate: requestsRate(1),
        takes: [[5_000, 1], [4_000, 1], [5_000, 1]],
        want: [0, { wait: 1000 }, { wait: 1000 }],
      },
    ];
    for (const c of cases) {
      it(c.name, () => {
        let level: BucketLevel | undefined;
        const got = c.takes.map(([at, cost]) => {
          const taken = take(level, c.rate, cost, at);
          if (!taken.ok) return taken.never ? "never" : { wait: taken.waitMs };
          level = taken.level;
          return taken.level.tokens;
        });
        expect(got.map((g) => (typeof g === "number" ? Math.round(g * 1e6) / 1e6 : g))).to.deep.equal(c.want);
      });
    }

    it("lowers a bucket at once when its limit drops", () => {
      expect(tokensAt({ tokens: 100, at: 0 }, requestsRate(3), 0)).to.equal(3);
      expect(tokensAt(undefined, imagesRate(7), 0)).to.equal(7);
    });
  });

  describe("charge: both buckets or neither", () => {
    const rates: QuotaRates = { requests: requestsRate(1), images: imagesRate(10) };
    const cases: [string, Parameters<typeof charge>[0], QuotaCost, { ok: true } | { limit: QuotaLimit; wait?: number }][] = [
      ["fresh buckets take a call", undefined, { requests: 1, images: 4 }, { ok: true }],
      ["no request left: requests refuses, images is not charged", { requests: { tokens: 0, at: 0 } }, { requests: 1, images: 4 }, { limit: "requests", wait: 1000 }],
      ["too few images: images refuses with its wait", { images: { tokens: 1, at: 0 } }, { requests: 1, images: 4 }, { limit: "images", wait: 18_000 }],
      ["both short: the longer wait names the limit", { requests: { tokens: 0, at: 0 }, images: { tokens: 3, at: 0 } }, { requests: 1, images: 4 }, { limit: "images", wait: 6000 }],
      ["n above the bucket: images, never, whatever else", { requests: { tokens: 0, at: 0 } }, { requests: 1, images: 11 }, { limit: "images" }],
    ];
    for (const [name, state, cost, want] of cases) {
      it(name, () => {
        const decision = charge(state, rates, cost, 0);
        if ("ok" in want) {
          expect(decision).to.deep.equal({ ok: true, state: { requests: { tokens: 0, at: 0 }, images: { tokens: 6, at: 0 } } });
          return;
        }
        expect(decision.ok).to.equal(false);
        if (decision.ok) return;
        expect(decision.limit).to.equal(want.limit);
        if (want.wait === undefined) expect(decision.never).to.equal(true);
        else expect(decision).to.deep.include({ never: false, waitMs: want.wait });
      });
    }

    it("keeps only the buckets a caller's limits have", () => {
      const decision = charge({ requests: { tokens: 0, at: 0 }, images: { tokens: 1, at: 0 } }, { images: imagesRate(10) }, ONE, 0);
      expect(decision).to.deep.equal({ ok: true, state: { images: { tokens: 0, at: 0 } } });
    });
  });

  describe("retry-after: whole seconds, rounded up, at least 1", () => {
    const cases: [number, number][] = [
      [1, 1],
      [500, 1],
      [1000, 1],
      [1001, 2],
      [12_000, 12],
      [59_999.99999999, 60],
      [60_000, 60],
    ];
    for (const [ms, seconds] of cases) {
      it(`${ms} ms → ${seconds} s, in the header too`, () => {
        expect(retryAfterSeconds(ms)).to.equal(seconds);
        const error = new ImageError("quota_exceeded", "over", { retryable: true, details: { retry_after_ms: Math.ceil(ms) } });
        expect(toConnectError(error).metadata.get("retry-after")).to.equal(String(seconds));
      });
    }
  });
});

describe("images: the memory quota store", () => {
  it("charges per caller, on its clock", async () => {
    const clock = new FakeClock(1_000_000);
    const store = new MemoryQuotaStore(10, clock.now);
    const rates = { requests: requestsRate(2) };
    const results = [];
    for (let i = 0; i < 3; i += 1) results.push((await store.charge("a", rates, ONE)).ok);
    expect(results).to.deep.equal([true, true, false]);
    expect((await store.charge("b", rates, ONE)).ok).to.equal(true);
    clock.advance(500);
    expect((await store.charge("a", rates, ONE)).ok).to.equal(true);
  });

  it("keeps at most maxCallers: refilled buckets go first, then the least recently charged", async () => {
    const clock = new FakeClock();
    const store = new MemoryQuotaStore(2, clock.now);
    const slow = { requests: requestsRate(1 / 60) };
    const fast = { requests: requestsRate(10) };
    await store.charge("slow", slow, ONE);
    await store.charge("fast", fast, ONE);
    clock.advance(1000);
    // fast has refilled, slow has not: fast goes.
    await store.charge("third", fast, ONE);
    expect(store.size).to.equal(2);
    expect((await store.charge("slow", slow, ONE)).ok, "slow still remembered").to.equal(false);
    // Nobody has refilled: the least recently charged (slow) goes, and starts full again.
    await store.charge("fourth", slow, ONE);
    expect(store.size).to.equal(2);
    expect((await store.charge("slow", slow, ONE)).ok).to.equal(true);
  });
});

describe("images: quota refusals", () => {
  const clock = new FakeClock(5_000_000);
  const refused: [string, QuotaLimit][] = [];
  const quotas = new ImageQuotas({
    store: new MemoryQuotaStore(100, clock.now),
    anonymous: { requestsPerSecond: 1 },
    onRefused: (who, limit) => refused.push([who, limit]),
  });

  it("refuses a request over requestsPerSecond with quota_exceeded, retryable, RESOURCE_EXHAUSTED and retry-after", async () => {
    const c = caller("ci", { requestsPerSecond: 2 });
    await quotas.charge(c, label, 1);
    await quotas.charge(c, label, 1);
    const error = await rejection(quotas.charge(c, label, 1));
    expect(error).to.deep.include({ code: "quota_exceeded", retryable: true, message: "caller ci is over the quota of 2 requests per second; retry in 1 s" });
    expect(error.details).to.deep.equal({ limit: "requests", caller: "ci", quota: 2, retry_after_ms: 500 });
    const status = toConnectError(error);
    expect(status.code).to.equal(Code.ResourceExhausted);
    expect(status.metadata.get("retry-after")).to.equal("1");
    // Not the provider's fault: no breaker counts it.
    expect(breakerVerdictOf(error)).to.equal("neutral");
    expect(refused).to.deep.include(["ci", "requests"]);
  });

  it("charges n images, and refuses a request larger than the bucket for good", async () => {
    const c = caller("batch", { imagesPerMinute: 5 });
    await quotas.charge(c, label, 3);
    const later = await rejection(quotas.charge(c, label, 3));
    expect(later.message).to.equal("caller batch is over the quota of 5 images per minute (this request asks for 3); retry in 12 s");
    expect(later.details).to.deep.include({ limit: "images", requested: 3, retry_after_ms: 12_000 });
    const never = await rejection(quotas.charge(c, label, 6));
    expect(never).to.deep.include({
      code: "quota_exceeded",
      retryable: false,
      message: "this request asks for 6 images, more than caller batch's quota of 5 images per minute allows at once; ask for at most 5",
    });
    expect(never.details).to.deep.equal({ limit: "images", caller: "batch", quota: 5, requested: 6 });
    await quotas.charge(c, label, 2);
  });

  it("lets callers without limits through, and holds anonymous calls to images.quotas.anonymous", async () => {
    for (let i = 0; i < 50; i += 1) await quotas.charge(caller("free"), label, 16);
    await quotas.charge(undefined, label, 1);
    const error = await rejection(quotas.charge(undefined, label, 1));
    expect(error.message).to.equal("anonymous callers are over the quota of 1 requests per second; retry in 1 s");
    expect(error.details["caller"]).to.equal(ANONYMOUS_CALLER);
    expect(refused.at(-1)).to.deep.equal(["anonymous", "requests"]);
  });

  it("is an OpenAI 429 rate_limit_exceeded with Retry-After on the OpenAI-shaped routes", async () => {
    const c = caller("web", { requestsPerSecond: 1 });
    await quotas.charge(c, label, 1);
    const mapped = fromRpcError(toConnectError(await rejection(quotas.charge(c, label, 1))), { authorizationSent: true });
    expect([mapped.status, mapped.type, mapped.code, mapped.headers]).to.deep.equal([429, "rate_limit_error", "rate_limit_exceeded", { "retry-after": "1" }]);
  });

  it("has its own stable code on the wire", () => {
    expect(pb.ErrorCode.QUOTA_EXCEEDED).to.equal(18);
  });
});

describe("images: quota configuration and the shared store's values", () => {
  it("follows the idempotency store with store: auto", () => {
    const of = (images: Record<string, unknown>) => quotaStoreOf(imagesConfigSchema.parse(images));
    expect(of({})).to.equal("memory");
    expect(of({ idempotency: { store: "nats" } })).to.equal("nats");
    expect(of({ idempotency: { store: "nats", enabled: false } })).to.equal("memory");
    expect(of({ idempotency: { store: "nats" }, quotas: { store: "memory" } })).to.equal("memory");
    expect(of({ quotas: { store: "nats" } })).to.equal("nats");
    expect(imagesConfigSchema.parse({}).quotas).to.deep.equal({ anonymous: {}, store: "auto", maxCallers: 10_000, nats: { bucket: "mmgate_quotas" } });
    expect(imagesConfigSchema.safeParse({ quotas: { anonymous: { imagesPerMinute: 0 } } }).success).to.equal(false);
  });

  it("stores a caller's buckets under a valid key, and reads back what it wrote (anything else as full buckets)", () => {
    expect(quotaKey("ci.runner.")).to.equal("q.ci=runner=");
    expect(quotaKey("anonymous")).to.equal("q.anonymous");
    const state = { requests: { tokens: 0.5, at: 1_700_000_000_000 }, images: { tokens: 3, at: 1_700_000_000_001 } };
    expect(decodeQuotaState(encodeQuotaState(state))).to.deep.equal(state);
    expect(decodeQuotaState(new TextEncoder().encode("not json"))).to.deep.equal({});
    expect(decodeQuotaState(new TextEncoder().encode('{"r":[1],"i":["x",2]}'))).to.deep.equal({});
  });
});
