/**
 * Idempotency keys shared by the replicas of a deployment, in a NATS
 * JetStream key-value bucket, with the memory store's semantics
 * (idempotency.ts): a retry that a load balancer sends to another replica
 * gets the first call's result instead of running, and paying, again.
 *
 * A key (scope and key, hashed: `r.<sha256>`) holds one record
 * (idempotency-record.ts):
 *
 * - Claim. The first replica to see the key writes `pending` with
 *   `kv.create`, which only one writer can win; the record carries the
 *   request's fingerprint, a claim token and the owner. A key whose record
 *   expired, or was released, is claimed with `kv.update` naming the
 *   revision read, just as atomically.
 * - Join. A replica that finds `pending` with the same fingerprint watches
 *   the key until the outcome is written, bounded by its caller's signal,
 *   and replays it; another fingerprint is `idempotency_conflict`, on every
 *   replica. Calls on the owner's own replica join its run in memory.
 * - Lease. The owner refreshes its claim every `heartbeatMs`. A waiting
 *   replica that sees no new revision for the claim's `leaseMs` (by its own
 *   clock: no clocks are compared across replicas) takes the claim over with
 *   `kv.update`: the owner is presumed dead, and since it may have
 *   dispatched the work the key becomes an unknown outcome (`timeout`,
 *   `stage=idempotency_owner_lost`), replayed for `unknownTtlMs`; it never
 *   runs again. An owner that was only slow finds its claim gone when it
 *   writes its outcome and leaves the record as it is.
 * - Outcome. A response is written as chunks of at most the value limit
 *   (`maxValueBytes`, the bucket's own and the server's max_payload) under
 *   `d.<sha256>.<claim>.<i>`, then the record becomes `completed`, naming
 *   their size and SHA-256, replayed until `completedTtlMs` has passed. A
 *   response over `maxResponseBytes`, or one the bucket has no room for, is
 *   `completed_unreplayable`. An unknown-outcome failure becomes `failed`,
 *   replayed for `unknownTtlMs`; any other failure `released`: the key may
 *   run again, and the calls that waited get the failure.
 *
 * The bucket going away. Until the bucket is reachable, and from the moment
 * it is not (a lost connection, an operation that timed out), the store is
 * degraded (`degraded`, logged once per change): new keys go to this
 * process's memory store (per replica, so a retry that reaches another
 * replica runs again), or are refused with `whenUnavailable: refuse`. A call
 * that had claimed its key runs on and returns its response; the owner
 * keeps trying to write the outcome for `leaseMs`, then keeps it in memory.
 * A call waiting for another replica's run waits up to `leaseMs` for the
 * bucket to come back, then is answered with an unknown outcome: it must
 * not run the work itself. A claim whose write timed out may have been
 * stored: the call runs in memory, and the other replicas, finding the
 * claim never refreshed, take it over as an unknown outcome: the work never
 * runs twice because of it. Keys this process held in memory while degraded
 * are answered from memory afterwards too.
 */
import { createHash, randomBytes } from "node:crypto";
import { hostname } from "node:os";
import type { KvEntry } from "nats";
import type { Logger } from "pino";
import { interruptibleWait, raceAbort, settleWithin } from "../../util/index.js";
import type { IdempotencyNatsConfig } from "../config.js";
import { ImageError, toImageError } from "../core/errors.js";
import type { ImageResponse } from "../model.js";
import {
  callerGaveUp,
  completedUnreplayable,
  idempotencyConflict,
  isUnknownOutcome,
  MemoryIdempotencyStore,
  waitForRun,
  type IdempotencyAnswer,
  type IdempotencyLimits,
  type IdempotencyStore,
  type IdempotentResult,
  type IdempotentWork,
} from "./idempotency.js";
import { IdempotencyStoreError, NatsBucket, type KeyWatch } from "./idempotency-nats-bucket.js";
import {
  checkLayout,
  chunkLength,
  decodeRecord,
  decodeResponse,
  encodeRecord,
  encodeResponse,
  errorFromStored,
  IdempotencyRecordError,
  MAX_RECORD_BYTES,
  sha256Of,
  storedError,
  type CompletedRecord,
  type PendingRecord,
  type StoredRecord,
} from "./idempotency-record.js";

