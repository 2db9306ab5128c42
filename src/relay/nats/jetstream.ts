/**
 * At-least-once ingest of router events from a JetStream stream: the
 * `jetstream` part of a NATS source's config, and the consumer loop the
 * source runs instead of a core subscription when it is set.
 *
 * The relay reads through a durable pull consumer with explicit acks. A
 * message is acked only once its events were applied to the filter state
 * (the source's delivery resolves after the last slice of the last event),
 * and at most `maxAckPending` messages are delivered and not yet acked: a
 * relay that applies slowly holds the server back instead of buffering.
 *
 * Where reading starts. A relay's filter state lives in its memory only, so
 * a relay process that starts has none, and nothing may be asked of the
 * workers to rebuild it. The first run of a source therefore resets its
 * durable consumer to the start of the stream (`deliverPolicy: all`) and
 * replays everything the stream retains; resuming the durable where a
 * previous process acked would leave the new filter without every event
 * before that point. (An ordered consumer would replay too, but without
 * acks: nothing would hold a message until it is applied, nor bound what is
 * in flight.) A later run of the same source (the supervisor
 * restarting it after the connection was lost for good) holds the state
 * that was built, and resumes just after the last message it applied,
 * which is where it acked. The consumer is created anew at that sequence
 * each time rather than taken as the server left it: messages the server
 * sent to a lost connection are pending there and would come back only
 * after `ackWait`, behind newer ones, and events must apply in stream order.
 * For the same reason a gap in the consumer's delivery sequence (a delivery
 * lost on the way) and a reconnect (deliveries and acks in flight may be
 * lost) reposition the consumer just after the last applied message.
 *
 * Duplicates: a message whose stream sequence was applied already (a
 * redelivery) is acked again and not applied; an event whose
 * (worker, dp_rank, event_id) is among the last `dedupeWindow` events
 * applied (a publisher that sent it twice) is dropped. Publishers that set
 * `Nats-Msg-Id` (routerEventMessageId) have the stream drop re-sent
 * messages within its duplicate window before they are stored.
 *
 * A message too large or not router-event JSON is terminated (acked for good:
 * the server never redelivers it), counted and logged; the stream goes on.
 */
import type * as NatsModule from "nats";
import type { ConsumerConfig, ConsumerInfo, ConsumerMessages, ConsumerStatus, JetStreamManager, JsMsg, NatsConnection, StreamConfig } from "nats";
import type { Logger } from "pino";
import { Counter, Gauge, type Registry } from "prom-client";
import { z } from "zod";
import type { RouterEvent } from "../../kv/index.js";
import { jetStreamErrorCode, streamCreatedMeanwhile } from "../../nats/index.js";
import { errorOf, MAX_TIMER_MS, registeredMetric, type WorkSlicer } from "../../util/index.js";
import { jetStreamNameSchema, natsSubjectSchema } from "./subject.js";

/** Defaults of the `jetstream` settings, named so that docs and tests can point at them. */
export const JETSTREAM_DEFAULTS = Object.freeze({
  stream: "MMGATE_KV_EVENTS",
  durable: "mmgate-relay",
  /** 24 hours: what a created stream keeps at most, by age. */
  maxAgeMs: 86_400_000,
  /** 1 GiB: what a created stream keeps at most, by size (the oldest messages go first). */
  maxBytes: 1024 * 1024 * 1024,
  /** 2 minutes, the server's own default: re-sent messages with the same Nats-Msg-Id within it are not stored. */
  duplicateWindowMs: 120_000,
  /** 30 seconds, the server's own default: a delivered message not acked within it is delivered again. */
  ackWaitMs: 30_000,
  /** Messages delivered and not yet acked (so, at most, received and not yet applied). */
  maxAckPending: 1024,
  /** Event keys remembered to drop duplicates: about 8 MiB. */
  dedupeWindow: 65_536,
});

/** The most `maxAckPending` may be: messages a relay holds unapplied, each up to `maxPayloadBytes`. */
export const MAX_ACK_PENDING_LIMIT = 65_536;
/** The most `dedupeWindow` may be (about 2 GiB of keys). */
export const MAX_DEDUPE_WINDOW = 16_777_216;

