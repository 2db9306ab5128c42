/**
 * RelayConsumer: mirrors every pool a KV relay publishes (C.7). Catalog and
 * pools are independent state machines:
 *
 * - Catalog: one WatchKvPoolCatalog stream. Every update is the whole
 *   catalog and replaces the local one: a pool that disappears drops its
 *   replica, a pool whose producer changed drops its replica and subscribes
 *   with the new expected producer, a new pool is subscribed. The stream is
 *   reopened after a failure or an end, with backoff; the pools keep going
 *   meanwhile.
 * - Pool: one SubscribeKvPool stream per catalogued producer, with that exact
 *   expected producer, fed into a fresh LaneMirror. Any violation, error
 *   status or clean end invalidates that pool only: its stream is closed,
 *   its replica dropped, and after bounded exponential backoff with jitter
 *   it subscribes again from a snapshot. The backoff resets when a snapshot
 *   is installed. By the reason the relay gave:
 *     CONTRACT_MISMATCH            stop the consumer: `run` resolves;
 *     UNSUPPORTED_FEATURE          quarantine the pool until its producer changes;
 *     POOL_NOT_FOUND, PRODUCER_CHANGED, PUBLICATION_UNAVAILABLE,
 *     INVALID_PUBLICATION, INTERNAL
 *                                  back off; the next catalog update retries at
 *                                  once (the watch is the catalog refresh: it
 *                                  withdraws or replaces the pool when that is
 *                                  what changed);
 *     anything else                back off.
 *
 * Every request carries the contract marker and the subscriber id. One
 * AbortSignal, given to `run`, ends everything; nothing a relay sends makes
 * `run` reject.
 */
import { randomBytes } from "node:crypto";
import { Code, ConnectError, createClient, type Client, type Transport } from "@connectrpc/connect";
import { KvEventRelay, type FilterUpdate } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { sameProducerIdentity, type PoolId, type ProducerIdentity } from "../../kv/index.js";
import { snapshotChunkCount } from "../cbi1/index.js";
import { checkSubscriberId, endpointName, producerToWire, RELAY_CONTRACT_MARKER, relayReasonOf, type PoolDescriptor } from "../wire/index.js";
import { backoffDelay, backoffOptions, cancelledOnExit, interruptibleWait, type BackoffOptions, type Wait } from "../../util/index.js";
import { readCatalogUpdate, type CatalogPool, type CatalogRejection, type CatalogSnapshot } from "./catalog.js";
import type { RelayIncarnation } from "./envelope.js";
import { isConsumerError } from "./errors.js";
import { LaneMirror, type SnapshotProgress } from "./lane-mirror.js";
import { LaneProbe, poolOverlap, PromptHashes, type PromptOptions } from "./overlap.js";
import type { CatalogView, ConsumerFailure, OverlapAnswer, PoolState, PoolView, RelayConsumerEvent, RelayConsumerListener, RunResult } from "./types.js";

export interface RelayConsumerOptions {
  /** How to reach the relay (a gRPC transport; raise its read limit to at least 8 MiB if it has one). */
  readonly transport: Transport;
  /** subscriber_id of every request: non-empty, at most 128 UTF-8 bytes, no control characters. Default "mmgate-consumer-<random>". */
  readonly subscriberId?: string;
  /** The relay's label in overlap answers (its address as configured). Default "". */
  readonly relay?: string;
  /** Backoff between a failed stream and the next (default 100 ms .. 10 s). */
  readonly backoff?: Partial<BackoffOptions>;
  /** Called with every event; an exception it throws is ignored. */
  readonly onEvent?: RelayConsumerListener;
  /**
   * Called with every update a pool's mirror accepted (snapshot chunks,
   * deltas, heartbeats), after it was applied; for tools that show the
   * frames themselves. An exception it throws is ignored.
   */
  readonly onUpdate?: (pool: string, update: FilterUpdate) => void;
  /** The local clock of views and events (ms, default Date.now). */
  readonly now?: () => number;
  /** The jitter source, [0, 1) (default Math.random). */
  readonly random?: () => number;
}

