import { expect } from "chai";
import { DcCkfState, targetsPrimary, type RouterEvent } from "../../src/kv/ckf/index.js";
import {
  MAX_ROUTER_EVENT_JSON_BYTES,
  RouterEventJsonError,
  routerEventFromJson,
  routerEventsFromJsonLines,
  type RouterEventJsonErrorCode,
} from "../../src/kv/ckf/index.js";

const BIG = 9143094415614847814n; // above 2^53: JSON.parse gives 9143094415614847000
const U64_MAX = 0xffff_ffff_ffff_ffffn;

const STORED = `{"worker_id":1,"event":{"event_id":1,"dp_rank":0,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":900000,"tokens_hash":9143094415614847814}]}}}}`;
const REMOVED = `{"worker_id":1,"event":{"event_id":2,"dp_rank":0,"data":{"removed":{"block_hashes":[900000]}}}}`;
const CLEARED = `{"worker_id":1,"event":{"event_id":3,"dp_rank":0,"data":"cleared"}}`;

/** A stored event with `blocks` spliced in as JSON text. */
const storedWith = (blocks: string, extra = "") =>
  `{"worker_id":1,"event":{"event_id":1,"data":{"stored":{${extra}"blocks":${blocks}}}}}`;

function expectFault(line: string, code: RouterEventJsonErrorCode, path: string): RouterEventJsonError {
  let caught: unknown;
  try {
    routerEventFromJson(line);
  } catch (e) {
    caught = e;
  }
  expect(caught, `expected ${code} at ${path}`).to.be.instanceOf(RouterEventJsonError);
  const err = caught as RouterEventJsonError;
  expect({ code: err.code, path: err.path }, err.message).to.deep.equal({ code, path });
  expect(err.line).to.equal(undefined);
  return err;
}

