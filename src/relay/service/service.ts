/**
 * The `dynamo.kvrelay.v1.KvEventRelay` handlers (kv-relay-contract C.1-C.4):
 * validation in the contract's order, admission limits, the pool stream
 * (snapshot chunks, then contiguous deltas, heartbeats only after the whole
 * snapshot), the catalog, readiness and load streams. Every failure is a
 * RelayError; the module's error mapper turns it into the status and the
 * `kv-relay-error-reason` trailer.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type {
  KvEventRelay} from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import {
  DataStatus,
  FilterUpdateKind,
  FilterUpdateSchema,
  KvPoolCatalogUpdateSchema,
  KvPoolLoadUpdateSchema,
  LoadViewSchema,
  RelayIdentitySchema,
  RelayInfoSchema,
  ServingLoadUpdateSchema,
  ServingReadinessUpdateSchema,
  type FilterUpdate,
  type ProducerIdentity as WireProducer,
  type RelayIdentity,
} from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { sameProducerIdentity, type ProducerIdentity } from "../../kv/index.js";
import { callTransportOf, directMessagesOf, pacedWritesOf, preEncode, preEncodedEnvelope, writesBinary, type DirectMessages, type PacedWrites } from "../../server/index.js";
import { linkSignals, Semaphore, type LinkedSignal } from "../../util/index.js";
import { openSpan } from "../../telemetry/index.js";
import { encodeSnapshot } from "../frames.js";
import { HubError, unixMicros, type HubSubscriber, type PublicationFrame, type SubscriberEndReason, type SubscriberRead } from "../hub/index.js";
import {
  checkContractMarker,
  checkSubscriberId,
  descriptorToWire,
  producerFromWire,
  producerToWire,
  RELAY_CONTRACT_MARKER,
  RELAY_PROTOCOL_VERSION,
  RelayError,
} from "../wire/index.js";
import { DeltaWire } from "./delta-wire.js";
import { DirectDelivery, HANDOVER_BACKLOG_BYTES, StreamMessages } from "./direct-delivery.js";
import type { LimitScope, RelayMetrics, RelayStream } from "./metrics.js";
import type { RelayPool } from "./pool.js";
import type { CatalogRevision, LoadWindow, Relay } from "./relay.js";

type FilterUpdateInit = MessageInitShape<typeof FilterUpdateSchema>;

/** Streams open per kind, against their limits. */
class StreamAdmission {
  private open = 0;
  constructor(
    private readonly limit: number,
    private readonly label: string,
  ) {}
  /** Takes a slot or throws RESOURCE_LIMIT with the reference's message. */
  admit(): () => void {
    if (this.open >= this.limit) throw new RelayError("RESOURCE_LIMIT", `Relay ${this.label} limit ${this.limit} reached`);
    this.open += 1;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.open -= 1;
    };
  }
}

/**
 * Pool streams open per key (a connection, a client address) against a cap
 * below the total, so that one client cannot take every slot. A stream
 * counts until its HTTP/2 stream is gone, not only while it is subscribed: a
 * lagged subscriber that does not read its end keeps counting against its
 * own client's caps (and no one else's).
 */
class KeyedAdmission<K> {
  private readonly open = new Map<K, number>();
  constructor(
    private readonly limit: number,
    private readonly label: string,
  ) {}
  /** Takes a slot for `key` or throws RESOURCE_LIMIT naming the limit. */
  admit(key: K): () => void {
    const count = this.open.get(key) ?? 0;
    if (count >= this.limit) throw new RelayError("RESOURCE_LIMIT", `Relay ${this.label} limit ${this.limit} reached`);
    this.open.set(key, count + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = (this.open.get(key) ?? 1) - 1;
      if (left > 0) this.open.set(key, left);
      else this.open.delete(key);
    };
  }
}

/** The fields both load RPCs' updates open with. */
interface LoadUpdateHead {
  readonly protocolVersion: number;
  readonly relay: RelayIdentity;
  readonly windowSequence: bigint;
  readonly observedMs: bigint;
  readonly windowMs: bigint;
  readonly contractMarker: number;
}

/** How a wait for the transport to take the last frame ended. */
type Handover = "taken" | "stop" | "ended" | "timeout";

