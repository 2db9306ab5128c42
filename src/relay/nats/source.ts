/**
 * A source of KV router events over NATS: workers publish each event as the
 * reference router's JSON (`{"worker_id":1,"event":{"event_id":1,...}}`) on a
 * subject, and the relay subscribes to it. One message carries one event as a
 * JSON object, or several as JSON lines (one event per line). The event JSON
 * is read by `routerEventFromJson`, so u64 hashes stay exact.
 *
 * A message that is too large or not router-event JSON is dropped whole,
 * counted by its RouterEventJsonError code and logged (at most one warning a
 * second); the source keeps going. Core NATS delivers at most once: what is
 * published while the relay is disconnected is lost, which the filter's
 * event-id checks are there to notice.
 *
 * Messages are delivered one at a time, in arrival order, each as one task
 * of a WorkSlicer (the relay's: the same one its ingest streams apply
 * through), which yields the event loop between events and, when the sink
 * hands back stepped work, between the blocks of an event. Messages that
 * arrive meanwhile wait, up to `maxPendingBytes` of them; one that would go
 * past it is dropped and counted (`backlogDropped`), as a NATS server drops
 * messages for a consumer that falls behind.
 *
 * With `jetstream` set, the source reads a JetStream stream through a
 * durable consumer instead (./jetstream.ts): at least once, acked once
 * applied, replayed from the stream's start when a relay process starts.
 */
import type * as NatsModule from "nats";
import type { ConnectionOptions, Msg, NatsConnection } from "nats";
import type { Logger } from "pino";
import { Counter, type Registry } from "prom-client";
import { z } from "zod";
import {
  MAX_ROUTER_EVENT_JSON_BYTES,
  RouterEventJsonError,
  routerEventFromJson,
  routerEventsFromJsonLines,
  type RouterEvent,
  type RouterEventJsonErrorCode,
} from "../../kv/index.js";
import { checkNatsCredentials, natsConnectionOptions, natsCredentialFields, natsReconnectWaitSchema, natsServersSchema } from "../../nats/index.js";
import { errorOf, MAX_TIMER_MS, registeredMetric, settleWithin, whenAborted, WorkSlicer } from "../../util/index.js";
import { openSpan, SpanKind } from "../../telemetry/index.js";
import { JetStreamIngest, jetStreamConfigSchema, type JetStreamStats } from "./jetstream.js";
import { natsSubjectSchema } from "./subject.js";

/** The default of `maxPendingBytes`: 64 MiB. */
export const DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024;

/**
 * Where to subscribe for router events. Every field but `subject` has a
 * default; errors name their field (`servers.0: expected HOST:PORT ...`).
 */
export const natsSourceConfigSchema = z
  .strictObject({
    /** NATS servers, `HOST:PORT` or `nats://HOST:PORT`; the client picks one and fails over to the others. */
    servers: natsServersSchema,
    /**
     * Subject the workers publish on; `*` (one token) and `>` (the rest)
     * wildcards are allowed. With `jetstream`, the default subject of a
     * created stream and of the consumer's filter.
     */
    subject: natsSubjectSchema,
    /** Queue group: relays in one group share the subject, each message going to one of them. Default: none; core NATS only. */
    queue: z.string().regex(/^[^\s]+$/, "a queue group is non-empty and has no whitespace").optional(),
    /** Largest message accepted; a larger one is dropped as TOO_LARGE before it is decoded. */
    maxPayloadBytes: z.int().min(1).max(MAX_ROUTER_EVENT_JSON_BYTES).default(MAX_ROUTER_EVENT_JSON_BYTES),
    /**
     * Bytes of messages received and not yet applied (64 MiB, a NATS server's
     * default allowance for a slow consumer); a message that would go past it
     * is dropped and counted (`mmgate_relay_nats_backlog_dropped_total`).
     * Core NATS only: a JetStream consumer is held back by `maxAckPending`.
     */
    maxPendingBytes: z.int().min(1).max(Number.MAX_SAFE_INTEGER).default(DEFAULT_MAX_PENDING_BYTES),
    /** Connection name the server shows in its monitoring. */
    name: z.string().min(1).default("mmgate-relay"),
    /** Pause between attempts to reconnect to a lost server (the client adds up to 100 ms of jitter). */
    reconnectWaitMs: natsReconnectWaitSchema,
    /** How long the first connection's handshake may take. */
    connectTimeoutMs: z.int().min(1).max(MAX_TIMER_MS).default(5000),
    ...natsCredentialFields,
    /** Read a JetStream stream (at least once, replayed on start) instead of subscribing to core NATS. Default: absent, core NATS. */
    jetstream: jetStreamConfigSchema.optional(),
  })
  .superRefine((c, ctx) => {
    checkNatsCredentials(c, ctx);
    if (c.queue !== undefined && c.jetstream !== undefined) {
      ctx.addIssue({ code: "custom", path: ["queue"], message: "a queue group is for core NATS: with jetstream, every relay reads the whole stream through a durable of its own" });
    }
  });