describe("router events from JSON", () => {
  describe("the reference's shapes", () => {
    it("reads a stored event, keeping the u64 tokens hash exact", () => {
      expect(BigInt((JSON.parse(STORED) as { event: { data: { stored: { blocks: { tokens_hash: number }[] } } } }).event.data.stored.blocks[0]!.tokens_hash)).to.not.equal(BIG);
      expect(routerEventFromJson(STORED)).to.deep.equal({
        workerId: 1n,
        dpRank: 0,
        eventId: 1n,
        data: { kind: "stored", blocks: [{ blockHash: 900000n, tokensHash: BIG }] },
      });
    });

    it("reads a removed event", () => {
      expect(routerEventFromJson(REMOVED)).to.deep.equal({
        workerId: 1n,
        dpRank: 0,
        eventId: 2n,
        data: { kind: "removed", blockHashes: [900000n] },
      });
    });

    it("reads a cleared event (and the map form {\"cleared\": null})", () => {
      const expected = { workerId: 1n, dpRank: 0, eventId: 3n, data: { kind: "cleared" } };
      expect(routerEventFromJson(CLEARED)).to.deep.equal(expected);
      expect(routerEventFromJson(CLEARED.replace(`"cleared"`, `{"cleared":null}`))).to.deep.equal(expected);
    });

    it("defaults dp_rank to 0, ignores unknown keys, and reads parent_hash and start_position", () => {
      const line = `{"worker_id":7,"session_id":"s","state_source":null,"event":{"event_id":9,"data":{"stored":{"parent_hash":5,"start_position":3,"blocks":[]}}}}`;
      expect(routerEventFromJson(line)).to.deep.equal({
        workerId: 7n,
        dpRank: 0,
        eventId: 9n,
        data: { kind: "stored", parentHash: 5n, startPosition: 3, blocks: [] },
      });
      // Option fields may also be absent.
      expect(routerEventFromJson(storedWith("[]")).data).to.deep.equal({ kind: "stored", blocks: [] });
    });

    it("maps mm_extra_info to a BlockExtraInfo with exact mm hashes", () => {
      const block = `{"block_hash":1,"tokens_hash":2,"mm_extra_info":{"mm_objects":[{"mm_hash":18446744073709551615,"offsets":[[0,4],[6,8]]}]}}`;
      const event = routerEventFromJson(storedWith(`[${block},{"block_hash":3,"tokens_hash":4,"mm_extra_info":null}]`));
      expect(event.data).to.deep.equal({
        kind: "stored",
        blocks: [
          { blockHash: 1n, tokensHash: 2n, mmExtraInfo: { mmObjects: [{ mmHash: U64_MAX, offsets: [[0, 4], [6, 8]] }] } },
          { blockHash: 3n, tokensHash: 4n },
        ],
      });
    });

    it("reads storage_tier and residency_domain, which the residency gate then judges", () => {
      const withTier = (fields: string) => CLEARED.replace(`{"worker_id":1,`, `{"worker_id":1,${fields}`);
      const host = routerEventFromJson(withTier(`"storage_tier":"host_pinned",`).replace(`"cleared"`, `{"removed":{"block_hashes":[]}}`));
      expect(host.storageTier).to.equal("host_pinned");
      expect(targetsPrimary(host)).to.equal(false);
      expect(routerEventFromJson(withTier(`"residency_domain":"worker",`)).residencyDomain).to.equal("primary");
      const owner = routerEventFromJson(withTier(`"residency_domain":"cache_owner",`));
      expect(owner.residencyDomain).to.equal("cache_owner");
      expect(targetsPrimary(owner)).to.equal(false);
      const unknown = routerEventFromJson(withTier(`"residency_domain":"elsewhere",`));
      expect(() => targetsPrimary(unknown)).to.throw().with.property("code", "UnsupportedResidencyDomain");
      expect(routerEventFromJson(STORED)).to.not.have.any.keys("storageTier", "residencyDomain");
    });
  });

  describe("u64 values above 2^53", () => {
    it("keeps them exact as JSON numbers and as decimal strings", () => {
      for (const form of [`9143094415614847814`, `"9143094415614847814"`]) {
        const event = routerEventFromJson(storedWith(`[{"block_hash":${form},"tokens_hash":${form}}]`, `"parent_hash":${form},`));
        expect(event.data).to.deep.equal({ kind: "stored", parentHash: BIG, blocks: [{ blockHash: BIG, tokensHash: BIG }] });
      }
      const ids = routerEventFromJson(`{"worker_id":"18446744073709551615","event":{"event_id":18446744073709551615,"data":{"removed":{"block_hashes":["9143094415614847814",9143094415614847814]}}}}`);
      expect(ids.workerId).to.equal(U64_MAX);
      expect(ids.eventId).to.equal(U64_MAX);
      expect(ids.data).to.deep.equal({ kind: "removed", blockHashes: [BIG, BIG] });
    });
  });

  describe("errors name a stable code and the JSON path", () => {
    it("rejects text that is not JSON", () => {
      expectFault(`{"worker_id":1,`, "NOT_JSON", "$");
      expectFault(``, "NOT_JSON", "$");
      expectFault(`${STORED} x`, "NOT_JSON", "$");
    });

    it("rejects a document or an event that is not an object", () => {
      expectFault(`[1]`, "TYPE", "$");
      expectFault(`"cleared"`, "TYPE", "$");
      expectFault(`{"worker_id":1,"event":[]}`, "TYPE", "$.event");
      expectFault(storedWith(`[1]`), "TYPE", "$.event.data.stored.blocks[0]");
      expectFault(storedWith(`{}`), "TYPE", "$.event.data.stored.blocks");
    });

    it("rejects missing fields", () => {
      expectFault(`{"event":{"event_id":1,"data":"cleared"}}`, "MISSING", "$.worker_id");
      expectFault(`{"worker_id":1}`, "MISSING", "$.event");
      expectFault(`{"worker_id":1,"event":{"data":"cleared"}}`, "MISSING", "$.event.event_id");
      expectFault(`{"worker_id":1,"event":{"event_id":1}}`, "MISSING", "$.event.data");
      expectFault(storedWith(`[]`).replace(`"blocks":[]`, `"parent_hash":1`), "MISSING", "$.event.data.stored.blocks");
      expectFault(storedWith(`[{"block_hash":1,"tokens_hash":2},{"block_hash":1,"tokens_hash":2},{"block_hash":3}]`), "MISSING", "$.event.data.stored.blocks[2].tokens_hash");
      expectFault(REMOVED.replace(`"block_hashes":[900000]`, ``), "MISSING", "$.event.data.removed.block_hashes");
    });

    it("rejects negative, fractional and too-big integers", () => {
      expectFault(storedWith(`[{"block_hash":1,"tokens_hash":-1}]`), "RANGE", "$.event.data.stored.blocks[0].tokens_hash");
      expectFault(storedWith(`[{"block_hash":1.5,"tokens_hash":1}]`), "RANGE", "$.event.data.stored.blocks[0].block_hash");
      expectFault(storedWith(`[{"block_hash":1,"tokens_hash":18446744073709551616}]`), "RANGE", "$.event.data.stored.blocks[0].tokens_hash");
      expectFault(storedWith(`[{"block_hash":1,"tokens_hash":"18446744073709551616"}]`), "RANGE", "$.event.data.stored.blocks[0].tokens_hash");
      expectFault(`{"worker_id":1,"event":{"event_id":1,"dp_rank":4294967296,"data":"cleared"}}`, "RANGE", "$.event.dp_rank");
      expectFault(storedWith(`[]`, `"start_position":-2,`), "RANGE", "$.event.data.stored.start_position");
      expectFault(REMOVED.replace(`[900000]`, `[1,2,1e400]`), "RANGE", "$.event.data.removed.block_hashes[2]");
    });

    it("rejects hashes of the wrong type or string form", () => {
      expectFault(storedWith(`[{"block_hash":true,"tokens_hash":1}]`), "TYPE", "$.event.data.stored.blocks[0].block_hash");
      expectFault(`{"worker_id":1,"event":{"event_id":1,"dp_rank":"0","data":"cleared"}}`, "TYPE", "$.event.dp_rank");
      for (const bad of [`"-1"`, `"0x10"`, `"01"`, `" 1"`, `""`, `"1.0"`]) {
        expectFault(REMOVED.replace(`[900000]`, `[${bad}]`), "FORMAT", "$.event.data.removed.block_hashes[0]");
      }
    });

    it("rejects an unknown data kind, tier or domain", () => {
      expectFault(CLEARED.replace(`"cleared"`, `"evicted"`), "UNKNOWN_VARIANT", "$.event.data");
      expectFault(CLEARED.replace(`"cleared"`, `{"evicted":{}}`), "UNKNOWN_VARIANT", "$.event.data.evicted");
      expectFault(CLEARED.replace(`"cleared"`, `{"stored":{"blocks":[]},"removed":{"block_hashes":[]}}`), "TYPE", "$.event.data");
      expectFault(CLEARED.replace(`"cleared"`, `"stored"`), "TYPE", "$.event.data");
      expectFault(CLEARED.replace(`{"worker_id":1,`, `{"worker_id":1,"storage_tier":"tape",`), "UNKNOWN_VARIANT", "$.storage_tier");
      expectFault(CLEARED.replace(`{"worker_id":1,`, `{"worker_id":1,"residency_domain":null,`), "TYPE", "$.residency_domain");
      expectFault(CLEARED.replace(`{"worker_id":1,`, `{"worker_id":1,"residency_domain":"primary",`), "UNKNOWN_VARIANT", "$.residency_domain");
    });

    it("rejects malformed mm_extra_info at its path", () => {
      const bad = (info: string) => storedWith(`[{"block_hash":1,"tokens_hash":2,"mm_extra_info":${info}}]`);
      expectFault(bad(`{}`), "MISSING", "$.event.data.stored.blocks[0].mm_extra_info.mm_objects");
      expectFault(bad(`{"mm_objects":[{"mm_hash":1,"offsets":[[0]]}]}`), "TYPE", "$.event.data.stored.blocks[0].mm_extra_info.mm_objects[0].offsets[0]");
      expectFault(bad(`{"mm_objects":[{"mm_hash":1,"offsets":[[0,-1]]}]}`), "RANGE", "$.event.data.stored.blocks[0].mm_extra_info.mm_objects[0].offsets[0][1]");
    });

    it("rejects duplicate keys", () => {
      expectFault(`{"worker_id":1,"worker_id":2,"event":{"event_id":1,"data":"cleared"}}`, "DUPLICATE_KEY", "$.worker_id");
    });

    it("rejects a line over the size limit before parsing it", () => {
      // Not JSON at all, so only the size check can name it.
      const huge = "x".repeat(MAX_ROUTER_EVENT_JSON_BYTES + 1);
      expectFault(huge, "TOO_LARGE", "$");
      // UTF-8 bytes count, not UTF-16 units: 1 + 2 * 2 bytes over a 4-byte limit.
      expect(() => routerEventFromJson(`"éé"`, { maxBytes: 4 })).to.throw(RouterEventJsonError).with.property("code", "TOO_LARGE");
      expect(() => routerEventFromJson(CLEARED, { maxBytes: CLEARED.length })).to.not.throw();
    });
  });

  describe("JSON lines", () => {
    it("yields events with their line numbers, skipping blank lines", () => {
      const text = `${STORED}\r\n\n${REMOVED}\n   \n${CLEARED}\n`;
      const got = [...routerEventsFromJsonLines(text)].map(({ line, event }) => [line, event.data.kind]);
      expect(got).to.deep.equal([
        [1, "stored"],
        [3, "removed"],
        [5, "cleared"],
      ]);
      expect([...routerEventsFromJsonLines("")]).to.deep.equal([]);
    });

    it("throws the bad line's error with its line number", () => {
      const text = [STORED, REMOVED, storedWith(`[{"block_hash":1,"tokens_hash":-5}]`), CLEARED].join("\n");
      const seen: number[] = [];
      let caught: unknown;
      try {
        for (const { line } of routerEventsFromJsonLines(text)) seen.push(line);
      } catch (e) {
        caught = e;
      }
      expect(seen).to.deep.equal([1, 2]);
      expect(caught).to.be.instanceOf(RouterEventJsonError);
      const err = caught as RouterEventJsonError;
      expect(err).to.include({ code: "RANGE", path: "$.event.data.stored.blocks[0].tokens_hash", line: 3 });
      expect(err.message).to.match(/^line 3: \$\.event\.data\.stored\.blocks\[0\]\.tokens_hash: /);
    });
  });

  describe("into a DcCkfState", () => {
    it("applies a stored run, its child and their removal without error", () => {
      const state = new DcCkfState({ expectedBlocksPerDc: 64 });
      const child = `{"worker_id":1,"event":{"event_id":2,"dp_rank":0,"data":{"stored":{"parent_hash":"900000","blocks":[{"block_hash":900001,"tokens_hash":"18446744073709551557"}]}}}}`;
      const removeBoth = `{"worker_id":1,"event":{"event_id":3,"dp_rank":0,"data":{"removed":{"block_hashes":[900001,900000]}}}}`;
      const events: RouterEvent[] = [...routerEventsFromJsonLines([STORED, child].join("\n"))].map((e) => e.event);
      for (const event of events) {
        expect(targetsPrimary(event)).to.equal(true);
        expect(state.applyEvent(event).firstError).to.equal(undefined);
      }
      // A run from the start of a sequence: its root's canonical hash is its tokens hash.
      expect(state.canonicalOf(1n, 0, 900000n)).to.equal(BIG);
      expect(state.contains(BIG)).to.equal(true);
      const childCanonical = state.canonicalOf(1n, 0, 900001n)!;
      expect(state.contains(childCanonical)).to.equal(true);
      expect(state.stats()).to.include({ members: 1, uniqueBlocks: 2 });

      expect(state.applyEvent(routerEventFromJson(removeBoth)).firstError).to.equal(undefined);
      expect(state.contains(BIG)).to.equal(false);
      expect(state.contains(childCanonical)).to.equal(false);
      expect(state.stats()).to.include({ members: 0, uniqueBlocks: 0 });
      expect(state.applyEvent(routerEventFromJson(CLEARED)).firstError).to.equal(undefined);
    });
  });
});
