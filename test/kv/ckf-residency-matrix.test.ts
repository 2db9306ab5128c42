/**
 * B.4 step 1, the residency gate, over the whole matrix of storage tier ×
 * residency domain × event kind, against the reference's
 * `RouterEvent::targets_primary` (dynamo kv-router protocols.rs):
 *
 * - Cleared resolves to a reset scope, not a tier: it applies whatever its
 *   tier, and is ignored only when scoped to the cache-owner domain.
 * - Stored / Removed in the cache-owner domain on the device tier are
 *   UnsupportedResidencyDomain; on another tier they are ignored. In the
 *   primary (worker) domain they apply on the device tier only.
 * - An unknown domain string is UnsupportedResidencyDomain for every kind. An
 *   unknown tier string (which the reference cannot even decode) is refused
 *   the same way here.
 */
import { expect } from "chai";
import { CkfError, DcCkfState, residencyGate, type RouterEvent } from "../../src/kv/ckf/index.js";
import { clearedEvent, external, removedEvent, sameWords, storedChain, storedEvent } from "./ckf-helpers.js";

type Verdict = "applied" | "ignored" | "UnsupportedResidencyDomain";
type Kind = "stored" | "removed" | "cleared";

const TIERS = [undefined, "device", "host_pinned", "disk", "external", "tape"] as const;
const DOMAINS = [undefined, "primary", "cache_owner", "mystery"] as const;
const KINDS: readonly Kind[] = ["stored", "removed", "cleared"];

/** The reference's verdict, written out case by case rather than computed like the gate. */
function expected(tier: (typeof TIERS)[number], domain: (typeof DOMAINS)[number], kind: Kind): Verdict {
  if (domain === "mystery" || tier === "tape") return "UnsupportedResidencyDomain";
  const device = tier === undefined || tier === "device";
  if (kind === "cleared") return domain === "cache_owner" ? "ignored" : "applied";
  if (domain === "cache_owner") return device ? "UnsupportedResidencyDomain" : "ignored";
  return device ? "applied" : "ignored";
}

const W = 7n;

describe("DcCkfState residency gate: tier × domain × kind (reference targets_primary)", () => {
  it("has the reference's verdict for a representative row of each kind", () => {
    // Spelled out, so the table below is not only checked against itself.
    expect(expected("host_pinned", undefined, "cleared")).to.equal("applied");
    expect(expected("disk", "primary", "cleared")).to.equal("applied");
    expect(expected("device", "cache_owner", "cleared")).to.equal("ignored");
    expect(expected("host_pinned", "cache_owner", "cleared")).to.equal("ignored");
    expect(expected(undefined, "cache_owner", "stored")).to.equal("UnsupportedResidencyDomain");
    expect(expected("device", "cache_owner", "removed")).to.equal("UnsupportedResidencyDomain");
    expect(expected("host_pinned", "cache_owner", "stored")).to.equal("ignored");
    expect(expected("host_pinned", undefined, "removed")).to.equal("ignored");
    expect(expected(undefined, undefined, "stored")).to.equal("applied");
    expect(expected("external", "mystery", "cleared")).to.equal("UnsupportedResidencyDomain");
  });

  for (const tier of TIERS) {
    for (const domain of DOMAINS) {
      for (const kind of KINDS) {
        const verdict = expected(tier, domain, kind);
        it(`${kind}, tier ${tier ?? "(absent)"}, domain ${domain ?? "(absent)"}: ${verdict}`, () => {
          const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 1000 });
          // The worker's device-tier blocks, applied first.
          const existing = storedChain(W, 0, [1n, 2n]);
          expect(state.applyEvent(existing.event).firstError).to.equal(undefined);
          const before = state.words().slice();
          const statsBefore = state.stats();

          let base: RouterEvent;
          if (kind === "stored") base = storedEvent(W, 0, [{ blockHash: 900n, tokensHash: 77n }]);
          else if (kind === "removed") base = removedEvent(W, 0, [external(existing.canonicals[1]!, W, 0)]);
          else base = clearedEvent(W, 0);
          const event = {
            ...base,
            ...(tier === undefined ? {} : { storageTier: tier }),
            ...(domain === undefined ? {} : { residencyDomain: domain }),
          } as RouterEvent;

          const gate = residencyGate(event);
          const outcome = state.applyEvent(event);
          if (verdict === "UnsupportedResidencyDomain") {
            expect(gate).to.be.instanceOf(CkfError).with.property("code", verdict);
            expect(outcome.firstError).to.be.instanceOf(CkfError).with.property("code", verdict);
            expect(outcome.publication).to.equal(undefined);
          } else {
            expect(gate).to.equal(verdict === "applied");
            expect(outcome.firstError).to.equal(undefined);
          }

          if (verdict !== "applied") {
            // Ignored or rejected: nothing changes, not even the pending count.
            expect(sameWords(before, state.words())).to.equal(true);
            expect(state.stats()).to.deep.equal(statsBefore);
            expect(state.contains(existing.canonicals[0]!)).to.equal(true);
            expect(state.contains(existing.canonicals[1]!)).to.equal(true);
            return;
          }
          expect(state.stats().pendingEvents).to.equal(statsBefore.pendingEvents + 1);
          if (kind === "stored") {
            expect(state.contains(77n)).to.equal(true);
            expect(state.ownership(77n)).to.deep.equal({ owners: 1, resident: true });
          } else if (kind === "removed") {
            expect(state.contains(existing.canonicals[0]!)).to.equal(true);
            expect(state.contains(existing.canonicals[1]!)).to.equal(false);
          } else {
            expect(state.contains(existing.canonicals[0]!)).to.equal(false);
            expect(state.contains(existing.canonicals[1]!)).to.equal(false);
            expect(state.stats()).to.include({ members: 0, uniqueBlocks: 0, occupiedSlots: 0 });
          }
        });
      }
    }
  }

  it("a worker reset tagged host_pinned drops its device-tier fingerprints, and publishes the change", () => {
    const state = new DcCkfState({ expectedBlocksPerDc: 64, publishEveryNEvents: 1 });
    const worker = storedChain(W, 0, [11n, 12n, 13n]);
    const other = storedChain(W + 1n, 0, [11n]);
    state.applyEvent(worker.event);
    state.applyEvent(other.event);
    const outcome = state.applyEvent({ ...clearedEvent(W, 0), storageTier: "host_pinned" });
    expect(outcome.firstError).to.equal(undefined);
    expect(outcome.publication?.images.length ?? 0).to.be.greaterThan(0);
    // The shared root stays (the other worker still owns it); the rest goes.
    expect(state.ownership(worker.canonicals[0]!)).to.deep.equal({ owners: 1, resident: true });
    expect(state.contains(worker.canonicals[1]!)).to.equal(false);
    expect(state.contains(worker.canonicals[2]!)).to.equal(false);
    expect(state.canonicalOf(W, 0, external(worker.canonicals[0]!, W, 0))).to.equal(undefined);
  });
});
