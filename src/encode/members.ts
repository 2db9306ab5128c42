/**
 * The Encode pool as the hop sees it: every member of the membership with
 * the state it is in (checking, admitted, ejected), admission driven by the
 * membership watch and an active health check, passive outlier ejection
 * after failures, and an immutable round-robin picker over the admitted
 * members that is rebuilt whenever that set changes.
 *
 * Members are told apart by id and address together: a worker that
 * re-registers under its id at a new address is a new member (checked and
 * admitted afresh), and the old address leaves the rotation at once.
 *
 * Outlier ejection follows Envoy's: `consecutiveFailures` transport
 * failures or timeouts in a row eject a member for `baseEjectionMs` times
 * the number of ejections in a row (capped at `maxEjectionMs`); a refused
 * connection ejects at once; never more than `maxEjectionPercent` of the
 * pool is ejected at a time. An ejected member comes back once its time has
 * passed and its health check says SERVING; the same check takes a member
 * that turns NOT_SERVING out of rotation without waiting for failures.
 */
import type { Logger } from "pino";
import type { Member, Membership, Resolver } from "../discovery/index.js";
import { RoundRobinPicker } from "../rpc/index.js";
import { delay, linkSignals } from "../util/index.js";

export interface OutlierOptions {
  /** Transport failures or timeouts in a row that eject a member. */
  readonly consecutiveFailures: number;
  /** First ejection's length; each further ejection in a row adds as much. */
  readonly baseEjectionMs: number;
  /** Longest ejection. */
  readonly maxEjectionMs: number;
  /** Most of the pool ejected at once, in percent. */
  readonly maxEjectionPercent: number;
  /** How often members are health-checked; 0: never (an ejected member returns when its time is up). */
  readonly intervalMs: number;
}

export type MemberStateName = "checking" | "admitted" | "ejected";

/** What one health check says; a check that cannot reach the member throws. */
export type HealthVerdict = "serving" | "not_serving";
export type HealthProbe = (member: Member, signal: AbortSignal) => Promise<HealthVerdict>;

/** How an encode call to a member ended, as far as the member's health goes. */
export type CallOutcome = "success" | "refused" | "transport" | "timeout";

/** A member and where it stands, for status pages and metrics. */
export interface MemberView {
  readonly member: Member;
  readonly key: string;
  readonly state: MemberStateName;
  /** Epoch milliseconds an ejection ends at; undefined when not ejected. */
  readonly ejectedUntil: number | undefined;
  readonly reason: string;
  readonly consecutiveFailures: number;
  readonly ejections: number;
}

/** A member handed out by a pick: report the call's outcome with its key. */
export interface PickedMember {
  readonly member: Member;
  readonly key: string;
}

export interface EncodeMembersOptions {
  readonly resolver: Resolver;
  readonly outlier: OutlierOptions;
  /** Checks a member's health; without it members are admitted as they join and nothing is probed. */
  readonly probe?: HealthProbe;
  /** A new member waits for a SERVING check before it takes traffic (discovered pools); false admits it at once (configured pools). */
  readonly checkBeforeAdmit: boolean;
  /** Only members this accepts join the pool; the others are ignored (and counted by the caller). */
  readonly accepts?: (member: Member) => boolean;
  readonly logger: Logger;
  /** Told whenever the admitted set changes, with its size. */
  readonly onAdmitted?: (count: number) => void;
  /** Told of each ejection. */
  readonly onEjected?: (member: Member, reason: string) => void;
  /** Told of the members the pool ignored, after each membership change. */
  readonly onIgnored?: (members: readonly Member[]) => void;
  /** Epoch milliseconds; Date.now by default. */
  readonly now?: () => number;
}

interface MemberState {
  readonly member: Member;
  readonly key: string;
  state: MemberStateName;
  ejectedUntil: number | undefined;
  reason: string;
  consecutiveFailures: number;
  ejections: number;
  /** A health check is running. */
  probing: boolean;
}

/** `id@address`: what tells two members apart. */
export function memberKey(member: Member): string {
  return `${member.id}@${member.address}`;
}

