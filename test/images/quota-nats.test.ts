/**
 * Quotas shared over NATS JetStream (src/images/quota/nats.ts) against a
 * real nats-server: two store instances on one bucket stand for two
 * replicas, on one clock the test holds still. The limit is shared, racing
 * charges never spend a token twice, and a store that cannot reach NATS
 * charges in memory at once, says so once, and shares again when NATS is
 * back. Two servers whose idempotency store is on NATS share a key's quota
 * without further settings.
 */
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { expect } from "chai";
import { connect } from "nats";
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import { defineImagesModule } from "../../src/images/index.js";
import { keyDigest } from "../../src/server/index.js";
import { pino } from "pino";
import { imagesConfigSchema } from "../../src/images/config.js";
import { imagesRate, requestsRate, type QuotaCost, type QuotaRates } from "../../src/images/quota/bucket.js";
import { decodeQuotaState, NatsQuotaStore, quotaKey } from "../../src/images/quota/nats.js";
import { eventually, expectRejection, FakeClock, metricValue, requireNats, startNats, startServer, type InProcessServer, type NatsServer } from "../support/index.js";
import { freePort } from "../support/process.js";

const ONE: QuotaCost = { requests: 1, images: 1 };

interface Replica {
  readonly store: NatsQuotaStore;
  readonly logs: string[];
}

