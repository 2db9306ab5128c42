import { createHash, type Hash } from "node:crypto";
import type { ImageRequest, ImageResponse } from "../model.js";
import { ImageError, toImageError } from "../core/errors.js";
import { validationError } from "../core/validation.js";
import { raceAbort } from "../../util/index.js";

/**
 * Idempotency keys: a call that repeats an earlier call's key (same scope,
 * same request) gets that call's result, or joins it while it runs, instead
 * of running, and paying, again.
 *
 * - Success: the response is replayed for `completedTtlMs`.
 * - Failure with `outcome=unknown`: the error is replayed for
 *   `unknownTtlMs`. The provider may have produced, and billed, the images,
 *   so a retry with the same key must not run them again.
 * - Any other failure (never dispatched, or a definite provider failure):
 *   forgotten, so the same key may run again.
 *
 * These are the semantics of every `IdempotencyStore`. This file has the
 * process-local one (`MemoryIdempotencyStore`) and the helpers they share;
 * `idempotency-nats.ts` keeps the keys in a NATS JetStream key-value bucket
 * shared by the replicas of a deployment.
 */

export interface IdempotencyLimits {
  /** Entries kept at once: pending, completed and replayed failures. */
  readonly maxEntries: number;
  /** Weight of completed responses kept (image bytes plus metadata). */
  readonly maxCompletedBytes: number;
  readonly completedTtlMs: number;
  readonly unknownTtlMs: number;
}

export const DEFAULT_IDEMPOTENCY_LIMITS: IdempotencyLimits = Object.freeze({
  maxEntries: 10_000,
  maxCompletedBytes: 256 * 1024 * 1024,
  completedTtlMs: 86_400_000,
  unknownTtlMs: 86_400_000,
});

/** Longest idempotency-key header accepted (validation then limits the key to maxIdentifierBytes). */
export const MAX_IDEMPOTENCY_HEADER_BYTES = 512;
/** The request header carrying the key (HTTP's Idempotency-Key; gRPC metadata is lower case). */
export const IDEMPOTENCY_HEADER = "idempotency-key";
/** Set on a response that was replayed or joined rather than run. */
export const IDEMPOTENCY_REPLAYED_HEADER = "idempotency-replayed";
/** Fixed overhead added to each completed response's weight. */
const ENTRY_OVERHEAD_BYTES = 256;

type Entry =
  | { readonly state: "pending"; readonly fingerprint: string; readonly result: Promise<ImageResponse> }
  | { readonly state: "completed"; readonly fingerprint: string; readonly response: ImageResponse; readonly bytes: number; readonly expiresAt: number }
  | { readonly state: "failed"; readonly fingerprint: string; readonly error: ImageError; readonly expiresAt: number };

/** How a call with an idempotency key was answered: it ran the work, got a stored answer (or failure), joined the run in flight, or used the key with another request. */
export type IdempotencyAnswer = "executed" | "replayed" | "joined" | "conflict";

export interface IdempotentResult {
  readonly response: ImageResponse;
  /** False for the call that ran the work; true for a replay or a joined call. */
  readonly replayed: boolean;
}

/** The work of a keyed call; it must not depend on the caller's cancellation. */
export type IdempotentWork = () => Promise<ImageResponse>;

/**
 * Where idempotency keys live. `run` runs `work` for the first call with
 * (scope, key); later calls with the same fingerprint get its result
 * (joining it while it runs), with a different one `idempotency_conflict`.
 * `signal` ends only this caller's wait (`cancelled`), never the work, so a
 * client that drops and retries finds the result. `onAnswer`, when given,
 * hears how this call is answered as soon as the store knows it (before a
 * joined call's wait), so a stream can announce itself.
 */
export interface IdempotencyStore {
  run(scope: string, key: string, fingerprint: string, signal: AbortSignal, work: IdempotentWork, onAnswer?: (answer: IdempotencyAnswer) => void): Promise<IdempotentResult>;
}

/** The answer to the same key with another request, from every store alike. */
export function idempotencyConflict(): ImageError {
  return new ImageError("idempotency_conflict", "the idempotency key was used with a different request", {
    details: { field: "idempotency_key" },
  });
}

/** The answer to a key whose successful response was too large to keep: it is not run again, and not replayed. */
export function completedUnreplayable(setting = "images.idempotency.maxCompletedBytes"): ImageError {
  return new ImageError("overloaded", "the response of this idempotency key is too large to replay", {
    retryable: false,
    details: { outcome: "completed_unreplayable", limit: "idempotency" },
    suggestions: [`The first call with this key succeeded; use a new key to generate again, or raise ${setting}.`],
  });
}

/**
 * Waits for a run's result on behalf of one caller: the caller giving up
 * (`signal`) is answered `cancelled` while the run goes on.
 */
