/**
 * Quotas shared by the replicas of a deployment: each caller's buckets are
 * one value of a NATS JetStream key-value bucket (`q.<caller>`), charged
 * with a write that names the revision read (create for a caller never
 * seen), so that two replicas charging one caller at once cannot both
 * spend the same tokens: the one that loses reads again and charges what
 * is left, up to MAX_ROUNDS times. A caller whose value kept changing for
 * every round is let through uncharged: contention means its buckets are
 * being charged right now, and a request is never held up for the store.
 *
 * The connection settings are those of the shared idempotency store
 * (`images.idempotency.nats`); the bucket is its own (`images.quotas.nats.bucket`),
 * kept in the server's memory (quotas need not survive a NATS restart),
 * each value dropped after QUOTA_VALUE_TTL_MS without a charge (by then
 * every bucket has refilled, unless its rate is below one request a day).
 *
 * NATS unreachable: before the first connection, and from the first
 * failure until the bucket answers again, callers are charged in this
 * process's memory (`MemoryQuotaStore`): per replica, so a caller may get
 * up to its limit from each replica meanwhile. The store logs the change
 * once each way and reports `degraded`; no request waits for NATS beyond
 * the operation that finds it gone (`requestTimeoutMs`).
 */
import type { KvEntry } from "nats";
import type { Logger } from "pino";
import { errorOf } from "../../util/index.js";
import type { IdempotencyNatsConfig } from "../config.js";
import { IdempotencyStoreError, NatsBucket } from "../runtime/idempotency-nats-bucket.js";
import type { BucketLevel, QuotaCost, QuotaDecision, QuotaRates, QuotaState } from "./bucket.js";
import { charge } from "./bucket.js";
import { MemoryQuotaStore, type QuotaStore } from "./store.js";

/** Reads and revision-checked writes a charge may take before it lets the call through uncharged. */
export const MAX_ROUNDS = 8;
/** How long the bucket keeps a caller's value after its last charge. */
export const QUOTA_VALUE_TTL_MS = 86_400_000;
/** The created bucket's size: about 100 000 callers. */
const BUCKET_BYTES = 16 * 1024 * 1024;
const VALUE_BYTES = 16 * 1024;

export interface NatsQuotaStoreOptions {
  /** The servers, credentials and timeouts (those of images.idempotency.nats). */
  readonly nats: IdempotencyNatsConfig;
  /** The key-value bucket of the quotas. */
  readonly bucket: string;
  /** Callers kept in memory while NATS is unreachable. */
  readonly maxCallers: number;
  readonly logger: Logger;
  /** The wall clock of the buckets' levels (compared across replicas: keep them in sync). */
  readonly now?: () => number;
}

/**
 * The key of a caller's value. Caller names are letters, digits, `.`, `_`
 * and `-`; a `.` separates tokens of a NATS subject and two in a row are
 * not allowed, so dots are written as `=`, which no name has.
 */
export function quotaKey(caller: string): string {
  return `q.${caller.replaceAll(".", "=")}`;
}

/** A value as stored: `{"r":[tokens,at],"i":[tokens,at]}`, each bucket present when limited. */
export function encodeQuotaState(state: QuotaState): Uint8Array {
  const out: Record<string, [number, number]> = {};
  if (state.requests) out["r"] = [state.requests.tokens, state.requests.at];
  if (state.images) out["i"] = [state.images.tokens, state.images.at];
  return new TextEncoder().encode(JSON.stringify(out));
}

function levelOf(value: unknown): BucketLevel | undefined {
  if (!Array.isArray(value) || value.length !== 2) return undefined;
  const [tokens, at] = value as unknown[];
  return typeof tokens === "number" && typeof at === "number" && Number.isFinite(tokens) && Number.isFinite(at) ? { tokens, at } : undefined;
}

/** A stored value's buckets; one that does not read is a caller never charged (full buckets), overwritten by the next charge. */
export function decodeQuotaState(value: Uint8Array): QuotaState {
  let raw: unknown;
  try {
    raw = JSON.parse(new TextDecoder().decode(value));
  } catch {
    return {};
  }
  if (raw === null || typeof raw !== "object") return {};
  const record = raw as Record<string, unknown>;
  const requests = levelOf(record["r"]);
  const images = levelOf(record["i"]);
  return { ...(requests ? { requests } : {}), ...(images ? { images } : {}) };
}

