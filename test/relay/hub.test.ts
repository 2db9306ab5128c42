import { expect } from "chai";
import { getEventListeners } from "node:events";
import { laneLease } from "../../src/kv/index.js";
import {
  DEFAULT_HUB_LIMITS,
  FRAME_ENVELOPE_HEADROOM_BYTES,
  HubError,
  hubLimits,
  MAX_DELTA_IMAGES,
  MAX_FRAME_BYTES,
  PublicationHub,
  publicationFrame,
  type HubErrorCode,
  type HubLimits,
  type HubSubscriber,
  type PublicationFrame,
} from "../../src/relay/index.js";
import { FakeClock } from "../support/clock.js";
import { BUCKETS, delta, frameOf, ID, identity, prng, snapshot } from "./hub-helpers.js";

/** Small limits, so that lag and recovery come after a handful of frames. */
const LIMITS: Partial<HubLimits> = {
  maxSubscribers: 8,
  maxDeltaImages: 4,
  maxFrameBytes: 1_000,
  maxQueuedFrames: 8,
  maxQueuedBytes: 8_000,
  subscriberIdleMs: 5_000,
  idleSweepIntervalMs: 1_000,
};

function hubAt(sequence = 5n, clock = new FakeClock()): { hub: PublicationHub; clock: FakeClock } {
  const hub = new PublicationHub({ identity: ID, limits: LIMITS, clock });
  hub.publishSnapshot(snapshot(sequence));
  return { hub, clock };
}

/** Publishes base -> base+1 with a payload of `payloadBytes`. */
function publish(hub: PublicationHub, base: bigint, payloadBytes?: number) {
  const d = delta(base);
  return hub.publishDelta(d, frameOf(d, payloadBytes));
}

function codeOf(f: () => unknown): HubErrorCode {
  try {
    f();
  } catch (error) {
    expect(error).to.be.instanceOf(HubError);
    return (error as HubError).code;
  }
  return expect.fail("expected a HubError");
}

