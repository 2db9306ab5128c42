/**
 * Router events for the JetStream scenarios of the end-to-end suite: a
 * deterministic workload of "workers" (lanes of one worker id and dp rank),
 * a JetStream publisher, and the filter the relay's must equal.
 *
 * - Workload: each lane stores chained runs of 1 to 3 blocks with random
 *   tokens hashes, removes some of its blocks and now and then clears; its
 *   event ids count up across scenarios. A prompt lane stores the first
 *   blocks of sample prompts with the tokens hashes the router computes for
 *   their tokens (computeBlockHashForSeq at the pool's block size, base
 *   model, no cache namespace), so that the router's Overlap answers for
 *   those prompts count the stored blocks; it never removes them.
 * - Publisher: one message per event on the stream's subject, with
 *   `Nats-Msg-Id` routerEventMessageId(event); every lane publishes one
 *   event after another (an event is retried with the same id until the
 *   stream acks it, so a lane's events are stored in its order), lanes at
 *   once: as many publishes in flight as lanes. It speaks JetStream's
 *   publish protocol itself (the message with the header and a reply
 *   subject; the stream's PubAck, or a 503 status when no stream takes the
 *   subject, answers there) over the nats package's core client, with one
 *   reply subscription and one sweep of overdue acks for all publishes: the
 *   package's `jetstream().publish` (a request, a timer and a promise chain
 *   each) takes about 3.5 times the CPU per message (nats 2.29, measured
 *   here: ~115 against ~33 µs), which on two shared cores is what bounds
 *   the rate of 100,000 events.
 * - Expected filter: a DcCkfState fed each acked event once, in stream
 *   order (the acks' sequences), as the relay applies them; a sequence no
 *   ack named (a message stored while its ack was lost, then stored again
 *   under a new sequence) is read from the stream, and an event key seen
 *   before is skipped as the relay's duplicate window drops it. The events
 *   are built as objects beside their JSON (parsing 100,000 lines again
 *   would double the filter's cost); one in 64 is checked against
 *   routerEventFromJson of its line.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { isDeepStrictEqual } from "node:util";
import { createInbox, headers, type JetStreamManager, type Msg, type NatsConnection, type Subscription } from "nats";
import {
  computeBlockHashForSeq,
  computeNextSeqHash,
  computeSeqHashForBlock,
  DcCkfState,
  DEFAULT_EXPECTED_UNIQUE_BLOCKS,
  routerEventFromJson,
  type KvCacheEventData,
  type RouterEvent,
} from "../../src/kv/index.js";
import type { LaneProbe } from "../../src/relay/index.js";
import { routerEventMessageId } from "../../src/relay/nats/index.js";
import { prng } from "../support/index.js";

/** One event: its JSON line (the message), the event it reads as, and its Nats-Msg-Id. */
export interface WorkloadEvent {
  readonly line: string;
  readonly event: RouterEvent;
  readonly msgId: string;
  /** `worker:rank:event_id`, as the relay's duplicate window keys it. */
  readonly key: string;
}

class Lane {
  nextId = 1;
  /** Live external hashes in storage order (a run chains to the last). */
  order: bigint[] = [];
  constructor(
    readonly worker: number,
    readonly rank: number,
  ) {}

  private event(json: string, data: KvCacheEventData): WorkloadEvent {
    const id = this.nextId++;
    const event: RouterEvent = { workerId: BigInt(this.worker), dpRank: this.rank, eventId: BigInt(id), data };
    return {
      line: `{"worker_id":${this.worker},"event":{"event_id":${id},"dp_rank":${this.rank},"data":${json}}}`,
      event,
      msgId: routerEventMessageId(event),
      key: `${this.worker}:${this.rank}:${id}`,
    };
  }

  /** A Stored event of `blocks` (external hash, tokens hash) after `parent` (an external hash this lane holds). */
  stored(parent: bigint | undefined, blocks: readonly (readonly [bigint, bigint])[]): WorkloadEvent {
    const json: string[] = [];
    for (const [external, tokens] of blocks) {
      this.order.push(external);
      json.push(`{"block_hash":${external},"tokens_hash":"${tokens}"}`);
    }
    const stored = blocks.map(([blockHash, tokensHash]) => ({ blockHash, tokensHash }));
    return this.event(
      `{"stored":{"parent_hash":${parent === undefined ? "null" : String(parent)},"blocks":[${json.join(",")}]}}`,
      parent === undefined ? { kind: "stored", blocks: stored } : { kind: "stored", parentHash: parent, blocks: stored },
    );
  }

