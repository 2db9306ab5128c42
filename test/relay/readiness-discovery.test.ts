import { expect } from "chai";
import { ServingReadinessState, WorkerRole, type ServingReadinessUpdate } from "../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { EtcdRegistration } from "../../src/discovery/index.js";
import { validateTopologyEntry } from "../../src/relay/index.js";
import { eventually, requireEtcd, startEtcd, type EtcdServer } from "../support/index.js";
import { CLIENT_STACKS, readinessNow, type ClientStack } from "./readiness-support.js";
import { startRelay, type RelayServer } from "./service/support.js";

/** Each entry's state and present and missing roles, keyed by model; every entry checked by the contract's topology rules first. */
function states(update: ServingReadinessUpdate): Record<string, { state: string; present: string[]; missing: string[] }> {
  const out: Record<string, { state: string; present: string[]; missing: string[] }> = {};
  for (const entry of update.entries) {
    validateTopologyEntry(entry);
    out[entry.canonicalModelId] = {
      state: ServingReadinessState[entry.state],
      present: entry.presentRoles.map((r) => WorkerRole[r]),
      missing: entry.missingRoles.map((r) => WorkerRole[r]),
    };
  }
  return out;
}

/** Waits until the readiness the relay sends now, over `stack`, has `model` in `state` (and passes `check`). */
async function until(server: RelayServer, stack: ClientStack, model: string, state: string, check: (entry: { present: string[]; missing: string[] }) => void = () => undefined) {
  return eventually(
    async () => {
      const entry = states(await readinessNow(server, stack))[model];
      expect(entry?.state, `${model} over ${stack}`).to.equal(state);
      check(entry!);
      return entry!;
    },
    { timeoutMs: 15_000 },
  );
}

describe("readiness from worker registrations (etcd discovery)", function () {
  this.timeout(60_000);
  let etcd: EtcdServer;
  let server: RelayServer;
  const registrations: EtcdRegistration[] = [];

  before(async function () {
    requireEtcd(this);
    etcd = await startEtcd();
    server = await startRelay({
      // One cluster for every pool; each pool's workers register under its own endpoint.
      discovery: { etcd: { endpoints: [etcd.endpoint] } },
      pools: [
        { name: "agg", expectedBlocks: 64, models: [{ model: "m" }], endpoint: { component: "agg" } },
        { name: "prefill", expectedBlocks: 64, models: [{ model: "pd" }], roles: ["PREFILL"], endpoint: { component: "prefill" } },
        { name: "decode", expectedBlocks: 64, models: [{ model: "pd" }], roles: ["DECODE"], endpoint: { component: "decode" } },
        // This pool opts out: its readiness still comes from event recency.
        { name: "recency", expectedBlocks: 64, models: [{ model: "e" }], endpoint: { component: "recency" }, discovery: { source: "events" } },
      ],
    });
  });
  after(async () => {
    await Promise.all(registrations.map((r) => r.close().catch(() => undefined)));
    await server?.close();
    await etcd?.stop();
  });

  async function register(component: string, instanceId: string, metadata: Record<string, string>): Promise<EtcdRegistration> {
    const registration = await EtcdRegistration.create({
      endpoints: [etcd.endpoint],
      namespace: "mmgate",
      component,
      endpoint: "generate",
      instanceId,
      address: "127.0.0.1:1",
      metadata,
      leaseTtlSeconds: 5,
    });
    registrations.push(registration);
    await registration.register();
    return registration;
  }

  it("a pool with no registered worker is UNAVAILABLE once its prefix is read; the events pool stays UNKNOWN", async () => {
    for (const stack of CLIENT_STACKS) {
      await until(server, stack, "m", "UNAVAILABLE", (e) => expect(e).to.deep.equal({ state: "UNAVAILABLE", present: [], missing: ["AGGREGATED"] }));
      await until(server, stack, "e", "UNKNOWN");
    }
  });

  it("an idle pool whose worker registered is READY without a single event, and UNAVAILABLE once it deregisters", async () => {
    const worker = await register("agg", "agg-1", { worker_type: "aggregated" });
    for (const stack of CLIENT_STACKS) await until(server, stack, "m", "READY", (e) => expect(e.present).to.deep.equal(["AGGREGATED"]));
    expect(server.relay.pool("agg")!.hasEventSource).to.equal(false);
    const metrics = await (await fetch(`http://${server.adminAddr}/metrics`)).text();
    expect(metrics).to.include('mmgate_relay_pool_live_workers{pool="agg",source="discovery"} 1');
    expect(metrics).to.include('mmgate_relay_pool_live_workers{pool="prefill",source="discovery"} 0');
    // The events pool has had no event: no series rather than a 0 that would read as "known dead".
    expect(metrics).to.not.include('pool="recency"');
    await worker.revoke();
    for (const stack of CLIENT_STACKS) await until(server, stack, "m", "UNAVAILABLE");
  });

  it("roles come from the workers' cards: a card of another role is ignored, and PD is READY once both roles are live", async () => {
    await register("prefill", "prefill-1", { worker_type: "prefill" });
    // Registered under the decode pool's prefix, but an encode card: not a worker of that pool.
    await register("decode", "stray-encoder", { worker_type: "encode" });
    for (const stack of CLIENT_STACKS) {
      await until(server, stack, "pd", "UNAVAILABLE", (e) => expect(e).to.deep.include({ present: ["PREFILL"], missing: ["DECODE"] }));
    }
    // A card without a worker type counts as a worker of the pool, any of its roles.
    await register("decode", "decode-1", {});
    for (const stack of CLIENT_STACKS) await until(server, stack, "pd", "READY", (e) => expect(e).to.deep.include({ present: ["PREFILL", "DECODE"], missing: [] }));
  });
});

describe("readiness from worker registrations: etcd not reachable", function () {
  this.timeout(30_000);

  it("the pool's entries stay UNKNOWN (no authoritative view) rather than UNAVAILABLE", async () => {
    const server = await startRelay({
      discovery: { etcd: { endpoints: ["http://127.0.0.1:1"], dialTimeoutMs: 200 } },
      pools: [{ name: "agg", expectedBlocks: 64, models: [{ model: "m" }] }],
    });
    try {
      for (const stack of CLIENT_STACKS) expect(states(await readinessNow(server, stack))["m"]).to.deep.equal({ state: "UNKNOWN", present: [], missing: [] });
      expect(server.relay.liveness(server.relay.pool("agg")!)).to.deep.include({ source: "discovery", authoritative: false });
    } finally {
      await server.close();
    }
  });
});