/** Lets every pending callback run (promise jobs, then one macrotask turn). */
function flush(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/** Reads what is queued now, without waiting for more. */
async function readQueued(subscriber: HubSubscriber): Promise<PublicationFrame[]> {
  const frames: PublicationFrame[] = [];
  while (subscriber.queuedFrames > 0) {
    const read = await subscriber.next();
    if (read.kind !== "frame") break;
    frames.push(read.frame);
  }
  return frames;
}

describe("relay hub: PublicationHub", () => {
  describe("limits", () => {
    it("defaults to the reference's values", () => {
      expect(DEFAULT_HUB_LIMITS).to.include({ maxSubscribers: 64, maxQueuedFrames: 16, maxQueuedBytes: 16_777_216, maxDeltaImages: 349_525, maxFrameBytes: 4_194_368 });
      expect(MAX_FRAME_BYTES).to.equal(4_194_368);
      expect(MAX_DELTA_IMAGES).to.equal(349_525);
      // publication_queue_bytes' floor: one largest frame plus headroom.
      expect(() => hubLimits({ maxQueuedBytes: 4_194_624 })).to.not.throw();
      expect(codeOf(() => hubLimits({ maxQueuedBytes: 4_194_623 }))).to.equal("InvalidConfig");
    });

    it("refuses limits out of range", () => {
      for (const bad of [
        { maxSubscribers: 0 },
        { maxDeltaImages: MAX_DELTA_IMAGES + 1 },
        { maxFrameBytes: MAX_FRAME_BYTES + 1 },
        { maxQueuedFrames: 0 },
        { maxQueuedFrames: 1.5 },
        { subscriberIdleMs: 0 },
        { idleSweepIntervalMs: 31_536_000_001 },
      ]) {
        expect(codeOf(() => hubLimits(bad)), JSON.stringify(bad)).to.equal("InvalidConfig");
      }
    });

    it("a subscriber's queue bounds stay within the hub's, and hold one largest frame", () => {
      const { hub } = hubAt();
      expect(codeOf(() => hub.subscribe({ maxQueuedFrames: 9 }))).to.equal("InvalidConfig");
      expect(codeOf(() => hub.subscribe({ maxQueuedBytes: 8_001 }))).to.equal("InvalidConfig");
      expect(codeOf(() => hub.subscribe({ maxQueuedBytes: 1_000 + FRAME_ENVELOPE_HEADROOM_BYTES - 1 }))).to.equal("InvalidConfig");
      const s = hub.subscribe({ maxQueuedFrames: 1, maxQueuedBytes: 1_256 });
      expect([s.maxQueuedFrames, s.maxQueuedBytes]).to.deep.equal([1, 1_256]);
      expect(publish(hub, 5n, 1_000)).to.include({ kind: "published", delivered: 1 });
      expect(hub.stats().subscribers).to.equal(1);
    });

    it("refuses a subscriber over maxSubscribers", () => {
      const { hub } = hubAt();
      for (let i = 0; i < 8; i++) hub.subscribe();
      expect(codeOf(() => hub.subscribe())).to.equal("SubscriberLimit");
    });
  });

  describe("snapshot and subscription", () => {
    it("is NotReady until a snapshot is installed; the snapshot must be the hub's generation and lease", () => {
      const hub = new PublicationHub({ identity: ID, limits: LIMITS, clock: new FakeClock() });
      expect(hub.state).to.equal("awaiting_snapshot");
      expect(codeOf(() => hub.subscribe())).to.equal("NotReady");
      expect(publish(hub, 5n)).to.deep.equal({ kind: "awaiting_snapshot" });
      expect(codeOf(() => hub.publishSnapshot(snapshot(5n, 0n, identity(1, 99n))))).to.equal("IdentityChanged");
      const otherLease = laneLease({ consumerInstance: 11n, physicalLane: 1, assignmentEpoch: 1n });
      expect(codeOf(() => hub.publishSnapshot(snapshot(5n, 0n, ID, otherLease)))).to.equal("LeaseChanged");
      expect(codeOf(() => hub.publishSnapshot({ ...snapshot(5n), buckets: new BigUint64Array(BUCKETS * 2) }))).to.equal("SnapshotBucketCount");
      expect(hub.state).to.equal("awaiting_snapshot");
      hub.publishSnapshot(snapshot(5n));
      expect(hub.state).to.equal("ready");
      expect(hub.stats().sequence).to.equal(5n);
    });

    it("copies a snapshot's words unless told to adopt them", () => {
      const copied = new PublicationHub({ identity: ID, limits: LIMITS, clock: new FakeClock() });
      const given = snapshot(5n, 7n);
      copied.publishSnapshot(given);
      const words = copied.subscribe().takeSnapshot().buckets;
      expect(words).to.not.equal(given.buckets);
      expect([...words]).to.deep.equal([...given.buckets]);
      const adopting = new PublicationHub({ identity: ID, limits: LIMITS, clock: new FakeClock() });
      const handed = snapshot(5n, 7n);
      adopting.publishSnapshot(handed, { adoptWords: true });
      expect(adopting.subscribe().takeSnapshot().buckets).to.equal(handed.buckets);
    });

    it("hands out the current snapshot once, then frames that continue from it", async () => {
      const { hub } = hubAt(5n);
      publish(hub, 5n);
      const s = hub.subscribe();
      publish(hub, 6n);
      publish(hub, 7n);
      const snap = s.takeSnapshot();
      expect(snap.sequence).to.equal(6n);
      expect(snap.buckets[5]).to.equal(6n); // the first delta's image
      expect(codeOf(() => s.takeSnapshot())).to.equal("SnapshotTaken");
      const frames = await readQueued(s);
      expect(frames.map((f) => [f.baseSequence, f.sequence])).to.deep.equal([
        [6n, 7n],
        [7n, 8n],
      ]);
    });

    it("copies the lane while a subscriber holds its snapshot, and writes in place once it is released", async () => {
      const { hub } = hubAt(5n);
      const s = hub.subscribe();
      const snap = s.takeSnapshot();
      const before = [...snap.buckets];
      publish(hub, 5n);
      publish(hub, 6n);
      expect([...snap.buckets]).to.deep.equal(before);
      expect(hub.stats()).to.include({ pinnedSnapshots: 1, laneCopies: 1 });
      await s.next(); // reading frames means bootstrap is over
      expect(hub.stats().pinnedSnapshots).to.equal(0);
      publish(hub, 7n);
      expect(hub.stats().laneCopies).to.equal(1);
      expect(codeOf(() => s.takeSnapshot())).to.equal("SnapshotTaken");
    });

    it("a replacement snapshot closes the subscribers of the old one as recovery", async () => {
      const { hub } = hubAt(5n);
      const s = hub.subscribe();
      hub.publishSnapshot(snapshot(9n));
      expect(await s.next()).to.deep.equal({ kind: "ended", reason: "recovery" });
      expect(hub.subscribe().takeSnapshot().sequence).to.equal(9n);
    });
  });

  describe("slow subscribers", () => {
    it("cuts a slow subscriber off as lagged while a fast one receives every frame in order", async () => {
      const { hub } = hubAt(5n);
      const fast = hub.subscribe();
      const slow = hub.subscribe({ maxQueuedFrames: 3 });
      fast.releaseSnapshot();
      slow.releaseSnapshot();
      const received: PublicationFrame[] = [];
      const results = [];
      for (let base = 5n; base < 25n; base++) {
        results.push(publish(hub, base));
        received.push(...(await readQueued(fast)));
      }
      expect(received.map((f) => f.sequence)).to.deep.equal(Array.from({ length: 20 }, (_, i) => BigInt(6 + i)));
      for (let i = 1; i < received.length; i++) expect(received[i]!.baseSequence).to.equal(received[i - 1]!.sequence);
      // The fourth frame did not fit the slow queue of three.
      expect(results[3]).to.deep.equal({ kind: "published", sequence: 9n, delivered: 1, lagged: 1 });
      expect(slow.endReason).to.equal("lagged");
      expect(slow.queuedFrames).to.equal(0); // freed at once, not left for the consumer
      expect(await slow.next()).to.deep.equal({ kind: "ended", reason: "lagged" });
      expect(await slow.next()).to.deep.equal({ kind: "ended", reason: "lagged" });
      const stats = hub.stats();
      expect(stats).to.include({ subscribers: 1, deltasPublished: 20 });
      expect(stats.ended.lagged).to.equal(1);
    });

    it("a frame that would pass the byte limit lags the subscriber; a largest admissible frame always fits an empty queue", () => {
      const { hub } = hubAt(5n);
      const s = hub.subscribe({ maxQueuedBytes: 3_000 });
      // 900 + 256 = 1,156 per frame: two fit in 3,000, the third does not.
      expect(publish(hub, 5n, 900)).to.include({ delivered: 1 });
      expect(publish(hub, 6n, 900)).to.include({ delivered: 1 });
      expect(s.queuedBytes).to.equal(2_312);
      expect(publish(hub, 7n, 900)).to.include({ delivered: 0, lagged: 1 });
      expect(s.endReason).to.equal("lagged");
      // A largest admissible frame always fits an empty queue of the smallest allowed size.
      const t = hub.subscribe({ maxQueuedBytes: 1_256 });
      expect(publish(hub, 8n, 1_000)).to.include({ delivered: 1, lagged: 0 });
      expect(t.queuedBytes).to.equal(1_256);
    });

    it("queued bytes never exceed any limit, whatever the subscribers do (checked after every publish)", async () => {
      const clock = new FakeClock();
      const { hub } = hubAt(0n, clock);
      const random = prng(0x5eed);
      const live = new Set<HubSubscriber>();
      const lastSeen = new Map<HubSubscriber, bigint>();
      let peakBytes = 0;
      for (let base = 0n; base < 600n; base++) {
        // Subscribers come and go, read at their own pace, or never.
        if (live.size < 8 && random() < 0.2) {
          const s = hub.subscribe({ maxQueuedFrames: 1 + Math.floor(random() * 8), maxQueuedBytes: 1_256 + Math.floor(random() * 6_744) });
          live.add(s);
          lastSeen.set(s, s.takeSnapshot().sequence);
        }
        const result = publish(hub, base, Math.floor(random() * 1_001));
        expect(result.kind).to.equal("published");
        const stats = hub.stats();
        let sum = 0;
        for (const s of live) {
          if (s.endReason !== undefined) {
            expect(s.queuedBytes).to.equal(0);
            live.delete(s);
            continue;
          }
          expect(s.queuedBytes).to.be.at.most(s.maxQueuedBytes);
          expect(s.queuedFrames).to.be.at.most(s.maxQueuedFrames);
          sum += s.queuedBytes;
        }
        expect(stats.queuedBytes).to.equal(sum);
        expect(stats.queuedBytes).to.be.at.most(LIMITS.maxSubscribers! * LIMITS.maxQueuedBytes!);
        expect(stats.subscribers).to.be.at.most(LIMITS.maxSubscribers!);
        // Subscribers still bootstrapping hold a lane each: bounded by the subscriber count.
        expect(stats.pinnedSnapshots).to.equal([...live].filter((s) => s.holdsSnapshot).length);
        expect(stats.pinnedSnapshots).to.be.at.most(stats.subscribers);
        peakBytes = Math.max(peakBytes, stats.queuedBytes);
        for (const s of live) {
          const r = random();
          if (r < 0.05) s.close();
          else if (r < 0.6) {
            for (const frame of await readQueued(s)) {
              // Every surviving subscriber sees an unbroken sequence.
              expect(frame.baseSequence).to.equal(lastSeen.get(s));
              lastSeen.set(s, frame.sequence);
            }
          }
        }
      }
      const stats = hub.stats();
      expect(stats.ended.lagged).to.be.greaterThan(0);
      expect(stats.ended.closed).to.be.greaterThan(0);
      expect(peakBytes).to.be.greaterThan(0);
      expect(stats.laneCopies).to.be.greaterThan(0);
    });
  });

  describe("retire", () => {
    it("closes every subscriber as retired, wakes a waiting read, and refuses everything after", async () => {
      const { hub, clock } = hubAt(5n);
      const waiting = hub.subscribe();
      const queued = hub.subscribe();
      const read = waiting.next();
      publish(hub, 5n);
      expect((await read).kind).to.equal("frame");
      const pending = waiting.next();
      publish(hub, 6n);
      publish(hub, 7n);
      hub.retire();
      expect((await pending).kind).to.equal("frame"); // handed over before retire
      expect(await waiting.next()).to.deep.equal({ kind: "ended", reason: "retired" });
      expect(await queued.next()).to.deep.equal({ kind: "ended", reason: "retired" });
      const stats = hub.stats();
      expect(stats).to.include({ state: "retired", subscribers: 0, queuedFrames: 0, queuedBytes: 0, pinnedSnapshots: 0 });
      expect(stats.ended.retired).to.equal(2);
      expect(codeOf(() => hub.subscribe())).to.equal("Retired");
      expect(codeOf(() => publish(hub, 8n))).to.equal("Retired");
      expect(codeOf(() => hub.publishSnapshot(snapshot(9n)))).to.equal("Retired");
      expect(clock.pending).to.equal(0); // no sweep timer left behind
      hub.retire(); // idempotent
    });

    it("a read already waiting when the hub retires yields the end", async () => {
      const { hub } = hubAt(5n);
      const s = hub.subscribe();
      const read = s.next();
      await flush();
      hub.retire();
      expect(await read).to.deep.equal({ kind: "ended", reason: "retired" });
    });
  });

  describe("idle eviction (fake clock)", () => {
    it("removes a subscriber that has not read for subscriberIdleMs; a waiting reader is never idle", async () => {
      const { hub, clock } = hubAt(5n);
      const reader = hub.subscribe();
      const sleeper = hub.subscribe();
      const read = reader.next(); // waits for frames: keeping up, however long nothing comes
      clock.advance(6_000);
      expect(sleeper.endReason).to.equal("idle");
      expect(reader.endReason).to.equal(undefined);
      clock.advance(60_000);
      expect(reader.endReason).to.equal(undefined);
      publish(hub, 5n);
      expect((await read).kind).to.equal("frame");
      // Now it stops reading: idle from the moment its last read returned.
      clock.advance(4_000);
      expect(reader.endReason).to.equal(undefined);
      clock.advance(1_000);
      expect(reader.endReason).to.equal("idle");
      expect(hub.stats().ended.idle).to.equal(2);
      expect(clock.pending).to.equal(0);
    });

    it("evicts a subscriber whose frames sit unread, frees its queue, and stops the sweep timer when none are left", async () => {
      const { hub, clock } = hubAt(5n);
      const s = hub.subscribe();
      expect(clock.pending).to.equal(1);
      publish(hub, 5n);
      publish(hub, 6n);
      clock.advance(4_999);
      expect(s.endReason).to.equal(undefined);
      clock.advance(1_000);
      expect(s.endReason).to.equal("idle");
      expect(s.queuedFrames).to.equal(0);
      expect(await s.next()).to.deep.equal({ kind: "ended", reason: "idle" });
      expect(hub.stats()).to.include({ subscribers: 0, queuedBytes: 0 });
      expect(clock.pending).to.equal(0);
      expect(hub.evictable).to.equal(true);
    });

    it("reading resets the idle clock", async () => {
      const { hub, clock } = hubAt(5n);
      const s = hub.subscribe();
      for (let base = 5n; base < 15n; base++) {
        publish(hub, base);
        clock.advance(4_000);
        expect((await s.next()).kind).to.equal("frame");
      }
      expect(s.endReason).to.equal(undefined);
      expect(hub.sweepIdle()).to.equal(0);
    });
  });

  describe("snapshot recovery", () => {
    for (const [cause, make] of [
      ["delta_images", () => delta(5n, [0, 1, 2, 3, 4].map((bucket) => ({ bucket, value: 1n })))],
      ["frame_bytes", () => delta(5n)],
    ] as const) {
      it(`a delta too large for one frame (${cause}) closes subscribers as recovery and waits for a fresh snapshot`, async () => {
        const { hub } = hubAt(5n);
        const a = hub.subscribe();
        const b = hub.subscribe();
        publish(hub, 4n + 1n); // 5 -> 6
        const big = { ...make(), baseSequence: 6n, sequence: 7n };
        const frame = frameOf(big, cause === "frame_bytes" ? 1_001 : 100);
        expect(hub.publishDelta(big, frame)).to.deep.equal({ kind: "recovery_required", cause, closed: 2 });
        expect(hub.state).to.equal("recovering");
        for (const s of [a, b]) {
          expect(s.queuedFrames).to.equal(0);
          expect(await s.next()).to.deep.equal({ kind: "ended", reason: "recovery" });
        }
        expect(codeOf(() => hub.subscribe())).to.equal("NotReady");
        // Deltas until the snapshot are dropped: the barrier snapshot carries them.
        expect(publish(hub, 7n)).to.deep.equal({ kind: "awaiting_snapshot" });
        const stats = hub.stats();
        expect(stats).to.include({ recoveries: 1, sequence: undefined, subscribers: 0 });
        expect(stats.ended.recovery).to.equal(2);
        hub.publishSnapshot(snapshot(8n));
        const c = hub.subscribe();
        expect(c.takeSnapshot().sequence).to.equal(8n);
        expect(publish(hub, 8n)).to.include({ kind: "published", sequence: 9n, delivered: 1 });
      });
    }
  });

  describe("terminal failures and frame checks", () => {
    it("a delta the mirror rejects fails the hub and closes everyone as failed", async () => {
      const { hub } = hubAt(5n);
      const s = hub.subscribe();
      expect(codeOf(() => publish(hub, 7n))).to.equal("SequenceGap");
      expect(hub.state).to.equal("failed");
      expect(await s.next()).to.deep.equal({ kind: "ended", reason: "failed" });
      expect(codeOf(() => hub.subscribe())).to.equal("Failed");
      expect(codeOf(() => publish(hub, 5n))).to.equal("Failed");
      expect(hub.evictable).to.equal(false);
    });

    it("a frame that is not its delta's is refused and changes nothing", () => {
      const { hub } = hubAt(5n);
      const s = hub.subscribe();
      const d = delta(5n);
      const wrong = [
        frameOf(delta(6n)),
        frameOf({ ...d, identity: identity(4) }),
        publicationFrame({ identity: ID, baseSequence: 5n, sequence: 5n, kind: "snapshot_chunk", payload: new Uint8Array(1) }),
        { ...frameOf(d), queuedBytes: 0 },
      ];
      for (const frame of wrong) expect(codeOf(() => hub.publishDelta(d, frame))).to.equal("InvalidFrame");
      expect(hub.stats()).to.include({ state: "ready", sequence: 5n, subscribers: 1, queuedFrames: 0, deltasPublished: 0 });
      expect(s.endReason).to.equal(undefined);
    });
  });

  describe("consumer stop", () => {
    it("a subscriber stopped by its AbortSignal is removed and its queue and snapshot freed", async () => {
      const { hub } = hubAt(5n);
      const controller = new AbortController();
      const s = hub.subscribe({ signal: controller.signal });
      const other = hub.subscribe();
      publish(hub, 5n);
      publish(hub, 6n);
      expect(hub.stats()).to.include({ queuedFrames: 4, pinnedSnapshots: 2 });
      expect(getEventListeners(controller.signal, "abort")).to.have.length(1);
      controller.abort();
      expect(s.endReason).to.equal("aborted");
      expect(s.queuedFrames).to.equal(0);
      expect(s.holdsSnapshot).to.equal(false);
      expect(getEventListeners(controller.signal, "abort")).to.have.length(0);
      expect(hub.stats()).to.include({ subscribers: 1, queuedFrames: 2, pinnedSnapshots: 1 });
      expect(hub.stats().ended.aborted).to.equal(1);
      expect(await s.next()).to.deep.equal({ kind: "ended", reason: "aborted" });
      expect(publish(hub, 7n)).to.include({ delivered: 1, lagged: 0 });
      expect(other.endReason).to.equal(undefined);
    });

    it("an abort wakes a waiting read; an already-aborted signal refuses the subscription", async () => {
      const { hub } = hubAt(5n);
      const controller = new AbortController();
      const s = hub.subscribe({ signal: controller.signal });
      const read = s.next();
      await flush();
      controller.abort();
      expect(await read).to.deep.equal({ kind: "ended", reason: "aborted" });
      expect(() => hub.subscribe({ signal: controller.signal })).to.throw();
      expect(hub.stats().subscribers).to.equal(0);
    });

    it("one read at a time: a second concurrent read is refused and the first still gets its frame", async () => {
      const { hub } = hubAt(5n);
      const s = hub.subscribe();
      const first = s.next();
      let refused: unknown;
      await s.next().catch((error: unknown) => (refused = error));
      expect(refused).to.be.instanceOf(Error);
      publish(hub, 5n);
      expect((await first).kind).to.equal("frame");
    });

    it("close() removes the subscriber the same way", async () => {
      const { hub } = hubAt(5n);
      const s = hub.subscribe();
      publish(hub, 5n);
      s.close();
      s.close();
      expect(await s.next()).to.deep.equal({ kind: "ended", reason: "closed" });
      expect(hub.stats()).to.include({ subscribers: 0, queuedFrames: 0, queuedBytes: 0 });
      expect(hub.stats().ended.closed).to.equal(1);
    });
  });
});
