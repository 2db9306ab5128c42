/**
 * KvRouter: one RelayConsumer per configured relay, and overlap queries
 * answered from every pool of every relay. Each relay runs as its own loop
 * (`runRelay`); the host supervises them. A consumer runs once: when it
 * stops because the relay refused the contract, `runRelay` throws and the
 * next run builds a new one.
 */
import type { Transport } from "@connectrpc/connect";
import { RelayConsumer, type BackoffOptions, type OverlapAnswer, type PoolView, type RelayConsumerEvent } from "../consumer/index.js";

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
  /** The consumers' clock (ms, default Date.now). */
  readonly now?: () => number;
}

/** One pool of one relay. */
export interface RouterPoolView extends PoolView {
  readonly relay: string;
}

interface RelaySlot {
  readonly address: string;
  consumer: RelayConsumer | undefined;
}

export class KvRouter {
  readonly relays: readonly string[];
  private readonly slots = new Map<string, RelaySlot>();

  constructor(private readonly options: KvRouterOptions) {
    this.relays = [...options.relays];
    for (const address of this.relays) this.slots.set(address, { address, consumer: undefined });
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
    slot.consumer = consumer;
    this.notify(relay, true);
    let result;
    try {
      result = await consumer.run(signal);
    } finally {
      slot.consumer = undefined;
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

  /**
   * The overlap of a prompt in every ready pool of every relay that serves
   * `model`, relays in configured order. Throws RouterError for an empty
   * model or too many tokens, and KvHashError for a token that is not a u32.
   */
  overlap(tokens: ArrayLike<number>, model: string): OverlapAnswer[] {
    if (model === "") throw new RouterError("MissingModel", "model is required: a canonical model id or an alias a pool registers");
    if (tokens.length > MAX_OVERLAP_TOKENS) {
      throw new RouterError("TooManyTokens", `${tokens.length} tokens; an overlap query carries at most ${MAX_OVERLAP_TOKENS}`);
    }
    const answers: OverlapAnswer[] = [];
    for (const slot of this.slots.values()) {
      const consumer = slot.consumer;
      if (consumer !== undefined) answers.push(...consumer.overlap(tokens, model));
    }
    return answers;
  }

  private notify(relay: string, running: boolean): void {
    try {
      this.options.onConsumer?.(relay, running);
    } catch {
      // The listener's failure is its own.
    }
  }
}
