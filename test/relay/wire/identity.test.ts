/**
 * C.2's "no zero fields" for a producer's CKF format, with upstream's one
 * exemption: the seed. A filter seeded with 0 is a valid filter, and a
 * relay publishing one must be followed, not refused as malformed.
 */
import { expect } from "chai";
import { producerFromWire, producerToWire } from "../../../src/relay/wire/index.js";
import { isRelayError } from "../../../src/relay/wire/index.js";
import { producer } from "../consumer/mirror-helpers.js";

describe("relay wire: producer identity validation", () => {
  it("accepts CKF seed 0 (upstream exempts the seed from 'no zero fields')", () => {
    const wire = producerToWire(producer({ seed: 0n }));
    expect(wire.ckfFormat?.seed).to.equal(0n);
    expect(producerFromWire(wire).format.seed).to.equal(0n);
  });

  const zeroed: [string, (w: ReturnType<typeof producerToWire>) => void][] = [
    ["format_version", (w) => (w.ckfFormat!.formatVersion = 0)],
    ["bucket_count", (w) => (w.ckfFormat!.bucketCount = 0n)],
    ["fingerprint_bits", (w) => (w.ckfFormat!.fingerprintBits = 0)],
    ["slots_per_bucket", (w) => (w.ckfFormat!.slotsPerBucket = 0)],
  ];
  for (const [field, zero] of zeroed) {
    it(`refuses ${field} 0 as malformed (INVALID_REQUEST)`, () => {
      const wire = producerToWire(producer());
      zero(wire);
      let caught: unknown;
      try {
        producerFromWire(wire);
      } catch (err) {
        caught = err;
      }
      expect(isRelayError(caught), String(caught)).to.equal(true);
      expect((caught as { reason?: string }).reason).to.equal("INVALID_REQUEST");
    });
  }
});
