import { clone } from "@bufbuild/protobuf";
import type { JsonObject } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import type { Logger } from "pino";
import { EncodeWorkerService } from "../../gen/mmgate/encode/v1/encode_pb.js";
import type { TraceLink } from "../../gen/mmgate/llm/v1/common_pb.js";
import { FinishReason_Kind, type AnnotatedOutput } from "../../gen/mmgate/llm/v1/output_pb.js";
import { PreprocessedRequestSchema, type PreprocessedRequest } from "../../gen/mmgate/llm/v1/request_pb.js";
import { shouldEncode } from "../llm/index.js";
import { inSpan, type TraceSpan } from "../telemetry/index.js";
import { cancelledOnExit, delay } from "../util/index.js";
import { isRefused, type CallOutcome } from "./members.js";

/** Where the hop stands: waiting for a binding, routing to one, or without a target. */
export type EncoderLifecycle = "pending" | "active" | "unavailable";

/** One admitted Encode worker, as a binding hands it out. */
export interface EncodeMember {
  readonly id: string;
  readonly transport: Transport;
  /** What the binding knows the member by (id and address); the outcome of the call is reported under it. */
  readonly key?: string;
}

/** What the router tells a binding of a call it made to one of its members. */
export type EncodeCallOutcome = CallOutcome;

/**
 * A live connection to one Encode target: round-robin over the members it
 * currently admits (admission changes apply at once, the rotation is kept).
 */
export interface EncodeBinding {
  /** The next admitted member; undefined when none is admitted or the binding is retired. */
  pick(): EncodeMember | undefined;
  /** How a call to the member picked under `key` went (feeds outlier ejection). */
  report?(key: string, outcome: EncodeCallOutcome): void;
  /** Retires the binding: picks made afterwards fail at once. */
  close(): void;
}

/** What a binding tells the router while it lives. */
export interface BindingEvents {
  /** The number of admitted members changed: none makes the hop Unavailable, some make it Active. */
  admitted(count: number): void;
}

/**
 * The Encode pool a hop is pointed at. Two targets with the same `id` are the
 * same pool (a committed group at one generation, or a legacy endpoint), so
 * a binding built for one serves the other.
 */
export interface EncodeTarget {
  readonly id: string;
  /** Builds the binding; may fail (then retried every second while the target is current). */
  bind(signal: AbortSignal, events?: BindingEvents): Promise<EncodeBinding>;
}

/** Why a request went downstream without an encoder result. */
export type FallbackCause = "no_member" | "encode_error" | "no_terminal" | "no_encoder_result" | "transport";

