/**
 * The shared idempotency store's way to its NATS JetStream key-value
 * bucket: it connects, binds the bucket (creating it when missing), knows
 * whether the bucket is reachable, and turns every operation's failure into
 * an IdempotencyStoreError with a stable code.
 *
 * Reachability. The bucket is `available` once bound, and unavailable from
 * the first failure that says the server cannot be reached (the client
 * disconnected, an operation timed out, JetStream or the bucket is gone)
 * until a new bind succeeds: a loop rebinds with a backoff from
 * `reconnectWaitMs`, at once when the client reconnects. The client itself
 * reconnects for ever. Every transition is reported (`onChange`), which is
 * how the store degrades to this process's memory and comes back. An
 * operation answered "no responders" did not happen (nothing took it): it is
 * tried again, with a short backoff, for up to `requestTimeoutMs` before it
 * counts as such a failure, so a stream that is set up or elects a leader
 * does not degrade the store for a moment's 503.
 *
 * Reads go to the stream leader (`allow_direct` off): a claim is decided by
 * a write that names the revision it read, and a chunk read from a replica
 * that lags would look missing.
 *
 * The quota store (../quota/nats.ts) keeps its buckets the same way, in a
 * key-value bucket of its own (`BucketSettings.what` names it in errors).
 */
import type * as NatsModule from "nats";
import type { KV, KvEntry, KvOptions, NatsConnection, QueuedIterator } from "nats";
import { backoffDelay, errorOf, interruptibleWait, MAX_TIMER_MS, settleWithin } from "../../util/index.js";
import { jetStreamErrorCode, natsConnectionOptions, noResponders, streamCreatedMeanwhile } from "../../nats/index.js";
import type { IdempotencyNatsConfig } from "../config.js";

/** Stable codes of IdempotencyStoreError. */
export type IdempotencyStoreErrorCode =
  /** The server, JetStream or the bucket cannot be reached now; whether the operation took effect is unknown. */
  | "unavailable"
  /** A write named a revision the key no longer has: another writer came first. */
  | "wrong_revision"
  /** The bucket or the message size limit refused the value. */
  | "full";

