/**
 * The readiness and load of one relay as the router keeps them (C.7): two
 * more independent state machines beside the consumer's catalog and pools,
 * each on its own stream with its own backoff.
 *
 * - Readiness: SubscribeServingReadiness. Every update replaces the whole
 *   projection, keyed by (namespace, canonical model id). Each entry is
 *   checked by the contract's topology rules: a malformed one is left out
 *   (invalidated), one this build cannot interpret is left out too
 *   (quarantined); both copies of a key listed twice are left out. While the
 *   stream is down there is no projection: every key is UNKNOWN.
 * - Load: SubscribeKvPoolLoad. The latest window replaces the last one
 *   whole; an entry whose producer cannot be read is left out. While the
 *   stream is down there is no window. A lagged stream (SUBSCRIBER_LAGGED)
 *   reopens this stream only.
 *
 * Every update's envelope (marker, version) is checked and its relay
 * identity held to the stream's first. CONTRACT_MISMATCH stops the stream
 * for good (the consumer stops the relay's run then, and a new run starts
 * both anew); any other failure or end backs off and reopens.
 */
import { Code, ConnectError, createClient, type Client, type Transport } from "@connectrpc/connect";
import { KvEventRelay, ServingReadinessState, WorkerRole, type KvPoolLoadUpdate, type ServingReadinessUpdate } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import type { ProducerIdentity } from "../../kv/index.js";
import {
  backoffDelay,
  backoffOptions,
  checkRelayIdentity,
  checkResponseEnvelope,
  interruptibleWait,
  isConsumerError,
  poolKey,
  type BackoffOptions,
  type ConsumerFailure,
  type RelayIncarnation,
} from "../consumer/index.js";
import { endpointName, poolIdFromWire, producerFromWire, RELAY_CONTRACT_MARKER, relayReasonOf, TopologyError, validateTopologyEntry } from "../wire/index.js";
import { cancelledOnExit } from "../../util/index.js";

export type ServingStateName = "UNKNOWN" | "UNAVAILABLE" | "READY";

/** One topology entry as the router reads it. */
export interface ReadinessEntryView {
  readonly namespace: string;
  readonly canonicalModelId: string;
  readonly state: ServingStateName;
  readonly missingRoles: readonly string[];
  readonly legacyFallbackActive: boolean;
  /** The members' pool keys (members without a pool id have none). */
  readonly poolKeys: ReadonlySet<string>;
  /** The members' endpoints, "namespace.component.endpoint". */
  readonly endpoints: readonly string[];
  /** Adapter readiness by canonical adapter id. */
  readonly adapters: ReadonlyMap<string, { readonly state: ServingStateName; readonly missingRoles: readonly string[] }>;
}

/** An entry of an update that was left out. */
export interface ReadinessRejection {
  readonly index: number;
  readonly key: string;
  /** The TopologyError code, or "DuplicateKey". */
  readonly code: string;
  readonly reason: "INVALID_REQUEST" | "UNSUPPORTED_FEATURE";
  readonly message: string;
}

export interface ReadinessProjection {
  readonly revision: bigint;
  /** By `${namespace}\0${canonicalModelId}`. */
  readonly entries: ReadonlyMap<string, ReadinessEntryView>;
  readonly rejected: readonly ReadinessRejection[];
  /** Local receive time (ms). */
  readonly receivedAt: number;
}

/** One pool's load in the latest window. */
export interface PoolLoadView {
  readonly producer: ProducerIdentity;
  readonly windowSequence: bigint;
  readonly kvUsedBlocks: bigint;
  readonly totalKvBlocks: bigint;
  readonly kvObservedRanks: number;
  readonly kvExpectedRanks: number;
}

export interface LoadProjection {
  readonly windowSequence: bigint;
  readonly windowMs: bigint;
  /** By pool key. */
  readonly pools: ReadonlyMap<string, PoolLoadView>;
  /** Local receive time (ms). */
  readonly receivedAt: number;
}

export function topologyKey(namespace: string, canonicalModelId: string): string {
  return `${namespace}\0${canonicalModelId}`;
}

const STATE_NAMES: Readonly<Record<number, ServingStateName>> = {
  [ServingReadinessState.UNKNOWN]: "UNKNOWN",
  [ServingReadinessState.UNAVAILABLE]: "UNAVAILABLE",
  [ServingReadinessState.READY]: "READY",
};