/** How much longer than the longest TTL the bucket keeps values: chunks are written before their record. */
export const BUCKET_TTL_MARGIN_MS = 3_600_000;
/** The largest chunk a reader accepts (the largest maxValueBytes). */
const MAX_CHUNK_BYTES = 64 * 1024 * 1024;
/** Chunk reads or writes in flight per response. */
const CHUNK_CONCURRENCY = 4;
/** Times a call reads the key again after losing a race to write it, before it gives up (`overloaded`). */
const MAX_ROUNDS = 16;

export interface NatsIdempotencyStoreOptions {
  /** Limits and TTLs of the keys; the limits bound the memory store used while the bucket is unreachable. */
  readonly limits: IdempotencyLimits;
  readonly nats: IdempotencyNatsConfig;
  readonly logger: Logger;
  /** Told how each call was answered (the metrics). */
  readonly observe?: (answer: IdempotencyAnswer) => void;
  /** Told of each claim taken over from a replica that stopped refreshing it. */
  readonly onTakeover?: () => void;
  /** The wall clock of expiry times (they are compared across replicas). */
  readonly now?: () => number;
  /** This replica, as records name their owner (default host name and pid). */
  readonly owner?: string;
}

/** One call to `run`, as it goes through the protocol. */
interface Call {
  readonly scope: string;
  readonly key: string;
  readonly recordKey: string;
  readonly id: string;
  readonly fingerprint: string;
  readonly signal: AbortSignal;
  readonly work: IdempotentWork;
  /** The caller's ear for how the call is answered (IdempotencyStore.run). */
  readonly onAnswer: (answer: IdempotencyAnswer) => void;
  /** Whether the call has been counted (once, by how it was first answered). */
  answered: boolean;
}

/** A run this replica owns: calls here with the same key join it in memory. */
interface LocalRun {
  readonly fingerprint: string;
  readonly result: Promise<ImageResponse>;
}

/** What a key's record says a call should do. */
type Verdict =
  | { readonly kind: "claim"; readonly over?: KvEntry; readonly stale?: CompletedRecord }
  | { readonly kind: "conflict" }
  | { readonly kind: "replay"; readonly record: CompletedRecord }
  | { readonly kind: "failed"; readonly error: ImageError }
  | { readonly kind: "join"; readonly entry: KvEntry; readonly record: PendingRecord };

type Outcome = { readonly response: ImageResponse } | { readonly error: ImageError };

const isStoreError = (error: unknown, code?: IdempotencyStoreError["code"]): error is IdempotencyStoreError =>
  error instanceof IdempotencyStoreError && (code === undefined || error.code === code);

/** The answer to a key whose owner stopped refreshing its claim: it may have dispatched the work. */
function ownerLost(): ImageError {
  return new ImageError("timeout", "the replica running this idempotency key stopped before it recorded the outcome", {
    details: { stage: "idempotency_owner_lost", outcome: "unknown" },
    suggestions: ["The images may have been produced, and billed; do not blindly retry. Use a new idempotency key to generate again."],
  });
}

/** The answer to a call that waited for another replica's run when the bucket went away. */
function lostWhileWaiting(): ImageError {
  return new ImageError("timeout", "the idempotency store became unreachable while this call waited for the run of its key on another replica", {
    details: { stage: "idempotency_store", outcome: "unknown" },
    suggestions: ["The run may have produced, and billed, the images; retry with the same idempotency key once the store is back to get its result."],
  });
}

function cancelledBeforeLookup(): ImageError {
  return new ImageError("cancelled", "the request was cancelled before its idempotency key was looked up");
}

function unreadableRecord(): ImageError {
  return new ImageError("internal", "the stored record of this idempotency key cannot be read", {
    details: { outcome: "unknown" },
    suggestions: ["Use a new idempotency key to generate again, and report the failure with the request id."],
  });
}