/**
 * How a NATS source reads from JetStream. Present (`jetstream: {}` takes
 * every default), the source consumes the stream; absent (the default), it
 * subscribes to core NATS.
 */
export const jetStreamConfigSchema = z
  .strictObject({
    /** The stream the workers' events are stored in. */
    stream: jetStreamNameSchema.default(JETSTREAM_DEFAULTS.stream),
    /**
     * The durable pull consumer this relay reads through. Each relay process,
     * and each pool in it, needs a name of its own: a fresh relay resets its
     * consumer to the start of the stream, and relays sharing one would split
     * (and reset) each other's events.
     */
    durable: jetStreamNameSchema.default(JETSTREAM_DEFAULTS.durable),
    /** The consumer's subject filter within the stream; default the source's `subject`. */
    filterSubject: natsSubjectSchema.optional(),
    /** Create the stream when it does not exist, with these settings; an existing stream is used as it is. */
    createStream: z
      .strictObject({
        /** Off: a missing stream is an error (the source is restarted with backoff until it exists). */
        enabled: z.boolean().default(true),
        /** The stream's subjects; default the source's `subject`. */
        subjects: z.array(natsSubjectSchema).min(1).optional(),
        /** Messages older than this are removed (0: no age limit). */
        maxAgeMs: z.int().min(0).max(Number.MAX_SAFE_INTEGER).default(JETSTREAM_DEFAULTS.maxAgeMs),
        /** The stream's size limit; past it the oldest messages are removed (0: no size limit). */
        maxBytes: z.int().min(0).max(Number.MAX_SAFE_INTEGER).default(JETSTREAM_DEFAULTS.maxBytes),
        /** Window in which a message re-sent with the same Nats-Msg-Id is dropped by the server. */
        duplicateWindowMs: z.int().min(1).max(MAX_TIMER_MS).default(JETSTREAM_DEFAULTS.duplicateWindowMs),
        /** Where the server keeps the messages: `file` survives a server restart, `memory` does not. */
        storage: z.enum(["file", "memory"]).default("file"),
        /** Copies of the stream in a clustered server (1..5). */
        replicas: z.int().min(1).max(5).default(1),
      })
      .prefault({})
      .superRefine((c, ctx) => {
        if (c.maxAgeMs > 0 && c.duplicateWindowMs > c.maxAgeMs) {
          ctx.addIssue({ code: "custom", path: ["duplicateWindowMs"], message: "the duplicate window cannot be longer than maxAgeMs" });
        }
      }),
    /** A delivered message not acked within this is delivered again (at least 1 s). */
    ackWaitMs: z.int().min(1000).max(MAX_TIMER_MS).default(JETSTREAM_DEFAULTS.ackWaitMs),
    /**
     * Messages delivered and not yet acked: the server sends no more until
     * the relay acks some, so this bounds what a slow relay holds.
     */
    maxAckPending: z.int().min(1).max(MAX_ACK_PENDING_LIMIT).default(JETSTREAM_DEFAULTS.maxAckPending),
    /**
     * Where a relay process starts reading: `all`, every message the stream
     * retains (the filter is rebuilt from them), or `new`, only messages
     * stored after it started (the filter starts empty and misses whatever
     * the workers hold from before).
     */
    deliverPolicy: z.enum(["all", "new"]).default("all"),
    /** Event keys (worker, dp_rank, event_id) remembered to drop duplicate events; 0 turns that off. */
    dedupeWindow: z.int().min(0).max(MAX_DEDUPE_WINDOW).default(JETSTREAM_DEFAULTS.dedupeWindow),
  });

/** JetStream settings, every default applied. */
export type JetStreamConfig = z.output<typeof jetStreamConfigSchema>;

/**
 * The `Nats-Msg-Id` a publisher should give a message carrying one event:
 * the event's key, so that the stream stores a re-sent event once.
 */
export function routerEventMessageId(event: Pick<RouterEvent, "workerId" | "dpRank" | "eventId">): string {
  return `${event.workerId}-${event.dpRank}-${event.eventId}`;
}

/**
 * The keys (worker, dp_rank, event_id) of the last `capacity` events seen,
 * in a ring: memory is bounded by the capacity, each check is O(1).
 */