/**
 * The wait, after each frame of a pool stream, for the transport to have
 * written it out (paced-writes.ts; all but HANDOVER_BACKLOG_BYTES of it)
 * before the next frame is produced: a client that does not read then holds
 * that little in the transport, and what follows stays in its bounded hub
 * queue, which overflows into SUBSCRIBER_LAGGED. The wait also ends on the
 * stop, on the subscription's
 * end (lagged, idle, retired: ended now, not at the client's next read), or
 * when the transport took less than HANDOVER_BACKLOG_BYTES for the whole
 * progress timeout (progress is bytes moving, not the whole frame: a slow
 * link finishes). One timer per stream, refreshed per wait.
 */
class HandoverWaits {
  private waits = 0;
  private waiter: ((handover: Handover) => void) | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private readonly onAbort = (): void => this.settle(this.waits, "stop");
  /** The transport's `taken` at the last check, and when it last moved by HANDOVER_BACKLOG_BYTES or more. */
  private takenAtCheck = 0;
  private progressAt = 0;
  /**
   * Every half timeout while a wait lasts: the wait times out once the
   * transport took less than HANDOVER_BACKLOG_BYTES for the whole timeout,
   * and goes on while bytes move (a slow link; or a transport that reads a
   * message ahead, as connect's does, and so waits on the frame before this
   * one too), which also restarts the hub's idle clock. After a stall of the
   * whole process the timer runs before the I/O callbacks that piled up
   * with it (write completions among them): judged in the check phase, once
   * they ran.
   */
  private readonly check = (): void => {
    const id = this.waits;
    setImmediate(() => {
      if (id !== this.waits || this.waiter === undefined) return;
      const taken = this.paced?.taken ?? 0;
      const now = performance.now();
      if (taken - this.takenAtCheck >= HANDOVER_BACKLOG_BYTES) {
        this.takenAtCheck = taken;
        this.progressAt = now;
        this.subscriber.noteProgress();
      } else if (now - this.progressAt >= this.timeoutMs) {
        this.settle(id, "timeout");
        return;
      }
      this.timer?.refresh();
    });
  };

  constructor(
    private readonly paced: PacedWrites | undefined,
    private readonly subscriber: HubSubscriber,
    private readonly signal: AbortSignal,
    private readonly timeoutMs: number,
  ) {
    if (paced === undefined) return;
    signal.addEventListener("abort", this.onAbort, { once: true });
    void subscriber.whenEnded().then(() => this.settle(this.waits, "ended"));
  }

  /** "taken" at once without a paced transport (HTTP/1.1): its own 'drain' wait paces it. */
  wait(): Handover | Promise<Handover> {
    if (this.signal.aborted) return "stop";
    if (this.subscriber.endReason !== undefined) return "ended";
    const paced = this.paced;
    if (paced === undefined || paced.backlog < HANDOVER_BACKLOG_BYTES) return "taken";
    const id = ++this.waits;
    this.takenAtCheck = paced.taken;
    this.progressAt = performance.now();
    if (this.timer === undefined) this.timer = setTimeout(this.check, Math.max(1, this.timeoutMs / 2));
    else this.timer.refresh();
    void paced.whenBelow(HANDOVER_BACKLOG_BYTES).then(() => this.settle(id, "taken"));
    return new Promise<Handover>((resolve) => (this.waiter = resolve));
  }

  dispose(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.signal.removeEventListener("abort", this.onAbort);
    this.settle(this.waits, "stop");
  }

  private settle(id: number, handover: Handover): void {
    if (id !== this.waits) return;
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.(handover);
  }
}

/** What the next step of a pool stream is. */
type Wake = { readonly kind: "read"; readonly read: SubscriberRead } | { readonly kind: "tick" } | { readonly kind: "stop" };

/**
 * The waits of one pool stream after its snapshot: the subscriber's next
 * read, the heartbeat due after an interval without updates, the stop. One
 * timer per stream, refreshed after every update sent, and one abort
 * listener; a wait costs a promise, not a timer and listeners per frame.
 */
class PoolStreamWaits {
  private read: SubscriberRead | undefined;
  private reads = 0;
  private due = false;
  private stopped = false;
  private waiter: ((wake: Wake) => void) | undefined;
  private readonly timer: ReturnType<typeof setTimeout>;
  private readonly onAbort = (): void => {
    this.stopped = true;
    this.wake({ kind: "stop" });
  };