function refused(retryAfterMs: number): ImageError {
  return new ImageError("overloaded", "the shared idempotency store is unreachable: requests with an idempotency key are refused until it is back", {
    retryable: true,
    details: { limit: "idempotency_store", retry_after_ms: retryAfterMs },
    suggestions: ["Retry later with the same idempotency key, or send the request without one."],
  });
}

function bucketFull(): ImageError {
  return new ImageError("overloaded", "too many idempotency keys are in use", {
    retryable: true,
    details: { limit: "idempotency" },
    suggestions: ["Retry later, or raise images.idempotency.nats.maxBucketBytes (for a new bucket) or the bucket's size."],
  });
}

function contended(): ImageError {
  return new ImageError("overloaded", "the idempotency key kept changing while this call read it", {
    retryable: true,
    details: { limit: "idempotency" },
    suggestions: ["Retry with the same idempotency key."],
  });
}

/** Runs `task` for 0..count-1, at most `limit` at a time; the first failure wins. */
async function eachLimited(count: number, limit: number, task: (index: number) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < count) await task(next++);
  };
  await Promise.all(Array.from({ length: Math.min(limit, count) }, worker));
}

export class NatsIdempotencyStore implements IdempotencyStore {
  private readonly bucket: NatsBucket;
  private readonly local: MemoryIdempotencyStore;
  private readonly running = new Map<string, LocalRun>();
  private readonly settling = new Set<Promise<void>>();
  private readonly closing = new AbortController();
  private readonly nats: IdempotencyNatsConfig;
  private readonly limits: IdempotencyLimits;
  private readonly logger: Logger;
  private readonly observe: (answer: IdempotencyAnswer) => void;
  private readonly onTakeover: () => void;
  private readonly now: () => number;
  private readonly owner: string;
  private readonly ttlMs: number;
  private wasDegraded = false;

  constructor(options: NatsIdempotencyStoreOptions) {
    this.nats = options.nats;
    this.limits = options.limits;
    this.logger = options.logger;
    this.observe = options.observe ?? (() => undefined);
    this.onTakeover = options.onTakeover ?? (() => undefined);
    this.now = options.now ?? Date.now;
    this.owner = options.owner ?? `${hostname()}:${process.pid}`;
    this.ttlMs = Math.max(this.limits.completedTtlMs, this.limits.unknownTtlMs) + BUCKET_TTL_MARGIN_MS;
    this.local = new MemoryIdempotencyStore(this.limits, this.now, this.observe);
    this.bucket = new NatsBucket(this.nats, { ttlMs: this.ttlMs }, (available, reason) => this.changed(available, reason));
  }

  /** Starts connecting to the bucket; calls meanwhile wait for the first attempt (at most about connectTimeoutMs). */
  start(): void {
    this.bucket.start();
  }

  /** True while the bucket is unreachable and keys are kept (or refused) by this process alone. */
  get degraded(): boolean {
    return this.bucket.unavailable;
  }

  /** Lets outcomes being written finish (briefly), then closes the connection. */
  async close(): Promise<void> {
    this.closing.abort();
    await settleWithin(Promise.allSettled([...this.settling]), this.nats.requestTimeoutMs * 2);
    await this.bucket.close();
  }

  async run(
    scope: string,
    key: string,
    fingerprint: string,
    signal: AbortSignal,
    work: IdempotentWork,
    onAnswer: (answer: IdempotencyAnswer) => void = () => undefined,
  ): Promise<IdempotentResult> {
    // Keys this process ran (or kept) while the bucket was unreachable are answered from memory.
    if (this.local.holds(scope, key)) return this.local.run(scope, key, fingerprint, signal, work, onAnswer);
    const id = createHash("sha256").update(`${scope}\u0000${key}`).digest("hex");
    const mine = this.running.get(id);
    if (mine) return this.joinLocal(mine, fingerprint, signal, onAnswer);
    const call: Call = { scope, key, recordKey: `r.${id}`, id, fingerprint, signal, work, onAnswer, answered: false };
    await this.bucket.started(signal);
    if (signal.aborted) throw cancelledBeforeLookup();
    if (!this.bucket.available) return this.withoutBucket(call);
    return this.shared(call);
  }