export class EventKeyWindow {
  private readonly ring: (string | undefined)[];
  private readonly keys = new Set<string>();
  private next = 0;

  constructor(readonly capacity: number) {
    this.ring = new Array<string | undefined>(capacity);
  }

  /** True, and remembered, when the event's key is not among the last `capacity`; false for a duplicate. */
  admit(event: RouterEvent): boolean {
    if (this.capacity === 0) return true;
    const key = `${event.workerId}:${event.dpRank}:${event.eventId}`;
    if (this.keys.has(key)) return false;
    const evicted = this.ring[this.next];
    if (evicted !== undefined) this.keys.delete(evicted);
    this.ring[this.next] = key;
    this.next = this.next + 1 === this.capacity ? 0 : this.next + 1;
    this.keys.add(key);
    return true;
  }

  get size(): number {
    return this.keys.size;
  }
}

/** Metrics of the JetStream consumers on one registry. */
export interface JetStreamMetrics {
  readonly acked: Counter;
  readonly terminated: Counter;
  readonly redelivered: Counter;
  readonly duplicateMessages: Counter;
  readonly duplicateEvents: Counter;
  readonly repositions: Counter;
  readonly pending: Gauge<"stream" | "consumer">;
}

/**
 * Registered on first use: `mmgate_relay_nats_jetstream_acked_total`,
 * `_terminated_total`, `_redelivered_total`, `_duplicate_messages_total`,
 * `_duplicate_events_total`, `_repositions_total` and the gauge
 * `mmgate_relay_nats_jetstream_pending{stream,consumer}`.
 */
export function jetStreamMetrics(registry: Registry): JetStreamMetrics {
  const counter = (name: string, help: string) => registeredMetric(registry, name, Counter, () => new Counter({ name, help, registers: [registry] }));
  const pendingName = "mmgate_relay_nats_jetstream_pending";
  return {
    acked: counter("mmgate_relay_nats_jetstream_acked_total", "JetStream messages acked once their router events were applied (redelivered ones included)"),
    terminated: counter("mmgate_relay_nats_jetstream_terminated_total", "JetStream messages terminated (acked for good) as too large or not router-event JSON"),
    redelivered: counter("mmgate_relay_nats_jetstream_redelivered_total", "JetStream messages the server delivered more than once"),
    duplicateMessages: counter("mmgate_relay_nats_jetstream_duplicate_messages_total", "JetStream messages dropped because the relay had applied that stream sequence already"),
    duplicateEvents: counter("mmgate_relay_nats_jetstream_duplicate_events_total", "Router events dropped because their (worker, dp_rank, event_id) was among the last dedupeWindow applied"),
    repositions: counter("mmgate_relay_nats_jetstream_repositions_total", "JetStream consumers recreated after the last applied message, after a gap in their delivery sequence or a reconnect"),
    pending: registeredMetric(
      registry,
      pendingName,
      Gauge<"stream" | "consumer">,
      () =>
        new Gauge<"stream" | "consumer">({
          name: pendingName,
          help: "Messages of the stream the relay's consumer has yet to deliver, as of its last delivery",
          labelNames: ["stream", "consumer"] as const,
          registers: [registry],
        }),
    ),
  };
}

/** What a JetStream consumer has done since its source was built (across runs). */
export interface JetStreamStats {
  /** Acks sent: messages applied, and messages delivered again after they were applied. */
  readonly acked: number;
  /** Malformed messages terminated. */
  readonly terminated: number;
  /** Messages delivered more than once. */
  readonly redelivered: number;
  /** Messages not applied because their stream sequence was applied already. */
  readonly duplicateMessages: number;
  /** Events not applied because their key was among the last `dedupeWindow`. */
  readonly duplicateEvents: number;
  /** Consumers recreated after the last applied message: a gap in the delivery sequence, a reconnect. */
  readonly repositions: number;
  /** Messages the consumer has yet to deliver, as of its last delivery. */
  readonly pending: number;
  /** The stream sequence of the last message applied; undefined before the first run positioned a consumer. */
  readonly appliedSequence: number | undefined;
}

