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

/** How one finished call counts: a success, a provider failure, or neither. */
export type CallVerdict = "success" | "failure" | "neutral";

/**
 * Decides how a call that ended with `error` counts. The breaker knows
 * nothing about error types; its owner does.
 */
export type ErrorClassifier = (error: unknown) => CallVerdict;

/** One admitted call; report how it ended once, or abandon it. */
export interface BreakerPermit {
  succeeded(): void;
  /** The call failed with `error`; the classifier decides how that counts. */
  failed(error: unknown): void;
  /**
   * The call failed before its request went out (capability discovery and
   * its checks): a failure by the classifier counts as `failed` does;
   * anything else is abandoned, so a request the provider never received
   * cannot re-open a half-open circuit.
   */
  failedBeforeCall(error: unknown): void;
  /** The call says nothing about the provider (it never reached it, or the caller left). */
  abandon(): void;
}

/** Whether a call may go ahead, and when not, why. */
export type BreakerAdmission =
  | { readonly admitted: true; readonly permit: BreakerPermit }
  | {
      readonly admitted: false;
      readonly state: "open" | "half_open";
      /** Until the circuit half-opens; absent while half-open probes run. */
      readonly retryAfterMs?: number;
    };

const NOOP_PERMIT: BreakerPermit = {
  succeeded: () => undefined,
  failed: () => undefined,
  failedBeforeCall: () => undefined,
  abandon: () => undefined,
};
const ALWAYS_ADMITTED: BreakerAdmission = { admitted: true, permit: NOOP_PERMIT };

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
    private readonly classify: ErrorClassifier,
    private readonly now: () => number = Date.now,
  ) {
    if (
      config.enabled &&
      !(config.failureThreshold > 0 && config.openDurationMs > 0 && config.halfOpenMaxCalls > 0 && config.successThreshold > 0)
    ) {
      throw new RangeError(
        `circuitBreaker of ${provider}: failureThreshold, openDurationMs, halfOpenMaxCalls and successThreshold must be above 0`,
      );
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

  /** Admits a call, or says why the circuit refuses it (counted in rejectedCalls). */
  admit(): BreakerAdmission {
    if (!this.config.enabled) return ALWAYS_ADMITTED;
    if (this.state === "open") {
      const remaining = this.openedAt + this.config.openDurationMs - this.now();
      if (remaining > 0) {
        this.rejectedCalls += 1;
        return { admitted: false, state: "open", retryAfterMs: remaining };
      }
      this.transition("half_open");
    }
    if (this.state === "half_open") {
      if (this.probesInFlight >= this.config.halfOpenMaxCalls) {
        this.rejectedCalls += 1;
        return { admitted: false, state: "half_open" };
      }
      this.probesInFlight += 1;
      return { admitted: true, permit: this.permit(this.epoch, true) };
    }
    return { admitted: true, permit: this.permit(this.epoch, false) };
  }

  private permit(epoch: number, probe: boolean): BreakerPermit {
    let done = false;
    const finish = (verdict: CallVerdict): void => {
      if (done) return;
      done = true;
      if (epoch === this.epoch) this.onResult(verdict, probe);
    };
    const abandon = (): void => {
      if (done) return;
      done = true;
      if (epoch === this.epoch && probe) this.probesInFlight -= 1;
    };
    return {
      succeeded: () => finish("success"),
      failed: (error) => finish(this.classify(error)),
      failedBeforeCall: (error) => {
        if (this.classify(error) === "failure") finish("failure");
        else abandon();
      },
      abandon,
    };
  }

  private onResult(kind: CallVerdict, probe: boolean): void {
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