  /** A record as written: within the bucket's value limit too. */
  private encode(record: StoredRecord): Uint8Array {
    return encodeRecord(record, Math.min(MAX_RECORD_BYTES, this.bucket.valueLimit));
  }

  private answer(call: Call, answer: IdempotencyAnswer): void {
    if (call.answered) return;
    call.answered = true;
    this.observe(answer);
    call.onAnswer(answer);
  }

  private async joinLocal(run: LocalRun, fingerprint: string, signal: AbortSignal, onAnswer: (answer: IdempotencyAnswer) => void): Promise<IdempotentResult> {
    if (run.fingerprint !== fingerprint) {
      this.observe("conflict");
      onAnswer("conflict");
      throw idempotencyConflict();
    }
    this.observe("joined");
    onAnswer("joined");
    return { response: await waitForRun(run.result, signal), replayed: true };
  }

  /** Keys in this process's memory while the bucket is unreachable, or refused. */
  private async withoutBucket(call: Call): Promise<IdempotentResult> {
    // A refused call ran nothing and replayed nothing: it is not counted.
    if (this.nats.whenUnavailable === "refuse") throw refused(Math.max(this.nats.reconnectWaitMs, 1000));
    return this.local.run(call.scope, call.key, call.fingerprint, call.signal, call.work, call.onAnswer);
  }

  private async shared(call: Call): Promise<IdempotentResult> {
    for (let round = 0; round < MAX_ROUNDS; round += 1) {
      let entry: KvEntry | null;
      try {
        entry = await raceAbort(this.bucket.get(call.recordKey), call.signal);
      } catch (error) {
        if (call.signal.aborted && !call.answered) throw cancelledBeforeLookup();
        if (call.signal.aborted) throw callerGaveUp();
        return this.bucketFailed(call, error);
      }
      const verdict = this.inspect(call, entry);
      switch (verdict.kind) {
        case "conflict":
          this.answer(call, "conflict");
          throw idempotencyConflict();
        case "failed":
          this.answer(call, "replayed");
          throw verdict.error;
        case "replay":
          this.answer(call, "replayed");
          return { response: await this.replay(call, verdict.record), replayed: true };
        case "join": {
          this.answer(call, "joined");
          const joined = await this.join(call, verdict.entry, verdict.record);
          if (joined === "reopened") continue;
          return { response: await this.replay(call, joined), replayed: true };
        }
        case "claim": {
          let claimed: Awaited<ReturnType<typeof this.claim>>;
          try {
            claimed = await this.claim(call, verdict);
          } catch (error) {
            return this.bucketFailed(call, error);
          }
          if (claimed === "lost") continue;
          this.answer(call, "executed");
          return this.execute(call, claimed.record, claimed.revision);
        }
      }
    }
    throw contended();
  }

  /** What the record read under the key tells this call to do. */
  private inspect(call: Call, entry: KvEntry | null): Verdict {
    if (entry === null || entry.operation !== "PUT") return { kind: "claim" };
    let record: StoredRecord;
    try {
      record = decodeRecord(entry.value);
    } catch (error) {
      this.logger.warn({ err: error, key: call.recordKey, revision: entry.revision }, "an idempotency record cannot be read; the key answers an unknown outcome");
      return { kind: "failed", error: unreadableRecord() };
    }
    if (record.state === "released") return { kind: "claim", over: entry };
    if (record.state !== "pending" && record.expiresAt <= this.now()) {
      return { kind: "claim", over: entry, ...(record.state === "completed" ? { stale: record } : {}) };
    }
    if (record.fingerprint !== call.fingerprint) return { kind: "conflict" };
    switch (record.state) {
      case "completed":
        return { kind: "replay", record };
      case "failed":
        return { kind: "failed", error: errorFromStored(record.error) };
      case "pending":
        return { kind: "join", entry, record };
    }
  }