/** What a JetStream consumer needs from its source. */
export interface JetStreamDeliveryPort {
  /** Counts a message received (every delivery, duplicates included). */
  received(): void;
  /**
   * Applies one message's events, in order, those `admit` lets through;
   * resolves once the last is applied: true, or false when the message was
   * rejected whole (too large, not router-event JSON: counted and logged).
   */
  apply(msg: { readonly data: Uint8Array; readonly subject: string }, admit: (event: RouterEvent) => boolean): Promise<boolean>;
  /** Whether a consumer is being read now. */
  consuming(on: boolean): void;
  /** The source's slicer: a message is decoded in one piece, so not in a turn whose slice is used. */
  readonly slicer: WorkSlicer;
}

/** A JetStream error the source cannot get past by itself (the supervisor restarts it with backoff). */
export class JetStreamSourceError extends Error {
  override readonly name = "JetStreamSourceError";
}

/**
 * A message up to this size is decoded in a turn whose slice is still open:
 * about a tenth of a millisecond of JSON, counted toward the slice like the
 * events it holds. A larger one starts a turn of its own.
 */
const SHARED_TURN_BYTES = 16 * 1024;

/** JetStream API error codes the loop tells apart. */
const STREAM_NOT_FOUND = 10059;
const CONSUMER_NOT_FOUND = 10014;

/** Why a consume session ended. */
type SessionEnd = { readonly kind: "stopped" } | { readonly kind: "reposition"; readonly detail: string } | { readonly kind: "failed"; readonly error: Error };

/**
 * The consumer side of a JetStream source: positions the durable consumer,
 * reads it, applies and acks. Its position and duplicate window belong to
 * the source and outlive a run.
 */
export class JetStreamIngest {
  readonly config: JetStreamConfig;
  /** The source's subject: the default stream subject and consumer filter. */
  private readonly subject: string;
  private readonly logger: Logger | undefined;
  private readonly metrics: JetStreamMetrics | undefined;
  private readonly port: JetStreamDeliveryPort;
  private readonly dedupe: EventKeyWindow;
  /** Stream sequence of the last message applied (or the consumer's start - 1); undefined until a first consumer exists. */
  private applied: number | undefined;
  private pending = 0;
  /** Messages applied (or dropped) whose ack goes out at the end of the turn. */
  private unacked: (JsMsg | { readonly msg: JsMsg; readonly terminate: true })[] = [];
  private ackFlush: ReturnType<typeof setImmediate> | undefined;
  /** Ends the consume session in progress for a reposition; set while one runs. */
  private onReconnect: (() => void) | undefined;
  private readonly counts = { acked: 0, terminated: 0, redelivered: 0, duplicateMessages: 0, duplicateEvents: 0, repositions: 0 };
  private readonly admit = (event: RouterEvent): boolean => {
    if (this.dedupe.admit(event)) return true;
    this.counts.duplicateEvents++;
    this.metrics?.duplicateEvents.inc();
    return false;
  };

  constructor(config: JetStreamConfig, subject: string, port: JetStreamDeliveryPort, options: { logger?: Logger | undefined; registry?: Registry | undefined } = {}) {
    this.config = config;
    this.subject = subject;
    this.port = port;
    this.logger = options.logger?.child({ stream: config.stream, consumer: config.durable });
    this.metrics = options.registry === undefined ? undefined : jetStreamMetrics(options.registry);
    this.dedupe = new EventKeyWindow(config.dedupeWindow);
  }

  /** The connection was re-established: the session in progress, if any, repositions its consumer. */
  reconnected(): void {
    this.onReconnect?.();
  }

  stats(): JetStreamStats {
    return { ...this.counts, pending: this.pending, appliedSequence: this.applied };
  }

