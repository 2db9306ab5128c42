/**
 * Direct delivery (src/relay/service/direct-delivery.ts): deltas written in
 * the hub's turn, taken from the subscriber's bounded queue only while the
 * transport holds less than HANDOVER_BACKLOG_BYTES, so that a client that
 * does not read fills that queue and lags out, and nothing past that bound
 * waits outside it. Checked against a stand-in transport whose backlog the
 * test drains.
 */
import { expect } from "chai";
import { PublicationHub, type HubLimits } from "../../../src/relay/hub/index.js";
import { DirectDelivery, HANDOVER_BACKLOG_BYTES, StreamMessages, type DirectWake } from "../../../src/relay/service/direct-delivery.js";
import type { DirectMessages, PacedWrites } from "../../../src/server/index.js";
import { delta, frameOf, ID, snapshot } from "../hub-helpers.js";

const LIMITS: Partial<HubLimits> = { maxFrameBytes: 1_000, maxQueuedFrames: 4, maxQueuedBytes: 8_000 };
const SNAPSHOT_SEQUENCE = 5n;
const PAYLOAD = 900;

/** A transport that keeps what is written as backlog until the test takes it. */
class FakeOut implements DirectMessages {
  backlog = 0;
  readonly writes: Buffer[] = [];
  private waiters: { readonly bytes: number; readonly resolve: () => void }[] = [];

  whenBelow(bytes: number): Promise<void> {
    if (this.backlog < bytes) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push({ bytes, resolve }));
  }

  write(envelope: Buffer): boolean {
    this.writes.push(envelope);
    this.backlog += envelope.byteLength;
    return true;
  }

  /** HTTP/2 took `bytes` (all of the backlog by default). */
  take(bytes = this.backlog): void {
    this.backlog -= bytes;
    const waiting = this.waiters;
    this.waiters = [];
    for (const waiter of waiting) {
      if (this.backlog < waiter.bytes) waiter.resolve();
      else this.waiters.push(waiter);
    }
  }
}

/** Promise jobs, then one macrotask turn. */
const settle = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/** The sequence a written envelope carries (the stand-in envelope is the frame's payload, filled with sequence % 251). */
const sequenceOf = (envelope: Buffer): number => envelope[0]!;

interface Case {
  readonly name: string;
  /** The transport's backlog when the delivery starts. */
  readonly backlog: number;
  /** Deltas published before the delivery starts, then after it. */
  readonly before: number;
  readonly after: number;
  /** Written before the transport takes anything, and queued in the hub then. */
  readonly written: number;
  readonly queued: number;
  /** Why the subscription ended (undefined: live), and what the handler is woken for then. */
  readonly ended?: string;
  readonly wake?: DirectWake;
}

const CASES: readonly Case[] = [
  { name: "a delta is written as the hub queues it", backlog: 0, before: 0, after: 3, written: 3, queued: 0 },
  { name: "deltas queued before the delivery starts go out at once, in order", backlog: 0, before: 3, after: 1, written: 4, queued: 0 },
  {
    name: "with the transport at the handover bound, deltas wait in the hub's queue",
    backlog: HANDOVER_BACKLOG_BYTES,
    before: 1,
    after: 2,
    written: 0,
    queued: 3,
  },
  {
    name: "what one drain writes counts toward the bound: it stops once the transport holds it",
    backlog: HANDOVER_BACKLOG_BYTES - 2 * PAYLOAD - 1,
    before: 4,
    after: 0,
    written: 3,
    queued: 1,
  },
  {
    name: "a client that takes nothing fills its queue and lags out",
    backlog: HANDOVER_BACKLOG_BYTES,
    before: 0,
    after: 5,
    written: 0,
    queued: 0,
    ended: "lagged",
    wake: "ended",
  },
];