/** What the consumer does after a pool stream failed. */
type Action = "stop" | "quarantine" | "backoff" | "backoff-until-catalog";

const CATALOG_REASONS: ReadonlySet<string> = new Set(["POOL_NOT_FOUND", "PRODUCER_CHANGED", "PUBLICATION_UNAVAILABLE", "INVALID_PUBLICATION", "INTERNAL"]);

function actionFor(failure: ConsumerFailure): Action {
  if (failure.source !== "relay") return "backoff";
  if (failure.reason === "CONTRACT_MISMATCH") return "stop";
  if (failure.reason === "UNSUPPORTED_FEATURE") return "quarantine";
  return CATALOG_REASONS.has(failure.reason) ? "backoff-until-catalog" : "backoff";
}

/** One pool in the catalog, for the producer the catalog names. */
interface Replica {
  readonly key: string;
  readonly poolId: PoolId;
  descriptor: PoolDescriptor | undefined;
  /** The producer subscribed to; undefined when the descriptor is unsupported. */
  readonly producer: ProducerIdentity | undefined;
  /** Aborted when the replica is dropped (withdrawn, replaced, run ended). */
  readonly controller: AbortController;
  state: PoolState;
  quarantine: "descriptor" | "relay" | undefined;
  mirror: LaneMirror | undefined;
  probe: LaneProbe | undefined;
  /** Failures since the last installed snapshot: the backoff exponent. */
  failures: number;
  resubscribes: number;
  lastError: ConsumerFailure | undefined;
  retryAt: number | undefined;
  wait: Wait | undefined;
  /** Woken early by the next catalog update (the reason asked for a catalog refresh). */
  awaitingCatalog: boolean;
}

export class RelayConsumer {
  readonly subscriberId: string;
  readonly relay: string;
  readonly backoff: BackoffOptions;
  private readonly client: Client<typeof KvEventRelay>;
  private readonly now: () => number;
  private readonly random: () => number;
  private readonly listeners = new Set<RelayConsumerListener>();
  private readonly updateListener: ((pool: string, update: FilterUpdate) => void) | undefined;
  private readonly replicas = new Map<string, Replica>();
  private readonly loops = new Set<Promise<void>>();
  private running = false;
  private internal: AbortController | undefined;
  private stopped: ConsumerFailure | undefined;
  private catalogConnected = false;
  private catalogRevision: bigint | undefined;
  private catalogRejected: readonly CatalogRejection[] = [];
  private catalogError: ConsumerFailure | undefined;

  /** Throws RelayError INVALID_REQUEST for a bad subscriber id and RangeError for bad backoff bounds. */
  constructor(options: RelayConsumerOptions) {
    this.subscriberId = checkSubscriberId(options.subscriberId ?? `mmgate-consumer-${randomBytes(6).toString("hex")}`);
    this.relay = options.relay ?? "";
    this.backoff = backoffOptions(options.backoff);
    this.client = createClient(KvEventRelay, options.transport);
    this.now = options.now ?? Date.now;
    this.random = options.random ?? Math.random;
    if (options.onEvent !== undefined) this.listeners.add(options.onEvent);
    this.updateListener = options.onUpdate;
  }

  /** Adds a listener for every event; returns its removal. */
  on(listener: RelayConsumerListener): () => void {
    this.listeners.add(listener);
    return () => {
      this.listeners.delete(listener);
    };
  }

  /**
   * Watches the catalog and mirrors its pools until `signal` fires (every
   * stream is closed before the promise resolves) or the relay answers
   * CONTRACT_MISMATCH. Runs once per consumer.
   */
  async run(signal: AbortSignal): Promise<RunResult> {
    if (this.running) throw new Error("RelayConsumer.run was already called");
    this.running = true;
    const internal = new AbortController();
    this.internal = internal;
    const onAbort = () => internal.abort();
    if (signal.aborted) internal.abort();
    else signal.addEventListener("abort", onAbort, { once: true });
    try {
      const catalog = this.catalogLoop(internal.signal);
      await new Promise<void>((resolve) => {
        if (internal.signal.aborted) resolve();
        else internal.signal.addEventListener("abort", () => resolve(), { once: true });
      });
      for (const replica of this.replicas.values()) replica.controller.abort();
      await catalog;
      await Promise.allSettled([...this.loops]);
    } finally {
      signal.removeEventListener("abort", onAbort);
      this.replicas.clear();
      this.catalogConnected = false;
    }
    return this.stopped === undefined ? { stopped: "aborted" } : { stopped: "contract-mismatch", error: this.stopped };
  }