  /**
   * Reads the stream until `signal` fires (then resolves once the message
   * being applied is applied and acked) or something fails that a new run
   * may get past (rejects with a JetStreamSourceError).
   */
  async run(nc: NatsConnection, nats: typeof NatsModule, signal: AbortSignal): Promise<void> {
    let jsm: JetStreamManager;
    try {
      jsm = await nc.jetstreamManager();
    } catch (error) {
      throw new JetStreamSourceError(`JetStream is not available on the server: ${errorOf(error).message}`, { cause: error });
    }
    await this.ensureStream(jsm, nats);
    while (!signal.aborted) {
      const info = await this.positionConsumer(jsm, nats);
      const end = await this.consume(nc, info, signal);
      if (end.kind === "stopped") return;
      if (end.kind === "failed") throw end.error;
      this.counts.repositions++;
      this.metrics?.repositions.inc();
      this.logger?.warn({ detail: end.detail, appliedSequence: this.applied }, "JetStream consumer restarts after the last applied message");
    }
  }

  /** The stream, created when missing and allowed; warns about settings that defeat a replay. */
  private async ensureStream(jsm: JetStreamManager, nats: typeof NatsModule): Promise<void> {
    const name = this.config.stream;
    const create = this.config.createStream;
    // A create that another relay's create of the same stream refused: the stream is then taken as that relay made it.
    let refused: unknown;
    for (;;) {
      try {
        const info = await jsm.streams.info(name);
        if (info.config.retention !== nats.RetentionPolicy.Limits) {
          this.logger?.warn(
            { retention: info.config.retention },
            "the stream does not use limits retention: acked messages leave it, so a relay that starts cannot replay them and its filter misses their events",
          );
        }
        if (this.applied !== undefined && info.state.last_seq < this.applied) {
          // A stream deleted and created again starts its sequences over: read it from its start.
          this.logger?.error({ lastSeq: info.state.last_seq, appliedSequence: this.applied }, "the stream holds fewer messages than were applied (it was recreated or purged): reading it from its start");
          this.applied = 0;
        } else if (this.applied !== undefined && info.state.messages > 0 && info.state.first_seq > this.applied + 1) {
          this.logger?.warn(
            { firstSeq: info.state.first_seq, appliedSequence: this.applied },
            "the stream's limits removed messages this relay had not applied yet: their events are lost to its filter",
          );
        }
        return;
      } catch (error) {
        if (jetStreamErrorCode(error) !== STREAM_NOT_FOUND) throw new JetStreamSourceError(`JetStream stream ${name}: ${errorOf(error).message}`, { cause: error });
        // Refused, and still missing: the refusal was no race (another stream holds these subjects).
        if (refused !== undefined) throw new JetStreamSourceError(`cannot create JetStream stream ${name}: ${errorOf(refused).message}`, { cause: refused });
      }
      if (!create.enabled) throw new JetStreamSourceError(`JetStream stream ${name} does not exist (createStream.enabled is off)`);
      const config: Partial<StreamConfig> & { name: string } = {
        name,
        subjects: [...(create.subjects ?? [this.subject])],
        retention: nats.RetentionPolicy.Limits,
        storage: create.storage === "file" ? nats.StorageType.File : nats.StorageType.Memory,
        discard: nats.DiscardPolicy.Old,
        max_age: nats.nanos(create.maxAgeMs),
        max_bytes: create.maxBytes === 0 ? -1 : create.maxBytes,
        duplicate_window: nats.nanos(create.duplicateWindowMs),
        num_replicas: create.replicas,
      };
      try {
        await jsm.streams.add(config);
        this.logger?.info({ subjects: config.subjects, maxAgeMs: create.maxAgeMs, maxBytes: create.maxBytes }, "JetStream stream created");
        return;
      } catch (error) {
        // Another relay created it meanwhile (JetStream refuses the later create as a name in use, or, racing, as
        // subjects that overlap the stream just made): take it as it is.
        if (!streamCreatedMeanwhile(error)) throw new JetStreamSourceError(`cannot create JetStream stream ${name}: ${errorOf(error).message}`, { cause: error });
        refused = error;
      }
    }
  }

