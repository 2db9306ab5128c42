/**
 * KvRouter: one RelayConsumer per configured relay, and overlap queries
 * answered from every pool of every relay. Each relay runs as its own loop
 * (`runRelay`); the host supervises them. A consumer runs once: when it
 * stops because the relay refused the contract, `runRelay` throws and the
 * next run builds a new one.
 *
 * Beside each consumer the relay's readiness and load streams run
 * (RelayState, C.7). An overlap answer is gated by the serving topology:
 * a pool whose (namespace, model) the relay reports UNAVAILABLE is left out
 * (C.7: stop routing to the key even though its pools stay published); one
 * whose readiness is UNKNOWN (no readiness yet, not in the topology, not a
 * member) answers only while no READY pool does (the contract's conservative
 * policy). Every pool left out is named in the answer, with why.
 */
import type { Transport } from "@connectrpc/connect";
import { sameProducerIdentity } from "../../kv/index.js";
import { RelayConsumer, type BackoffOptions, type OverlapAnswer, type PoolView, type RelayConsumerEvent } from "../consumer/index.js";
import type { PoolDescriptor } from "../wire/index.js";
import { RelayState, topologyKey, type PoolLoadView, type ReadinessProjection, type RelayStateEvent, type ServingStateName } from "./relay-state.js";

/** The most tokens one overlap query may carry (2^20). */
export const MAX_OVERLAP_TOKENS = 1_048_576;

export const ROUTER_ERROR_CODES = [
  /** The request names no model. */
  "MissingModel",
  /** The request carries more than MAX_OVERLAP_TOKENS tokens. */
  "TooManyTokens",
  /** The relay refused the KV relay contract (CONTRACT_MISMATCH): it speaks another version. */
  "ContractMismatch",
] as const;

export type RouterErrorCode = (typeof ROUTER_ERROR_CODES)[number];

export class RouterError extends Error {
  override readonly name = "RouterError";
  constructor(
    readonly code: RouterErrorCode,
    message: string,
  ) {
    super(message);
  }
}

export interface KvRouterOptions {
  /** The relays, HOST:PORT each, in the order answers list them. */
  readonly relays: readonly string[];
  /** The transport to one relay. */
  readonly transportOf: (relay: string) => Transport;
  readonly subscriberId: string;
  readonly backoff?: Partial<BackoffOptions>;
  /** Every event of every relay's consumer, with the relay's address; an exception it throws is ignored. */
  readonly onEvent?: (relay: string, event: RelayConsumerEvent) => void;
  /** Called when a relay's consumer starts or ends (its pools appear or vanish). */
  readonly onConsumer?: (relay: string, running: boolean) => void;
  /** Every event of every relay's readiness and load streams; an exception it throws is ignored. */
  readonly onStateEvent?: (relay: string, event: RelayStateEvent) => void;
  /** The consumers' clock (ms, default Date.now). */
  readonly now?: () => number;
}

/** One pool of one relay. */
export interface RouterPoolView extends PoolView {
  readonly relay: string;
}

/** A pool's serving readiness as the router gates on it: READY or UNKNOWN answer, UNAVAILABLE never. */
export interface PoolReadinessVerdict {
  readonly state: ServingStateName;
  /** Why, for a pool that is not READY. */
  readonly detail: string;
}

/** An answer with the pool's readiness and its latest load (when the load stream has one for this producer). */
export interface RoutedOverlap extends OverlapAnswer {
  readonly readiness: "READY" | "UNKNOWN";
  readonly load: PoolLoadView | undefined;
}

/** A pool that serves the model and holds a ready mirror, left out of the answer. */
export interface ExcludedPool {
  readonly relay: string;
  readonly poolKey: string;
  readonly dcId: bigint;
  readonly endpoint: string;
  readonly canonicalModelId: string;
  readonly readiness: "UNAVAILABLE" | "UNKNOWN";
  readonly detail: string;
}

export interface RouteResult {
  readonly pools: RoutedOverlap[];
  readonly excluded: ExcludedPool[];
}

interface RelaySlot {
  readonly address: string;
  consumer: RelayConsumer | undefined;
  state: RelayState | undefined;
}

/**
 * The readiness of `model` (a canonical id the descriptor registers) in the
 * pool with `key`, by the relay's last readiness projection.
 */