  /**
   * Writes this call's claim over what it read: the claim or, when another
   * writer came first, `lost` (read again). A write whose fate is unknown
   * throws `unavailable` (the bucket is then unreachable).
   */
  private async claim(call: Call, verdict: Extract<Verdict, { kind: "claim" }>): Promise<{ record: PendingRecord; revision: number } | "lost"> {
    const record: PendingRecord = {
      state: "pending",
      fingerprint: call.fingerprint,
      claim: randomBytes(8).toString("hex"),
      owner: this.owner,
      heartbeatAt: this.now(),
      leaseMs: this.nats.leaseMs,
    };
    const value = this.encode(record);
    try {
      // Not cut short by the caller's signal: whoever claims must know it did.
      const revision = verdict.over ? await this.bucket.update(call.recordKey, value, verdict.over.revision) : await this.bucket.create(call.recordKey, value);
      if (verdict.stale) this.purgeChunks(call.id, verdict.stale);
      return { record, revision };
    } catch (error) {
      if (isStoreError(error, "wrong_revision")) return "lost";
      if (isStoreError(error, "full")) throw bucketFull();
      throw error;
    }
  }

  /**
   * The bucket failed before this call claimed anything: its key goes to
   * memory (or is refused). A claim whose write timed out may be stored:
   * nobody refreshes it, so the other replicas take it over as an unknown
   * outcome, and the work still runs once.
   */
  private async bucketFailed(call: Call, error: unknown): Promise<IdempotentResult> {
    if (!isStoreError(error)) throw error;
    // A call that was told to wait for another replica must not run the work itself.
    if (call.answered) throw lostWhileWaiting();
    return this.withoutBucket(call);
  }

  // ---------------------------------------------------------------- owner

  private async execute(call: Call, record: PendingRecord, revision: number): Promise<IdempotentResult> {
    const result = call.work();
    const run: LocalRun = { fingerprint: call.fingerprint, result };
    this.running.set(call.id, run);
    const heartbeat = new Heartbeat(this.bucket, call.recordKey, record, revision, this.nats.heartbeatMs, this.now, this.closing.signal);
    const recordOutcome = (outcome: Outcome) => {
      // Tracked from the moment there is an outcome to write: `close` waits for these, not for the work.
      const writing: Promise<void> = this.settle(call, record, heartbeat, outcome)
        .catch((error: unknown) => this.logger.error({ err: error, key: call.recordKey }, "recording an idempotency outcome failed"))
        .finally(() => {
          if (this.running.get(call.id) === run) this.running.delete(call.id);
          this.settling.delete(writing);
        });
      this.settling.add(writing);
    };
    result.then(
      (response) => recordOutcome({ response }),
      (error: unknown) => recordOutcome({ error: toImageError(error) }),
    );
    return { response: await waitForRun(result, call.signal), replayed: false };
  }

  /** The record an outcome becomes (a completed one names its chunks, of `chunkBytes` each). */
  private recordOf(claim: PendingRecord, outcome: Outcome, blob: Buffer | undefined, chunkBytes: number): StoredRecord {
    const now = this.now();
    if ("response" in outcome) {
      if (blob === undefined) {
        return { state: "failed", fingerprint: claim.fingerprint, expiresAt: now + this.limits.completedTtlMs, error: storedError(completedUnreplayable("images.idempotency.nats.maxResponseBytes")) };
      }
      return {
        state: "completed",
        fingerprint: claim.fingerprint,
        claim: claim.claim,
        expiresAt: now + this.limits.completedTtlMs,
        size: blob.byteLength,
        sha256: sha256Of(blob),
        chunkBytes,
        chunks: Math.ceil(blob.byteLength / chunkBytes),
      };
    }
    if (isUnknownOutcome(outcome.error)) return { state: "failed", fingerprint: claim.fingerprint, expiresAt: now + this.limits.unknownTtlMs, error: storedError(outcome.error) };
    return { state: "released", fingerprint: claim.fingerprint, claim: claim.claim, error: storedError(outcome.error) };
  }

