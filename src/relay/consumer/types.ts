/**
 * What the relay consumer shows its callers: the per-pool views, the
 * overlap answers, the events a progress UI or a router's metrics follow,
 * and how `run` ended.
 */
import type { PoolId } from "../../kv/index.js";
import type { PoolDescriptor } from "../wire/index.js";
import type { CatalogRejection } from "./catalog.js";
import type { SnapshotProgress } from "./lane-mirror.js";

/**
 * Where a pool's replica is:
 * - subscribing: a SubscribeKvPool stream is open, no frame has arrived yet;
 * - assembling: snapshot chunks are arriving; the filter is not exposed;
 * - ready: the snapshot is installed and deltas apply; overlap queries use it;
 * - backoff: the last stream failed; the replica is dropped and a new
 *   subscription (from a fresh snapshot) follows after the wait;
 * - quarantined: the relay or the descriptor uses a feature this build does
 *   not support; nothing is tried until the catalog lists another producer
 *   (or a supported descriptor) for the pool.
 */
export type PoolState = "subscribing" | "assembling" | "ready" | "backoff" | "quarantined";

/** Why a stream ended or a pool is held back. */
export interface ConsumerFailure {
  /**
   * relay: an error status with a kv-relay-error-reason trailer;
   * violation: the consumer refused what the relay sent (a ConsumerError);
   * transport: an error status without a known reason, or a failure below the relay;
   * eof: the relay ended the stream cleanly, which a pool or catalog stream never does;
   * descriptor: the catalog's descriptor is unsupported.
   */
  readonly source: "relay" | "violation" | "transport" | "eof" | "descriptor";
  /** The RelayErrorReason name, the ConsumerError code, the status code name (e.g. "Unavailable"), "EOF", or "UNSUPPORTED_FEATURE". */
  readonly reason: string;
  readonly message: string;
  /** Local time of the failure (ms, the consumer's clock). */
  readonly at: number;
}

export interface PoolView {
  /** The pool's key (poolKey of its PoolId): what every event names it by. */
  readonly key: string;
  readonly poolId: PoolId;
  /** The catalog's descriptor; undefined for a pool quarantined because its descriptor is unsupported. */
  readonly descriptor: PoolDescriptor | undefined;
  readonly state: PoolState;
  /** The mirror's installed sequence while ready. */
  readonly installedSequence: bigint | undefined;
  /** The current subscription's snapshot progress (0 of n before the first chunk and between subscriptions). */
  readonly progress: SnapshotProgress;
  /** Local receive time of the current subscription's last frame (ms, the consumer's clock). */
  readonly lastFrameAt: number | undefined;
  /** send_ts_us of that frame: the producer's wall clock, for display. */
  readonly lastSendTsUs: bigint | undefined;
  /** Subscriptions opened for this producer after the first. */
  readonly resubscribes: number;
  readonly lastError: ConsumerFailure | undefined;
  /** When the next subscription is due, in backoff (ms, the consumer's clock). */
  readonly retryAt: number | undefined;
}

export interface CatalogView {
  /** Whether a catalog stream is open. */
  readonly connected: boolean;
  /** The revision of the last catalog applied; undefined before the first. */
  readonly revision: bigint | undefined;
  /** Entries of the last catalog that were left out. */
  readonly rejected: readonly CatalogRejection[];
  readonly lastError: ConsumerFailure | undefined;
}

/** One pool's answer to an overlap query: PoolOverlap (mmgate.kvrouter.v1) plus the pool key. */
export interface OverlapAnswer {
  readonly poolKey: string;
  /** The consumer's `relay` label. */
  readonly relay: string;
  readonly dcId: bigint;
  /** "namespace.component.endpoint". */
  readonly endpoint: string;
  readonly matchedBlocks: number;
  readonly totalBlocks: number;
  readonly blockSize: number;
  /** The installed sequence the answer was computed at. */
  readonly sequence: bigint;
  readonly canonicalModelId: string;
}

export type RelayConsumerEvent =
  | {
      readonly type: "catalog";
      readonly revision: bigint;
      /** Pools listed (quarantined ones included). */
      readonly pools: number;
      readonly added: readonly string[];
      readonly removed: readonly string[];
      /** Pools whose producer changed: the old replica was dropped and the new producer subscribed. */
      readonly replaced: readonly string[];
      readonly rejected: readonly CatalogRejection[];
    }
  | { readonly type: "catalog-error"; readonly error: ConsumerFailure; readonly retryInMs: number }
  | { readonly type: "subscribing"; readonly pool: string; readonly resubscribes: number }
  | { readonly type: "snapshot-progress"; readonly pool: string; readonly chunksReceived: number; readonly chunksExpected: number }
  | { readonly type: "ready"; readonly pool: string; readonly sequence: bigint }
  | { readonly type: "delta"; readonly pool: string; readonly sequence: bigint; readonly images: number }
  | { readonly type: "heartbeat"; readonly pool: string; readonly sequence: bigint; readonly sendTsUs: bigint }
  | { readonly type: "invalidated"; readonly pool: string; readonly error: ConsumerFailure; readonly retryInMs: number }
  | { readonly type: "quarantined"; readonly pool: string; readonly error: ConsumerFailure }
  | { readonly type: "withdrawn"; readonly pool: string }
  | { readonly type: "stopped"; readonly error: ConsumerFailure };

export type RelayConsumerListener = (event: RelayConsumerEvent) => void;

/** How `run` ended: its signal fired, or the relay refused the contract (CONTRACT_MISMATCH), which no retry can fix. */
export type RunResult = { readonly stopped: "aborted" } | { readonly stopped: "contract-mismatch"; readonly error: ConsumerFailure };