  /** Every pool of the current catalog. */
  pools(): PoolView[] {
    return [...this.replicas.values()].map((replica) => this.view(replica));
  }

  /** One pool by key. */
  pool(key: string): PoolView | undefined {
    const replica = this.replicas.get(key);
    return replica === undefined ? undefined : this.view(replica);
  }

  /**
   * The lane of a ready pool as little-endian u64 bucket words: the mirror's
   * own memory, for reading only (the next delta writes into it); undefined
   * unless the pool is ready.
   */
  words(key: string): BigUint64Array | undefined {
    const replica = this.replicas.get(key);
    return replica?.state === "ready" ? replica.mirror?.words : undefined;
  }

  catalog(): CatalogView {
    return { connected: this.catalogConnected, revision: this.catalogRevision, rejected: this.catalogRejected, lastError: this.catalogError };
  }

  /**
   * The prefix overlap of a prompt in every ready pool that serves `model`
   * (a canonical id or an alias): see poolOverlap. Pools that do not serve
   * the model, and pools that are not ready, give no answer. Throws
   * KvHashError for a token that is not a u32.
   */
  overlap(tokens: ArrayLike<number>, model: string, options: PromptOptions = {}): OverlapAnswer[] {
    const prompt = new PromptHashes(tokens, options);
    const answers: OverlapAnswer[] = [];
    for (const replica of this.replicas.values()) {
      const { descriptor, probe, mirror } = replica;
      if (replica.state !== "ready" || descriptor === undefined || probe === undefined || mirror?.installedSequence === undefined) continue;
      const result = poolOverlap(prompt, model, descriptor, probe);
      if (!result.served) continue;
      answers.push({
        poolKey: replica.key,
        relay: this.relay,
        dcId: descriptor.producer.poolId.dcId,
        endpoint: endpointName(descriptor.servingEndpoint),
        matchedBlocks: result.matchedBlocks,
        totalBlocks: result.totalBlocks,
        blockSize: result.blockSize,
        sequence: mirror.installedSequence,
        canonicalModelId: result.registration.model,
      });
    }
    return answers;
  }

  // --- catalog -----------------------------------------------------------------

  private async catalogLoop(signal: AbortSignal): Promise<void> {
    let failures = 0;
    const request = { subscriberId: this.subscriberId, contractMarker: RELAY_CONTRACT_MARKER };
    while (!signal.aborted) {
      let failure: ConsumerFailure;
      let streamRelay: RelayIncarnation | undefined;
      try {
        // The attempt's stream ends with the consumer, or once this attempt is over.
        for await (const update of cancelledOnExit(signal, (attempt) => this.client.watchKvPoolCatalog(request, { signal: attempt }))) {
          if (signal.aborted) break;
          this.catalogConnected = true;
          const snapshot = readCatalogUpdate(update, streamRelay);
          streamRelay = snapshot.relay;
          this.applyCatalog(snapshot);
          failures = 0;
        }
        failure = this.failure("eof", "EOF", "the relay ended the catalog stream");
      } catch (error) {
        failure = this.classify(error);
      } finally {
        this.catalogConnected = false;
      }
      if (signal.aborted) return;
      this.catalogError = failure;
      if (actionFor(failure) === "stop") {
        this.stop(failure);
        return;
      }
      const delay = backoffDelay(failures++, this.backoff, this.random);
      this.emit({ type: "catalog-error", error: failure, retryInMs: delay });
      await interruptibleWait(delay, signal).done;
    }
  }

