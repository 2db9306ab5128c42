/**
 * The consumer against the real relay over the network: recovery from a
 * lagged subscription, a relay restart, and a chaos run with random
 * disconnects and delays, each ending with mirrors byte-identical to the
 * producer's filter; overlap answers checked against the truth.
 */
import net from "node:net";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { expect } from "chai";
import { LaneProbe, RelayConsumer } from "../../../src/relay/index.js";
import { computeSeqHashForBlock } from "../../../src/kv/index.js";
import { eventually, prng } from "../../support/index.js";
import { chain, removed, startRelay, type RelayServer } from "./support.js";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { KvEventService, PublishRequestSchema, type RouterEvent as WireRouterEvent } from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";

const EIGHT_MIB = 8 * 1024 * 1024;

function consumerOf(addr: string, id: string): RelayConsumer {
  return new RelayConsumer({
    transport: createGrpcTransport({ baseUrl: `http://${addr}`, readMaxBytes: EIGHT_MIB }),
    subscriberId: id,
    relay: addr,
    backoff: { minMs: 10, maxMs: 200 },
  });
}

async function publish(server: RelayServer, events: WireRouterEvent[], pool = "default"): Promise<void> {
  const client = createClient(KvEventService, server.connectTransport);
  await client.publish(
    (async function* () {
      yield create(PublishRequestSchema, { pool, events });
    })(),
  );
}

function sameWords(a: BigUint64Array | undefined, b: BigUint64Array): boolean {
  return a !== undefined && a.length === b.length && Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}

/** Waits until `consumer` mirrors the pool exactly, at the pool's sequence. */
async function mirrored(consumer: RelayConsumer, server: RelayServer, timeoutMs = 15_000): Promise<void> {
  const pool = server.relay.pool("default")!;
  await eventually(
    () => {
      const view = consumer.pools().find((p) => p.state === "ready");
      expect(view, "a ready pool").to.not.equal(undefined);
      expect(view!.installedSequence).to.equal(pool.sequence);
      expect(sameWords(consumer.words(view!.key), pool.words()), "mirror == producer filter").to.equal(true);
    },
    { timeoutMs },
  );
}

/**
 * A TCP proxy that, while `chaos` is on, delays chunks and cuts connections
 * at random; `hold()` stops passing the server's bytes to the client until
 * `release()` (a client that stops reading, seen from the server).
 */
class ChaosProxy {
  chaos = true;
  cuts = 0;
  private readonly upstreams = new Set<net.Socket>();
  private holding = false;
  private readonly server: net.Server;
  private readonly sockets = new Set<net.Socket>();
  constructor(
    private readonly target: number,
    private readonly random: () => number,
  ) {
    this.server = net.createServer((client) => this.accept(client));
  }
  async listen(): Promise<string> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    return `127.0.0.1:${(this.server.address() as net.AddressInfo).port}`;
  }
  private accept(client: net.Socket): void {
    const upstream = net.connect(this.target, "127.0.0.1");
    this.upstreams.add(upstream);
    upstream.on("close", () => this.upstreams.delete(upstream));
    if (this.holding) upstream.pause();
    for (const s of [client, upstream]) {
      this.sockets.add(s);
      s.on("close", () => this.sockets.delete(s));
      s.on("error", () => undefined);
    }
    const relay = (from: net.Socket, to: net.Socket) =>
      from.on("data", (chunk: Buffer) => {
        if (this.chaos && this.random() < 0.2) {
          from.pause();
          setTimeout(() => {
            to.write(chunk);
            from.resume();
          }, Math.floor(this.random() * 20));
        } else {
          to.write(chunk);
        }
      });
    relay(client, upstream);
    relay(upstream, client);
    if (this.chaos) {
      setTimeout(
        () => {
          if (!this.chaos) return;
          this.cuts += 1;
          client.destroy();
          upstream.destroy();
        },
        50 + Math.floor(this.random() * 400),
      );
    }
  }
  hold(): void {
    this.holding = true;
    for (const upstream of this.upstreams) upstream.pause();
  }
  release(): void {
    this.holding = false;
    for (const upstream of this.upstreams) upstream.resume();
  }
  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise((resolve) => this.server.close(resolve));
  }
}