/** Reads one readiness update (its envelope already checked): every valid entry, the others rejected. */
export function readReadinessUpdate(update: ServingReadinessUpdate, receivedAt: number): ReadinessProjection {
  const entries = new Map<string, ReadinessEntryView>();
  const rejected: ReadinessRejection[] = [];
  const duplicates = new Set<string>();
  update.entries.forEach((entry, index) => {
    const key = topologyKey(entry.namespace, entry.canonicalModelId);
    try {
      validateTopologyEntry(entry);
    } catch (error) {
      if (!(error instanceof TopologyError)) throw error;
      rejected.push({ index, key, code: error.code, reason: error.reason, message: error.message });
      return;
    }
    if (duplicates.has(key) || entries.has(key)) {
      entries.delete(key);
      duplicates.add(key);
      rejected.push({ index, key, code: "DuplicateKey", reason: "INVALID_REQUEST", message: `entries[${index}] repeats ${entry.namespace}/${entry.canonicalModelId}; every copy is left out` });
      return;
    }
    const poolKeys = new Set<string>();
    for (const member of entry.members) if (member.poolId !== undefined) poolKeys.add(poolKey(poolIdFromWire(member.poolId)));
    entries.set(
      key,
      Object.freeze({
        namespace: entry.namespace,
        canonicalModelId: entry.canonicalModelId,
        state: STATE_NAMES[entry.state]!,
        missingRoles: Object.freeze(entry.missingRoles.map(roleName)),
        legacyFallbackActive: entry.legacyFallbackActive,
        poolKeys,
        endpoints: Object.freeze(entry.members.map((member) => endpointName(member.endpoint!))),
        adapters: new Map(entry.adapters.map((a) => [a.canonicalModelId, Object.freeze({ state: STATE_NAMES[a.state]!, missingRoles: Object.freeze(a.missingRoles.map(roleName)) })])),
      }),
    );
  });
  return Object.freeze({ revision: update.revision, entries, rejected: Object.freeze(rejected), receivedAt });
}

/** Reads one load window (its envelope already checked): entries whose producer cannot be read are left out. */
export function readLoadUpdate(update: KvPoolLoadUpdate, receivedAt: number): LoadProjection {
  const pools = new Map<string, PoolLoadView>();
  for (const entry of update.pools) {
    let producer: ProducerIdentity;
    try {
      producer = producerFromWire(entry.producer, "load entry producer");
    } catch {
      continue;
    }
    pools.set(
      poolKey(producer.poolId),
      Object.freeze({
        producer,
        windowSequence: update.windowSequence,
        kvUsedBlocks: entry.kvUsedBlocks,
        totalKvBlocks: entry.totalKvBlocks,
        kvObservedRanks: entry.kvObservedRanks,
        kvExpectedRanks: entry.kvExpectedRanks,
      }),
    );
  }
  return Object.freeze({ windowSequence: update.windowSequence, windowMs: update.windowMs, pools, receivedAt });
}

/** Validated roles are known values: their enum names. */
function roleName(role: number): string {
  return (WorkerRole[role] as string | undefined) ?? String(role);
}

export type RelayStateEvent =
  | { readonly type: "readiness"; readonly projection: ReadinessProjection }
  | { readonly type: "load"; readonly projection: LoadProjection }
  | { readonly type: "stream-error"; readonly stream: "readiness" | "load"; readonly error: ConsumerFailure; readonly retryInMs: number | undefined };

export interface RelayStateOptions {
  readonly transport: Transport;
  readonly subscriberId: string;
  readonly backoff?: Partial<BackoffOptions>;
  /** Local clock (ms, default Date.now). */
  readonly now?: () => number;
  readonly onEvent?: (event: RelayStateEvent) => void;
}

/** The readiness and load streams of one relay, and what they last said. */
export class RelayState {
  private readonly client: Client<typeof KvEventRelay>;
  private readonly backoff: BackoffOptions;
  private readonly now: () => number;
  private readinessValue: ReadinessProjection | undefined;
  private loadValue: LoadProjection | undefined;
  private readinessOpen = false;
  private loadOpen = false;

