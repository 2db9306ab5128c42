import { ImageError, isBreakerFailure, type ErrorCode } from "../core/errors.js";

export interface CircuitBreakerConfig {
  readonly enabled: boolean;
  readonly failureThreshold: number;
  readonly openDurationMs: number;
  readonly halfOpenMaxCalls: number;
  readonly successThreshold: number;
}

export const DEFAULT_CIRCUIT_BREAKER: CircuitBreakerConfig = Object.freeze({
  enabled: true,
  failureThreshold: 5,
  openDurationMs: 180_000,
  halfOpenMaxCalls: 1,
  successThreshold: 1,
});

export type CircuitState = "closed" | "open" | "half_open";

export interface CircuitSnapshot {
  readonly state: CircuitState;
  readonly consecutiveFailures: number;
  readonly retryAfterMs: number;
  readonly rejectedCalls: number;
  readonly transitions: number;
}

/** One admitted call; report its outcome once, or abandon it. */
export interface BreakerPermit {
  /** `undefined` for success, otherwise the error code of the failure. */
  record(outcome: ErrorCode | undefined): void;
  abandon(): void;
}

const NOOP_PERMIT: BreakerPermit = { record: () => undefined, abandon: () => undefined };

/**
 * A per-provider circuit breaker. Results of permits issued before the last
 * state change are ignored (epochs), so a slow call from a past state
 * cannot flip the current one.
 */
export class CircuitBreaker {
  private state: CircuitState = "closed";
  private epoch = 0;
  private consecutiveFailures = 0;
  private openedAt = 0;
  private probesInFlight = 0;
  private probeSuccesses = 0;
  private rejectedCalls = 0;
  private transitions = 0;

  constructor(
    readonly provider: string,
    private readonly config: CircuitBreakerConfig,
    private readonly now: () => number = Date.now,
  ) {
    if (
      config.enabled &&
      !(config.failureThreshold > 0 && config.openDurationMs > 0 && config.halfOpenMaxCalls > 0 && config.successThreshold > 0)
    ) {
      throw new ImageError("configuration", `circuit breaker limits for ${provider} must be above 0`);
    }
  }

  snapshot(): CircuitSnapshot {
    return {
      state: this.currentState(),
      consecutiveFailures: this.consecutiveFailures,
      retryAfterMs: this.state === "open" ? Math.max(0, this.openedAt + this.config.openDurationMs - this.now()) : 0,
      rejectedCalls: this.rejectedCalls,
      transitions: this.transitions,
    };
  }

  private currentState(): CircuitState {
    if (this.state === "open" && this.now() >= this.openedAt + this.config.openDurationMs) return "half_open";
    return this.state;
  }

  private transition(next: CircuitState): void {
    this.state = next;
    this.epoch += 1;
    this.transitions += 1;
    this.probesInFlight = 0;
    this.probeSuccesses = 0;
    if (next === "open") this.openedAt = this.now();
    if (next === "closed") this.consecutiveFailures = 0;
  }

  /** Admits a call or throws `overloaded` when the circuit refuses it. */
  acquire(): BreakerPermit {
    if (!this.config.enabled) return NOOP_PERMIT;
    if (this.state === "open") {
      const remaining = this.openedAt + this.config.openDurationMs - this.now();
      if (remaining > 0) {
        this.rejectedCalls += 1;
        throw new ImageError("overloaded", "the provider's circuit is open", {
          retryable: true,
          provider: this.provider,
          details: { circuit_state: "open", retry_after_ms: remaining },
        });
      }
      this.transition("half_open");
    }
    if (this.state === "half_open") {
      if (this.probesInFlight >= this.config.halfOpenMaxCalls) {
        this.rejectedCalls += 1;
        throw new ImageError("overloaded", "the provider's circuit is half open and probing", {
          retryable: true,
          provider: this.provider,
          details: { circuit_state: "half_open" },
        });
      }
      this.probesInFlight += 1;
      return this.permit(this.epoch, true);
    }
    return this.permit(this.epoch, false);
  }

  private permit(epoch: number, probe: boolean): BreakerPermit {
    let done = false;
    return {
      record: (outcome) => {
        if (done) return;
        done = true;
        if (epoch !== this.epoch) return;
        this.onResult(outcome, probe);
      },
      abandon: () => {
        if (done) return;
        done = true;
        if (epoch === this.epoch && probe) this.probesInFlight -= 1;
      },
    };
  }

  private onResult(outcome: ErrorCode | undefined, probe: boolean): void {
    const kind = outcome === undefined ? "success" : isBreakerFailure(outcome) ? "failure" : "neutral";
    if (this.state === "closed") {
      if (kind === "success") this.consecutiveFailures = 0;
      else if (kind === "failure") {
        this.consecutiveFailures += 1;
        if (this.consecutiveFailures >= this.config.failureThreshold) this.transition("open");
      }
      return;
    }
    if (this.state === "half_open" && probe) {
      this.probesInFlight -= 1;
      if (kind !== "success") {
        this.transition("open");
        return;
      }
      this.probeSuccesses += 1;
      if (this.probeSuccesses >= this.config.successThreshold && this.probesInFlight === 0) this.transition("closed");
    }
  }
}