export class EncodeMembers {
  private readonly members = new Map<string, MemberState>();
  private picker = new RoundRobinPicker<MemberState>([], { key: (m) => m.key });
  private membership: Membership;
  private readonly now: () => number;
  private readonly stopped = new AbortController();

  constructor(private readonly options: EncodeMembersOptions) {
    this.now = options.now ?? Date.now;
    this.membership = options.resolver.current();
    this.apply(this.membership);
  }

  /** The committed membership the pool follows. */
  get generation(): bigint {
    return this.membership.generation;
  }

  get admittedCount(): number {
    return this.picker.size;
  }

  /**
   * Follows the membership (admission runs from the watch, not from picks)
   * and runs the health checks, until `signal` fires or `close`.
   */
  async run(signal: AbortSignal): Promise<void> {
    const stop = linkSignals([signal, this.stopped.signal]);
    try {
      await Promise.all([this.watch(stop.signal), this.checkLoop(stop.signal)]);
    } finally {
      stop.dispose();
    }
  }

  close(): void {
    this.stopped.abort();
  }

  /** The next admitted member in rotation; undefined when none is admitted. */
  pick(): PickedMember | undefined {
    const state = this.picker.pick();
    return state && { member: state.member, key: state.key };
  }

  /** What an encode call to the member `key` came to. */
  report(key: string, outcome: CallOutcome): void {
    const state = this.members.get(key);
    if (state === undefined) return;
    if (outcome === "success") {
      state.consecutiveFailures = 0;
      // A member that has served again starts its ejection count over.
      if (state.state === "admitted") state.ejections = 0;
      return;
    }
    state.consecutiveFailures += 1;
    if (state.state !== "admitted") return;
    if (outcome === "refused") this.eject(state, "connection refused");
    else if (state.consecutiveFailures >= this.options.outlier.consecutiveFailures) {
      this.eject(state, `${state.consecutiveFailures} consecutive failures (last: ${outcome === "timeout" ? "timeout" : "transport"})`);
    }
  }

  views(): MemberView[] {
    return [...this.members.values()]
      .sort((a, b) => (a.member.id < b.member.id ? -1 : a.member.id > b.member.id ? 1 : a.key < b.key ? -1 : 1))
      .map((s) => ({
        member: s.member,
        key: s.key,
        state: s.state,
        ejectedUntil: s.ejectedUntil,
        reason: s.reason,
        consecutiveFailures: s.consecutiveFailures,
        ejections: s.ejections,
      }));
  }

  private async watch(signal: AbortSignal): Promise<void> {
    for await (const view of this.options.resolver.watch(signal)) {
      if (view.generation === this.membership.generation && view.members === this.membership.members) continue;
      this.membership = view;
      this.apply(view);
    }
  }

  /** Brings the states in line with a committed membership: new members join, gone ones leave at once. */
  private apply(view: Membership): void {
    const ignored: Member[] = [];
    const keys = new Set<string>();
    for (const member of view.members) {
      if (this.options.accepts && !this.options.accepts(member)) {
        ignored.push(member);
        continue;
      }
      const key = memberKey(member);
      keys.add(key);
      if (this.members.has(key)) continue;
      const admitted = !this.options.checkBeforeAdmit || this.options.probe === undefined;
      const state: MemberState = {
        member,
        key,
        state: admitted ? "admitted" : "checking",
        ejectedUntil: undefined,
        reason: admitted ? "" : "waiting for its first health check",
        consecutiveFailures: 0,
        ejections: 0,
        probing: false,
      };
      this.members.set(key, state);
      // Checked now, so that it takes traffic as soon as it is SERVING.
      if (!admitted) void this.check(state, this.stopped.signal);
    }
    for (const key of [...this.members.keys()]) if (!keys.has(key)) this.members.delete(key);
    this.options.onIgnored?.(ignored);
    this.rebuild();
  }

