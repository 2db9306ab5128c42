/**
 * A deterministic stream of router events that reaches every path of
 * DcCkfState's application: chains from the root and continuations of a
 * member's known blocks, re-offers, shared canonical hashes (few tokens
 * hashes, several members), a block hash remapped late in an event
 * (InvalidBlockSequence after most of the chain was checked), unknown parents,
 * duplicates within an event, removals of known and unknown hashes, Cleared
 * members, events over a block limit, and, in a small filter, inserts that
 * fail mid-event (CapacityExhausted) with later blocks of the same event
 * still applied. The sliced-application tests apply it with and without
 * pauses and compare.
 */
import type { RouterEvent, StoredBlock } from "../../src/kv/index.js";
import { prng } from "../support/index.js";

export interface WorkloadOptions {
  readonly seed: number;
  readonly events: number;
  /** Most blocks of a Stored event (an event over `overLimit` is made now and then when set). */
  readonly maxBlocks: number;
  /** When set, about one event in 25 carries this many blocks (or block hashes). */
  readonly overLimit?: number;
}

const WORKERS = [1n, 2n, 3n];
const RANKS = [0, 1];

export function ckfWorkload(options: WorkloadOptions): RouterEvent[] {
  const random = prng(options.seed);
  const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)]!;
  const int = (n: number) => Math.floor(random() * n);
  /** Block hashes each member has used, for parents, removals and remaps. */
  const known = new Map<string, bigint[]>();
  let nextHash = 1_000n;
  let eventId = 0n;
  const events: RouterEvent[] = [];
  for (let e = 0; e < options.events; e++) {
    const workerId = pick(WORKERS);
    const dpRank = pick(RANKS);
    const key = `${workerId}:${dpRank}`;
    const mine = known.get(key) ?? [];
    known.set(key, mine);
    eventId += 1n;
    const roll = random();
    if (options.overLimit !== undefined && roll < 0.04) {
      const n = options.overLimit;
      const data =
        random() < 0.5
          ? { kind: "stored" as const, blocks: Array.from({ length: n }, () => ({ blockHash: nextHash++, tokensHash: BigInt(1 + int(6)) })) }
          : { kind: "removed" as const, blockHashes: Array.from({ length: n }, () => BigInt(int(2_000))) };
      events.push({ workerId, dpRank, eventId, data });
      continue;
    }
    if (roll < 0.62) {
      const n = 1 + int(options.maxBlocks);
      const blocks: StoredBlock[] = [];
      for (let i = 0; i < n; i++) {
        // Few tokens hashes: chains of different members coincide, so canonical hashes are shared.
        const tokensHash = BigInt(1 + int(6));
        let blockHash: bigint;
        const r = random();
        if (r < 0.08 && mine.length > 0) blockHash = pick(mine); // a re-offer, or a remap when the chain differs
        else if (r < 0.11 && blocks.length > 0) blockHash = pick(blocks).blockHash; // a duplicate within the event
        else blockHash = nextHash++;
        blocks.push({ blockHash, tokensHash });
        mine.push(blockHash);
      }
      const r = random();
      const parentHash = r < 0.45 && mine.length > n ? pick(mine.slice(0, mine.length - n)) : r < 0.5 ? nextHash++ : undefined;
      const startPosition = parentHash === undefined && random() < 0.03 ? 4 : undefined;
      events.push({ workerId, dpRank, eventId, data: { kind: "stored", blocks, ...(parentHash === undefined ? {} : { parentHash }), ...(startPosition === undefined ? {} : { startPosition }) } });
    } else if (roll < 0.9) {
      const n = 1 + int(options.maxBlocks);
      const blockHashes = Array.from({ length: n }, () => (random() < 0.8 && mine.length > 0 ? pick(mine) : nextHash + BigInt(int(50))));
      events.push({ workerId, dpRank, eventId, data: { kind: "removed", blockHashes } });
    } else {
      events.push({ workerId, dpRank, eventId, data: { kind: "cleared" } });
      mine.length = 0;
    }
  }
  return events;
}
