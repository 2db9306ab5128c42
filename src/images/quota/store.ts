/**
 * Where callers' buckets live: this process's memory (`MemoryQuotaStore`),
 * or a NATS key-value bucket the replicas share (./nats.ts). Both charge
 * with the same math (./bucket.ts).
 */
import { charge, isFull, QUOTA_LIMITS, type QuotaCost, type QuotaDecision, type QuotaRates, type QuotaState } from "./bucket.js";

export interface QuotaStore {
  /** Charges `cost` to the buckets of `caller` (a caller name, or "anonymous") at `rates`: all or nothing. */
  charge(caller: string, rates: QuotaRates, cost: QuotaCost): Promise<QuotaDecision>;
  /** True while a shared store cannot be reached and buckets are this process's alone. */
  readonly degraded: boolean;
  close(): Promise<void>;
}

interface Entry {
  state: QuotaState;
  /** The rates it was last charged at, to tell whether it has refilled. */
  rates: QuotaRates;
}

/**
 * Buckets in this process: a map of at most `maxCallers` callers, most
 * recently charged last. When a new caller finds it full, the buckets that
 * have refilled (forgetting them changes nothing) are dropped; if none has,
 * the least recently charged one is, and that caller starts full again.
 */
export class MemoryQuotaStore implements QuotaStore {
  private readonly entries = new Map<string, Entry>();

  constructor(
    private readonly maxCallers: number,
    private readonly now: () => number = Date.now,
  ) {}

  readonly degraded = false;

  get size(): number {
    return this.entries.size;
  }

  async charge(caller: string, rates: QuotaRates, cost: QuotaCost): Promise<QuotaDecision> {
    return this.chargeNow(caller, rates, cost);
  }

  /** The charge, synchronously (the shared store's fallback uses it too). */
  chargeNow(caller: string, rates: QuotaRates, cost: QuotaCost): QuotaDecision {
    const now = this.now();
    const entry = this.entries.get(caller);
    const decision = charge(entry?.state, rates, cost, now);
    if (!decision.ok) return decision;
    if (entry !== undefined) {
      // Most recently charged last: the map's order is the eviction order.
      this.entries.delete(caller);
    } else if (this.entries.size >= this.maxCallers) {
      this.makeRoom(now);
    }
    this.entries.set(caller, { state: decision.state, rates });
    return decision;
  }

  async close(): Promise<void> {
    this.entries.clear();
  }

  private makeRoom(now: number): void {
    for (const [caller, entry] of this.entries) {
      if (QUOTA_LIMITS.every((limit) => entry.rates[limit] === undefined || isFull(entry.state[limit], entry.rates[limit], now))) this.entries.delete(caller);
    }
    while (this.entries.size >= this.maxCallers) {
      const oldest = this.entries.keys().next();
      if (oldest.done === true) break;
      this.entries.delete(oldest.value);
    }
  }
}
