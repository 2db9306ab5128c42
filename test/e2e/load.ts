/**
 * A bounded load generator for the end-to-end suite: `concurrency` callers
 * of the hop's EncodeHopService.Generate, each sending one request after
 * another until a fixed count is reached, a fixed duration has passed or
 * `stop()` is called (whichever comes first; a duration is always set, so a
 * run always ends). Every request has a deadline, and a watchdog a little
 * after it: a call that has not ended by then is counted as hung and left
 * behind, so nothing here can wait forever.
 *
 * Each request ends as one of:
 * - encoded: the final output carries an encoder result, and every receipt
 *   the token worker wrote for it is verified (its bytes read and hashed to
 *   the content hash the Encode worker claimed);
 * - unverified: encoded, but some receipt is not verified (counted apart);
 * - fallback: answered without an encoder result (the hop forwarded the
 *   original request: no worker, or the encode failed);
 * - failed: an error status (its code counted);
 * - hung: still running at the watchdog.
 *
 * A stream the server reset with REFUSED_STREAM (HTTP/2: it was never
 * processed; a draining server refuses streams that arrive after its
 * GOAWAY) is UNAVAILABLE by gRPC's HTTP/2 mapping, and connect-node says so
 * when it reads the reset code; but Node's stream "error" event comes first
 * and connect-node then reports INTERNAL ("Stream closed with error code
 * NGHTTP2_REFUSED_STREAM"). Such a failure is counted as UNAVAILABLE here,
 * marked `refused`.
 */