describe("images: quotas shared over NATS JetStream", function () {
  this.timeout(30_000);
  let nats: NatsServer;
  let bucket: string;
  let buckets = 0;
  const replicas: Replica[] = [];
  const clock = new FakeClock(1_700_000_000_000);

  before(async function () {
    requireNats(this);
    nats = await startNats({ jetstream: true });
  });
  after(async () => {
    await nats?.stop();
  });
  beforeEach(() => {
    buckets += 1;
    bucket = `quota_${process.pid}_${buckets}`;
  });
  afterEach(async () => {
    await Promise.all(replicas.splice(0).map((r) => r.store.close()));
  });

  function replica(servers = [nats.url]): Replica {
    const logs: string[] = [];
    const nc = imagesConfigSchema.parse({
      idempotency: { store: "nats", nats: { servers, requestTimeoutMs: 1000, connectTimeoutMs: 1000, reconnectWaitMs: 100 } },
    }).idempotency.nats;
    const store = new NatsQuotaStore({
      nats: nc,
      bucket,
      maxCallers: 100,
      logger: pino({ level: "info" }, { write: (line: string) => void logs.push(line) }),
      now: clock.now,
    });
    store.start();
    const entry = { store, logs };
    replicas.push(entry);
    return entry;
  }

  const logged = (r: Replica, text: string) => r.logs.filter((line) => line.includes(text)).length;
  const connected = (r: Replica) => eventually(() => expect(logged(r, "quota store connected")).to.equal(1));

  it("shares a caller's limit across replicas, and keeps other callers apart", async () => {
    const [a, b] = [replica(), replica()];
    await Promise.all([connected(a), connected(b)]);
    const rates: QuotaRates = { requests: requestsRate(2) };
    expect((await a.store.charge("ci", rates, ONE)).ok).to.equal(true);
    expect((await b.store.charge("ci", rates, ONE)).ok).to.equal(true);
    for (const r of [a, b]) expect(await r.store.charge("ci", rates, ONE)).to.deep.include({ ok: false, limit: "requests", waitMs: 500 });
    expect((await b.store.charge("web", rates, ONE)).ok).to.equal(true);
    // Images count n on every replica alike.
    const images: QuotaRates = { images: imagesRate(5) };
    expect((await a.store.charge("batch", images, { requests: 1, images: 3 })).ok).to.equal(true);
    expect(await b.store.charge("batch", images, { requests: 1, images: 3 })).to.deep.include({ ok: false, limit: "images", waitMs: 12_000 });
    clock.advance(12_000);
    expect((await b.store.charge("batch", images, { requests: 1, images: 3 })).ok).to.equal(true);

    const nc = await connect({ servers: nats.url });
    try {
      const kv = await nc.jetstream().views.kv(bucket);
      const stored = await kv.get(quotaKey("ci"));
      expect(decodeQuotaState(stored!.value)).to.deep.equal({ requests: { tokens: 0, at: clock.now() - 12_000 } });
    } finally {
      await nc.close();
    }
    expect(a.store.degraded).to.equal(false);
  });

  it("never spends a token twice when replicas charge one caller at once", async () => {
    const [a, b] = [replica(), replica()];
    await Promise.all([connected(a), connected(b)]);
    const rates: QuotaRates = { requests: requestsRate(4) };
    const results = await Promise.all(Array.from({ length: 8 }, (_, i) => (i % 2 === 0 ? a : b).store.charge("busy", rates, ONE)));
    expect(results.filter((r) => r.ok)).to.have.length(4);
    expect((await a.store.charge("busy", rates, ONE)).ok).to.equal(false);
  });

  it("charges in memory at once while NATS is unreachable, says so once, and shares again once it is back", async () => {
    const nowhere = replica([`127.0.0.1:${await freePort()}`]);
    await eventually(() => expect(nowhere.store.degraded).to.equal(true));
    // Never held up: the replica's own buckets decide.
    const rates: QuotaRates = { requests: requestsRate(1) };
    expect((await nowhere.store.charge("solo", rates, ONE)).ok).to.equal(true);
    expect((await nowhere.store.charge("solo", rates, ONE)).ok).to.equal(false);
    expect(logged(nowhere, "quota store unreachable")).to.equal(1);

    const a = replica();
    await connected(a);
    expect((await a.store.charge("ci", rates, ONE)).ok).to.equal(true);
    await nats.halt();
    try {
      await eventually(() => expect(a.store.degraded).to.equal(true));
      // The shared bucket is gone: this replica counts on its own, from full.
      expect((await a.store.charge("ci", rates, ONE)).ok).to.equal(true);
      expect((await a.store.charge("ci", rates, ONE)).ok).to.equal(false);
      expect(logged(a, "quota store unreachable")).to.equal(1);
    } finally {
      await nats.restart();
    }
    await eventually(() => expect(logged(a, "quota store reachable again")).to.equal(1), { timeoutMs: 10_000 });
    expect(a.store.degraded).to.equal(false);
    clock.advance(1000);
    expect((await a.store.charge("ci", rates, ONE)).ok).to.equal(true);
    const b = replica();
    await connected(b);
    expect((await b.store.charge("ci", rates, ONE)).ok, "shared again").to.equal(false);
  });

  it("two servers with the idempotency store on NATS share a key's quota (store: auto)", async () => {
    const dir = await mkdtemp(join(tmpdir(), "mmgate-quota-nats-"));
    const servers: InProcessServer[] = [];
    try {
      const file = join(dir, "keys.yaml");
      const key = "shared-key-0123456789abcdef";
      await writeFile(file, `keys:\n  - { name: app, sha256: ${keyDigest(key)}, scopes: [images], limits: { requestsPerSecond: 1 } }\n`);
      const lines: string[][] = [[], []];
      for (const logLines of lines) {
        servers.push(
          await startServer({
            modules: [defineImagesModule({ quotaClock: clock.now })],
            config: {
              auth: { keysFile: file },
              images: {
                reference: { latencyMs: 1, defaultSize: "64x64" },
                idempotency: { store: "nats", nats: { servers: [nats.url], bucket: `${bucket}_idem`, requestTimeoutMs: 1000, connectTimeoutMs: 1000 } },
                quotas: { nats: { bucket } },
              },
            },
            logLines,
          }),
        );
      }
      await eventually(() => expect(lines.map((l) => l.filter((line) => line.includes("quota store connected")).length)).to.deep.equal([1, 1]));
      const call = { headers: { authorization: `Bearer ${key}` } };
      const request = { request: { prompt: "shared", parameters: { n: 1 } } };
      await createClient(ImageService, servers[0]!.transport).generate(request, call);
      const refused = await expectRejection(createClient(ImageService, servers[1]!.transport).generate(request, call), { type: ConnectError, code: Code.ResourceExhausted });
      expect(refused.metadata.get("retry-after")).to.equal("1");
      expect(await metricValue(servers[1]!.host.metrics.registry, "mmgate_images_quota_rejections_total", { caller: "app", limit: "requests" })).to.equal(1);
      expect(await metricValue(servers[1]!.host.metrics.registry, "mmgate_images_quota_store_degraded")).to.equal(0);
    } finally {
      await Promise.all(servers.map((s) => s.close()));
      await rm(dir, { recursive: true, force: true });
    }
  });
});