export function poolReadiness(projection: ReadinessProjection | undefined, key: string, descriptor: PoolDescriptor, model: string): PoolReadinessVerdict {
  if (projection === undefined) return { state: "UNKNOWN", detail: "the relay's readiness stream is not open" };
  const registration = descriptor.registrations.find((r) => r.model === model);
  if (registration === undefined) return { state: "UNKNOWN", detail: `the pool does not register ${model}` };
  const namespace = descriptor.servingEndpoint.namespace;
  const base = registration.target.kind === "base" ? registration.model : registration.target.baseModel;
  const entry = projection.entries.get(topologyKey(namespace, base));
  if (entry === undefined) {
    const rejected = projection.rejected.find((r) => r.key === topologyKey(namespace, base));
    return { state: "UNKNOWN", detail: rejected === undefined ? `${namespace}/${base} is not in the relay's serving topology` : `the relay's entry for ${namespace}/${base} was refused: ${rejected.message}` };
  }
  if (!entry.poolKeys.has(key)) return { state: "UNKNOWN", detail: `the pool is not a member of ${namespace}/${base} in the relay's serving topology` };
  let state = entry.state;
  let missing = entry.missingRoles;
  let what = `${namespace}/${base}`;
  if (registration.target.kind === "lora") {
    const adapter = entry.adapters.get(registration.model);
    if (adapter === undefined) return { state: "UNKNOWN", detail: `adapter ${registration.model} is not in the relay's entry for ${what}` };
    state = adapter.state;
    missing = adapter.missingRoles;
    what = `adapter ${registration.model} of ${what}`;
  }
  if (state === "READY") return { state, detail: "" };
  if (state === "UNKNOWN") return { state, detail: `the relay reports ${what} UNKNOWN (availability not known yet)` };
  return { state, detail: `the relay reports ${what} UNAVAILABLE${missing.length > 0 ? `: missing ${missing.join(", ")}` : ": no live worker"}` };
}

const RANK: Readonly<Record<ServingStateName, number>> = { UNAVAILABLE: 0, UNKNOWN: 1, READY: 2 };

export class KvRouter {
  readonly relays: readonly string[];
  private readonly slots = new Map<string, RelaySlot>();

  constructor(private readonly options: KvRouterOptions) {
    this.relays = [...options.relays];
    for (const address of this.relays) this.slots.set(address, { address, consumer: undefined, state: undefined });
  }

  /**
   * Mirrors `relay` until `signal` fires (resolves). Throws RouterError
   * ContractMismatch when the relay refuses the contract: no retry of this
   * consumer can succeed, a later run with a new one may (after an upgrade).
   */
  async runRelay(relay: string, signal: AbortSignal): Promise<void> {
    const slot = this.slots.get(relay);
    if (slot === undefined) throw new RangeError(`relay ${relay} is not configured`);
    if (slot.consumer !== undefined) throw new Error(`relay ${relay} already has a running consumer`);
    const consumer = new RelayConsumer({
      transport: this.options.transportOf(relay),
      subscriberId: this.options.subscriberId,
      relay,
      ...(this.options.backoff !== undefined ? { backoff: this.options.backoff } : {}),
      ...(this.options.now !== undefined ? { now: this.options.now } : {}),
      onEvent: (event) => this.options.onEvent?.(relay, event),
    });
    const state = new RelayState({
      transport: this.options.transportOf(relay),
      subscriberId: this.options.subscriberId,
      ...(this.options.backoff !== undefined ? { backoff: this.options.backoff } : {}),
      ...(this.options.now !== undefined ? { now: this.options.now } : {}),
      onEvent: (event) => this.options.onStateEvent?.(relay, event),
    });
    slot.consumer = consumer;
    slot.state = state;
    // The readiness and load streams end with the consumer's run (a contract mismatch stops it; the next run starts all three).
    const stateStop = new AbortController();
    const stopState = () => stateStop.abort();
    signal.addEventListener("abort", stopState, { once: true });
    const stateRun = state.run(stateStop.signal);
    this.notify(relay, true);
    let result;
    try {
      result = await consumer.run(signal);
    } finally {
      stateStop.abort();
      signal.removeEventListener("abort", stopState);
      await stateRun;
      slot.consumer = undefined;
      slot.state = undefined;
      this.notify(relay, false);
    }
    if (result.stopped === "contract-mismatch") {
      throw new RouterError("ContractMismatch", `relay ${relay} refused the KV relay contract: ${result.error.message}`);
    }
  }