/** A NATS source's settings, every default applied. */
export type NatsSourceConfig = z.output<typeof natsSourceConfigSchema>;
/** What a config file may say. */
export type NatsSourceConfigInput = z.input<typeof natsSourceConfigSchema>;

/**
 * Receives each event, in message order. It may apply the event at once, or
 * return stepped work (a generator that yields where it may pause, such as
 * RelayPool.applyInSteps), which the source runs to its end through its
 * slicer before the next event; any other value is ignored. An exception,
 * from the call or from a step, is counted (`sinkErrors`) and logged; the
 * source goes on with the next event.
 */
export type RouterEventSink = (event: RouterEvent) => unknown;

/** Counters of a NATS source (on a prom-client registry). */
export interface NatsSourceMetrics {
  /** Messages received, accepted or not. */
  readonly messages: Counter;
  /** Events handed to the sink. */
  readonly events: Counter;
  /** Messages dropped, by RouterEventJsonError code. */
  readonly rejected: Counter<"code">;
  /** Events whose sink threw. */
  readonly sinkErrors: Counter;
  /** Messages dropped because `maxPendingBytes` of earlier ones were still waiting. */
  readonly backlogDropped: Counter;
}

function counter<L extends string = string>(registry: Registry, name: string, help: string, labelNames: readonly L[] = []): Counter<L> {
  return registeredMetric(registry, name, Counter<L>, () => new Counter<L>({ name, help, labelNames, registers: [registry] }));
}

/**
 * The counters every NATS source on `registry` shares, registered on first
 * use: `mmgate_relay_nats_messages_total`, `mmgate_relay_nats_events_total`,
 * `mmgate_relay_nats_rejected_total{code}`,
 * `mmgate_relay_nats_sink_errors_total` and
 * `mmgate_relay_nats_backlog_dropped_total`.
 */
export function natsSourceMetrics(registry: Registry): NatsSourceMetrics {
  return {
    messages: counter(registry, "mmgate_relay_nats_messages_total", "NATS messages received by the relay's router-event sources, accepted or not"),
    events: counter(registry, "mmgate_relay_nats_events_total", "Router events read from NATS messages and handed on"),
    rejected: counter(registry, "mmgate_relay_nats_rejected_total", "NATS messages dropped as too large or not router-event JSON, by error code", ["code"] as const),
    sinkErrors: counter(registry, "mmgate_relay_nats_sink_errors_total", "Router events from NATS whose consumer threw"),
    backlogDropped: counter(registry, "mmgate_relay_nats_backlog_dropped_total", "NATS messages dropped because maxPendingBytes of earlier ones were still waiting to be applied"),
  };
}

export interface NatsEventSourceOptions {
  readonly logger?: Logger;
  /** Registers the source's counters (natsSourceMetrics) on this registry. */
  readonly registry?: Registry;
  /**
   * Delivers each message as one task of this slicer, yielding the loop
   * whenever its slice is spent. Default: a slicer of the source's own.
   */
  readonly slicer?: WorkSlicer;
  /**
   * Called before a message's events are delivered; what it returns is
   * called after the last one (the relay holds the pool's publications, so
   * that a message publishes as one delta however many turns it takes).
   */
  readonly aroundMessage?: () => () => void;
}

/** What a source has done since it was built (across runs). */
export interface NatsEventSourceStats {
  /** Messages received, accepted or not. */
  readonly messages: number;
  /** Events handed to the sink (including those whose sink threw). */
  readonly events: number;
  /** Messages dropped, by code; every code is present. */
  readonly rejected: Readonly<Record<RouterEventJsonErrorCode, number>>;
  /** Events whose sink threw. */
  readonly sinkErrors: number;
  /** Messages dropped because `maxPendingBytes` of earlier ones were still waiting. */
  readonly backlogDropped: number;
  /** Bytes of messages received and not yet delivered. */
  readonly pendingBytes: number;
  /** Whether a run is connected to a server now (from when the server has its subscription, or its JetStream consumer). */
  readonly connected: boolean;
  /** The JetStream consumer's counts; absent for a core NATS source. */
  readonly jetstream?: JetStreamStats;
}