  constructor(
    intervalMs: number,
    private readonly signal: AbortSignal,
  ) {
    this.timer = setTimeout(() => {
      this.due = true;
      this.wake({ kind: "tick" });
    }, intervalMs);
    if (signal.aborted) this.stopped = true;
    else signal.addEventListener("abort", this.onAbort, { once: true });
  }

  /** From now on, waits are for `next` (the subscriber's next read). */
  expect(next: Promise<SubscriberRead>): void {
    this.read = undefined;
    const id = ++this.reads;
    next.then(
      (read) => this.settle(id, read),
      () => this.settle(id, { kind: "ended", reason: "failed" }),
    );
  }

  /** The first of: the stop, the read, a due heartbeat (a read before a heartbeat). */
  wait(): Wake | Promise<Wake> {
    if (this.stopped) return { kind: "stop" };
    if (this.read !== undefined) return { kind: "read", read: this.read };
    if (this.due) return { kind: "tick" };
    return new Promise<Wake>((resolve) => (this.waiter = resolve));
  }

  /** An update went out: the next heartbeat is a whole interval away (missed ticks are delayed, never bursted). */
  sent(): void {
    this.due = false;
    this.timer.refresh();
  }

  dispose(): void {
    clearTimeout(this.timer);
    this.signal.removeEventListener("abort", this.onAbort);
  }

  private settle(id: number, read: SubscriberRead): void {
    if (id !== this.reads) return;
    this.read = read;
    this.wake({ kind: "read", read });
  }

  private wake(wake: Wake): void {
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.(wake);
  }
}

export interface RelayServiceOptions {
  readonly relay: Relay;
  readonly metrics: RelayMetrics;
  /** Fires when the server drains: streams end cleanly. */
  readonly drainSignal: AbortSignal;
}