  /** Every pool of every running consumer, relays in configured order. */
  pools(): RouterPoolView[] {
    const views: RouterPoolView[] = [];
    for (const slot of this.slots.values()) {
      for (const view of slot.consumer?.pools() ?? []) views.push({ ...view, relay: slot.address });
    }
    return views;
  }

  /** Whether relay's catalog stream is open. */
  connected(relay: string): boolean {
    return this.slots.get(relay)?.consumer?.catalog().connected === true;
  }

  /** Pools ready for queries, over every relay. */
  readyPools(): number {
    let ready = 0;
    for (const slot of this.slots.values()) for (const view of slot.consumer?.pools() ?? []) if (view.state === "ready") ready++;
    return ready;
  }

  /** Pools with a ready mirror whose readiness lets them answer some model (READY or UNKNOWN), over every relay. */
  routablePools(): number {
    return this.pools().filter((view) => view.state === "ready" && this.servingState(view) !== "UNAVAILABLE").length;
  }

  /** The readiness and load streams of `relay` (while its run lasts). */
  relayState(relay: string): RelayState | undefined {
    return this.slots.get(relay)?.state;
  }

  /** A pool's best readiness over the models it registers (READY over UNKNOWN over UNAVAILABLE). */
  servingState(view: RouterPoolView): ServingStateName {
    const descriptor = view.descriptor;
    if (descriptor === undefined || descriptor.registrations.length === 0) return "UNKNOWN";
    const projection = this.slots.get(view.relay)?.state?.readiness;
    let best: ServingStateName = "UNAVAILABLE";
    for (const registration of descriptor.registrations) {
      const state = poolReadiness(projection, view.key, descriptor, registration.model).state;
      if (RANK[state] > RANK[best]) best = state;
    }
    return best;
  }

  /**
   * The overlap of a prompt in every ready pool of every relay that serves
   * `model`, relays in configured order. Throws RouterError for an empty
   * model or too many tokens, and KvHashError for a token that is not a u32.
   */
  overlap(tokens: ArrayLike<number>, model: string): RoutedOverlap[] {
    return this.route(tokens, model).pools;
  }

  /**
   * The overlap answers (`overlap`) and the pools left out of them by the
   * relays' readiness: UNAVAILABLE always, UNKNOWN while some pool is READY.
   */
  route(tokens: ArrayLike<number>, model: string): RouteResult {
    if (model === "") throw new RouterError("MissingModel", "model is required: a canonical model id or an alias a pool registers");
    if (tokens.length > MAX_OVERLAP_TOKENS) {
      throw new RouterError("TooManyTokens", `${tokens.length} tokens; an overlap query carries at most ${MAX_OVERLAP_TOKENS}`);
    }
    const judged: { answer: OverlapAnswer; verdict: PoolReadinessVerdict; load: PoolLoadView | undefined }[] = [];
    for (const slot of this.slots.values()) {
      const consumer = slot.consumer;
      if (consumer === undefined) continue;
      for (const answer of consumer.overlap(tokens, model)) {
        const descriptor = consumer.pool(answer.poolKey)?.descriptor;
        if (descriptor === undefined) continue;
        const verdict = poolReadiness(slot.state?.readiness, answer.poolKey, descriptor, answer.canonicalModelId);
        const load = slot.state?.load?.pools.get(answer.poolKey);
        // A window of another generation says nothing about this mirror's producer.
        judged.push({ answer, verdict, load: load !== undefined && sameProducerIdentity(load.producer, descriptor.producer) ? load : undefined });
      }
    }
    const anyReady = judged.some((j) => j.verdict.state === "READY");
    const result: RouteResult = { pools: [], excluded: [] };
    for (const { answer, verdict, load } of judged) {
      if (verdict.state === "READY" || (verdict.state === "UNKNOWN" && !anyReady)) {
        result.pools.push({ ...answer, readiness: verdict.state, load });
        continue;
      }
      const { relay, poolKey, dcId, endpoint, canonicalModelId } = answer;
      const detail = verdict.state === "UNKNOWN" ? `${verdict.detail}; left out while READY pools answer` : verdict.detail;
      result.excluded.push({ relay, poolKey, dcId, endpoint, canonicalModelId, readiness: verdict.state, detail });
    }
    return result;
  }

  private notify(relay: string, running: boolean): void {
    try {
      this.options.onConsumer?.(relay, running);
    } catch {
      // The listener's failure is its own.
    }
  }
}