  removed(external: bigint): WorkloadEvent {
    this.order.splice(this.order.indexOf(external), 1);
    return this.event(`{"removed":{"block_hashes":[${external}]}}`, { kind: "removed", blockHashes: [external] });
  }

  cleared(): WorkloadEvent {
    this.order = [];
    return this.event(`"cleared"`, { kind: "cleared" });
  }
}

/** Tokens per KV block of the stack's pool (the relay's default blockSize). */
export const BLOCK_SIZE = 16;

/** A sample prompt and how many of its leading blocks the prompt lane stores. */
export interface SamplePrompt {
  readonly tokens: readonly number[];
  readonly storedBlocks: number;
}

/**
 * The workload: `lanes` workers (worker ids from 1, two dp ranks each) and
 * a prompt lane. Deterministic for a seed.
 */
export class EventWorkload {
  private readonly random: () => number;
  private readonly lanes: Lane[];
  private readonly promptLane: Lane;
  private nextBlock = 1_000_000n;
  readonly prompts: SamplePrompt[] = [];

  constructor(lanes: number, seed: number) {
    this.random = prng(seed);
    this.lanes = Array.from({ length: lanes }, (_, i) => new Lane(1 + Math.floor(i / 2), i % 2));
    this.promptLane = new Lane(900_000, 0);
  }

  get laneCount(): number {
    return this.lanes.length;
  }

  private u64(): bigint {
    const r = this.random;
    return (BigInt(Math.floor(r() * 2 ** 32)) << 32n) | BigInt(Math.floor(r() * 2 ** 32));
  }

  /**
   * `count` sample prompts of 3 to 10 blocks (and a partial block), the
   * first 0..all of their blocks stored in one or two chained events each;
   * returns those events (one lane: publish them in order).
   */
  promptEvents(count: number): WorkloadEvent[] {
    const events: WorkloadEvent[] = [];
    for (let p = 0; p < count; p++) {
      const blocks = 3 + Math.floor(this.random() * 8);
      const tokens = Array.from({ length: blocks * BLOCK_SIZE + 5 }, () => Math.floor(this.random() * 150_000));
      // Every depth: none, some, all (one in four prompts stored whole).
      const storedBlocks = p % 4 === 0 ? blocks : Math.floor(this.random() * (blocks + 1));
      this.prompts.push({ tokens, storedBlocks });
      if (storedBlocks === 0) continue;
      // The router's hashing: block hashes of the tokens; the filter keys chain them.
      const hashes = computeBlockHashForSeq(tokens, BLOCK_SIZE).slice(0, storedBlocks);
      const external = computeSeqHashForBlock(hashes);
      const pairs = hashes.map((h, i) => [external[i]!, h] as const);
      const split = storedBlocks > 1 && p % 2 === 1 ? Math.ceil(storedBlocks / 2) : storedBlocks;
      events.push(this.promptLane.stored(undefined, pairs.slice(0, split)));
      if (split < storedBlocks) events.push(this.promptLane.stored(pairs[split - 1]![0], pairs.slice(split)));
    }
    return events;
  }

  /**
   * `count` events spread over the lanes (lane i gets every lanes-th), each
   * lane's in order: 70 % Stored (a run chained to the lane's last block
   * seven times in ten), 29.5 % Removed (a random live block), 0.5 % Cleared.
   */
  laneEvents(count: number): WorkloadEvent[][] {
    const out: WorkloadEvent[][] = this.lanes.map(() => []);
    for (let i = 0; i < count; i++) {
      const index = i % this.lanes.length;
      const lane = this.lanes[index]!;
      const roll = this.random();
      let event: WorkloadEvent;
      if (roll < 0.7 || lane.order.length === 0) {
        const parent = lane.order.length > 0 && this.random() < 0.7 ? lane.order[lane.order.length - 1] : undefined;
        const n = 1 + Math.floor(this.random() * 3);
        const blocks = Array.from({ length: n }, () => [this.nextBlock++, this.u64()] as const);
        event = lane.stored(parent, blocks);
      } else if (roll < 0.995) {
        event = lane.removed(lane.order[Math.floor(this.random() * lane.order.length)]!);
      } else {
        event = lane.cleared();
      }
      out[index]!.push(event);
    }
    return out;
  }

}

/** The prompt's expected overlap in a filter: its leading sequence hashes `probe` holds. */
export function expectedOverlap(prompt: SamplePrompt, probe: LaneProbe): { matched: number; total: number } {
  const seq = computeSeqHashForBlock(computeBlockHashForSeq(prompt.tokens, BLOCK_SIZE));
  let matched = 0;
  while (matched < seq.length && probe.contains(seq[matched]!)) matched++;
  return { matched, total: seq.length };
}