import type { ClientHttp2Stream, Http2Session, OutgoingHttpHeaders, SecureClientSessionOptions } from "node:http2";
import { setTimeout as sleep } from "node:timers/promises";
import { toJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { EncodeHopService } from "../../gen/mmgate/encode/v1/encode_pb.js";
import type { PreprocessedRequest } from "../../gen/mmgate/llm/v1/request_pb.js";

type SessionManager = NonNullable<Parameters<typeof createGrpcTransport>[0]["sessionManager"]>;

/**
 * connect-node's session manager with every HTTP/2 session it hands out
 * given an "error" listener of its own. connect-node 2.1.2 destroys a
 * session that receives GOAWAY without open streams with an error that Node
 * raises later, on the socket's close; when the manager has left the
 * session by then (a new request reconnected), its listeners are gone and
 * the error is an uncaught exception that ends the process
 * (connectrpc/connect-es#1768, open; #1769 proposes the same listener). A
 * draining hop sends exactly that GOAWAY: without this the load generator
 * itself could crash the suite. The listener only keeps the error from
 * being uncaught: the calls on the session fail on their own, and the
 * manager's own listeners, while attached, still see it.
 */
class GuardedSessionManager implements SessionManager {
  private readonly inner: Http2SessionManager;
  private readonly guarded = new WeakSet<Http2Session>();
  /** Session errors no one else listened to. */
  static swallowed = 0;

  constructor(baseUrl: string, options: SecureClientSessionOptions) {
    this.inner = new Http2SessionManager(baseUrl, {}, options);
  }

  get authority(): string {
    return this.inner.authority;
  }

  async request(method: string, path: string, headers: OutgoingHttpHeaders, options: Parameters<SessionManager["request"]>[3]): Promise<ClientHttp2Stream> {
    const stream = await this.inner.request(method, path, headers, options);
    const session = stream.session;
    if (session !== undefined && !this.guarded.has(session)) {
      this.guarded.add(session);
      session.on("error", () => {
        if (session.listenerCount("error") === 1) GuardedSessionManager.swallowed++;
      });
    }
    return stream;
  }

  notifyResponseByteRead(stream: ClientHttp2Stream): void {
    this.inner.notifyResponseByteRead(stream);
  }
}

/**
 * A gRPC transport over one HTTP/2 (TLS) connection to `baseUrl`, safe from
 * connect-es#1768 (above); `readMaxBytes` raises its read limit (a relay's
 * snapshot chunks).
 */
export function guardedTransport(baseUrl: string, options: SecureClientSessionOptions, readMaxBytes?: number): Transport {
  return createGrpcTransport({ baseUrl, sessionManager: new GuardedSessionManager(baseUrl, options), ...(readMaxBytes !== undefined ? { readMaxBytes } : {}) });
}

/** Session errors the guard kept from being uncaught exceptions, so far. */
export function swallowedSessionErrors(): number {
  return GuardedSessionManager.swallowed;
}

export type OutcomeKind = "encoded" | "unverified" | "fallback" | "failed" | "hung";

/** One request's end. Times are `performance.now()` milliseconds. */
export interface Outcome {
  readonly kind: OutcomeKind;
  /** The status code of a failed request. */
  readonly code?: Code;
  readonly message?: string;
  readonly startedAt: number;
  readonly endedAt: number;
  /** Receipts of an encoded request (verified or not). */
  readonly receipts: number;
  /** A failure the server refused the stream with (REFUSED_STREAM: never processed). */
  readonly refused?: boolean;
  /** An unverified receipt's reason. */
  readonly reason?: string;
}

export interface LoadOptions {
  /** Callers at once. */
  readonly concurrency: number;
  /** Requests in all (none: until the duration or stop()). */
  readonly count?: number;
  /** Longest run; new requests stop being sent after it. */
  readonly durationMs: number;
  /** Each request's deadline (the client's timeout). */
  readonly deadlineMs: number;
  /** How long after its deadline a request that has not ended counts as hung (1000 by default). */
  readonly hangSlackMs?: number;
  /** A caller's pause after a failed request, so that a refusing server is not spun against (50 by default). */
  readonly pauseAfterFailureMs?: number;
}

/** What the requests of one run came to. */
export interface LoadReport {
  readonly outcomes: readonly Outcome[];
  readonly requests: number;
  readonly encoded: number;
  readonly unverified: number;
  readonly fallback: number;
  readonly failed: number;
  readonly hung: number;
  /** Failed requests by code name. */
  readonly codes: Readonly<Record<string, number>>;
  readonly elapsedMs: number;
}

export function summarize(outcomes: readonly Outcome[], elapsedMs = 0): LoadReport {
  const count = (kind: OutcomeKind) => outcomes.filter((o) => o.kind === kind).length;
  const codes: Record<string, number> = {};
  for (const o of outcomes) if (o.kind === "failed") codes[Code[o.code ?? Code.Unknown]] = (codes[Code[o.code ?? Code.Unknown]] ?? 0) + 1;
  return {
    outcomes,
    requests: outcomes.length,
    encoded: count("encoded"),
    unverified: count("unverified"),
    fallback: count("fallback"),
    failed: count("failed"),
    hung: count("hung"),
    codes,
    elapsedMs,
  };
}

/** `UNAVAILABLE×3, DEADLINE_EXCEEDED×1`, or "-". */
export function codesText(codes: Readonly<Record<string, number>>): string {
  const parts = Object.entries(codes).map(([code, n]) => `${code.replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase()}×${n}`);
  return parts.length > 0 ? parts.join(", ") : "-";
}

interface FinalArgs {
  readonly encoder_result_present?: boolean;
  readonly receipts?: readonly { readonly verified?: boolean; readonly content_hash?: string | null; readonly reason?: string }[];
}

/** A running load: its report once every caller has ended. */
export interface Load {
  /** Stops sending new requests (the ones in flight finish, or reach their watchdog). */
  stop(): void;
  /** Outcomes so far. */
  snapshot(): readonly Outcome[];
  readonly done: Promise<LoadReport>;
}

export class HopLoad {
  private readonly clients: Client<typeof EncodeHopService>[];

  /**
   * `transports`: the connections the callers share (caller i uses
   * transports[i % length]); `token`: the bearer token.
   */
  constructor(
    transports: readonly Transport[],
    private readonly request: (i: number) => PreprocessedRequest,
    private readonly token: string,
  ) {
    this.clients = transports.map((t) => createClient(EncodeHopService, t));
  }

  /**
   * Sends request `i` on caller `slot`'s connection; never rejects, never
   * outlives its deadline by more than `hangSlackMs`.
   */
  async one(slot: number, i: number, deadlineMs: number, hangSlackMs = 1000): Promise<Outcome> {
    const client = this.clients[slot % this.clients.length]!;
    const startedAt = performance.now();
    const abort = new AbortController();
    let watchdog: NodeJS.Timeout | undefined;
    const hung = new Promise<"hung">((resolve) => {
      watchdog = setTimeout(() => {
        abort.abort();
        resolve("hung");
      }, deadlineMs + hangSlackMs);
    });
    const call = (async (): Promise<Omit<Outcome, "startedAt" | "endedAt">> => {
      try {
        let last: FinalArgs | undefined;
        const stream = client.generate({ request: this.request(i) }, { headers: { authorization: `Bearer ${this.token}` }, timeoutMs: deadlineMs, signal: abort.signal });
        for await (const res of stream) {
          const extra = res.output?.data?.extraArgs;
          if (extra !== undefined) last = toJson(ValueSchema, extra) as FinalArgs;
        }
        if (last?.encoder_result_present !== true) return { kind: "fallback", receipts: 0 };
        const receipts = last.receipts ?? [];
        const bad = receipts.find((r) => r.verified !== true || typeof r.content_hash !== "string" || !/^[0-9a-f]{16}$/.test(r.content_hash));
        if (receipts.length > 0 && bad === undefined) return { kind: "encoded", receipts: receipts.length };
        return { kind: "unverified", receipts: receipts.length, reason: bad?.reason ?? "no receipts" };
      } catch (err) {
        const error = ConnectError.from(err);
        const refused = /REFUSED_STREAM/.test(error.rawMessage);
        return { kind: "failed", code: refused ? Code.Unavailable : error.code, message: error.rawMessage, receipts: 0, ...(refused ? { refused } : {}) };
      }
    })();
    const result = await Promise.race([call, hung]);
    clearTimeout(watchdog);
    const endedAt = performance.now();
    if (result === "hung") return { kind: "hung", startedAt, endedAt, receipts: 0 };
    return { ...result, startedAt, endedAt };
  }

  /** Starts a run. */
  start(options: LoadOptions): Load {
    const outcomes: Outcome[] = [];
    let stopped = false;
    let issued = 0;
    const began = performance.now();
    const timer = setTimeout(() => (stopped = true), options.durationMs);
    const caller = async (slot: number) => {
      while (!stopped && (options.count === undefined || issued < options.count)) {
        const i = issued++;
        const outcome = await this.one(slot, i, options.deadlineMs, options.hangSlackMs);
        outcomes.push(outcome);
        if (outcome.kind === "failed" && !stopped) await sleep(options.pauseAfterFailureMs ?? 50);
      }
    };
    const done = Promise.all(Array.from({ length: options.concurrency }, (_, slot) => caller(slot))).then(() => {
      clearTimeout(timer);
      return summarize(outcomes, performance.now() - began);
    });
    return {
      stop: () => {
        stopped = true;
      },
      snapshot: () => [...outcomes],
      done,
    };
  }
}