/**
 * A run's NATS connection failed for good: the first connection failed, the
 * server refused the credentials again after a reconnect, or it refused the
 * subscription (or, with JetStream, the stream or consumer: the cause is a
 * JetStreamSourceError).
 */
export class NatsSourceError extends Error {
  override readonly name = "NatsSourceError";
}

const REJECT_CODES: readonly RouterEventJsonErrorCode[] = ["TOO_LARGE", "NOT_JSON", "TOO_DEEP", "DUPLICATE_KEY", "TYPE", "MISSING", "RANGE", "FORMAT", "UNKNOWN_VARIANT"];

/** What delivering reads of a message, core or JetStream. */
interface ReceivedMessage {
  readonly data: Uint8Array;
  readonly subject: string;
}

/** How long a stop waits for the connection to drain before it closes it outright. */
const DRAIN_TIMEOUT_MS = 2000;

/** At most one log line per interval; counts what it held back. */
class LogThrottle {
  private last = -Infinity;
  private held = 0;
  constructor(private readonly intervalMs: number) {}

  /** The number held back since the last line when a line may be logged now; undefined when not. */
  take(): number | undefined {
    const now = performance.now();
    if (now - this.last < this.intervalMs) {
      this.held++;
      return undefined;
    }
    this.last = now;
    const held = this.held;
    this.held = 0;
    return held;
  }
}

/** The nats client library, loaded on first use: most processes never talk to NATS. */
let natsModule: Promise<typeof NatsModule> | undefined;


/** Whether a sink handed back stepped work rather than nothing (or whatever else it returned). */
function isSteps(value: unknown): value is Generator<void, unknown, void> {
  return typeof value === "object" && value !== null && typeof (value as { next?: unknown }).next === "function";
}

/** What an event counts toward a slice: one, and one per block or block hash it carries. */
function eventBlocks(event: RouterEvent): number {
  const data = event.data;
  return 1 + (data.kind === "stored" ? data.blocks.length : data.kind === "removed" ? data.blockHashes.length : 0);
}

/** Whether a line break stands between two non-blank parts of `text`. */
function hasInnerLineBreak(text: string): boolean {
  return text.trim().includes("\n");
}

/**
 * Subscribes to a NATS subject and hands each router event on it to a sink.
 * `run(signal)` is a supervised task: it rejects only when it cannot connect
 * at start-up or the connection closes for good, so a supervisor restarts it
 * with backoff; a lost server is the client's to reconnect to.
 */
export class NatsEventSource {
  readonly config: NatsSourceConfig;
  private readonly sink: RouterEventSink;
  private readonly logger: Logger | undefined;
  private readonly metrics: NatsSourceMetrics | undefined;
  private readonly decoder = new TextDecoder("utf-8", { fatal: true });
  private readonly rejectLog = new LogThrottle(1000);
  private readonly sinkLog = new LogThrottle(1000);
  private readonly backlogLog = new LogThrottle(1000);
  private readonly slicer: WorkSlicer;
  private readonly aroundMessage: (() => () => void) | undefined;
  /** Messages received, waiting for their turn (the one being delivered included) from `head` on, and their bytes. */
  private backlog: Msg[] = [];
  private head = 0;
  private pendingBytes = 0;
  /** Delivers the backlog; undefined while it is empty. */
  private delivering: Promise<void> | undefined;
  private readonly counts = {
    messages: 0,
    events: 0,
    sinkErrors: 0,
    backlogDropped: 0,
    rejected: Object.fromEntries(REJECT_CODES.map((c) => [c, 0])) as Record<RouterEventJsonErrorCode, number>,
  };
  private connected = false;
  private running = false;
  /** The JetStream consumer, when `jetstream` is set; its position and duplicate window outlive a run. */
  private readonly jetstream: JetStreamIngest | undefined;