  private applyCatalog(snapshot: CatalogSnapshot): void {
    if (this.internal?.signal.aborted === true) return;
    const added: string[] = [];
    const removed: string[] = [];
    const replaced: string[] = [];
    for (const [key, replica] of this.replicas) {
      if (snapshot.pools.has(key)) continue;
      this.drop(replica);
      removed.push(key);
      this.emit({ type: "withdrawn", pool: key });
    }
    const started: Replica[] = [];
    for (const pool of snapshot.pools.values()) {
      const existing = this.replicas.get(pool.key);
      if (existing !== undefined && this.keep(existing, pool)) continue;
      if (existing === undefined) added.push(pool.key);
      else {
        this.drop(existing);
        replaced.push(pool.key);
      }
      const replica = this.replica(pool);
      this.replicas.set(pool.key, replica);
      started.push(replica);
    }
    this.catalogRevision = snapshot.revision;
    this.catalogRejected = snapshot.rejected;
    this.emit({ type: "catalog", revision: snapshot.revision, pools: snapshot.pools.size, added, removed, replaced, rejected: snapshot.rejected });
    for (const replica of started) {
      if (replica.state === "quarantined") this.emit({ type: "quarantined", pool: replica.key, error: replica.lastError! });
      else this.start(replica);
    }
  }

  /** Whether `existing` stays for the catalog's `pool` (same producer, or still the same unsupported descriptor); refreshes what it keeps. */
  private keep(existing: Replica, pool: CatalogPool): boolean {
    if (pool.descriptor === undefined) {
      if (existing.quarantine !== "descriptor") return false;
      existing.lastError = this.failure("descriptor", "UNSUPPORTED_FEATURE", pool.unsupported);
      return true;
    }
    if (existing.producer === undefined || !sameProducerIdentity(existing.producer, pool.descriptor.producer)) return false;
    // Descriptor metadata (endpoint, registrations, semantics, roles) is not part of the producer key: take the latest.
    existing.descriptor = pool.descriptor;
    if (existing.awaitingCatalog) existing.wait?.wake();
    return true;
  }

  private replica(pool: CatalogPool): Replica {
    const unsupported = pool.descriptor === undefined;
    return {
      key: pool.key,
      poolId: pool.poolId,
      descriptor: pool.descriptor,
      producer: pool.descriptor?.producer,
      controller: new AbortController(),
      state: unsupported ? "quarantined" : "subscribing",
      quarantine: unsupported ? "descriptor" : undefined,
      mirror: undefined,
      probe: undefined,
      failures: 0,
      resubscribes: 0,
      lastError: unsupported ? this.failure("descriptor", "UNSUPPORTED_FEATURE", pool.unsupported) : undefined,
      retryAt: undefined,
      wait: undefined,
      awaitingCatalog: false,
    };
  }

  private drop(replica: Replica): void {
    replica.controller.abort();
    replica.mirror = undefined;
    replica.probe = undefined;
    if (this.replicas.get(replica.key) === replica) this.replicas.delete(replica.key);
  }

  // --- pools -------------------------------------------------------------------

  private start(replica: Replica): void {
    const loop = this.poolLoop(replica).catch(() => undefined);
    this.loops.add(loop);
    void loop.finally(() => this.loops.delete(loop));
  }