export class NatsQuotaStore implements QuotaStore {
  private readonly bucket: NatsBucket;
  private readonly local: MemoryQuotaStore;
  private readonly logger: Logger;
  private readonly now: () => number;
  private readonly where: Record<string, unknown>;
  private wasDegraded = false;
  private warnedFull = false;

  constructor(options: NatsQuotaStoreOptions) {
    this.logger = options.logger;
    this.now = options.now ?? Date.now;
    this.local = new MemoryQuotaStore(options.maxCallers, this.now);
    this.where = { store: "nats", servers: options.nats.servers, bucket: options.bucket };
    const config: IdempotencyNatsConfig = {
      ...options.nats,
      name: `${options.nats.name}-quotas`,
      bucket: options.bucket,
      storage: "memory",
      maxBucketBytes: BUCKET_BYTES,
      maxValueBytes: VALUE_BYTES,
    };
    this.bucket = new NatsBucket(config, { ttlMs: QUOTA_VALUE_TTL_MS, what: "quota store" }, (available, reason) => this.changed(available, reason));
  }

  /** Starts connecting; callers are charged in memory until the bucket is bound. */
  start(): void {
    this.bucket.start();
  }

  get degraded(): boolean {
    return this.bucket.unavailable;
  }

  async close(): Promise<void> {
    await this.bucket.close();
  }

  async charge(caller: string, rates: QuotaRates, cost: QuotaCost): Promise<QuotaDecision> {
    if (!this.bucket.available) return this.local.chargeNow(caller, rates, cost);
    const key = quotaKey(caller);
    let admitted: QuotaDecision | undefined;
    for (let round = 0; round < MAX_ROUNDS; round += 1) {
      let entry: KvEntry | null;
      try {
        entry = await this.bucket.get(key);
      } catch (error) {
        return this.fallBack(error, caller, rates, cost);
      }
      const state = entry !== null && entry.operation === "PUT" ? decodeQuotaState(entry.value) : undefined;
      const decision = charge(state, rates, cost, this.now());
      // A refusal writes nothing.
      if (!decision.ok) return decision;
      admitted = decision;
      try {
        const value = encodeQuotaState(decision.state);
        if (entry === null) await this.bucket.create(key, value);
        else await this.bucket.update(key, value, entry.revision);
        return decision;
      } catch (error) {
        if (error instanceof IdempotencyStoreError && error.code === "wrong_revision") continue;
        return this.fallBack(error, caller, rates, cost);
      }
    }
    this.logger.debug({ ...this.where, caller, rounds: MAX_ROUNDS }, "quota store: a caller's buckets kept changing; the call goes through uncharged");
    return admitted ?? { ok: true, state: {} };
  }

  /** The bucket failed this charge: this process's memory decides (an unreachable bucket is already marked so by NatsBucket). */
  private fallBack(error: unknown, caller: string, rates: QuotaRates, cost: QuotaCost): QuotaDecision {
    if (error instanceof IdempotencyStoreError && error.code === "full" && !this.warnedFull) {
      this.warnedFull = true;
      this.logger.warn({ ...this.where, err: error.message }, "quota store: the bucket is full; callers it has no room for are charged per replica");
    } else if (!(error instanceof IdempotencyStoreError)) {
      this.logger.error({ ...this.where, err: errorOf(error) }, "quota store: a charge failed unexpectedly; charged in this process");
    }
    return this.local.chargeNow(caller, rates, cost);
  }

  private changed(available: boolean, reason?: string): void {
    if (!available) {
      this.wasDegraded = true;
      this.logger.warn({ ...this.where, reason }, "quota store unreachable: quotas are per replica until it is back (a caller may get its limit from each replica)");
      return;
    }
    this.logger.info(this.where, this.wasDegraded ? "quota store reachable again: quotas are shared across replicas" : "quota store connected: quotas are shared across replicas");
  }
}