export class EncodeHopError extends Error {
  override readonly name = "EncodeHopError";
  constructor(
    readonly cause_: FallbackCause,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** What one call through the hop may carry to the Encode worker. */
export interface HopCallOptions {
  readonly requestId: string;
  /** Metadata to forward (the caller's headers that matter downstream). */
  readonly headers?: Readonly<Record<string, string>>;
  /**
   * Longest the encode call may take. The call has its own context bounded
   * by this, never the caller's signal: a worker that was asked to encode
   * hands out tensors that only the downstream call releases, so a caller
   * leaving mid-encode must not cut the call.
   */
  readonly timeoutMs?: number;
}

export interface EncoderRouterOptions {
  readonly logger: Logger;
  /** Wait before building a binding again after a failure (1 s, as the reference). */
  readonly retryMs?: number;
  /** Told of every lifecycle change (module readiness, metrics). */
  readonly onLifecycle?: (state: EncoderLifecycle) => void;
  /** Told of every request that fell back to downstream inline encoding. */
  readonly onFallback?: (cause: FallbackCause, member: string | undefined) => void;
  /** Told of every multimodal request passed through because no member is admitted (the hop is not Active). */
  readonly onUnavailable?: () => void;
  /** Told of every request encoded, with the member that encoded it. */
  readonly onEncoded?: (member: string) => void;
}

/** The result of consuming an encode stream. */
interface EncodeOutcome {
  readonly encoderResult: JsonObject;
  readonly traceLink: TraceLink | undefined;
}

/**
 * Consumes an Encode worker's stream by the reference's rules: any error
 * item fails it; the terminal is the last output with a finish reason; the
 * terminal's encoder_result must be present (an object by the contract).
 */
export async function consumeEncodeStream(stream: AsyncIterable<AnnotatedOutput>): Promise<EncodeOutcome> {
  let terminal: AnnotatedOutput["data"];
  for await (const item of stream) {
    const errorMessage =
      item.error !== undefined || item.event === "error"
        ? (item.comment[0] ?? "the Encode worker reported an error")
        : item.data?.finishReason?.kind === FinishReason_Kind.ERROR
          ? item.data.finishReason.errorMessage
          : undefined;
    if (errorMessage !== undefined) throw new EncodeHopError("encode_error", `Encode worker returned an error: ${errorMessage}`);
    if (item.data?.finishReason !== undefined) terminal = item.data;
  }
  if (terminal === undefined) throw new EncodeHopError("no_terminal", "Encode worker stream ended without a terminal chunk");
  if (terminal.encoderResult === undefined) {
    throw new EncodeHopError("no_encoder_result", "Encode worker terminal is missing an object-shaped encoder_result");
  }
  return { encoderResult: terminal.encoderResult, traceLink: terminal.workerTraceLink };
}

/**
 * The optional multimodal Encode hop: multimodal requests are encoded by one
 * of the target's admitted Encode workers (round-robin) and go downstream
 * with the encoder result attached; everything else, and every request the
 * hop cannot encode, goes downstream unchanged. A request never fails
 * because of the hop.
 *
 * `setTarget` is synchronous; binding happens in `run`, the background
 * driver a module hands to its task supervisor.
 */
export class EncoderRouter {
  /** Pending until a binding says how many members it admits, as the reference starts. */
  private lifecycle: EncoderLifecycle = "pending";
  private target: EncodeTarget | undefined;
  private binding: { readonly targetId: string; readonly binding: EncodeBinding } | undefined;
  /** Aborted (and replaced) whenever the target changes or the router closes. */
  private epoch = new AbortController();
  private closed = false;
  /** Members the current binding admits (as it last said). */
  private admitted = 0;
  private readonly retryMs: number;

  constructor(private readonly options: EncoderRouterOptions) {
    this.retryMs = options.retryMs ?? 1000;
  }

  get state(): EncoderLifecycle {
    return this.lifecycle;
  }

  get targetId(): string | undefined {
    return this.target?.id;
  }

  /**
   * Points the hop at a target (or none). Clearing is immediate, so requests
   * stop using a removed pool before anything else happens; the same target
   * id keeps its binding; another one drops it and waits for a new one.
   */
  setTarget(target: EncodeTarget | undefined): void {
    if (this.closed || (target !== undefined && target.id === this.target?.id)) return;
    this.target = target;
    if (target === undefined) {
      this.retire();
      this.setLifecycle("unavailable");
    } else if (this.binding?.targetId === target.id) {
      this.setLifecycle(this.admitted > 0 ? "active" : "unavailable");
    } else {
      this.retire();
      this.setLifecycle("pending");
    }
    this.nextEpoch();
  }

  /**
   * The background driver: builds a binding for the current target, retries
   * every `retryMs` after a failure, starts over when the target changes,
   * and returns when `signal` fires (leaving no timer or binding behind).
   */
  async run(signal: AbortSignal): Promise<void> {
    while (!signal.aborted && !this.closed) {
      const target = this.target;
      // One signal for this round: the driver stops, or the target changes.
      const round = linkedAbort(signal, this.epoch.signal);
      try {
        if (target === undefined || this.binding?.targetId === target.id) {
          await round.aborted;
          continue;
        }
        try {
          // Until the binding says otherwise, a bound target routes (a binding that never reports admits its members as they are).
          let bound = false;
          this.admitted = 1;
          const events: BindingEvents = {
            admitted: (count) => {
              this.admitted = count;
              if (bound && this.binding?.targetId === target.id) this.setLifecycle(count > 0 ? "active" : "unavailable");
            },
          };
          const binding = await target.bind(round.signal, events);
          if (round.signal.aborted || this.closed) {
            binding.close();
            continue;
          }
          this.binding = { targetId: target.id, binding };
          bound = true;
          this.setLifecycle(this.admitted > 0 ? "active" : "unavailable");
          this.options.logger.info({ target: target.id, admitted: this.admitted }, "encode target bound");
        } catch (err) {
          if (round.signal.aborted) continue;
          this.options.logger.error({ err, target: target.id }, "failed to activate the encode target; retrying");
          await delay(this.retryMs, round.signal).catch(() => undefined);
        }
      } finally {
        round.dispose();
      }
    }
  }

  /** Stops routing for good and retires the binding. */
  close(): void {
    this.closed = true;
    this.retire();
    this.setLifecycle("unavailable");
    this.nextEpoch();
  }

  /**
   * Prepares a request for downstream: encodes it when the hop is active and
   * the request needs it, else returns it unchanged. Never throws: a failed
   * encode returns the original request (media intact, no encoder result).
   */
  async prepare(request: PreprocessedRequest, call: HopCallOptions): Promise<PreprocessedRequest> {
    if (!shouldEncode(request)) return request;
    // The encode step's span (tracing on): the Encode call is its child; a fallback marks it failed with its cause.
    return inSpan("hop.encode", this.target ? { "mmgate.encode.target": this.target.id } : undefined, (span) => this.encodeOrPass(request, call, span));
  }

  private async encodeOrPass(request: PreprocessedRequest, call: HopCallOptions, span: TraceSpan | undefined): Promise<PreprocessedRequest> {
    if (this.lifecycle !== "active") {
      // The reference's None target: no admitted member, no error per request.
      this.options.onUnavailable?.();
      span?.set("mmgate.encode.outcome", "unavailable");
      return request;
    }
    const binding = this.binding?.binding;
    let member: EncodeMember | undefined;
    try {
      member = binding?.pick();
      if (member === undefined) throw new EncodeHopError("no_member", "no Encode worker is admitted");
      span?.set("mmgate.encode.member", member.id);
      const client = createClient(EncodeWorkerService, member.transport);
      const headers = new Headers(call.headers ?? {});
      headers.set("x-request-id", call.requestId);
      // An error item ends the consumption early: the call is cancelled then, not left to the worker.
      const responses = cancelledOnExit(undefined, (signal) => client.encode({ request }, { headers, signal, ...(call.timeoutMs !== undefined ? { timeoutMs: call.timeoutMs } : {}) }));
      let outcome: EncodeOutcome;
      try {
        outcome = await consumeEncodeStream(outputsOf(responses));
      } catch (err) {
        if (member.key !== undefined) binding?.report?.(member.key, callOutcomeOf(err));
        throw err;
      }
      if (member.key !== undefined) binding?.report?.(member.key, "success");
      // Once a worker has handed out a transfer handle, the request goes
      // downstream even if the caller has gone: the receiver owns transfer
      // completion and buffer release.
      const encoded = clone(PreprocessedRequestSchema, request);
      encoded.encoderResult = outcome.encoderResult;
      encoded.migrationLink = outcome.traceLink;
      this.options.onEncoded?.(member.id);
      span?.set("mmgate.encode.outcome", "encoded");
      return encoded;
    } catch (err) {
      const cause = err instanceof EncodeHopError ? err.cause_ : "transport";
      this.options.logger.warn(
        { err, cause, member: member?.id, requestId: call.requestId },
        "Encoder hop failed; falling back to downstream inline encoding",
      );
      this.options.onFallback?.(cause, member?.id);
      span?.set("mmgate.encode.outcome", "fallback").set("mmgate.encode.fallback_cause", cause).fail(err, cause);
      return request;
    }
  }

  private nextEpoch(): void {
    const previous = this.epoch;
    this.epoch = new AbortController();
    previous.abort();
  }

  private retire(): void {
    this.binding?.binding.close();
    this.binding = undefined;
  }

  private setLifecycle(state: EncoderLifecycle): void {
    if (this.lifecycle === state) return;
    this.lifecycle = state;
    this.options.onLifecycle?.(state);
  }
}

/**
 * What a failed encode call says of the member's health: its answers
 * (an error item, a missing terminal) mean it is alive; a refused
 * connection, a deadline or a broken transport do not.
 */
function callOutcomeOf(err: unknown): EncodeCallOutcome {
  if (err instanceof EncodeHopError) return "success";
  if (isRefused(err)) return "refused";
  const code = ConnectError.from(err).code;
  if (code === Code.DeadlineExceeded) return "timeout";
  if (code === Code.ResourceExhausted || code === Code.InvalidArgument || code === Code.Unauthenticated || code === Code.PermissionDenied) return "success";
  return "transport";
}

async function* outputsOf(responses: AsyncIterable<{ output?: AnnotatedOutput | undefined }>): AsyncGenerator<AnnotatedOutput> {
  for await (const response of responses) if (response.output) yield response.output;
}

/**
 * A signal that fires when either input fires, and a promise of that; the
 * listeners come off again on `dispose`, so a long-lived signal gathers none.
 */
function linkedAbort(a: AbortSignal, b: AbortSignal): { signal: AbortSignal; aborted: Promise<void>; dispose(): void } {
  const controller = new AbortController();
  let resolve!: () => void;
  const aborted = new Promise<void>((r) => (resolve = r));
  const fire = () => {
    controller.abort();
    resolve();
  };
  if (a.aborted || b.aborted) fire();
  a.addEventListener("abort", fire, { once: true });
  b.addEventListener("abort", fire, { once: true });
  return {
    signal: controller.signal,
    aborted,
    dispose() {
      a.removeEventListener("abort", fire);
      b.removeEventListener("abort", fire);
      fire();
    },
  };
}