  /**
   * Writes the outcome over the claim: the chunks first, then the record,
   * retried while the bucket is unreachable for up to `leaseMs`. A claim
   * taken over meanwhile is left as it is.
   */
  private async settle(call: Call, claim: PendingRecord, heartbeat: Heartbeat, outcome: Outcome): Promise<void> {
    let { revision, lost } = await heartbeat.stop();
    let blob: Buffer | undefined;
    if ("response" in outcome) {
      const encoded = encodeResponse(outcome.response);
      if (encoded.byteLength <= this.nats.maxResponseBytes) blob = encoded;
    }
    const giveUpAt = performance.now() + this.nats.leaseMs;
    let written: CompletedRecord | undefined;
    while (!lost) {
      const record = this.recordOf(claim, outcome, blob, this.bucket.valueLimit);
      try {
        if (record.state === "completed") {
          written = record;
          await this.writeChunks(call.id, blob!, record);
        }
        await this.bucket.update(call.recordKey, this.encode(record), revision);
        return;
      } catch (error) {
        if (isStoreError(error, "wrong_revision")) {
          const current = await this.stillOurs(call.recordKey, claim);
          if (current === "lost") lost = true;
          else if (current !== "unknown") revision = current;
          if (current !== "unknown") continue;
        } else if (isStoreError(error, "full") && blob !== undefined) {
          // No room for the response: the key is answered as unreplayable, and never runs again.
          this.logger.warn({ key: call.recordKey, bytes: blob.byteLength }, "the idempotency bucket has no room for a response; its key answers completed_unreplayable");
          if (written) this.purgeChunks(call.id, written);
          blob = undefined;
          continue;
        } else if (isStoreError(error, "full")) {
          break;
        } else if (!isStoreError(error, "unavailable")) {
          throw error;
        }
        const left = giveUpAt - performance.now();
        if (left <= 0 || this.closing.signal.aborted) break;
        await this.bucket.whenAvailable(Math.min(left, this.nats.heartbeatMs), this.closing.signal);
      }
    }
    if (lost) {
      this.logger.warn({ key: call.recordKey, claim: claim.claim }, "an idempotency claim was taken over before its outcome was recorded; the key answers an unknown outcome");
      if (written) this.purgeChunks(call.id, written);
    } else {
      this.logger.warn({ key: call.recordKey, claim: claim.claim }, "the outcome of an idempotency key could not be recorded; this replica keeps it, the others will take the claim over as an unknown outcome");
    }
    this.local.remember(call.scope, call.key, call.fingerprint, outcome);
  }

  /**
   * The record's revision when it is still this claim's pending record (a
   * write that timed out may have landed), `lost` when it is another's,
   * `unknown` when the bucket cannot tell now.
   */
  private async stillOurs(recordKey: string, claim: PendingRecord): Promise<number | "lost" | "unknown"> {
    let entry: KvEntry | null;
    try {
      entry = await this.bucket.get(recordKey);
    } catch {
      return "unknown";
    }
    if (entry === null || entry.operation !== "PUT") return "lost";
    try {
      const record = decodeRecord(entry.value);
      return record.state === "pending" && record.claim === claim.claim ? entry.revision : "lost";
    } catch {
      return "lost";
    }
  }

  private chunkKey(id: string, record: CompletedRecord, index: number): string {
    return `d.${id}.${record.claim}.${index}`;
  }

  private async writeChunks(id: string, blob: Buffer, record: CompletedRecord): Promise<void> {
    await eachLimited(record.chunks, CHUNK_CONCURRENCY, async (index) => {
      const start = index * record.chunkBytes;
      await this.bucket.put(this.chunkKey(id, record, index), blob.subarray(start, start + chunkLength(record, index)));
    });
  }

  /** Removes a completed record's chunks, best effort: the bucket's TTL removes them anyway. */
  private purgeChunks(id: string, record: CompletedRecord): void {
    void eachLimited(record.chunks, CHUNK_CONCURRENCY, (index) => this.bucket.purge(this.chunkKey(id, record, index))).catch(() => undefined);
  }

  // ---------------------------------------------------------------- readers