  private async checkLoop(signal: AbortSignal): Promise<void> {
    const interval = this.options.outlier.intervalMs;
    while (!signal.aborted) {
      await delay(interval > 0 ? interval : 1000, signal).catch(() => undefined);
      if (signal.aborted) return;
      const now = this.now();
      for (const state of [...this.members.values()]) {
        if (this.options.probe === undefined || interval === 0) {
          // Without checks an ejection simply runs out.
          if (state.state === "ejected" && state.ejectedUntil !== undefined && now >= state.ejectedUntil) this.admit(state);
          continue;
        }
        void this.check(state, signal);
      }
    }
  }

  /** One health check of `state`'s member, and what follows from it. */
  private async check(state: MemberState, signal: AbortSignal): Promise<void> {
    const probe = this.options.probe;
    if (probe === undefined || state.probing) return;
    state.probing = true;
    let verdict: HealthVerdict | Error;
    try {
      verdict = await probe(state.member, signal);
    } catch (err) {
      verdict = err instanceof Error ? err : new Error(String(err));
    } finally {
      state.probing = false;
    }
    // The member left (or came back as another) while it was checked.
    if (signal.aborted || this.members.get(state.key) !== state) return;
    const now = this.now();
    if (verdict === "serving") {
      if (state.state === "checking" || (state.state === "ejected" && now >= (state.ejectedUntil ?? 0))) this.admit(state);
      return;
    }
    const reason = verdict === "not_serving" ? "health: NOT_SERVING" : `health check failed: ${verdict.message}`;
    if (state.state === "admitted") {
      if (verdict === "not_serving") {
        // Taken out by its operator (or draining): out of rotation now, back when SERVING.
        state.state = "checking";
        state.reason = reason;
        this.options.logger.info({ member: state.member.id, address: state.member.address }, "Encode worker not serving: out of rotation");
        this.rebuild();
      } else {
        this.report(state.key, isRefused(verdict) ? "refused" : "transport");
      }
      return;
    }
    state.reason = state.state === "ejected" ? `${state.reason.split("; ")[0]}; ${reason}` : reason;
  }

  private admit(state: MemberState): void {
    const was = state.state;
    state.state = "admitted";
    state.ejectedUntil = undefined;
    state.reason = "";
    state.consecutiveFailures = 0;
    if (was !== "admitted") {
      this.options.logger.info({ member: state.member.id, address: state.member.address, was }, "Encode worker admitted");
      this.rebuild();
    }
  }

  private eject(state: MemberState, reason: string): void {
    const pool = this.members.size;
    const ejected = [...this.members.values()].filter((s) => s.state === "ejected").length;
    if ((ejected + 1) * 100 > this.options.outlier.maxEjectionPercent * pool) {
      // Over the cap it stays in rotation; its calls keep falling back.
      return;
    }
    const { baseEjectionMs, maxEjectionMs } = this.options.outlier;
    state.ejections += 1;
    const length = Math.min(baseEjectionMs * state.ejections, maxEjectionMs);
    state.state = "ejected";
    state.ejectedUntil = this.now() + length;
    state.reason = reason;
    this.options.logger.warn(
      { member: state.member.id, address: state.member.address, reason, ejectionMs: length, ejections: state.ejections },
      "Encode worker ejected",
    );
    this.options.onEjected?.(state.member, reason);
    this.rebuild();
  }

  /** A new picker when the admitted set changed (the rotation carries over). */
  private rebuild(): void {
    const admitted = [...this.members.values()].filter((s) => s.state === "admitted").sort((a, b) => (a.key < b.key ? -1 : 1));
    const same = admitted.length === this.picker.size && admitted.every((s, i) => this.picker.endpoints[i] === s);
    if (same) return;
    this.picker = this.picker.rebuild(admitted);
    this.options.onAdmitted?.(admitted.length);
  }
}

/** Whether an error says the peer refused the connection (nothing listens there). */
export function isRefused(error: unknown): boolean {
  for (let e: unknown = error, depth = 0; e !== undefined && e !== null && depth < 5; depth++) {
    if ((e as { code?: unknown }).code === "ECONNREFUSED") return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}