  /**
   * Validates `config` (throws a ZodError naming the field); connects only in
   * `run`. With `jetstream`, the sink is taken to start empty: the first run
   * replays the stream from its start (`deliverPolicy: all`), later runs
   * resume after the last message applied.
   */
  constructor(config: NatsSourceConfigInput, sink: RouterEventSink, options: NatsEventSourceOptions = {}) {
    this.config = natsSourceConfigSchema.parse(config);
    this.sink = sink;
    this.logger = options.logger?.child({ source: "nats", subject: this.config.subject });
    this.metrics = options.registry === undefined ? undefined : natsSourceMetrics(options.registry);
    this.slicer = options.slicer ?? new WorkSlicer();
    this.aroundMessage = options.aroundMessage;
    const jetstream = this.config.jetstream;
    this.jetstream =
      jetstream === undefined
        ? undefined
        : new JetStreamIngest(
            jetstream,
            this.config.subject,
            {
              received: () => {
                this.counts.messages++;
                this.metrics?.messages.inc();
              },
              apply: (msg, admit) => this.deliver(msg, admit),
              consuming: (on) => {
                this.connected = on;
              },
              slicer: this.slicer,
            },
            { logger: this.logger, registry: options.registry },
          );
  }

  stats(): NatsEventSourceStats {
    return {
      messages: this.counts.messages,
      events: this.counts.events,
      rejected: { ...this.counts.rejected },
      sinkErrors: this.counts.sinkErrors,
      backlogDropped: this.counts.backlogDropped,
      pendingBytes: this.pendingBytes,
      connected: this.connected,
      ...(this.jetstream === undefined ? {} : { jetstream: this.jetstream.stats() }),
    };
  }

  /**
   * Connects, subscribes and delivers events until `signal` fires, then
   * drains the connection, delivers what it had received, and resolves.
   * Rejects when the first connection fails (no server answers,
   * authentication is refused) or the connection
   * later closes for good; a server lost meanwhile is reconnected to by the
   * client, every `reconnectWaitMs`, with no limit on attempts.
   */
  async run(signal: AbortSignal): Promise<void> {
    if (this.running) throw new Error("the NATS source is already running");
    this.running = true;
    try {
      await this.session(signal);
    } finally {
      this.connected = false;
      // What was received is delivered before the run ends, whichever way it ends.
      await this.delivering;
      this.running = false;
    }
  }

  private connectionOptions(): ConnectionOptions {
    // A first connection that fails is the supervisor's to retry.
    return natsConnectionOptions(this.config);
  }


  private async session(signal: AbortSignal): Promise<void> {
    if (signal.aborted) return;
    natsModule ??= import("nats");
    const nats = await natsModule;
    const connecting = nats.connect(this.connectionOptions());
    const first = await Promise.race([connecting.then((nc) => ({ nc }), (error: unknown) => ({ error: errorOf(error) })), whenAborted(signal, connecting.catch(() => undefined))]);
    if (first === undefined) {
      // Stopped while connecting: close whatever the attempt yields.
      void connecting.then((nc) => nc.close()).catch(() => undefined);
      return;
    }
    if ("error" in first) {
      if (signal.aborted) return;
      throw new NatsSourceError(`cannot connect to NATS (${this.config.servers.join(", ")}): ${first.error.message}`, { cause: first.error });
    }
    const nc = first.nc;
    const closed = nc.closed();
    void this.watchStatus(nc, nats);
    if (this.jetstream !== undefined) return this.jetStreamSession(this.jetstream, nc, nats, closed, signal);

    let refuse: (error: Error) => void = () => undefined;
    const refused = new Promise<Error>((resolve) => (refuse = resolve));
    nc.subscribe(this.config.subject, {
      ...(this.config.queue === undefined ? {} : { queue: this.config.queue }),
      callback: (error, msg) => {
        if (error !== null) refuse(error);
        else this.onMessage(msg);
      },
    });
    // Connected once the server has the subscription: a flush is a round trip behind the SUB.
    nc.flush().then(
      () => {
        if (nc.isClosed() || nc.isDraining() || signal.aborted) return;
        this.connected = true;
        this.logger?.info({ server: nc.getServer(), queue: this.config.queue }, "NATS source subscribed");
      },
      () => undefined,
    );

    const outcome = await Promise.race([
      closed.then((error) => ({ closed: error ?? undefined })),
      refused.then((error) => ({ refused: error })),
      whenAborted(signal, closed),
    ]);
    if (outcome === undefined || signal.aborted) {
      await this.stop(nc);
      return;
    }
    this.connected = false;
    if ("refused" in outcome) {
      await nc.close().catch(() => undefined);
      throw new NatsSourceError(`NATS subscription to ${this.config.subject} failed: ${outcome.refused.message}`, { cause: outcome.refused });
    }
    const reason = outcome.closed;
    throw new NatsSourceError(`NATS connection closed${reason === undefined ? "" : `: ${reason.message}`}`, { cause: reason });
  }