  /**
   * Creates the durable consumer anew: at the configured deliver policy on
   * a source's first run (its sink starts empty), just after the last
   * applied message later.
   */
  private async positionConsumer(jsm: JetStreamManager, nats: typeof NatsModule): Promise<ConsumerInfo> {
    const { stream, durable } = this.config;
    try {
      await jsm.consumers.delete(stream, durable);
    } catch (error) {
      if (jetStreamErrorCode(error) !== CONSUMER_NOT_FOUND) throw new JetStreamSourceError(`cannot reset JetStream consumer ${durable}: ${errorOf(error).message}`, { cause: error });
    }
    const start: Partial<ConsumerConfig> =
      this.applied !== undefined
        ? { deliver_policy: nats.DeliverPolicy.StartSequence, opt_start_seq: this.applied + 1 }
        : { deliver_policy: this.config.deliverPolicy === "all" ? nats.DeliverPolicy.All : nats.DeliverPolicy.New };
    let info: ConsumerInfo;
    try {
      info = await jsm.consumers.add(stream, {
        durable_name: durable,
        description: "mmgate relay: router events, acked once applied",
        ack_policy: nats.AckPolicy.Explicit,
        ack_wait: nats.nanos(this.config.ackWaitMs),
        max_ack_pending: this.config.maxAckPending,
        max_deliver: -1,
        replay_policy: nats.ReplayPolicy.Instant,
        // A relay recreates its consumer on every start and reposition, so the server need not write the
        // consumer's state (its acks) to disk: on a busy 2-core machine that work competes with the relay's.
        mem_storage: true,
        filter_subject: this.config.filterSubject ?? this.subject,
        ...start,
      });
    } catch (error) {
      throw new JetStreamSourceError(`cannot create JetStream consumer ${durable} on ${stream}: ${errorOf(error).message}`, { cause: error });
    }
    const first = this.applied === undefined;
    // A new consumer has delivered nothing: its delivered stream sequence is where it starts, less one.
    this.applied ??= info.delivered.stream_seq;
    this.setPending(info.num_pending);
    this.publishPending();
    this.logger?.info({ startAfter: this.applied, pending: info.num_pending, replay: first && this.config.deliverPolicy === "all" }, "JetStream consumer positioned");
    return info;
  }

  /**
   * One consume session on the consumer just positioned, until it stops,
   * fails, skips a delivery or the connection is re-established (deliveries
   * and acks in flight then may have been lost: the server would send the
   * lost ones again only after ackWait, and with maxAckPending of them
   * unacked it sends nothing else meanwhile).
   */
  private async consume(nc: NatsConnection, info: ConsumerInfo, signal: AbortSignal): Promise<SessionEnd> {
    let messages: ConsumerMessages;
    try {
      const consumer = await nc.jetstream().consumers.get(info.stream_name, info.name);
      // As many as may be unacked: the server stops there, so the client's buffer is bounded by it too.
      messages = await consumer.consume({ max_messages: this.config.maxAckPending });
    } catch (error) {
      return { kind: "failed", error: new JetStreamSourceError(`cannot read JetStream consumer ${info.name}: ${errorOf(error).message}`, { cause: error }) };
    }
    const status = await messages.status();
    let ended: SessionEnd | undefined;
    const end = (why: SessionEnd) => {
      ended ??= why;
      void messages.close().catch(() => undefined);
    };
    const onAbort = () => end({ kind: "stopped" });
    signal.addEventListener("abort", onAbort, { once: true });
    // Stopped while the consumer was being set up: the listener above would never fire.
    if (signal.aborted) onAbort();
    this.port.consuming(true);
    void this.watchConsumer(status, info.name, end);
    this.onReconnect = () => end({ kind: "reposition", detail: "reconnected" });
    // Deliveries are numbered from 1 on a new consumer, redeliveries included: a number skipped is a delivery lost.
    let expected = 1;
    try {
      for await (const msg of messages) {
        if (ended !== undefined) break;
        const delivery = msg.info.deliverySequence;
        if (delivery !== expected) {
          end({ kind: "reposition", detail: `delivery ${delivery} came after ${expected - 1}` });
          break;
        }
        expected = delivery + 1;
        await this.handle(msg);
      }
    } catch (error) {
      end({ kind: "failed", error: new JetStreamSourceError(`JetStream consumer ${info.name} failed: ${errorOf(error).message}`, { cause: error }) });
    } finally {
      // Before a new consumer replaces this one, and before a stopping source drains the connection.
      this.flushAcks();
      // The client stops its status listeners only once its iterator is read to the end, which a break skips.
      (status as { stop?: () => void }).stop?.();
      signal.removeEventListener("abort", onAbort);
      this.onReconnect = undefined;
      this.port.consuming(false);
      end({ kind: "stopped" });
    }
    if (ended?.kind === "stopped" && !signal.aborted && !nc.isClosed()) {
      return { kind: "failed", error: new JetStreamSourceError(`JetStream consumer ${info.name} stopped delivering`) };
    }
    return ended ?? { kind: "stopped" };
  }