/**
 * The filter fed every event once in stream order, as far as the stream's
 * sequences are known; beside it, the blocks each (worker, rank) holds by
 * those events, with the canonical hashes the filter keys them by.
 */
export class ExpectedFilter {
  readonly state = new DcCkfState({ expectedBlocksPerDc: DEFAULT_EXPECTED_UNIQUE_BLOCKS });
  /** `worker:rank` → external block hash → canonical hash. */
  private readonly live = new Map<string, Map<bigint, bigint>>();
  private readonly bySeq = new Map<number, WorkloadEvent>();
  private readonly applied = new Set<string>();
  /** The next stream sequence to apply. */
  private next = 1;
  /** Sequences read from the stream because no ack named them. */
  filled = 0;
  /** Events found in the stream twice (skipped the second time). */
  storedTwice = 0;

  /** Notes the sequence an ack gave an event (a duplicate's ack gives the first one's). */
  acked(seq: number, event: WorkloadEvent): void {
    if (!this.bySeq.has(seq)) this.bySeq.set(seq, event);
  }

  /** Applies every event from the next sequence on whose sequence is known, in order; returns the next sequence. */
  advance(): number {
    for (let event = this.bySeq.get(this.next); event !== undefined; event = this.bySeq.get(this.next)) {
      this.bySeq.delete(this.next);
      this.apply(event);
      this.next++;
    }
    return this.next;
  }

  private apply(event: WorkloadEvent): void {
    if (this.applied.has(event.key)) {
      this.storedTwice++;
      return;
    }
    this.applied.add(event.key);
    if (this.applied.size % 64 === 1 && !isDeepStrictEqual(routerEventFromJson(event.line), event.event)) {
      throw new Error(`the workload's event is not what its line reads as: ${event.line}`);
    }
    this.state.applyEvent(event.event);
    this.track(event.event);
  }

  /** The blocks an event leaves its (worker, rank) holding; a Stored after an unknown parent is refused, as the filter refuses it. */
  private track(event: RouterEvent): void {
    const lane = `${event.workerId}:${event.dpRank}`;
    let blocks = this.live.get(lane);
    if (blocks === undefined) this.live.set(lane, (blocks = new Map()));
    const data = event.data;
    if (data.kind === "cleared") blocks.clear();
    else if (data.kind === "removed") for (const hash of data.blockHashes) blocks.delete(hash);
    else {
      let canonical = data.parentHash === undefined ? undefined : blocks.get(data.parentHash);
      if (data.parentHash !== undefined && canonical === undefined) return;
      for (const block of data.blocks) {
        canonical = canonical === undefined ? block.tokensHash : computeNextSeqHash(canonical, block.tokensHash);
        blocks.set(block.blockHash, canonical);
      }
    }
  }

  /** Blocks the applied events leave held that `probe` (a mirror's lane) does not hold: what lost Stored events leave out. */
  missingFrom(probe: LaneProbe): number {
    let missing = 0;
    for (const blocks of this.live.values()) for (const canonical of blocks.values()) if (!probe.contains(canonical)) missing++;
    return missing;
  }

  /** Applies up to `lastSeq`, reading from the stream the sequences no ack named. */
  async catchUp(jsm: JetStreamManager, stream: string, lastSeq: number): Promise<void> {
    while (this.advance() <= lastSeq) {
      const message = await jsm.streams.getMessage(stream, { seq: this.next });
      const line = new TextDecoder().decode(message.data);
      const event: RouterEvent = routerEventFromJson(line);
      this.bySeq.set(this.next, {
        line,
        event,
        msgId: routerEventMessageId(event),
        key: `${event.workerId}:${event.dpRank}:${event.eventId}`,
      });
      this.filled++;
    }
  }
}

/** What one publishing run came to. */
export interface PublishReport {
  /** Events to publish. */
  readonly events: number;
  /** Events the stream acked (stored, or a duplicate of one stored). */
  readonly acked: number;
  /** Publishes that failed (no ack within the timeout, no server) and were sent again. */
  readonly retries: number;
  /** Acks that said duplicate: a re-sent event the stream had stored already. */
  readonly duplicates: number;
  /** The highest stream sequence acked. */
  readonly lastSeq: number;
  readonly elapsedMs: number;
  /** When the run ended (performance.now()). */
  readonly endedAt: number;
}

export interface PublisherOptions {
  /** The wait for each ack. */
  readonly ackTimeoutMs: number;
  /** Pause before a failed publish is sent again. */
  readonly retryPauseMs: number;
  /** The run stops sending (events left unacked are counted) after this long. */
  readonly deadlineMs: number;
}