  private async poolLoop(replica: Replica): Promise<void> {
    const signal = replica.controller.signal;
    const producer = replica.producer!;
    const request = { subscriberId: this.subscriberId, expectedProducer: producerToWire(producer), contractMarker: RELAY_CONTRACT_MARKER };
    for (let first = true; !signal.aborted; first = false) {
      if (!first) replica.resubscribes++;
      const mirror = new LaneMirror(producer, { now: this.now });
      replica.mirror = mirror;
      replica.probe = undefined;
      replica.state = "subscribing";
      replica.retryAt = undefined;
      this.emit({ type: "subscribing", pool: replica.key, resubscribes: replica.resubscribes });
      let failure: ConsumerFailure;
      try {
        for await (const update of cancelledOnExit(signal, (attempt) => this.client.subscribeKvPool(request, { signal: attempt }))) {
          this.onUpdate(replica, mirror, update);
        }
        failure = this.failure("eof", "EOF", "the relay ended the pool stream");
      } catch (error) {
        failure = this.classify(error);
      }
      if (signal.aborted) return;
      replica.mirror = undefined;
      replica.probe = undefined;
      replica.lastError = failure;
      const action = actionFor(failure);
      if (action === "stop") {
        this.stop(failure);
        return;
      }
      if (action === "quarantine") {
        replica.state = "quarantined";
        replica.quarantine = "relay";
        this.emit({ type: "quarantined", pool: replica.key, error: failure });
        return;
      }
      const delay = backoffDelay(replica.failures++, this.backoff, this.random);
      replica.state = "backoff";
      replica.retryAt = this.now() + delay;
      replica.awaitingCatalog = action === "backoff-until-catalog";
      this.emit({ type: "invalidated", pool: replica.key, error: failure, retryInMs: delay });
      replica.wait = interruptibleWait(delay, signal);
      await replica.wait.done;
      replica.wait = undefined;
      replica.awaitingCatalog = false;
    }
  }

  /** One frame into the replica's mirror; a violation throws out of the stream loop. */
  private onUpdate(replica: Replica, mirror: LaneMirror, update: FilterUpdate): void {
    const step = mirror.apply(update);
    const pool = replica.key;
    if (this.updateListener !== undefined) {
      try {
        this.updateListener(pool, update);
      } catch {
        // The listener's failure is its own.
      }
    }
    switch (step.kind) {
      case "chunk":
        replica.state = "assembling";
        this.emit({ type: "snapshot-progress", pool, chunksReceived: step.chunksReceived, chunksExpected: step.chunksExpected });
        return;
      case "ready":
        replica.probe = new LaneProbe(mirror.format, mirror.words!);
        replica.state = "ready";
        replica.failures = 0;
        this.emit({ type: "snapshot-progress", pool, chunksReceived: step.chunksExpected, chunksExpected: step.chunksExpected });
        this.emit({ type: "ready", pool, sequence: step.sequence });
        return;
      case "heartbeat":
        this.emit({ type: "heartbeat", pool, sequence: step.sequence, sendTsUs: step.sendTsUs });
        return;
      case "delta":
        this.emit({ type: "delta", pool, sequence: step.sequence, images: step.images });
        return;
    }
  }

  // --- shared ------------------------------------------------------------------

  private stop(failure: ConsumerFailure): void {
    if (this.stopped !== undefined) return;
    this.stopped = failure;
    this.emit({ type: "stopped", error: failure });
    this.internal?.abort();
  }

  private failure(source: ConsumerFailure["source"], reason: string, message: string): ConsumerFailure {
    return { source, reason, message, at: this.now() };
  }

  /** A stream's error as a failure: the relay's reason when it gave one, the consumer's verdict, or the status. */
  private classify(error: unknown): ConsumerFailure {
    if (isConsumerError(error)) return this.failure("violation", error.code, error.message);
    const reason = relayReasonOf(error);
    if (reason !== undefined) return this.failure("relay", reason, (error as ConnectError).rawMessage);
    const status = ConnectError.from(error);
    return this.failure("transport", Code[status.code] ?? String(status.code), status.rawMessage);
  }

  private view(replica: Replica): PoolView {
    const mirror = replica.mirror;
    const progress: SnapshotProgress = mirror?.progress ?? {
      chunksReceived: 0,
      chunksExpected: replica.producer === undefined ? 0 : snapshotChunkCount(replica.producer.format.bucketCount),
    };
    return {
      key: replica.key,
      poolId: replica.poolId,
      descriptor: replica.descriptor,
      state: replica.state,
      installedSequence: mirror?.installedSequence,
      progress,
      lastFrameAt: mirror?.lastFrameAt,
      lastSendTsUs: mirror?.lastSendTsUs,
      resubscribes: replica.resubscribes,
      lastError: replica.lastError,
      retryAt: replica.retryAt,
    };
  }

  private emit(event: RelayConsumerEvent): void {
    for (const listener of this.listeners) {
      try {
        listener(event);
      } catch {
        // A listener's failure is its own; the consumer goes on.
      }
    }
  }
}