export async function waitForRun<T>(result: Promise<T>, signal: AbortSignal): Promise<T> {
  try {
    return await raceAbort(result, signal);
  } catch (error) {
    if (signal.aborted && !(error instanceof ImageError)) throw callerGaveUp();
    throw error;
  }
}

/** What a caller that stopped waiting for a keyed run is told. */
export function callerGaveUp(): ImageError {
  return new ImageError("cancelled", "the request was cancelled; the call with this idempotency key goes on", {
    suggestions: ["Retry with the same idempotency key to get the result."],
  });
}

/** Whether a failure must be remembered under its key (the provider may have billed) rather than forgotten. */
export function isUnknownOutcome(error: ImageError): boolean {
  return error.details["outcome"] === "unknown";
}

function invalid(field: string, code: string, message: string): ImageError {
  return validationError([{ field, code, message }]);
}

/**
 * The request with the key of the `idempotency-key` header, if any. The
 * header must be visible ASCII of 1..512 bytes and equal any
 * `idempotency_key` in the request.
 */
export function withHeaderKey(request: ImageRequest, headers: Headers): ImageRequest {
  const header = headers.get(IDEMPOTENCY_HEADER);
  if (header === null) return request;
  if (!/^[\x21-\x7e]+$/.test(header) || header.length > MAX_IDEMPOTENCY_HEADER_BYTES) {
    throw invalid("idempotency_key", "invalid", `the ${IDEMPOTENCY_HEADER} header must be 1 to ${MAX_IDEMPOTENCY_HEADER_BYTES} visible ASCII characters`);
  }
  if (request.idempotencyKey !== undefined && request.idempotencyKey !== header) {
    throw invalid("idempotency_key", "mismatch", `the ${IDEMPOTENCY_HEADER} header and idempotency_key differ`);
  }
  return { ...request, idempotencyKey: header };
}

/** The key space of a caller: its bearer credential (hashed), or one shared anonymous scope. */
export function scopeOf(headers: Headers): string {
  const authorization = headers.get("authorization");
  if (authorization === null || authorization === "") return "anonymous";
  return `bearer:${createHash("sha256").update(authorization).digest("hex")}`;
}

function feed(hash: Hash, value: unknown): void {
  if (value instanceof Uint8Array) {
    hash.update(`b${value.byteLength}:`);
    hash.update(value);
  } else if (Array.isArray(value)) {
    hash.update(`[${value.length}:`);
    for (const item of value) {
      feed(hash, item);
      hash.update(",");
    }
    hash.update("]");
  } else if (value !== null && typeof value === "object") {
    const record = value as Record<string, unknown>;
    hash.update("{");
    for (const key of Object.keys(record).sort()) {
      if (record[key] === undefined) continue;
      hash.update(`${JSON.stringify(key)}:`);
      feed(hash, record[key]);
      hash.update(",");
    }
    hash.update("}");
  } else {
    hash.update(JSON.stringify(value) ?? "null");
  }
}

/**
 * SHA-256 of the normalized request (defaults filled in, as the service
 * reads it off the wire) without idempotency_key and timeout_ms: two calls
 * are "the same request" exactly when this matches. Input images are hashed
 * by content.
 */
export function requestFingerprint(request: ImageRequest): string {
  const { idempotencyKey: _key, timeoutMs: _timeout, ...rest } = request;
  const hash = createHash("sha256");
  feed(hash, rest);
  return hash.digest("hex");
}

function entryId(scope: string, key: string): string {
  return `${scope}\u0000${key}`;
}

/** What a completed response costs to keep: its image bytes plus its metadata as JSON. */
export function responseWeight(response: ImageResponse): number {
  let images = 0;
  const data = response.data.map((image) => {
    images += image.data?.byteLength ?? 0;
    return { ...image, data: undefined };
  });
  return ENTRY_OVERHEAD_BYTES + images + Buffer.byteLength(JSON.stringify({ ...response, data }));
}

/** Process-local, bounded, TTL'd store of idempotent calls; expiry is checked lazily, no timers. */
export class MemoryIdempotencyStore implements IdempotencyStore {
  private readonly entries = new Map<string, Entry>();
  private completedBytes = 0;

  constructor(
    private readonly limits: IdempotencyLimits = DEFAULT_IDEMPOTENCY_LIMITS,
    private readonly now: () => number = Date.now,
    /** Told how each call was answered (the metrics). */
    private readonly observe: (answer: IdempotencyAnswer) => void = () => undefined,
  ) {}

  get size(): number {
    return this.entries.size;
  }

  get bytes(): number {
    return this.completedBytes;
  }