  /** Reads the JetStream stream on `nc` until `signal` fires or the connection or the consumer fails for good. */
  private async jetStreamSession(jetstream: JetStreamIngest, nc: NatsConnection, nats: typeof NatsModule, closed: Promise<void | Error>, signal: AbortSignal): Promise<void> {
    const stopLoop = new AbortController();
    const onAbort = () => stopLoop.abort();
    signal.addEventListener("abort", onAbort, { once: true });
    const loop = jetstream.run(nc, nats, stopLoop.signal).then(
      () => ({ ended: undefined }),
      (error: unknown) => ({ ended: errorOf(error) }),
    );
    const outcome = await Promise.race([closed.then((error) => ({ closed: error ?? undefined })), loop, whenAborted(signal, closed)]);
    // The message being applied is applied and acked before the connection drains.
    stopLoop.abort();
    signal.removeEventListener("abort", onAbort);
    await loop;
    if (outcome === undefined || signal.aborted) {
      await this.stop(nc);
      return;
    }
    this.connected = false;
    if ("ended" in outcome && !nc.isClosed()) {
      await nc.close().catch(() => undefined);
      const cause = outcome.ended ?? new Error("the consumer stopped");
      throw new NatsSourceError(`NATS JetStream source (stream ${jetstream.config.stream}) failed: ${cause.message}`, { cause });
    }
    const reason = "closed" in outcome ? outcome.closed : (await closed) || undefined;
    throw new NatsSourceError(`NATS connection closed${reason === undefined ? "" : `: ${reason.message}`}`, { cause: reason });
  }

  /** Drains (unsubscribes, flushes, closes); closes outright when that takes too long, as it does while disconnected. */
  private async stop(nc: NatsConnection): Promise<void> {
    this.connected = false;
    if (nc.isClosed()) return;
    const drained = nc.drain();
    if (!(await settleWithin(drained, DRAIN_TIMEOUT_MS))) this.logger?.warn("NATS drain timed out; closing");
    if (!nc.isClosed()) await nc.close().catch(() => undefined);
    await nc.closed();
    this.logger?.info("NATS source stopped");
  }

  /** Follows the connection's state until it closes. */
  private async watchStatus(nc: NatsConnection, nats: typeof NatsModule): Promise<void> {
    try {
      for await (const status of nc.status()) {
        switch (status.type) {
          case nats.Events.Disconnect:
            this.connected = false;
            this.logger?.warn({ server: status.data }, "NATS disconnected; reconnecting");
            break;
          case nats.Events.Reconnect:
            // Deliveries and acks in flight may be lost: a JetStream consumer starts over after the last applied message.
            this.jetstream?.reconnected();
            // The client sends the subscription again on reconnecting; connected once the server has it.
            nc.flush().then(
              () => {
                if (!nc.isClosed() && !nc.isDraining()) this.connected = true;
              },
              () => undefined,
            );
            this.logger?.info({ server: status.data }, "NATS reconnected");
            break;
          case nats.Events.LDM:
            this.logger?.info({ server: status.data }, "NATS server entering lame duck mode");
            break;
          case nats.Events.Error:
            this.logger?.warn({ detail: status.data }, "NATS error");
            break;
          default:
            break;
        }
      }
    } catch (error) {
      this.logger?.debug({ err: errorOf(error) }, "NATS status stream ended");
    }
  }

  private onMessage(msg: Msg): void {
    this.counts.messages++;
    this.metrics?.messages.inc();
    const bytes = msg.data.length;
    if (this.head < this.backlog.length && this.pendingBytes + bytes > this.config.maxPendingBytes) {
      this.counts.backlogDropped++;
      this.metrics?.backlogDropped.inc();
      const held = this.backlogLog.take();
      if (held !== undefined) {
        this.logger?.warn({ subject: msg.subject, bytes, pendingBytes: this.pendingBytes, held }, "dropped a NATS message: maxPendingBytes of earlier ones are still waiting to be applied");
      }
      return;
    }
    this.backlog.push(msg);
    this.pendingBytes += bytes;
    this.delivering ??= this.deliverBacklog();
  }

