import { spawn } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { expect } from "chai";
import { ClientClosedError, Etcd3 } from "etcd3";
import pino from "pino";
import { Registry } from "prom-client";
import { EtcdRegistration, EtcdResolver, etcdDiscoverySchema, etcdPoolPrefix, type Membership } from "../../src/discovery/index.js";
import { eventually, requireEtcd, startEtcd, type EtcdServer } from "../support/index.js";

const ids = (m: Membership) => m.members.map((x) => x.id);
const WAIT = { timeoutMs: 15000, intervalMs: 20 };

function issues(raw: unknown): string[] {
  const parsed = etcdDiscoverySchema.safeParse(raw);
  return parsed.success ? [] : parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`);
}

describe("discovery: etcdDiscoverySchema", () => {
  it("defaults namespace, lease TTL and dial timeout", () => {
    expect(etcdDiscoverySchema.parse({ endpoints: ["http://127.0.0.1:2379"], component: "encoder", endpoint: "encode" })).to.deep.equal({
      endpoints: ["http://127.0.0.1:2379"],
      namespace: "default",
      component: "encoder",
      endpoint: "encode",
      leaseTtlSeconds: 10,
      dialTimeoutMs: 5000,
    });
  });

  it("names the field of each error", () => {
    expect(issues({ endpoints: ["127.0.0.1:2379"], component: "a/b", endpoint: "", leaseTtlSeconds: 0, extra: 1 }).map((i) => i.split(":")[0])).to.have.members([
      "endpoints.0",
      "component",
      "endpoint",
      "leaseTtlSeconds",
      "",
    ]);
    expect(issues({ endpoints: [], component: "c", endpoint: "e" })[0]).to.match(/^endpoints: /);
    expect(issues({ endpoints: ["ftp://h:1"], component: "c", endpoint: "e" })).to.deep.equal(["endpoints.0: expected an http:// or https:// URL"]);
  });
});

describe("discovery: etcd", function () {
  this.timeout(60000);
  let etcd: EtcdServer;
  let seq = 0;
  /** A fresh pool per test, so tests do not see each other's members. */
  let pool: { namespace: string; component: string; endpoint: string };
  const cleanup: (() => Promise<void>)[] = [];

  before(async function () {
    requireEtcd(this);
    etcd = await startEtcd();
  });
  after(async () => etcd?.stop());
  beforeEach(() => {
    pool = { namespace: `t${++seq}`, component: "encoder", endpoint: "encode" };
  });
  afterEach(async () => {
    for (const fn of cleanup.splice(0).reverse()) await fn();
  });

  async function resolver(extra: Partial<Parameters<typeof EtcdResolver.create>[0]> = {}): Promise<EtcdResolver> {
    const r = await EtcdResolver.create({ endpoints: [etcd.endpoint], ...pool, ...extra });
    cleanup.push(() => r.close());
    return r;
  }

  async function registration(instanceId: string, address: string, extra: { leaseTtlSeconds?: number; metadata?: Record<string, string> } = {}): Promise<EtcdRegistration> {
    const r = await EtcdRegistration.create({ endpoints: [etcd.endpoint], ...pool, instanceId, address, retryDelayMs: 100, ...extra });
    cleanup.push(() => r.close().catch(() => undefined));
    return r;
  }

  async function rawClient(): Promise<Etcd3> {
    const client = new Etcd3({ hosts: etcd.endpoint });
    cleanup.push(async () => client.close());
    return client;
  }

  it("shows registrations as members, sorted by id, one generation per change", async () => {
    const r = await resolver();
    expect(r.current()).to.deep.equal({ generation: 1n, members: [] });
    await (await registration("w2", "10.0.0.2:7000", { metadata: { zone: "b" } })).register();
    await eventually(() => expect(ids(r.current())).to.deep.equal(["w2"]), WAIT);
    expect(r.current().generation).to.equal(2n);
    await (await registration("w1", "10.0.0.1:7000")).register();
    await eventually(() => expect(ids(r.current())).to.deep.equal(["w1", "w2"]), WAIT);
    expect(r.current()).to.deep.equal({
      generation: 3n,
      members: [
        { id: "w1", address: "10.0.0.1:7000", metadata: {} },
        { id: "w2", address: "10.0.0.2:7000", metadata: { zone: "b" } },
      ],
    });
    const client = await rawClient();
    expect(await client.get(`${etcdPoolPrefix(pool)}w1`).string()).to.equal('{"id":"w1","address":"10.0.0.1:7000","metadata":{}}');
  });

  it("loads existing members at start-up as generation 1, then watches without losing updates", async () => {
    await (await registration("a", "h:1")).register();
    await (await registration("b", "h:2")).register();
    const r = await resolver();
    expect([r.current().generation, ids(r.current())]).to.deep.equal([1n, ["a", "b"]]);
    const views: Membership[] = [];
    const controller = new AbortController();
    const watching = (async () => {
      for await (const view of r.watch(controller.signal)) views.push(view);
    })();
    await (await registration("c", "h:3")).register();
    await eventually(() => expect(ids(views.at(-1)!)).to.deep.equal(["a", "b", "c"]), WAIT);
    expect(views[0]!.generation).to.equal(1n);
    expect(views.at(-1)!.generation).to.equal(2n);
    controller.abort();
    await watching;
  });

  it("revoke removes the member at once; run returns after revoking when its signal fires", async () => {
    const r = await resolver();
    const a = await registration("a", "h:1");
    const b = await registration("b", "h:2");
    const controller = new AbortController();
    const running = b.run(controller.signal);
    await eventually(() => expect(ids(r.current())).to.deep.equal(["b"]), WAIT);
    await a.register();
    await eventually(() => expect(ids(r.current())).to.deep.equal(["a", "b"]), WAIT);
    await a.revoke();
    // Gone from etcd when revoke returns, long before its 10 s lease would run out.
    const client = await rawClient();
    expect(await client.get(a.key).string()).to.equal(null);
    await eventually(() => expect(ids(r.current())).to.deep.equal(["b"]), WAIT);
    controller.abort();
    await running;
    await eventually(() => expect(ids(r.current())).to.deep.equal([]), WAIT);
    // [] → [b] → [a, b] → [b] → [].
    expect(r.current().generation).to.equal(5n);
  });

  it("a member whose process stops keeping its lease alive expires", async () => {
    const r = await resolver();
    await (await registration("stays", "h:1", { leaseTtlSeconds: 30 })).register();
    const fixture = fileURLToPath(new URL("../fixtures/etcd-register.ts", import.meta.url));
    const child = spawn(process.execPath, ["--import", "tsx", fixture, etcd.endpoint, JSON.stringify(pool), "gone", "h:2", "1"], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    cleanup.push(async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGKILL");
        await once(child, "exit");
      }
    });
    await eventually(() => expect(ids(r.current())).to.deep.equal(["gone", "stays"]), WAIT);
    child.kill("SIGKILL");
    await once(child, "exit");
    // Still a member until its 1 s lease runs out on etcd's side.
    await eventually(() => expect(ids(r.current())).to.deep.equal(["stays"]), WAIT);
  });

  it("re-registers when the lease is lost", async () => {
    const r = await resolver();
    const a = await registration("a", "h:1", { leaseTtlSeconds: 5 });
    const controller = new AbortController();
    const running = a.run(controller.signal);
    cleanup.push(async () => {
      controller.abort();
      await running;
    });
    await eventually(() => expect(ids(r.current())).to.deep.equal(["a"]), WAIT);
    // Someone revokes every lease behind the registration's back (an operator, a lease expiry).
    const client = await rawClient();
    for (const lease of (await client.leaseClient.leaseLeases()).leases) await client.leaseClient.leaseRevoke({ ID: lease.ID });
    // [a] → [] → [a] again, under a new lease.
    await eventually(() => expect([r.current().generation >= 4n, ids(r.current())]).to.deep.equal([true, ["a"]]), WAIT);
  });

  it("ignores malformed values with a warning", async () => {
    const lines: string[] = [];
    const logger = pino({ level: "warn" }, { write: (line: string) => void lines.push(line) });
    const client = await rawClient();
    const prefix = etcdPoolPrefix(pool);
    await client.put(`${prefix}bad-json`).value("{nope");
    await client.put(`${prefix}no-address`).value(JSON.stringify({ id: "no-address" }));
    await client.put(`${prefix}other-id`).value(JSON.stringify({ id: "x", address: "h:1" }));
    await client.put(`${prefix}good`).value(JSON.stringify({ id: "good", address: "h:2" }));
    const r = await resolver({ logger });
    expect(ids(r.current())).to.deep.equal(["good"]);
    expect(lines.filter((l) => l.includes("ignoring a malformed member"))).to.have.length(3);
    // A member that turns malformed leaves; one that turns valid joins.
    await client.put(`${prefix}good`).value("[]");
    await client.put(`${prefix}no-address`).value(JSON.stringify({ id: "no-address", address: "h:3" }));
    await eventually(() => expect(ids(r.current())).to.deep.equal(["no-address"]), WAIT);
    expect(lines.filter((l) => l.includes("ignoring a malformed member"))).to.have.length(4);
  });

  it("keeps the last membership while etcd is down and resumes the watch after it returns", async () => {
    const registry = new Registry();
    const errors: Error[] = [];
    const r = await resolver({ registry, onError: (e) => errors.push(e) });
    const a = await registration("a", "h:1", { leaseTtlSeconds: 30 });
    const controllers: AbortController[] = [];
    const runs: Promise<void>[] = [];
    cleanup.push(async () => {
      for (const c of controllers) c.abort();
      await Promise.all(runs);
    });
    const run = (reg: EtcdRegistration) => {
      const c = new AbortController();
      controllers.push(c);
      runs.push(reg.run(c.signal));
    };
    run(a);
    await eventually(() => expect(ids(r.current())).to.deep.equal(["a"]), WAIT);
    const before = r.current();

    await etcd.halt();
    await eventually(() => expect(errors).to.not.be.empty, WAIT);
    expect((await registry.getSingleMetricAsString("mmgate_discovery_errors_total"))).to.match(/resolver="etcd"\} [1-9]/);
    expect(r.current()).to.equal(before);
    // Registered while etcd is down: it retries until etcd answers.
    run(await registration("b", "h:2", { leaseTtlSeconds: 30 }));

    await etcd.restart();
    // Registered after etcd is back.
    await (await registration("c", "h:3")).register();
    await eventually(() => expect(ids(r.current())).to.deep.equal(["a", "b", "c"]), { timeoutMs: 30000, intervalMs: 50 });
    expect(r.current().generation > before.generation).to.equal(true);
  });

  it("close ends every watch and closes the client", async () => {
    const r = await EtcdResolver.create({ endpoints: [etcd.endpoint], ...pool });
    const controller = new AbortController();
    const views: Membership[] = [];
    const watching = (async () => {
      for await (const view of r.watch(controller.signal)) views.push(view);
    })();
    await eventually(() => expect(views).to.have.length(1), WAIT);
    await r.close();
    await watching; // ends without the signal
    expect(r.current().generation).to.equal(1n);
    const error = await r.client.get("x").catch((e: unknown) => e);
    expect(error).to.be.instanceOf(ClientClosedError);
    await r.close(); // twice is fine
  });
});
