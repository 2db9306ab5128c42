/**
 * A scripted KvEventRelay served over real HTTP/2 (connect-node), for the
 * consumer tests: a catalog the test sets, and pools that send a snapshot of
 * their lane and then whatever the test publishes or injects, with faults
 * queued per subscription.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create } from "@bufbuild/protobuf";
import { ConnectError, type Code, type HandlerContext, type Transport } from "@connectrpc/connect";
import { connectNodeAdapter, createGrpcTransport } from "@connectrpc/connect-node";
import {
  KvEventRelay,
  KvPoolCatalogSnapshotSchema,
  KvPoolCatalogUpdateSchema,
  type FilterUpdate,
  type KvPoolCatalogUpdate,
  type KvPoolDescriptor,
  type SubscribeKvPoolRequest,
  type WatchKvPoolCatalogRequest,
} from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { sameProducerIdentity, type ProducerIdentity } from "../../../src/kv/index.js";
import { poolKey } from "../../../src/relay/index.js";
import {
  descriptorToWire,
  producerFromWire,
  producerToWire,
  RELAY_CONTRACT_MARKER,
  RELAY_PROTOCOL_VERSION,
  RelayError,
  type PoolDescriptor,
  type RelayErrorReasonName,
} from "../../../src/relay/wire/index.js";
import type { BucketImage } from "../../../src/relay/index.js";
import { applyImages, deltaUpdate, heartbeatUpdate, producer, RELAY, snapshotUpdates } from "./mirror-helpers.js";

type Item<T> = { readonly kind: "message"; readonly message: T } | { readonly kind: "end" } | { readonly kind: "error"; readonly error: Error };

/** An unbounded queue one server stream drains until an end, an error, or its call's signal. */
class Channel<T> {
  private readonly items: Item<T>[] = [];
  private wake: (() => void) | undefined;

  push(item: Item<T>): void {
    this.items.push(item);
    this.wake?.();
  }

  async *drain(signal: AbortSignal): AsyncGenerator<T> {
    for (;;) {
      for (let item = this.items.shift(); item !== undefined; item = this.items.shift()) {
        if (item.kind === "end") return;
        if (item.kind === "error") throw item.error;
        yield item.message;
      }
      if (signal.aborted) return;
      await new Promise<void>((resolve) => {
        const done = () => {
          signal.removeEventListener("abort", done);
          this.wake = undefined;
          resolve();
        };
        this.wake = done;
        signal.addEventListener("abort", done, { once: true });
      });
      if (signal.aborted) return;
    }
  }
}

/** What one subscription does instead of (or before) serving normally. */
export type SubscriptionFault =
  /** Fail at once with this reason in the trailer. */
  | { readonly kind: "error"; readonly reason: RelayErrorReasonName }
  /** Fail at once with a status and no reason trailer. */
  | { readonly kind: "status"; readonly code: Code }
  /** Send the snapshot, then end the stream cleanly. */
  | { readonly kind: "eof-after-snapshot" }
  /** Send a heartbeat before the snapshot. */
  | { readonly kind: "heartbeat-first" }
  /** Send the snapshot chunks with another producer identity. */
  | { readonly kind: "wrong-producer" };

export class FakePool {
  words: BigUint64Array;
  sequence: bigint;
  /** Subscriptions served (faults included). */
  subscriptions = 0;
  readonly faults: SubscriptionFault[] = [];
  readonly live = new Set<Channel<FilterUpdate>>();

  constructor(
    readonly producer: ProducerIdentity,
    words?: BigUint64Array,
    sequence = 1n,
  ) {
    this.words = words ?? new BigUint64Array(producer.format.bucketCount);
    this.sequence = sequence;
  }

  get key(): string {
    return poolKey(this.producer.poolId);
  }

  /** One publication: the images go into the lane and out to every live stream as the delta sequence -> sequence + 1. */
  publish(images: readonly BucketImage[]): void {
    applyImages(this.words, images);
    const update = deltaUpdate(this.producer, this.sequence, images);
    this.sequence++;
    this.pushRaw(update);
  }

  heartbeat(sendTsUs = 1n): void {
    this.pushRaw(heartbeatUpdate(this.producer, this.sequence, { sendTsUs }));
  }

  /** Sends `update` as is on every live stream. */
  pushRaw(update: FilterUpdate): void {
    for (const channel of this.live) channel.push({ kind: "message", message: update });
  }

  /** Ends every live stream cleanly. */
  endLive(): void {
    for (const channel of this.live) channel.push({ kind: "end" });
  }

  /** Fails every live stream with `reason`. */
  failLive(reason: RelayErrorReasonName): void {
    for (const channel of this.live) channel.push({ kind: "error", error: new RelayError(reason, `injected ${reason}`).toConnectError() });
  }

  async *serve(signal: AbortSignal): AsyncGenerator<FilterUpdate> {
    this.subscriptions++;
    const fault = this.faults.shift();
    if (fault?.kind === "error") throw new RelayError(fault.reason, `injected ${fault.reason}`).toConnectError();
    if (fault?.kind === "status") throw new ConnectError("injected status", fault.code);
    // The snapshot and the live queue are taken at the same instant, so the
    // first queued delta is exactly snapshot -> snapshot + 1.
    const channel = new Channel<FilterUpdate>();
    this.live.add(channel);
    const snapshot = snapshotUpdates(this.producer, this.sequence, this.words.slice());
    try {
      if (fault?.kind === "heartbeat-first") yield heartbeatUpdate(this.producer, this.sequence);
      const other = fault?.kind === "wrong-producer" ? producerToWire(producer({ pool: 77 })) : undefined;
      for (const chunk of snapshot) yield other === undefined ? chunk : { ...chunk, producer: other };
      if (fault?.kind === "eof-after-snapshot") return;
      yield* channel.drain(signal);
    } finally {
      this.live.delete(channel);
    }
  }
}