  /** The stored response of a completed record; one that cannot be read is `completed_unreplayable` (it never runs again). */
  private async replay(call: Call, record: CompletedRecord): Promise<ImageResponse> {
    try {
      checkLayout(record, this.nats.maxResponseBytes, MAX_CHUNK_BYTES);
      const blob = Buffer.allocUnsafe(record.size);
      await eachLimited(record.chunks, CHUNK_CONCURRENCY, async (index) => {
        const entry = await this.patiently(call, () => this.bucket.get(this.chunkKey(call.id, record, index)));
        if (entry === null || entry.operation !== "PUT") throw new IdempotencyRecordError("MALFORMED", `chunk ${index} of a stored response is missing`);
        if (entry.value.byteLength !== chunkLength(record, index)) throw new IdempotencyRecordError("MALFORMED", `chunk ${index} of a stored response has the wrong length`);
        blob.set(entry.value, index * record.chunkBytes);
      });
      if (sha256Of(blob) !== record.sha256) throw new IdempotencyRecordError("DIGEST_MISMATCH", "a stored response does not have its recorded SHA-256");
      return decodeResponse(blob);
    } catch (error) {
      if (!(error instanceof IdempotencyRecordError)) throw error;
      this.logger.warn({ err: error, key: call.recordKey }, "a stored idempotent response cannot be replayed");
      throw completedUnreplayable("images.idempotency.nats.maxResponseBytes");
    }
  }

  /** Runs a read, waiting (up to `leaseMs` each time, and the caller's signal) for the bucket while it is unreachable. */
  private async patiently<T>(call: Call, read: () => Promise<T>): Promise<T> {
    for (;;) {
      try {
        return await waitForRun(read(), call.signal);
      } catch (error) {
        if (!isStoreError(error, "unavailable")) throw error;
        if (!(await this.bucket.whenAvailable(this.nats.leaseMs, call.signal))) {
          if (call.signal.aborted) throw callerGaveUp();
          throw lostWhileWaiting();
        }
      }
    }
  }

  /**
   * Waits for another replica's run: its completed record, its failure
   * (thrown), or `reopened` when the key became free to claim. A claim not
   * refreshed for its lease is taken over as an unknown outcome.
   */
  private async join(call: Call, first: KvEntry, claim: PendingRecord): Promise<CompletedRecord | "reopened"> {
    let current = claim;
    let revision = first.revision;
    let seenAt = performance.now();
    let watch: KeyWatch | undefined;
    try {
      for (;;) {
        if (watch === undefined) {
          watch = await this.patiently(call, () => this.bucket.watch(call.recordKey));
          // A watch after an outage starts a new lease: the owner may have been cut off too.
          seenAt = performance.now();
        }
        const left = current.leaseMs - (performance.now() - seenAt);
        if (left <= 0) {
          const error = await this.takeOver(call, current, revision);
          if (error) throw error;
          seenAt = performance.now();
          continue;
        }
        let next: KvEntry | "idle" | "aborted";
        try {
          next = await watch.next(left, call.signal);
        } catch (error) {
          if (!isStoreError(error, "unavailable")) throw error;
          watch.stop();
          watch = undefined;
          continue;
        }
        if (next === "aborted") throw callerGaveUp();
        if (next === "idle") continue;
        if (next.revision !== revision) {
          revision = next.revision;
          seenAt = performance.now();
        }
        if (next.operation !== "PUT") return "reopened";
        const verdict = this.inspect(call, next);
        switch (verdict.kind) {
          case "join":
            // A heartbeat, or a new run of the same request after the last one was released.
            current = verdict.record;
            continue;
          case "replay":
            return verdict.record;
          case "failed":
            throw verdict.error;
          case "conflict":
            throw idempotencyConflict();
          case "claim": {
            // Released: the calls that waited for that run get its failure.
            const record = decodeRecord(next.value);
            if (record.state === "released" && record.claim === current.claim) throw errorFromStored(record.error);
            return "reopened";
          }
        }
      }
    } finally {
      watch?.stop();
    }
  }