describe("direct delivery: deltas written in the hub's turn within the handover bound", () => {
  for (const c of CASES) {
    it(c.name, async () => {
      const hub = new PublicationHub({ identity: ID, limits: LIMITS });
      hub.publishSnapshot(snapshot(SNAPSHOT_SEQUENCE));
      const subscriber = hub.subscribe();
      const out = new FakeOut();
      out.backlog = c.backlog;
      let base = SNAPSHOT_SEQUENCE;
      const publish = (n: number) => {
        for (let i = 0; i < n; i++, base++) {
          const d = delta(base);
          hub.publishDelta(d, frameOf(d, PAYLOAD));
        }
      };
      publish(c.before);
      const abort = new AbortController();
      const delivery = new DirectDelivery({
        out,
        subscriber,
        expected: ID,
        envelopeOf: (frame) => Buffer.from(frame.payload),
        sequence: SNAPSHOT_SEQUENCE,
        heartbeatIntervalMs: 60_000,
        signal: abort.signal,
      });
      try {
        publish(c.after);
        const expected = (count: number, from = 0) => Array.from({ length: count }, (_, i) => Number(SNAPSHOT_SEQUENCE + 1n + BigInt(from + i)) % 251);
        expect(out.writes.map(sequenceOf)).to.deep.equal(expected(c.written));
        expect(subscriber.queuedFrames).to.equal(c.queued);
        expect(subscriber.endReason).to.equal(c.ended);
        if (c.wake !== undefined) {
          expect(await delivery.next()).to.equal(c.wake);
          return;
        }
        // The transport takes everything: what waited goes out, in order, after what went before.
        out.take();
        await settle();
        const total = c.before + c.after;
        expect(out.writes.map(sequenceOf)).to.deep.equal(expected(total));
        expect(subscriber.queuedFrames).to.equal(0);
        expect(delivery.sequence).to.equal(SNAPSHOT_SEQUENCE + BigInt(total));
        expect(delivery.failure).to.equal(undefined);
      } finally {
        delivery.dispose();
        abort.abort();
        hub.retire();
      }
    });
  }

  it("a delta that does not continue the sequence the snapshot left fails the stream, and nothing is written", async () => {
    const hub = new PublicationHub({ identity: ID, limits: LIMITS });
    hub.publishSnapshot(snapshot(SNAPSHOT_SEQUENCE));
    const subscriber = hub.subscribe();
    const out = new FakeOut();
    const abort = new AbortController();
    const delivery = new DirectDelivery({
      out,
      subscriber,
      expected: ID,
      envelopeOf: (frame) => Buffer.from(frame.payload),
      sequence: SNAPSHOT_SEQUENCE + 1n,
      heartbeatIntervalMs: 60_000,
      signal: abort.signal,
    });
    try {
      const d = delta(SNAPSHOT_SEQUENCE);
      hub.publishDelta(d, frameOf(d, PAYLOAD));
      expect(await delivery.next()).to.equal("failed");
      expect(delivery.failure?.reason).to.equal("INVALID_PUBLICATION");
      expect(out.writes).to.have.length(0);
    } finally {
      delivery.dispose();
      hub.retire();
    }
  });

  it("StreamMessages reads the backlog of the pacer and writes through the call's direct writes", async () => {
    const written: Buffer[] = [];
    let below: number | undefined;
    const paced = {
      backlog: 1234,
      whenBelow: (bytes: number) => {
        below = bytes;
        return Promise.resolve();
      },
    } as unknown as PacedWrites;
    const direct: DirectMessages = {
      backlog: -1,
      whenBelow: () => Promise.reject(new Error("the pacer's, not this")),
      write: (envelope) => written.push(envelope) > 0,
    };
    const out = new StreamMessages(paced, direct);
    expect(out.backlog).to.equal(1234);
    await out.whenBelow(10);
    expect(below).to.equal(10);
    expect(out.write(Buffer.from([7]))).to.equal(true);
    expect(written).to.deep.equal([Buffer.from([7])]);
  });
});