  /** Ends the session when the consumer or the stream goes away under it (another relay with the same durable, an operator). */
  private async watchConsumer(statuses: AsyncIterable<ConsumerStatus>, name: string, end: (why: SessionEnd) => void): Promise<void> {
    try {
      for await (const status of statuses) {
        switch (status.type) {
          case "consumer_deleted":
          case "consumer_not_found":
          case "stream_not_found":
            end({ kind: "failed", error: new JetStreamSourceError(`JetStream consumer ${name}: ${status.type.replaceAll("_", " ")} (does another relay use the same durable name?)`) });
            return;
          case "heartbeats_missed":
            this.logger?.warn({ missed: status.data }, "JetStream heartbeats missed");
            break;
          default:
            break;
        }
      }
    } catch {
      // The session ended.
    }
  }

  /** One delivered message: dropped as a duplicate, or applied; then acked (or terminated when malformed). */
  private async handle(msg: JsMsg): Promise<void> {
    const port = this.port;
    port.received();
    const info = msg.info;
    if (info.redelivered) {
      this.counts.redelivered++;
      this.metrics?.redelivered.inc();
    }
    this.setPending(info.pending);
    const sequence = info.streamSequence;
    if (this.applied !== undefined && sequence <= this.applied) {
      // Applied already; its ack was late or lost. Ack again so that the server lets it go.
      this.counts.duplicateMessages++;
      this.metrics?.duplicateMessages.inc();
      this.ack(msg, false);
      return;
    }
    // A message's JSON is decoded in one piece: a large one not in a turn whose slice was used already,
    // a small one (most are one event) within the slice's budget like any other step.
    const slicer = port.slicer;
    if (slicer.busy && (msg.data.length > SHARED_TURN_BYTES || slicer.due(0))) await slicer.yieldTurn();
    const accepted = await port.slicer.exclusive(() => port.apply(msg, this.admit));
    this.applied = sequence;
    this.ack(msg, !accepted);
  }

  /**
   * Acks (or terminates) once the turn is over, with every other message
   * applied in it: each ack is a protocol message, and the client writes
   * them out together instead of one socket write each.
   */
  private ack(msg: JsMsg, terminate: boolean): void {
    this.unacked.push(terminate ? { msg, terminate } : msg);
    this.ackFlush ??= setImmediate(() => this.flushAcks());
  }

  /** Sends the acks waiting for the turn's end now (a session ending sends them before anything else). */
  private flushAcks(): void {
    if (this.ackFlush !== undefined) clearImmediate(this.ackFlush);
    this.ackFlush = undefined;
    const waiting = this.unacked;
    this.unacked = [];
    let acked = 0;
    let terminated = 0;
    for (const entry of waiting) {
      const terminate = "terminate" in entry;
      const msg = terminate ? entry.msg : entry;
      try {
        if (terminate) msg.term();
        else msg.ack();
      } catch (error) {
        // The connection is closing: the message comes back to a later consumer, which drops it as applied.
        this.logger?.debug({ err: errorOf(error) }, "could not ack a JetStream message");
        continue;
      }
      if (terminate) terminated++;
      else acked++;
    }
    // Metrics once a turn, not once a message: a labelled gauge hashes its labels on every set.
    this.counts.acked += acked;
    this.counts.terminated += terminated;
    if (acked > 0) this.metrics?.acked.inc(acked);
    if (terminated > 0) this.metrics?.terminated.inc(terminated);
    this.publishPending();
  }

  /** Notes the consumer's pending count; the gauge follows at the end of the turn. */
  private setPending(pending: number): void {
    this.pending = pending;
  }

  private publishPending(): void {
    this.metrics?.pending.set({ stream: this.config.stream, consumer: this.config.durable }, this.pending);
  }
}