/** What one catalog stream does instead of serving normally. */
export type CatalogFault = { readonly kind: "error"; readonly reason: RelayErrorReasonName } | { readonly kind: "bad-marker" };

export class FakeRelay {
  readonly pools = new Map<string, FakePool>();
  private catalogEntries: KvPoolDescriptor[] = [];
  private revision = 0n;
  readonly catalogStreams = new Set<Channel<KvPoolCatalogUpdate>>();
  readonly catalogFaults: CatalogFault[] = [];
  catalogSubscriptions = 0;
  readonly catalogRequests: WatchKvPoolCatalogRequest[] = [];
  readonly subscribeRequests: SubscribeKvPoolRequest[] = [];
  private readonly sessions = new Set<http2.ServerHttp2Session>();

  private readonly server: http2.Http2Server;
  private _transport: Transport | undefined;

  private constructor() {
    const handler = connectNodeAdapter({
      routes: (router) => {
        router.service(KvEventRelay, {
          watchKvPoolCatalog: (request, context) => this.watchCatalog(request, context),
          subscribeKvPool: (request, context) => this.subscribe(request, context),
        });
      },
    });
    this.server = http2.createServer(handler);
    this.server.on("session", (session) => {
      this.sessions.add(session);
      session.on("close", () => this.sessions.delete(session));
    });
  }

  static async start(): Promise<FakeRelay> {
    const relay = new FakeRelay();
    await new Promise<void>((resolve) => relay.server.listen(0, "127.0.0.1", resolve));
    const { port } = relay.server.address() as AddressInfo;
    relay._transport = createGrpcTransport({ baseUrl: `http://127.0.0.1:${port}` });
    return relay;
  }

  /** A gRPC transport to the relay. */
  get transport(): Transport {
    return this._transport!;
  }

  /** Serves `pool` from now on, in place of any pool with its PoolId. */
  addPool(pool: FakePool): FakePool {
    this.pools.set(pool.key, pool);
    return pool;
  }

  /** Replaces the catalog and sends it on every catalog stream. */
  setCatalog(entries: readonly (PoolDescriptor | KvPoolDescriptor)[]): void {
    this.catalogEntries = entries.map((entry) => ("$typeName" in entry ? entry : descriptorToWire(entry)));
    this.revision += 3n; // revisions may skip values
    const update = this.catalogUpdate();
    for (const channel of this.catalogStreams) channel.push({ kind: "message", message: update });
  }

  /** Sends `update` as is on every catalog stream. */
  pushCatalogRaw(update: KvPoolCatalogUpdate): void {
    for (const channel of this.catalogStreams) channel.push({ kind: "message", message: update });
  }

  catalogUpdate(init: Partial<Omit<KvPoolCatalogUpdate, "$typeName">> = {}): KvPoolCatalogUpdate {
    return create(KvPoolCatalogUpdateSchema, {
      protocolVersion: RELAY_PROTOCOL_VERSION,
      relay: RELAY,
      revision: this.revision,
      snapshot: create(KvPoolCatalogSnapshotSchema, { pools: this.catalogEntries }),
      contractMarker: RELAY_CONTRACT_MARKER,
      ...init,
    });
  }

  /** Open pool streams over every pool. */
  livePoolStreams(): number {
    let n = 0;
    for (const pool of this.pools.values()) n += pool.live.size;
    return n;
  }

  async close(): Promise<void> {
    for (const session of this.sessions) session.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private async *watchCatalog(request: WatchKvPoolCatalogRequest, context: HandlerContext): AsyncGenerator<KvPoolCatalogUpdate> {
    this.catalogRequests.push(request);
    this.catalogSubscriptions++;
    const fault = this.catalogFaults.shift();
    if (fault?.kind === "error") throw new RelayError(fault.reason, `injected ${fault.reason}`).toConnectError();
    const channel = new Channel<KvPoolCatalogUpdate>();
    this.catalogStreams.add(channel);
    try {
      yield fault?.kind === "bad-marker" ? this.catalogUpdate({ contractMarker: 0x4b565232 }) : this.catalogUpdate();
      yield* channel.drain(context.signal);
    } finally {
      this.catalogStreams.delete(channel);
    }
  }

  private subscribe(request: SubscribeKvPoolRequest, context: HandlerContext): AsyncGenerator<FilterUpdate> {
    this.subscribeRequests.push(request);
    const expected = producerFromWire(request.expectedProducer, "expected_producer");
    const pool = this.pools.get(poolKey(expected.poolId));
    if (pool === undefined) throw new RelayError("POOL_NOT_FOUND", "no such pool").toConnectError();
    if (!sameProducerIdentity(pool.producer, expected)) throw new RelayError("PRODUCER_CHANGED", "the pool has another producer").toConnectError();
    return pool.serve(context.signal);
  }
}