/** A stream's PubAck, or the error it answered with. */
interface PubAckJson {
  readonly seq?: number;
  readonly duplicate?: boolean;
  readonly error?: { readonly code?: number; readonly description?: string };
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();
/** The header a stream drops re-sent messages by, within its duplicate window. */
const MSG_ID_HEADER = "Nats-Msg-Id";

/** Publishes lanes of events to a JetStream subject; see the file's comment. */
export class JetStreamPublisher {
  /** Acked so far in the current run. */
  acked = 0;
  private stopped = false;
  private readonly inbox = createInbox();
  private next = 0;
  /** Publishes awaiting their ack, by reply token. */
  private readonly waiting = new Map<string, { readonly settle: (ack: { seq: number; duplicate: boolean } | Error) => void; readonly deadline: number }>();
  private subscription: Subscription | undefined;

  constructor(
    private readonly nc: NatsConnection,
    private readonly subject: string,
    private readonly expected: ExpectedFilter,
    private readonly options: PublisherOptions,
  ) {}

  private onReply(msg: Msg): void {
    const token = msg.subject.slice(this.inbox.length + 1);
    const waiting = this.waiting.get(token);
    if (waiting === undefined) return; // an ack after its timeout: the event was sent again
    this.waiting.delete(token);
    // A status reply has no body (503: no stream takes the subject yet).
    if (msg.data.length === 0) return waiting.settle(new Error(`status ${msg.headers?.code ?? "?"} ${msg.headers?.description ?? ""}`));
    let ack: PubAckJson;
    try {
      ack = JSON.parse(decoder.decode(msg.data)) as PubAckJson;
    } catch {
      return waiting.settle(new Error("an ack that is not JSON"));
    }
    if (ack.error !== undefined || typeof ack.seq !== "number") return waiting.settle(new Error(`stream error ${ack.error?.code ?? "?"}: ${ack.error?.description ?? "no sequence"}`));
    waiting.settle({ seq: ack.seq, duplicate: ack.duplicate === true });
  }

  /** One attempt: the stream's ack, or an Error (no ack within the timeout, no stream, no connection). */
  private send(event: WorkloadEvent): Promise<{ seq: number; duplicate: boolean } | Error> {
    const token = String(this.next++);
    return new Promise((settle) => {
      this.waiting.set(token, { settle, deadline: performance.now() + this.options.ackTimeoutMs });
      try {
        const h = headers();
        h.set(MSG_ID_HEADER, event.msgId);
        this.nc.publish(this.subject, encoder.encode(event.line), { reply: `${this.inbox}.${token}`, headers: h });
      } catch (error) {
        this.waiting.delete(token);
        settle(error instanceof Error ? error : new Error(String(error)));
      }
    });
  }

  async publish(lanes: readonly (readonly WorkloadEvent[])[]): Promise<PublishReport> {
    const started = performance.now();
    const end = started + this.options.deadlineMs;
    let retries = 0;
    let duplicates = 0;
    let lastSeq = 0;
    this.acked = 0;
    this.stopped = false;
    this.subscription ??= this.nc.subscribe(`${this.inbox}.*`, { callback: (_error, msg) => this.onReply(msg) });
    const sweep = setInterval(() => {
      const now = performance.now();
      for (const [token, waiting] of this.waiting) {
        if (waiting.deadline > now) continue;
        this.waiting.delete(token);
        waiting.settle(new Error("no ack"));
      }
    }, 50);
    const lane = async (events: readonly WorkloadEvent[]) => {
      for (const event of events) {
        for (;;) {
          if (this.stopped || performance.now() > end) return;
          const ack = await this.send(event);
          if (ack instanceof Error) {
            retries++;
            await sleep(this.options.retryPauseMs);
            continue;
          }
          // Applied as the stream's sequence fills in, so that the expected filter is ready when the last ack is.
          this.expected.acked(ack.seq, event);
          this.expected.advance();
          if (ack.duplicate) duplicates++;
          lastSeq = Math.max(lastSeq, ack.seq);
          this.acked++;
          break;
        }
      }
    };
    try {
      await Promise.all(lanes.map(lane));
    } finally {
      clearInterval(sweep);
      this.stopped = false;
    }
    const endedAt = performance.now();
    return { events: lanes.reduce((n, l) => n + l.length, 0), acked: this.acked, retries, duplicates, lastSeq, elapsedMs: endedAt - started, endedAt };
  }

  /** Ends the current run: each lane stops after the publish it awaits (events left are not acked). */
  stop(): void {
    this.stopped = true;
  }
}