  constructor(private readonly options: RelayStateOptions) {
    this.client = createClient(KvEventRelay, options.transport);
    this.backoff = backoffOptions(options.backoff);
    this.now = options.now ?? Date.now;
  }

  /** The last readiness projection; undefined while the stream is down (every key UNKNOWN). */
  get readiness(): ReadinessProjection | undefined {
    return this.readinessValue;
  }

  /** The latest load window; undefined while the stream is down. */
  get load(): LoadProjection | undefined {
    return this.loadValue;
  }

  get readinessConnected(): boolean {
    return this.readinessOpen;
  }

  get loadConnected(): boolean {
    return this.loadOpen;
  }

  /** Runs both streams until `signal` fires (or each is refused with CONTRACT_MISMATCH). */
  async run(signal: AbortSignal): Promise<void> {
    await Promise.all([this.readinessLoop(signal), this.loadLoop(signal)]);
  }

  private readinessLoop(signal: AbortSignal): Promise<void> {
    return this.loop(
      "readiness",
      signal,
      (s) => this.client.subscribeServingReadiness({ subscriberId: this.options.subscriberId, contractMarker: RELAY_CONTRACT_MARKER }, { signal: s }),
      (update: ServingReadinessUpdate) => {
        this.readinessOpen = true;
        this.readinessValue = readReadinessUpdate(update, this.now());
        this.emit({ type: "readiness", projection: this.readinessValue });
      },
      () => {
        this.readinessOpen = false;
        this.readinessValue = undefined;
      },
    );
  }

  private loadLoop(signal: AbortSignal): Promise<void> {
    return this.loop(
      "load",
      signal,
      (s) => this.client.subscribeKvPoolLoad({ subscriberId: this.options.subscriberId, contractMarker: RELAY_CONTRACT_MARKER }, { signal: s }),
      (update: KvPoolLoadUpdate) => {
        this.loadOpen = true;
        this.loadValue = readLoadUpdate(update, this.now());
        this.emit({ type: "load", projection: this.loadValue });
      },
      () => {
        this.loadOpen = false;
        this.loadValue = undefined;
      },
    );
  }

  /** One stream, reopened with backoff after a failure or an end; `reset` drops its state when it goes down. */
  private async loop<T extends { readonly contractMarker: number; readonly protocolVersion: number; readonly relay?: ServingReadinessUpdate["relay"] }>(
    stream: "readiness" | "load",
    signal: AbortSignal,
    open: (signal: AbortSignal) => AsyncIterable<T>,
    apply: (update: T) => void,
    reset: () => void,
  ): Promise<void> {
    let failures = 0;
    const what = stream === "readiness" ? "ServingReadinessUpdate" : "KvPoolLoadUpdate";
    while (!signal.aborted) {
      let failure: ConsumerFailure;
      let first: RelayIncarnation | undefined;
      try {
        // A contract violation leaves the loop with the stream still open: it is cancelled, not left to the relay.
        for await (const update of cancelledOnExit(signal, open)) {
          checkResponseEnvelope(update, what);
          first = checkRelayIdentity(update.relay, first, what);
          apply(update);
          failures = 0;
        }
        failure = { source: "eof", reason: "EOF", message: `the relay ended the ${stream} stream`, at: this.now() };
      } catch (error) {
        failure = this.classify(error);
      } finally {
        reset();
      }
      if (signal.aborted) return;
      if (failure.source === "relay" && failure.reason === "CONTRACT_MISMATCH") {
        this.emit({ type: "stream-error", stream, error: failure, retryInMs: undefined });
        return;
      }
      const delay = backoffDelay(failures++, this.backoff);
      this.emit({ type: "stream-error", stream, error: failure, retryInMs: delay });
      await interruptibleWait(delay, signal).done;
    }
  }

  private classify(error: unknown): ConsumerFailure {
    const at = this.now();
    if (isConsumerError(error)) return { source: "violation", reason: error.code, message: error.message, at };
    const reason = relayReasonOf(error);
    if (reason !== undefined) return { source: "relay", reason, message: (error as ConnectError).rawMessage, at };
    const status = ConnectError.from(error);
    return { source: "transport", reason: Code[status.code] ?? String(status.code), message: status.rawMessage, at };
  }

  private emit(event: RelayStateEvent): void {
    try {
      this.options.onEvent?.(event);
    } catch {
      // The listener's failure is its own.
    }
  }
}