export class IdempotencyStoreError extends Error {
  override readonly name = "IdempotencyStoreError";
  constructor(
    readonly code: IdempotencyStoreErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** JetStream's "wrong last sequence": the expected revision did not match. */
const WRONG_LAST_SEQUENCE = 10071;
/** Room left in each value for the headers and subject of the message carrying it. */
const VALUE_HEADROOM_BYTES = 1024;
/**
 * Between tries of an operation answered "no responders" (a stream being set
 * up, or a clustered stream electing its leader: JetStream answers 503 for a
 * moment, though the server is there).
 */
const NO_RESPONDERS_BACKOFF = { minMs: 10, maxMs: 200 } as const;
/** How long `close` waits for the connection to drain. */
const DRAIN_TIMEOUT_MS = 2000;

function classify(error: unknown, store: string, operation: string): IdempotencyStoreError {
  if (error instanceof IdempotencyStoreError) return error;
  const e = errorOf(error) as Error & { api_error?: { err_code?: number; description?: string }; code?: string };
  const what = `${store} ${operation}: ${e.message}`;
  if (jetStreamErrorCode(e) === WRONG_LAST_SEQUENCE) return new IdempotencyStoreError("wrong_revision", what, { cause: e });
  if (e.code === "MAX_PAYLOAD_EXCEEDED" || /maximum (bytes|messages)|size exceeds|insufficient (resources|storage)/i.test(e.api_error?.description ?? e.message)) {
    return new IdempotencyStoreError("full", what, { cause: e });
  }
  return new IdempotencyStoreError("unavailable", what, { cause: e });
}

/** What the bucket is created with when it does not exist. */
export interface BucketSettings {
  /** Age past which the server drops a value (the bucket's TTL). */
  readonly ttlMs: number;
  /** What errors call the store ("idempotency store" by default). */
  readonly what?: string;
}

/** A key's values as a watch sees them: the current one first, then every change. */
export interface KeyWatch {
  /** The next value; `idle` after `waitMs` without one, `aborted` when `signal` fires. Throws `unavailable` once the watch is lost. */
  next(waitMs: number, signal: AbortSignal): Promise<KvEntry | "idle" | "aborted">;
  stop(): void;
}

type State = "starting" | "available" | "unavailable" | "closed";

let natsModule: Promise<typeof NatsModule> | undefined;

export class NatsBucket {
  private state: State = "starting";
  private nc: NatsConnection | undefined;
  private kv: KV | undefined;
  /** Until the bucket is bound, the configured limit. */
  private chunkLimit: number;
  private boundTtlMs = 0;
  private readonly stopping = new AbortController();
  private wakeWait: () => void = () => undefined;
  /** A wake-up that came while the loop was not waiting (binding): it must not wait then. */
  private woken = false;
  private loop: Promise<void> | undefined;
  private readonly firstAttempt: Promise<void>;
  private settleFirst: () => void = () => undefined;
  /** Woken on every transition: waiters for availability, and watches (which end when the bucket is lost). */
  private readonly listeners = new Set<() => void>();

  constructor(
    private readonly config: IdempotencyNatsConfig,
    private readonly settings: BucketSettings,
    /** Told of every change of reachability, with the reason when it is lost. */
    private readonly onChange: (available: boolean, reason?: string) => void,
  ) {
    this.firstAttempt = new Promise<void>((resolve) => (this.settleFirst = resolve));
    this.chunkLimit = config.maxValueBytes - VALUE_HEADROOM_BYTES;
  }

  /** Starts connecting (in the background). */
  start(): void {
    this.loop ??= this.maintain();
  }

  get available(): boolean {
    return this.state === "available";
  }

  /** True once the first connection attempt has failed and no bind has succeeded since. */
  get unavailable(): boolean {
    return this.state === "unavailable";
  }

  /** The largest value written: the configured one, the bucket's and the server's limits, less room for headers. */
  get valueLimit(): number {
    return this.chunkLimit;
  }

  /** The TTL of the bound bucket (0: none); an existing bucket keeps its own, which may be shorter than the store needs. */
  get bucketTtlMs(): number {
    return this.boundTtlMs;
  }

  /** Resolves once the first attempt to reach the bucket has succeeded or failed, or when `signal` fires. */
  async started(signal: AbortSignal): Promise<void> {
    if (this.state !== "starting" || signal.aborted) return;
    await new Promise<void>((resolve) => {
      const onAbort = () => resolve();
      signal.addEventListener("abort", onAbort, { once: true });
      void this.firstAttempt.then(() => {
        signal.removeEventListener("abort", onAbort);
        resolve();
      });
    });
  }

  /** Resolves true once the bucket is available, false after `waitMs` or when `signal` fires first. */
  async whenAvailable(waitMs: number, signal: AbortSignal): Promise<boolean> {
    const deadline = performance.now() + waitMs;
    while (!this.available) {
      const left = deadline - performance.now();
      if (left <= 0 || signal.aborted || this.state === "closed") return false;
      const wait = interruptibleWait(left, signal);
      this.listeners.add(wait.wake);
      await wait.done;
      this.listeners.delete(wait.wake);
    }
    return true;
  }

  async get(key: string): Promise<KvEntry | null> {
    return this.op("get", (kv) => kv.get(key));
  }

  /** Writes `key` if it has no value (or a deleted one); `wrong_revision` when it has one. */
  async create(key: string, value: Uint8Array): Promise<number> {
    return this.op("create", (kv) => kv.create(key, value));
  }

  /** Writes `key` if its revision is still `revision`; `wrong_revision` otherwise. */
  async update(key: string, value: Uint8Array, revision: number): Promise<number> {
    return this.op("update", (kv) => kv.update(key, value, revision));
  }

  async put(key: string, value: Uint8Array): Promise<number> {
    return this.op("put", (kv) => kv.put(key, value));
  }

  /** Removes `key`'s values (best effort: the bucket's TTL removes them anyway). */
  async purge(key: string): Promise<void> {
    await this.op("purge", (kv) => kv.purge(key));
  }

  async watch(key: string): Promise<KeyWatch> {
    const iterator = await this.op("watch", (kv) => kv.watch({ key }));
    return this.keyWatch(iterator);
  }

  /** Has the loop bind again now, or as soon as its current attempt ends. */
  private wakeLoop(): void {
    this.woken = true;
    this.wakeWait();
  }

  /** Stops reconnecting and drains the connection. */
  async close(): Promise<void> {
    this.stopping.abort();
    this.wakeLoop();
    await this.loop;
    this.setState("closed");
    const nc = this.nc;
    this.nc = undefined;
    this.kv = undefined;
    if (nc === undefined || nc.isClosed()) return;
    if (!(await settleWithin(nc.drain(), DRAIN_TIMEOUT_MS)) && !nc.isClosed()) await nc.close().catch(() => undefined);
  }

  private get what(): string {
    return this.settings.what ?? "idempotency store";
  }

  private async op<T>(name: string, run: (kv: KV) => Promise<T>): Promise<T> {
    const kv = this.kv;
    if (kv === undefined || this.state !== "available") throw new IdempotencyStoreError("unavailable", `${this.what} ${name}: the bucket is not reachable`);
    const deadline = performance.now() + this.config.requestTimeoutMs;
    for (let attempt = 0; ; attempt++) {
      try {
        return await run(kv);
      } catch (error) {
        // Nothing took the request: it did not happen, and is tried again for up to requestTimeoutMs before the bucket counts as lost.
        if (noResponders(error) && this.kv === kv && this.state === "available") {
          const waitMs = backoffDelay(attempt, NO_RESPONDERS_BACKOFF);
          if (performance.now() + waitMs < deadline && (await interruptibleWait(waitMs, this.stopping.signal).done) === "elapsed") continue;
        }
        const failure = classify(error, this.what, name);
        if (failure.code === "unavailable") this.lost(failure.message);
        throw failure;
      }
    }
  }

  private lost(reason: string): void {
    if (this.state !== "available") return;
    this.setState("unavailable", reason);
    this.wakeLoop();
  }

  private setState(state: State, reason?: string): void {
    const was = this.state;
    this.state = state;
    if (state !== "closed" && was !== state && (was === "available" || state === "available" || was === "starting")) {
      this.onChange(state === "available", reason);
    }
    for (const wake of [...this.listeners]) wake();
  }

  /** Connects and binds until it is closed; after a loss, binds again (with a backoff) until it succeeds. */
  private async maintain(): Promise<void> {
    let failures = 0;
    const stop = this.stopping.signal;
    while (!stop.aborted) {
      if (this.state !== "available") {
        try {
          await this.bind();
          failures = 0;
          this.setState("available");
        } catch (error) {
          if (stop.aborted) break;
          failures += 1;
          const reason = errorOf(error).message;
          if (this.state === "starting") this.setState("unavailable", reason);
        }
        this.settleFirst();
      }
      if (this.woken && this.state !== "available") {
        // The client reconnected (or the bucket was lost again) while binding: bind again at once.
        this.woken = false;
        continue;
      }
      this.woken = false;
      const waitMs = this.state === "available" ? MAX_TIMER_MS : backoffDelay(failures - 1, { minMs: Math.max(this.config.reconnectWaitMs, 50), maxMs: Math.max(this.config.reconnectWaitMs * 10, 1000) });
      const wait = interruptibleWait(waitMs, stop);
      this.wakeWait = wait.wake;
      await wait.done;
      this.wakeWait = () => undefined;
    }
    this.settleFirst();
  }

  private async bind(): Promise<void> {
    natsModule ??= import("nats");
    const nats = await natsModule;
    if (this.nc === undefined || this.nc.isClosed()) {
      // A first connection that fails is this loop's to retry, so that the store degrades at once.
      this.nc = await nats.connect(natsConnectionOptions(this.config));
      void this.followStatus(this.nc, nats);
    }
    const nc = this.nc;
    const options: Partial<KvOptions> = {
      history: 1,
      ttl: this.settings.ttlMs,
      maxBucketSize: this.config.maxBucketBytes,
      maxValueSize: this.config.maxValueBytes,
      replicas: this.config.replicas,
      storage: this.config.storage === "memory" ? nats.StorageType.Memory : nats.StorageType.File,
      timeout: this.config.requestTimeoutMs,
      allow_direct: false,
    };
    const js = nc.jetstream({ timeout: this.config.requestTimeoutMs });
    let kv: KV;
    try {
      kv = await js.views.kv(this.config.bucket, options);
    } catch (error) {
      // Replicas that start together on a new bucket race to create it: the one that loses is refused, and
      // binds to the bucket the other made, rather than degrading until its next attempt.
      if (!streamCreatedMeanwhile(error)) throw error;
      kv = await js.views.kv(this.config.bucket, options);
    }
    // An existing bucket keeps its own limits: values must fit them too.
    const status = await kv.status();
    const limits = [this.config.maxValueBytes, nc.info?.max_payload ?? this.config.maxValueBytes];
    if (status.maxValueSize > 0) limits.push(status.maxValueSize);
    this.chunkLimit = Math.min(...limits) - VALUE_HEADROOM_BYTES;
    this.kv = kv;
    this.boundTtlMs = status.ttl;
  }

  private async followStatus(nc: NatsConnection, nats: typeof NatsModule): Promise<void> {
    try {
      for await (const status of nc.status()) {
        if (status.type === nats.Events.Disconnect) this.lost("disconnected from the NATS server");
        else if (status.type === nats.Events.Reconnect) this.wakeLoop();
      }
    } catch {
      // The status stream ends with the connection.
    }
  }

  private keyWatch(iterator: QueuedIterator<KvEntry>): KeyWatch {
    const entries: KvEntry[] = [];
    let ended: IdempotencyStoreError | undefined;
    let wake: () => void = () => undefined;
    const end = (failure: IdempotencyStoreError) => {
      ended ??= failure;
      wake();
    };
    // A lost bucket ends the watch: the server may never send it another entry.
    const onChange = () => {
      if (!this.available) end(new IdempotencyStoreError("unavailable", `${this.what} watch: the bucket is not reachable`));
    };
    this.listeners.add(onChange);
    void (async () => {
      try {
        for await (const entry of iterator) {
          entries.push(entry);
          wake();
        }
        end(new IdempotencyStoreError("unavailable", `${this.what} watch: ended`));
      } catch (error) {
        end(classify(error, this.what, "watch"));
      }
    })();
    return {
      next: async (waitMs, signal) => {
        for (;;) {
          const entry = entries.shift();
          if (entry !== undefined) return entry;
          if (ended !== undefined) throw ended;
          if (signal.aborted) return "aborted";
          const wait = interruptibleWait(waitMs, signal);
          wake = wait.wake;
          const how = await wait.done;
          if (how === "elapsed" && entries.length === 0 && ended === undefined) return "idle";
        }
      },
      stop: () => {
        this.listeners.delete(onChange);
        iterator.stop();
      },
    };
  }
}