export function relayService(options: RelayServiceOptions): Partial<ServiceImpl<typeof KvEventRelay>> {
  const { relay, metrics, drainSignal } = options;
  const config = relay.config;
  const admission = {
    catalog: new StreamAdmission(config.maxCatalogSubscribers, "catalog stream"),
    pool: new StreamAdmission(config.maxPoolStreamsTotal, "total pool stream"),
    readiness: new StreamAdmission(config.maxReadinessSubscribers, "readiness stream"),
    load: new StreamAdmission(config.maxLoadSubscribers, "load stream"),
  };
  const encoding = new Semaphore(config.publicationEncodingConcurrency);
  // Messages are only read by the serializer, so one identity message serves every response.
  const relayIdentityMessage: RelayIdentity = create(RelayIdentitySchema, {
    drtInstanceId: relay.identity.drtInstanceId,
    relayIncarnation: relay.identity.relayIncarnation,
  });

  const perConnection = new KeyedAdmission<object>(config.maxPoolStreamsPerConnection, "per-connection pool stream");
  const perPeer = new KeyedAdmission<string>(config.maxPoolStreamsPerPeer, "per-peer pool stream");
  const admit = (stream: RelayStream, scope: LimitScope = "total"): (() => void) => {
    try {
      const release = admission[stream].admit();
      metrics.subscribers.inc({ stream });
      return () => {
        release();
        metrics.subscribers.dec({ stream });
      };
    } catch (error) {
      metrics.limitRejected.inc({ stream, scope });
      throw error;
    }
  };

  /**
   * The pool stream's slots of its connection and of its client's address.
   * The returned release frees them once the call's HTTP/2 stream is gone:
   * an error whose trailers wait behind data the client has not read keeps
   * counting against that client only.
   */
  const admitClient = (ctx: HandlerContext): (() => void) => {
    const transport = callTransportOf(ctx);
    const releases: (() => void)[] = [];
    const take = <K>(limit: KeyedAdmission<K>, key: K | undefined, scope: LimitScope): void => {
      if (key === undefined) return;
      try {
        releases.push(limit.admit(key));
      } catch (error) {
        metrics.limitRejected.inc({ stream: "pool", scope });
        for (const release of releases) release();
        throw error;
      }
    };
    take(perConnection, transport?.connection, "per_connection");
    take(perPeer, transport?.peerAddress, "per_peer");
    const releaseAll = (): void => {
      for (const release of releases) release();
    };
    const stream = transport?.stream;
    return () => {
      if (stream === undefined || stream.destroyed) releaseAll();
      else stream.once("close", releaseAll);
    };
  };

  /** Ends when the call is cancelled or the server drains; disposed when the call ends. */
  const stopSignal = (ctx: HandlerContext): LinkedSignal => linkSignals([ctx.signal, drainSignal]);

  // mmgate has no request or token data: every serving-load view says so (UNAVAILABLE, empty stats).
  const unavailableLoad = create(LoadViewSchema, { requests: {}, tokens: {}, status: DataStatus.UNAVAILABLE });

  /**
   * The windows of a load stream (both load RPCs, C.4): the current one, then
   * every later one in order. A subscriber that fell behind the kept windows
   * ends SUBSCRIBER_LAGGED, counted as lagged{stream="load"}; a stream the
   * relay closes (the drain, the relay's close, a window that could not be
   * made) ends PUBLICATION_UNAVAILABLE, so the client reconnects; the client's
   * own cancel ends it quietly.
   */
  /**
   * A load RPC's stream: SubscribeKvPoolLoad and SubscribeServingLoad are one
   * stream kind (one limit, one gauge, one lag counter) over the same
   * windows, each window made into the RPC's own message from the fields
   * they share (`head`).
   */
  async function* loadStream<T>(
    req: { readonly contractMarker: number; readonly subscriberId: string },
    ctx: HandlerContext,
    message: (head: LoadUpdateHead, window: LoadWindow) => T,
  ): AsyncGenerator<T> {
    checkContractMarker(req.contractMarker);
    checkSubscriberId(req.subscriberId);
    const release = admit("load");
    try {
      for await (const window of loadWindows(ctx)) {
        const { windowSequence, observedMs, windowMs } = window;
        yield message({ protocolVersion: RELAY_PROTOCOL_VERSION, relay: relayIdentityMessage, windowSequence, observedMs, windowMs, contractMarker: RELAY_CONTRACT_MARKER }, window);
      }
    } finally {
      release();
    }
  }

  async function* loadWindows(ctx: HandlerContext): AsyncGenerator<LoadWindow> {
    const link = stopSignal(ctx);
    try {
      let window = relay.currentLoadWindow();
      for (;;) {
        yield window;
        let next: LoadWindow | undefined;
        try {
          next = await relay.loadWindowAfter(window.windowSequence, link.signal);
        } catch (error) {
          if (error instanceof RelayError && error.reason === "SUBSCRIBER_LAGGED") metrics.lagged.inc({ stream: "load" });
          throw error;
        }
        if (next === undefined) {
          if (ctx.signal.aborted) return;
          throw new RelayError("PUBLICATION_UNAVAILABLE", "the relay is shutting down; reconnect, to another relay");
        }
        metrics.loadUpdates.inc();
        window = next;
      }
    } finally {
      link.dispose();
    }
  }

  function endError(reason: SubscriberEndReason, pool: RelayPool, expected: ProducerIdentity, during: "snapshot" | "stream"): RelayError | undefined {
    switch (reason) {
      case "lagged":
        metrics.lagged.inc({ stream: "pool" });
        return new RelayError("SUBSCRIBER_LAGGED", "the subscriber fell behind the publication queue; resubscribe from a fresh snapshot");
      case "idle":
        return during === "snapshot"
          ? new RelayError("SNAPSHOT_PROGRESS_TIMEOUT", `no snapshot chunk could be handed over within ${config.snapshotProgressTimeoutMs} ms`)
          : new RelayError("SUBSCRIBER_LAGGED", `the subscriber read nothing for ${config.snapshotProgressTimeoutMs} ms; resubscribe from a fresh snapshot`);
      case "retired":
      case "recovery":
        return sameProducerIdentity(pool.producer, expected)
          ? new RelayError("PUBLICATION_UNAVAILABLE", "the publication requires a fresh snapshot; resubscribe")
          : new RelayError("PRODUCER_CHANGED", "the pool's producer generation changed; refresh the catalog");
      case "failed":
        return new RelayError("INVALID_PUBLICATION", "the pool's publication generation failed and was fenced; refresh the catalog");
      case "aborted":
      case "closed":
        return undefined;
    }
  }

  /** One FilterUpdate: a frame's sequences and payload, or a heartbeat at `sequence`; sent now unless `sentAtUs` says otherwise. */
  function update(producer: WireProducer, kind: FilterUpdateKind, frame: PublicationFrame | undefined, sequence: bigint, sentAtUs = unixMicros()): FilterUpdate {
    const init: FilterUpdateInit = {
      protocolVersion: RELAY_PROTOCOL_VERSION,
      relay: relayIdentityMessage,
      producer,
      baseSequence: frame?.baseSequence ?? sequence,
      sequence: frame?.sequence ?? sequence,
      sendTsUs: sentAtUs,
      kind,
      contractMarker: RELAY_CONTRACT_MARKER,
    };
    if (frame !== undefined) init.payload = frame.payload;
    return create(FilterUpdateSchema, init);
  }

  /**
   * Each delta's FilterUpdate, made once for every subscriber of its pool:
   * stamped with the delta's publication time, so it is the same message for
   * all of them, and, for calls that take protobuf binary, serialized once
   * (server/pre-encoded.ts). Held as long as the frame is (a subscriber's queue).
   */
  const deltaUpdates = new WeakMap<PublicationFrame, { message?: FilterUpdate; encoded?: FilterUpdate; envelope?: Buffer }>();
  /** Per producer generation: its identity's wire form, and the delta encoder over it, made once. */
  const generations = new WeakMap<ProducerIdentity, { readonly producer: WireProducer; readonly wire: DeltaWire }>();
  const generationOf = (identity: ProducerIdentity) => {
    let generation = generations.get(identity);
    if (generation === undefined) {
      const producer = producerToWire(identity);
      generations.set(identity, (generation = { producer, wire: new DeltaWire(relayIdentityMessage, producer) }));
    }
    return generation;
  };
  const sharedDelta = (frame: PublicationFrame) => {
    let shared = deltaUpdates.get(frame);
    if (shared === undefined) deltaUpdates.set(frame, (shared = {}));
    return shared;
  };
  function deltaUpdate(frame: PublicationFrame, binary: boolean): FilterUpdate {
    const shared = sharedDelta(frame);
    const message = (shared.message ??= update(generationOf(frame.identity).producer, FilterUpdateKind.DELTA, frame, frame.sequence, frame.publishedAtUs));
    if (!binary) return message;
    return (shared.encoded ??= preEncode(FilterUpdateSchema, message));
  }
  // The hub hands one frame to every subscriber in a row: the last one's envelope is found without a WeakMap lookup each.
  let lastEnvelopeFrame: PublicationFrame | undefined;
  let lastEnvelope: Buffer | undefined;
  /** A delta's length-prefixed FilterUpdate, as a direct delivery writes it: the same bytes, without the message. */
  const deltaEnvelope = (frame: PublicationFrame): Buffer => {
    if (frame === lastEnvelopeFrame) return lastEnvelope!;
    const shared = sharedDelta(frame);
    const envelope = (shared.envelope ??= shared.encoded !== undefined ? preEncodedEnvelope(shared.encoded, FilterUpdateSchema)! : generationOf(frame.identity).wire.envelope(frame, frame.publishedAtUs));
    lastEnvelopeFrame = frame;
    lastEnvelope = envelope;
    return envelope;
  };

  /** Why a handover that did not complete ends the stream: undefined to end it cleanly (the stop, the consumer's own close). */
  function handoverError(
    handover: Exclude<Handover, "taken">,
    subscriber: HubSubscriber,
    pool: RelayPool,
    expected: ProducerIdentity,
    during: "snapshot" | "stream",
  ): RelayError | undefined {
    switch (handover) {
      case "stop":
        return undefined;
      case "timeout":
        return endError("idle", pool, expected, during);
      case "ended":
        return endError(subscriber.endReason ?? "closed", pool, expected, during);
    }
  }

  async function* poolStream(
    subscriber: HubSubscriber,
    pool: RelayPool,
    expected: ProducerIdentity,
    stop: AbortSignal,
    paced: PacedWrites | undefined,
    binary: boolean,
    direct: DirectMessages | undefined,
  ): AsyncGenerator<FilterUpdate> {
    const snapshot = subscriber.takeSnapshot();
    const frames = encodeSnapshot(snapshot);
    const wireProducer = producerToWire(expected);
    const handover = new HandoverWaits(paced, subscriber, stop, config.snapshotProgressTimeoutMs);
    const bootstrap = openSpan("relay.bootstrap", { "mmgate.relay.pool_id": String(expected.poolId), "mmgate.relay.snapshot.sequence": String(snapshot.sequence), "mmgate.relay.snapshot.chunks": frames.count });
    let waits: PoolStreamWaits | undefined;
    const poolLabel = { pool: pool.name };
    let bootstrapped = false;
    try {
      for (let i = 0; i < frames.count; i++) {
        if (i > 0) {
          // The next chunk is encoded only once the transport took this one.
          const handed = await handover.wait();
          if (handed !== "taken") {
            const error = handoverError(handed, subscriber, pool, expected, "snapshot");
            if (error === undefined) return;
            throw error;
          }
          subscriber.noteProgress();
        }
        const permit = await encoding.acquire(stop).catch(() => undefined);
        if (permit === undefined) return;
        let next: IteratorResult<PublicationFrame>;
        try {
          next = frames.next();
        } finally {
          permit.release();
        }
        if (next.done === true) break;
        const frame = next.value;
        if (frame.kind !== "snapshot_chunk" || frame.sequence !== snapshot.sequence || frame.baseSequence !== snapshot.sequence) {
          throw new RelayError("INVALID_PUBLICATION", "a snapshot chunk does not sit at its snapshot's sequence");
        }
        const handedAt = performance.now();
        yield update(wireProducer, FilterUpdateKind.SNAPSHOT_CHUNK, frame, snapshot.sequence);
        metrics.bootstrapBytes.inc(poolLabel, frame.payload.byteLength);
        if (stop.aborted) return;
        // Without paced writes (HTTP/1.1) the transport asks for the next message only once this one is written out.
        if (performance.now() - handedAt > config.snapshotProgressTimeoutMs) {
          throw new RelayError("SNAPSHOT_PROGRESS_TIMEOUT", `a snapshot chunk took longer than ${config.snapshotProgressTimeoutMs} ms to hand over`);
        }
        const ended = subscriber.endReason;
        if (ended !== undefined) {
          const error = endError(ended, pool, expected, "snapshot");
          if (error === undefined) return;
          throw error;
        }
      }
      subscriber.releaseSnapshot();
      bootstrapped = true;
      metrics.bootstraps.inc({ ...poolLabel, result: "completed" });
      // The lag the bootstrap left: deltas queued behind the snapshot.
      bootstrap?.set("mmgate.relay.lag_frames", subscriber.queuedFrames).set("mmgate.relay.lag_bytes", subscriber.queuedBytes).end();
      let current = snapshot.sequence;
      if (direct !== undefined) {
        // HTTP/2 and protobuf binary: once the last chunk is handed over, deltas are written in the hub's turn (direct-delivery.ts).
        const handed = await handover.wait();
        if (handed !== "taken") {
          const error = handoverError(handed, subscriber, pool, expected, "snapshot");
          if (error === undefined) return;
          throw error;
        }
        const out = paced === undefined ? direct : new StreamMessages(paced, direct);
        const delivery = new DirectDelivery({ out, subscriber, expected, envelopeOf: deltaEnvelope, sequence: current, heartbeatIntervalMs: config.poolHeartbeatIntervalMs, signal: stop });
        try {
          for (;;) {
            let wake = delivery.next();
            if (wake instanceof Promise) wake = await wake;
            if (wake === "stop") return;
            if (wake === "failed") throw delivery.failure!;
            if (wake === "ended") {
              const error = endError(subscriber.endReason ?? "closed", pool, expected, "stream");
              if (error === undefined) return;
              throw error;
            }
            delivery.pause();
            metrics.poolHeartbeats.inc();
            yield update(wireProducer, FilterUpdateKind.HEARTBEAT, undefined, delivery.sequence);
            delivery.resume();
          }
        } finally {
          delivery.dispose();
        }
      }
      // Frames carry the hub's identity object: compared field by field once, then by reference.
      let checked: ProducerIdentity | undefined;
      waits = new PoolStreamWaits(config.poolHeartbeatIntervalMs, stop);
      // The first handover is the last chunk's.
      let during: "snapshot" | "stream" = "snapshot";
      // A read stays pending across a heartbeat; a new one is asked for only after a delta was taken.
      let reading = false;
      for (;;) {
        // Frames wait in the hub's bounded queue, not in the transport, until the transport took the last one.
        // (Answers that need no wait are used as they are: an await costs a turn of the microtask queue per frame.)
        let handed = handover.wait();
        if (handed instanceof Promise) handed = await handed;
        if (handed !== "taken") {
          const error = handoverError(handed, subscriber, pool, expected, during);
          if (error === undefined) return;
          throw error;
        }
        during = "stream";
        if (stop.aborted) return;
        // A frame already queued is taken at once; otherwise the first of the next frame, a heartbeat and the stop.
        let read = reading ? undefined : subscriber.poll();
        if (read === undefined) {
          if (!reading) {
            waits.expect(subscriber.next());
            reading = true;
          }
          let wake = waits.wait();
          if (wake instanceof Promise) wake = await wake;
          if (wake.kind === "stop") return;
          if (wake.kind === "tick") {
            metrics.poolHeartbeats.inc();
            yield update(wireProducer, FilterUpdateKind.HEARTBEAT, undefined, current);
            waits.sent();
            continue;
          }
          reading = false;
          read = wake.read;
        }
        if (read.kind === "ended") {
          const error = endError(read.reason, pool, expected, "stream");
          if (error === undefined) return;
          throw error;
        }
        const frame = read.frame;
        if (frame.identity !== checked) {
          if (!sameProducerIdentity(frame.identity, expected)) throw new RelayError("INVALID_PUBLICATION", "a delta of another producer generation reached the stream");
          checked = frame.identity;
        }
        if (frame.kind !== "delta" || frame.baseSequence !== current || frame.sequence !== current + 1n) {
          throw new RelayError("INVALID_PUBLICATION", `the publication is not contiguous: at ${current}, got ${frame.kind} ${frame.baseSequence} -> ${frame.sequence}`);
        }
        current = frame.sequence;
        // The same message for every subscriber (its identity is `expected`'s, checked above).
        yield deltaUpdate(frame, binary);
        waits.sent();
      }
    } finally {
      if (!bootstrapped) metrics.bootstraps.inc({ ...poolLabel, result: "ended" });
      bootstrap?.set("mmgate.relay.bootstrap.interrupted", true).end();
      waits?.dispose();
      handover.dispose();
    }
  }

  return {
    getRelayInfo(req) {
      checkContractMarker(req.contractMarker);
      return create(RelayInfoSchema, { protocolVersion: RELAY_PROTOCOL_VERSION, relay: relayIdentityMessage, contractMarker: RELAY_CONTRACT_MARKER });
    },

    async *watchKvPoolCatalog(req, ctx) {
      checkContractMarker(req.contractMarker);
      checkSubscriberId(req.subscriberId);
      const release = admit("catalog");
      const link = stopSignal(ctx);
      const stop = link.signal;
      try {
        // Every kept revision after the last one sent, in order (a withdrawal is never folded into the republication that follows it); the last again on the heartbeat.
        let sent: CatalogRevision | undefined;
        for (;;) {
          const seen = relay.catalog.version;
          const next: CatalogRevision = sent === undefined ? relay.currentCatalog() : (relay.catalogAfter(sent.revision) ?? sent);
          yield create(KvPoolCatalogUpdateSchema, {
            protocolVersion: RELAY_PROTOCOL_VERSION,
            relay: relayIdentityMessage,
            revision: next.revision,
            snapshot: { pools: next.pools.map(descriptorToWire) },
            contractMarker: RELAY_CONTRACT_MARKER,
          });
          sent = next;
          if (relay.catalogAfter(sent.revision) !== undefined) continue;
          await relay.catalog.waitPast(seen, config.catalogHeartbeatIntervalMs, stop);
          if (stop.aborted) return;
        }
      } finally {
        release();
        link.dispose();
      }
    },

    async *subscribeKvPool(req, ctx) {
      checkContractMarker(req.contractMarker);
      checkSubscriberId(req.subscriberId);
      if (req.expectedProducer === undefined) throw new RelayError("INVALID_REQUEST", "expected_producer is required");
      const expected = producerFromWire(req.expectedProducer, "expected_producer");
      const release = admit("pool");
      let releaseClient: (() => void) | undefined;
      let subscriber: HubSubscriber | undefined;
      const link = stopSignal(ctx);
      const stop = link.signal;
      try {
        releaseClient = admitClient(ctx);
        const pool = relay.poolById(expected.poolId);
        if (pool === undefined) throw new RelayError("POOL_NOT_FOUND", "no pool with this pool_id is published here; refresh the catalog");
        if (!sameProducerIdentity(pool.producer, expected)) {
          throw new RelayError("PRODUCER_CHANGED", "the pool is published by another producer generation; refresh the catalog");
        }
        relay.markRequested(pool);
        if (pool.hub === undefined && relay.initializedHubs() >= config.maxInitializedPoolHubs) {
          metrics.limitRejected.inc({ stream: "pool", scope: "initialized_hub" });
          throw new RelayError("RESOURCE_LIMIT", `Relay initialized pool hub limit ${config.maxInitializedPoolHubs} reached`);
        }
        try {
          // A large pool's first hub copies its barrier snapshot over a few turns: the stream waits for it.
          subscriber = (await pool.hubReady(stop)).subscribe({ signal: stop });
        } catch (error) {
          if (stop.aborted) return;
          if (error instanceof HubError && error.code === "SubscriberLimit") {
            metrics.limitRejected.inc({ stream: "pool", scope: "per_pool" });
            throw new RelayError("RESOURCE_LIMIT", `Relay per-pool stream limit ${config.maxSubscribersPerPool} reached`);
          }
          if (error instanceof HubError) throw new RelayError("PUBLICATION_UNAVAILABLE", `the pool's publication is not available: ${error.message}`, { cause: error });
          throw error;
        }
        const binary = writesBinary(ctx, FilterUpdateSchema);
        yield* poolStream(subscriber, pool, expected, stop, pacedWritesOf(ctx), binary, binary ? directMessagesOf(ctx) : undefined);
      } finally {
        subscriber?.close();
        release();
        releaseClient?.();
        link.dispose();
      }
    },

    async *subscribeServingReadiness(req, ctx) {
      checkContractMarker(req.contractMarker);
      checkSubscriberId(req.subscriberId);
      const release = admit("readiness");
      const link = stopSignal(ctx);
      const stop = link.signal;
      try {
        relay.noteReadiness();
        for (;;) {
          const seen = relay.readiness.version;
          yield create(ServingReadinessUpdateSchema, {
            protocolVersion: RELAY_PROTOCOL_VERSION,
            relay: relayIdentityMessage,
            revision: seen,
            // Each entry checked by the contract's topology rules (topology.ts); one the reference would reject is never sent.
            entries: relay.readinessEntries(),
            contractMarker: RELAY_CONTRACT_MARKER,
          });
          // A change or the heartbeat tick: either way the current projection goes out again.
          await relay.readiness.waitPast(seen, config.readinessHeartbeatIntervalMs, stop);
          if (stop.aborted) return;
        }
      } finally {
        release();
        link.dispose();
      }
    },

    subscribeKvPoolLoad(req, ctx) {
      return loadStream(req, ctx, (head, window) =>
        create(KvPoolLoadUpdateSchema, {
          ...head,
          pools: window.pools.map((entry) => ({
            producer: producerToWire(entry.descriptor.producer),
            kvUsedBlocks: entry.kvUsedBlocks,
            totalKvBlocks: entry.totalKvBlocks,
            kvObservedRanks: entry.kvObservedRanks,
            kvExpectedRanks: entry.kvExpectedRanks,
          })),
        }),
      );
    },

    subscribeServingLoad(req, ctx) {
      return loadStream(req, ctx, (head, window) =>
        create(ServingLoadUpdateSchema, {
          ...head,
          pools: window.pools.map((entry) => ({
            producer: producerToWire(entry.descriptor.producer),
            load: unavailableLoad,
            // Unset when unknown; max_concurrency is never known here.
            deployment: entry.liveWorkers === undefined ? {} : { liveWorkers: entry.liveWorkers },
          })),
          models: window.models.map((model) => ({
            namespace: model.namespace,
            canonicalModelId: model.canonicalModelId,
            load: unavailableLoad,
            // Frontends are not something the relay sees: 0 (unknown).
            deployment: { servingPools: model.servingPools },
          })),
        }),
      );
    },
  };
}