  /** Delivers waiting messages one at a time, in arrival order, until none is left. */
  private async deliverBacklog(): Promise<void> {
    // Start on a later microtask: onMessage returns to the client at once.
    await undefined;
    try {
      while (this.head < this.backlog.length) {
        const current = this.backlog[this.head]!;
        try {
          await this.slicer.exclusive(() => this.deliver(current));
        } catch (error) {
          this.logger?.error({ err: errorOf(error), subject: current.subject }, "delivering a NATS message failed");
        }
        this.head += 1;
        this.pendingBytes -= current.data.length;
        // Delivered messages leave the array in batches, not one shift at a time.
        if (this.head >= 1024 && this.head * 2 >= this.backlog.length) {
          this.backlog = this.backlog.slice(this.head);
          this.head = 0;
        }
        // The next message's JSON is decoded in one piece: not in a turn that applying used already.
        if (this.slicer.busy && this.head < this.backlog.length) await this.slicer.yieldTurn();
      }
      this.backlog = [];
      this.head = 0;
    } finally {
      this.delivering = undefined;
    }
  }

  /**
   * One message's events to the sink, in order, in slices; those `admit`
   * turns down are left out. False when the message was rejected whole (too
   * large, not router-event JSON).
   */
  private async deliver(msg: ReceivedMessage, admit?: (event: RouterEvent) => boolean): Promise<boolean> {
    let events: RouterEvent[];
    try {
      events = this.decode(msg.data);
    } catch (error) {
      this.reject(msg, error instanceof RouterEventJsonError ? error : new RouterEventJsonError("NOT_JSON", "$", errorOf(error).message));
      return false;
    }
    const slicer = this.slicer;
    // Decoding counts toward the slice: one step per event it read.
    if (slicer.due(events.length)) await slicer.yieldTurn();
    const release = this.aroundMessage?.();
    const span = openSpan("relay.nats.batch", { "messaging.system": "nats", "messaging.destination.name": msg.subject, "messaging.batch.message_count": events.length }, SpanKind.CONSUMER);
    try {
      for (const event of events) {
        if (admit !== undefined && !admit(event)) continue;
        this.counts.events++;
        this.metrics?.events.inc();
        try {
          const steps = this.sink(event);
          if (isSteps(steps)) {
            const done = slicer.finish(steps);
            if (done instanceof Promise) await done;
          }
        } catch (error) {
          this.counts.sinkErrors++;
          this.metrics?.sinkErrors.inc();
          const held = this.sinkLog.take();
          if (held !== undefined) this.logger?.error({ err: errorOf(error), subject: msg.subject, held }, "router event sink threw; the event is lost");
        }
        if (slicer.due(eventBlocks(event))) await slicer.yieldTurn();
      }
    } finally {
      release?.();
      span?.end();
    }
    return true;
  }

  /** The events of one message: one JSON object, or JSON lines. Throws RouterEventJsonError. */
  private decode(data: Uint8Array): RouterEvent[] {
    const maxBytes = this.config.maxPayloadBytes;
    if (data.length > maxBytes) throw new RouterEventJsonError("TOO_LARGE", "$", `a message of ${data.length} bytes is larger than ${maxBytes}`);
    let text: string;
    try {
      text = this.decoder.decode(data);
    } catch {
      throw new RouterEventJsonError("NOT_JSON", "$", "the message is not UTF-8");
    }
    try {
      return [routerEventFromJson(text, { maxBytes })];
    } catch (error) {
      // One document that is not JSON may still be JSON lines.
      if (!(error instanceof RouterEventJsonError) || error.code !== "NOT_JSON" || !hasInnerLineBreak(text)) throw error;
    }
    const events = Array.from(routerEventsFromJsonLines(text, { maxBytes }), (numbered) => numbered.event);
    if (events.length === 0) throw new RouterEventJsonError("NOT_JSON", "$", "the message carries no event");
    return events;
  }

  private reject(msg: ReceivedMessage, error: RouterEventJsonError): void {
    this.counts.rejected[error.code]++;
    this.metrics?.rejected.inc({ code: error.code });
    const held = this.rejectLog.take();
    if (held === undefined) return;
    this.logger?.warn(
      { subject: msg.subject, bytes: msg.data.length, code: error.code, path: error.path, line: error.line, detail: error.detail, held },
      "dropped a NATS message that is not router-event JSON",
    );
  }
}