describe("relay consumer against the real relay", function () {
  this.timeout(60_000);
  const stops: AbortController[] = [];
  afterEach(() => {
    for (const stop of stops.splice(0)) stop.abort();
  });
  const run = (consumer: RelayConsumer): void => {
    const stop = new AbortController();
    stops.push(stop);
    void consumer.run(stop.signal);
  };

  it("a lagged subscription ends SUBSCRIBER_LAGGED and the consumer recovers to an exact mirror", async () => {
    const server = await startRelay({ pools: [{ name: "default", expectedBlocks: 8192 }], publicationThreshold: 1, publicationQueueCapacity: 2 });
    const proxy = new ChaosProxy(Number(server.addr.split(":")[1]), () => 0.5);
    proxy.chaos = false;
    try {
      const consumer = consumerOf(await proxy.listen(), "lagger");
      const invalidated: string[] = [];
      consumer.on((event) => {
        if (event.type === "invalidated") invalidated.push(String((event.error as { reason?: string }).reason));
      });
      run(consumer);
      await mirrored(consumer, server);
      // The consumer stops reading: once HTTP/2's window is full the relay cannot send, and the deltas
      // (one per message, each in its own turn) fill the subscriber's queue of two.
      proxy.hold();
      const pool = server.relay.pool("default")!;
      for (let i = 0; i < 400 && (pool.hub?.stats().ended.lagged ?? 0) === 0; i++) await publish(server, [chain(BigInt(1 + (i % 7)), BigInt(i) * 100n, 64)]);
      expect(pool.hub!.stats().ended.lagged).to.equal(1);
      proxy.release();
      await mirrored(consumer, server);
      expect(invalidated).to.include("SUBSCRIBER_LAGGED");
    } finally {
      await proxy.close();
      await server.close();
    }
  });

  it("the relay restarted mid-stream: the consumer resynchronises with the new relay", async () => {
    const first = await startRelay({ pools: [{ name: "default", expectedBlocks: 4096 }] });
    const port = first.addr.split(":")[1]!;
    const consumer = consumerOf(first.addr, "restart");
    run(consumer);
    await publish(first, [chain(1n, 1000n, 50)]);
    await mirrored(consumer, first);
    await first.close();
    // The same address, a new relay (new relay incarnation, new producer incarnation, empty filter).
    const restarted = await startRelay({ pools: [{ name: "default", expectedBlocks: 4096 }] }, { listen: `127.0.0.1:${port}` });
    try {
      await publish(restarted, [chain(2n, 7000n, 40), chain(3n, 9000n, 10)]);
      await mirrored(consumer, restarted);
      expect(consumer.pools()).to.have.length(1);
      expect(consumer.pools()[0]!.descriptor?.producer.producerIncarnation).to.equal(restarted.relay.pool("default")!.producer.producerIncarnation);
    } finally {
      await restarted.close();
    }
  });

  it("chaos: 10,000 events with random disconnects and delays end with every consumer's mirror byte-identical to the producer's filter", async () => {
    const server = await startRelay({ pools: [{ name: "default", expectedBlocks: 65_536 }], publicationThreshold: 8 });
    const random = prng(0x5eed);
    const proxies: ChaosProxy[] = [];
    try {
      const consumers: RelayConsumer[] = [];
      for (let i = 0; i < 3; i++) {
        const proxy = new ChaosProxy(Number(server.addr.split(":")[1]), random);
        proxies.push(proxy);
        const consumer = consumerOf(await proxy.listen(), `chaos-${i}`);
        consumers.push(consumer);
        run(consumer);
      }
      const live: bigint[][] = [[], [], [], [], []];
      let sent = 0;
      let next = 1n;
      while (sent < 10_000) {
        const batch: WireRouterEvent[] = [];
        const size = 1 + Math.floor(random() * 200);
        for (let i = 0; i < size && sent < 10_000; i++, sent++) {
          const worker = Math.floor(random() * live.length);
          const held = live[worker]!;
          if (held.length > 0 && random() < 0.3) {
            const at = Math.floor(random() * held.length);
            batch.push(removed(BigInt(worker), [held[at]!]));
            held.splice(at, 1);
          } else {
            const blocks = 1 + Math.floor(random() * 4);
            batch.push(chain(BigInt(worker), next, blocks));
            for (let b = 0; b < blocks; b++) held.push(next + BigInt(b));
            next += BigInt(blocks) + 1n;
          }
        }
        await publish(server, batch);
        await new Promise((resolve) => setTimeout(resolve, Math.floor(random() * 15)));
      }
      for (const proxy of proxies) proxy.chaos = false;
      for (const consumer of consumers) await mirrored(consumer, server, 30_000);
      expect(proxies.reduce((n, p) => n + p.cuts, 0), "the run cut connections").to.be.greaterThan(3);
      expect(server.relay.pool("default")!.occupancy().uniqueBlocks).to.be.greaterThan(1000);
    } finally {
      for (const proxy of proxies) await proxy.close();
      await server.close();
    }
  });

  it("overlap: no false negatives against the truth from the events, and a false-positive rate near the theory", async () => {
    const server = await startRelay({ pools: [{ name: "default", expectedBlocks: 16_384 }] });
    try {
      const consumer = consumerOf(server.addr, "overlap");
      run(consumer);
      // 12,000 blocks in 400 chains fill the 4,096-bucket filter to about 73% of its slots.
      const events: WireRouterEvent[] = [];
      for (let c = 0; c < 400; c++) events.push(chain(BigInt(c % 16), BigInt(c) * 1000n + 1n, 30));
      await publish(server, events);
      await mirrored(consumer, server);
      const view = consumer.pools()[0]!;
      const pool = server.relay.pool("default")!;
      const probe = new LaneProbe(pool.producer.format, consumer.words(view.key)!);
      // The truth from the events: each chain's canonical sequence hashes. Every one is found (no false negatives).
      const truth = new Set<bigint>();
      for (const event of events) {
        if (event.data.case !== "stored") continue;
        for (const hash of computeSeqHashForBlock(event.data.value.blocks.map((b) => b.tokensHash))) truth.add(hash);
      }
      expect(truth.size).to.equal(pool.occupancy().uniqueBlocks);
      for (const hash of truth) expect(probe.contains(hash), `held ${hash}`).to.equal(true);
      // Random keys the producer never held: the filter claims about 2 * slots * load / 2^16 of them.
      const random = prng(42);
      const trials = 200_000;
      let falsePositives = 0;
      for (let i = 0; i < trials; i++) {
        const key = (BigInt(Math.floor(random() * 2 ** 32)) << 32n) | BigInt(Math.floor(random() * 2 ** 32));
        if (probe.contains(key) && !truth.has(key)) falsePositives += 1;
      }
      const stats = pool.stats();
      const load = stats.occupiedSlots / (stats.buckets * 4);
      const theory = (2 * 4 * load) / 65_536;
      const rate = falsePositives / trials;
      expect(rate).to.be.within(theory * 0.5, theory * 1.6);
    } finally {
      await server.close();
    }
  });
});