  /** Replaces a claim whose owner stopped refreshing it with an unknown outcome; undefined when the record changed first. */
  private async takeOver(call: Call, claim: PendingRecord, revision: number): Promise<ImageError | undefined> {
    const error = ownerLost();
    const record: StoredRecord = { state: "failed", fingerprint: claim.fingerprint, expiresAt: this.now() + this.limits.unknownTtlMs, error: storedError(error) };
    try {
      await this.bucket.update(call.recordKey, this.encode(record), revision);
    } catch (failure) {
      if (isStoreError(failure)) return undefined;
      throw failure;
    }
    this.onTakeover();
    this.logger.warn(
      { key: call.recordKey, claim: claim.claim, owner: claim.owner, leaseMs: claim.leaseMs },
      "took over an idempotency claim its replica stopped refreshing: the key answers an unknown outcome",
    );
    return error;
  }

  // ---------------------------------------------------------------- reachability

  private changed(available: boolean, reason?: string): void {
    const where = { store: "nats", servers: this.nats.servers, bucket: this.nats.bucket };
    if (!available) {
      this.wasDegraded = true;
      const message =
        this.nats.whenUnavailable === "refuse"
          ? "idempotency store unreachable: requests with an idempotency key are refused until it is back"
          : "idempotency store unreachable: idempotency keys are process-local until it is back (a retry that reaches another replica runs again)";
      this.logger.warn({ ...where, reason }, message);
      return;
    }
    const ttl = this.bucket.bucketTtlMs;
    if (ttl > 0 && ttl < this.ttlMs - BUCKET_TTL_MARGIN_MS) {
      this.logger.warn({ ...where, bucketTtlMs: ttl, completedTtlMs: this.limits.completedTtlMs, unknownTtlMs: this.limits.unknownTtlMs }, "the idempotency bucket's TTL is shorter than the keys' TTLs: its records expire sooner");
    }
    this.logger.info(where, this.wasDegraded ? "idempotency store reachable again: idempotency keys are shared across replicas" : "idempotency store connected: idempotency keys are shared across replicas");
  }
}

/** The owner's refreshes of its claim, until its outcome is written. */
class Heartbeat {
  private revision: number;
  private lost = false;
  private readonly stopped = new AbortController();
  private readonly loop: Promise<void>;
  private readonly onClose = () => this.stopped.abort();

  constructor(
    private readonly bucket: NatsBucket,
    private readonly key: string,
    private readonly record: PendingRecord,
    revision: number,
    private readonly everyMs: number,
    private readonly now: () => number,
    /** The store closing: no more refreshes, whether the work ended or not. */
    private readonly closing: AbortSignal,
  ) {
    this.revision = revision;
    if (closing.aborted) this.stopped.abort();
    else closing.addEventListener("abort", this.onClose, { once: true });
    this.loop = this.beat();
  }

  private async beat(): Promise<void> {
    while (!this.lost) {
      if ((await interruptibleWait(this.everyMs, this.stopped.signal).done) === "aborted") return;
      try {
        const value = encodeRecord({ ...this.record, heartbeatAt: this.now() }, Math.min(MAX_RECORD_BYTES, this.bucket.valueLimit));
        this.revision = await this.bucket.update(this.key, value, this.revision);
      } catch (error) {
        // An unreachable bucket is tried again at the next beat; a changed record is either a
        // refresh that timed out but landed (still ours) or a takeover.
        if (isStoreError(error, "wrong_revision")) await this.recheck();
      }
    }
  }

  private async recheck(): Promise<void> {
    try {
      const entry = await this.bucket.get(this.key);
      const record = entry !== null && entry.operation === "PUT" ? decodeRecord(entry.value) : undefined;
      if (record?.state === "pending" && record.claim === this.record.claim) this.revision = entry!.revision;
      else this.lost = true;
    } catch {
      // Unknown for now: the next beat finds out.
    }
  }

  /** Stops refreshing; the revision to write the outcome over, and whether the claim was lost. */
  async stop(): Promise<{ revision: number; lost: boolean }> {
    this.closing.removeEventListener("abort", this.onClose);
    this.stopped.abort();
    await this.loop;
    return { revision: this.revision, lost: this.lost };
  }
}