  async run(
    scope: string,
    key: string,
    fingerprint: string,
    signal: AbortSignal,
    work: IdempotentWork,
    onAnswer: (answer: IdempotencyAnswer) => void = () => undefined,
  ): Promise<IdempotentResult> {
    const answer = (how: IdempotencyAnswer) => {
      this.observe(how);
      onAnswer(how);
    };
    const id = entryId(scope, key);
    const existing = this.lookup(id);
    if (existing) {
      if (existing.fingerprint !== fingerprint) {
        answer("conflict");
        throw idempotencyConflict();
      }
      answer(existing.state === "pending" ? "joined" : "replayed");
      if (existing.state === "completed") return { response: existing.response, replayed: true };
      if (existing.state === "failed") throw existing.error;
      return { response: await waitForRun(existing.result, signal), replayed: true };
    }
    answer("executed");
    this.makeRoom();
    const result = work();
    const entry: Entry = { state: "pending", fingerprint, result };
    this.entries.set(id, entry);
    result.then(
      (response) => this.settle(id, entry, response, undefined),
      (error: unknown) => this.settle(id, entry, undefined, toImageError(error)),
    );
    return { response: await waitForRun(result, signal), replayed: false };
  }

  /** Whether (scope, key) has a live entry here: running, or a stored answer not yet expired. Changes nothing. */
  holds(scope: string, key: string): boolean {
    const entry = this.entries.get(entryId(scope, key));
    return entry !== undefined && (entry.state === "pending" || entry.expiresAt > this.now());
  }

  /**
   * Keeps the outcome of a run that happened elsewhere (a shared store that
   * could not record it), as if it had run here: later calls on this
   * process replay it. Best effort: with no room left it is not kept.
   */
  remember(scope: string, key: string, fingerprint: string, outcome: { readonly response: ImageResponse } | { readonly error: ImageError }): void {
    const id = entryId(scope, key);
    if (this.lookup(id)) return;
    try {
      this.makeRoom();
    } catch {
      return;
    }
    const placeholder: Entry = { state: "pending", fingerprint, result: new Promise<ImageResponse>(() => undefined) };
    this.entries.set(id, placeholder);
    if ("response" in outcome) this.settle(id, placeholder, outcome.response, undefined);
    else this.settle(id, placeholder, undefined, outcome.error);
  }

  /** The live entry under `id`, refreshed as most recently used; expired entries are dropped. */
  private lookup(id: string): Entry | undefined {
    const entry = this.entries.get(id);
    if (!entry) return undefined;
    if (entry.state !== "pending" && entry.expiresAt <= this.now()) {
      this.remove(id, entry);
      return undefined;
    }
    this.entries.delete(id);
    this.entries.set(id, entry);
    return entry;
  }

  private remove(id: string, entry: Entry): void {
    if (this.entries.get(id) !== entry) return;
    this.entries.delete(id);
    if (entry.state === "completed") this.completedBytes -= entry.bytes;
  }

  private sweepExpired(): void {
    const now = this.now();
    for (const [id, entry] of this.entries) if (entry.state !== "pending" && entry.expiresAt <= now) this.remove(id, entry);
  }

  /** Evicts least recently used completed responses until `fits` holds; false when it cannot. */
  private evictCompleted(fits: () => boolean): boolean {
    for (const [id, entry] of this.entries) {
      if (fits()) return true;
      if (entry.state === "completed") this.remove(id, entry);
    }
    return fits();
  }

  /**
   * Room for one more entry: expired entries go first, then the least
   * recently used completed responses. Pending calls and unknown-outcome
   * failures are never evicted (that could run a paid call twice), so a
   * store full of them refuses new keys with `overloaded`.
   */
  private makeRoom(): void {
    const fits = () => this.entries.size < this.limits.maxEntries;
    if (fits()) return;
    this.sweepExpired();
    if (this.evictCompleted(fits)) return;
    throw new ImageError("overloaded", "too many idempotency keys are in use", {
      retryable: true,
      details: { limit: "idempotency" },
      suggestions: ["Retry later, or raise images.idempotency.maxEntries."],
    });
  }

  private settle(id: string, pending: Entry, response: ImageResponse | undefined, error: ImageError | undefined): void {
    if (this.entries.get(id) !== pending) return;
    this.entries.delete(id);
    const now = this.now();
    if (response) {
      const bytes = responseWeight(response);
      if (bytes > this.limits.maxCompletedBytes) {
        // The caller that ran it has its response; a replay cannot have it and must not run it again.
        this.entries.set(id, { state: "failed", fingerprint: pending.fingerprint, error: completedUnreplayable(), expiresAt: now + this.limits.completedTtlMs });
        return;
      }
      this.sweepExpired();
      this.evictCompleted(() => this.completedBytes + bytes <= this.limits.maxCompletedBytes);
      this.entries.set(id, { state: "completed", fingerprint: pending.fingerprint, response, bytes, expiresAt: now + this.limits.completedTtlMs });
      this.completedBytes += bytes;
      return;
    }
    if (error && isUnknownOutcome(error)) {
      this.entries.set(id, { state: "failed", fingerprint: pending.fingerprint, error, expiresAt: now + this.limits.unknownTtlMs });
    }
  }
}
