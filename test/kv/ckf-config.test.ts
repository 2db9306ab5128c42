import { expect } from "chai";
import {
  bucketCount,
  CkfError,
  ckfConfig,
  DEFAULT_CKF_CONFIG,
  formatIdentity,
  MAX_RELAY_BUCKET_COUNT,
  type CkfErrorCode,
} from "../../src/kv/ckf/index.js";

function codeOf(f: () => unknown): CkfErrorCode {
  try {
    f();
  } catch (error) {
    expect(error).to.be.instanceOf(CkfError);
    return (error as CkfError).code;
  }
  expect.fail("expected a CkfError");
}

describe("CKF config", () => {
  describe("bucketCount", () => {
    // B.1's table.
    for (const [n, buckets] of [
      [1, 2],
      [32, 16],
      [64, 32],
      [256, 128],
      [4096, 2048],
      [1_048_576, 524_288],
      [2_097_152, 1_048_576],
    ] as const) {
      it(`gives ${buckets} buckets for ${n} expected blocks`, () => {
        expect(bucketCount(n)).to.equal(buckets);
        expect(bucketCount(BigInt(n))).to.equal(buckets);
      });
    }

    it("is ceil(5n/16) rounded up to a power of two, never below 2", () => {
      for (let n = 1; n <= 5000; n++) {
        const target = Math.max(2, Math.ceil((5 * n) / 16));
        const expected = 2 ** Math.ceil(Math.log2(target));
        expect(bucketCount(n), `n=${n}`).to.equal(expected);
      }
    });

    it("rejects 0 as ExpectedCapacityZero and non-integers as InvalidExpectedCapacity", () => {
      expect(codeOf(() => bucketCount(0))).to.equal("ExpectedCapacityZero");
      expect(codeOf(() => bucketCount(0n))).to.equal("ExpectedCapacityZero");
      expect(codeOf(() => bucketCount(-1))).to.equal("InvalidExpectedCapacity");
      expect(codeOf(() => bucketCount(1.5))).to.equal("InvalidExpectedCapacity");
      expect(codeOf(() => bucketCount(1n << 64n))).to.equal("InvalidExpectedCapacity");
    });

    it("reports CapacityOverflow when the u64 arithmetic overflows", () => {
      // 5n + 15 overflows u64 (once it fits, (5n + 15) / 16 < 2^60, so the power of two cannot).
      const largest = ((1n << 64n) - 16n) / 5n;
      expect(bucketCount(largest)).to.equal(2 ** 60);
      expect(codeOf(() => bucketCount(largest + 1n))).to.equal("CapacityOverflow");
      expect(codeOf(() => bucketCount((1n << 64n) - 1n))).to.equal("CapacityOverflow");
      expect(codeOf(() => bucketCount(2 ** 63))).to.equal("CapacityOverflow");
    });
  });

  describe("ckfConfig", () => {
    it("fills the reference defaults", () => {
      const config = ckfConfig();
      expect(config).to.deep.equal(DEFAULT_CKF_CONFIG);
      expect(config.seed).to.equal(0x5dee_ce66_d1b5_4a33n);
      expect(config.maxKicks).to.equal(500);
      expect(config.search.verificationWindow).to.equal(2);
      expect(config.publishEveryNEvents).to.equal(1);
      expect(config.expectedBlocksPerDc).to.equal(1);
    });

    const cases: [string, Parameters<typeof ckfConfig>[0], CkfErrorCode][] = [
      ["expectedBlocksPerDc 0", { expectedBlocksPerDc: 0 }, "ExpectedCapacityZero"],
      ["expectedBlocksPerDc -3", { expectedBlocksPerDc: -3 }, "InvalidExpectedCapacity"],
      ["maxKicks 0", { maxKicks: 0 }, "InvalidMaxKicks"],
      ["maxKicks 4097", { maxKicks: 4097 }, "InvalidMaxKicks"],
      ["maxKicks 1.5", { maxKicks: 1.5 }, "InvalidMaxKicks"],
      ["verificationWindow 0", { search: { verificationWindow: 0 } }, "InvalidVerificationWindow"],
      ["verificationWindow 9", { search: { verificationWindow: 9 } }, "InvalidVerificationWindow"],
      ["publishEveryNEvents 0", { publishEveryNEvents: 0 }, "InvalidPublishEveryNEvents"],
      ["publishEveryNEvents 0.5", { publishEveryNEvents: 0.5 }, "InvalidPublishEveryNEvents"],
      ["seed -1", { seed: -1n }, "InvalidSeed"],
      ["seed 2^64", { seed: 1n << 64n }, "InvalidSeed"],
      ["2^26 expected blocks (2^25 buckets)", { expectedBlocksPerDc: 2 ** 26 }, "BucketCountTooLarge"],
      ["2^63 expected blocks", { expectedBlocksPerDc: 2 ** 63 }, "CapacityOverflow"],
    ];
    for (const [what, init, code] of cases) {
      it(`rejects ${what} with ${code}`, () => {
        expect(codeOf(() => ckfConfig(init))).to.equal(code);
      });
    }

    it("accepts the bounds: maxKicks 1 and 4096, window 1 and 8, the relay's largest filter", () => {
      expect(() => ckfConfig({ maxKicks: 1, search: { verificationWindow: 1 } })).not.to.throw();
      expect(() => ckfConfig({ maxKicks: 4096, search: { verificationWindow: 8 } })).not.to.throw();
      expect(bucketCount(ckfConfig({ expectedBlocksPerDc: 2 ** 25 }).expectedBlocksPerDc)).to.equal(MAX_RELAY_BUCKET_COUNT);
    });

    it("builds the format identity of version 1, 16-bit fingerprints, 4 slots", () => {
      expect(formatIdentity(0x5eedn, 1024)).to.deep.equal({
        formatVersion: 1,
        seed: 0x5eedn,
        bucketCount: 1024,
        fingerprintBits: 16,
        slotsPerBucket: 4,
      });
    });
  });
});
