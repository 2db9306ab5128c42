import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { expect } from "chai";
import {
  IdentitySource,
  ServingReadinessState,
  TopologyEntrySchema,
  WorkerRole,
  type ServingReadinessUpdate,
  type TopologyEntry,
} from "../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { KvEventService, PublishRequestSchema } from "../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { TopologyError, validateTopologyEntry, type TopologyErrorCode } from "../../src/relay/index.js";
import { ConfigError } from "../../src/server/index.js";
import { eventually, expectRejection, expectThrown } from "../support/index.js";
import { CLIENT_STACKS, readinessNow } from "./readiness-support.js";
import { chain, startRelay, type RelayServer } from "./service/support.js";

/** An entry the reference's validate_topology_entry accepts. */
function validEntry(): TopologyEntry {
  return create(TopologyEntrySchema, {
    namespace: "prod",
    canonicalModelId: "llama",
    state: ServingReadinessState.READY,
    presentRoles: [WorkerRole.DECODE],
    members: [
      {
        endpoint: { namespace: "prod", component: "backend", endpoint: "generate" },
        roles: [WorkerRole.DECODE],
        poolId: {
          identityVersion: 1,
          indexerDomain: {
            cacheSemantics: { digest: new Uint8Array(16).fill(0x11), source: IdentitySource.DEFAULT_DERIVED },
            routingScope: { digest: new Uint8Array(16).fill(0x22), source: IdentitySource.EXPLICIT },
          },
          dcId: 0xaabbccddeeff0011n,
        },
      },
    ],
    duplicateRoleEndpoints: [WorkerRole.PREFILL],
    adapters: [{ canonicalModelId: "tenant-a", state: ServingReadinessState.READY }],
  });
}

function refusal(entry: TopologyEntry): { code: TopologyErrorCode; reason: string } {
  const error = expectThrown(() => validateTopologyEntry(entry), { type: TopologyError });
  return { code: error.code, reason: error.reason };
}

describe("topology: the contract's validate_topology_entry, ported", () => {
  it("accepts a complete entry, with UNKNOWN a valid state and a member without a pool id", () => {
    validateTopologyEntry(validEntry());
    const unknown = validEntry();
    unknown.state = ServingReadinessState.UNKNOWN;
    delete unknown.members[0]!.poolId;
    validateTopologyEntry(unknown);
  });

  const cases: [string, (e: TopologyEntry) => void, TopologyErrorCode, "INVALID_REQUEST" | "UNSUPPORTED_FEATURE"][] = [
    ["no member", (e) => (e.members = []), "MissingTopologyMembers", "INVALID_REQUEST"],
    ["an UNSPECIFIED member role", (e) => (e.members[0]!.roles = [WorkerRole.UNSPECIFIED]), "WorkerRole", "INVALID_REQUEST"],
    ["an unknown member role", (e) => (e.members[0]!.roles = [99 as WorkerRole]), "WorkerRole", "UNSUPPORTED_FEATURE"],
    ["a member without roles", (e) => (e.members[0]!.roles = []), "MissingWorkerRoles", "INVALID_REQUEST"],
    ["a member of another namespace", (e) => (e.members[0]!.endpoint!.namespace = "other"), "TopologyNamespaceMismatch", "INVALID_REQUEST"],
    ["a member without an endpoint", (e) => delete e.members[0]!.endpoint, "MissingField", "INVALID_REQUEST"],
    ["two members at one endpoint", (e) => e.members.push(create(TopologyEntrySchema, { members: [e.members[0]!] }).members[0]!), "DuplicateTopologyMember", "INVALID_REQUEST"],
    ["LEGACY as a duplicate endpoint role", (e) => (e.duplicateRoleEndpoints = [WorkerRole.LEGACY]), "UnsupportedDuplicateEndpointRole", "INVALID_REQUEST"],
    ["AGGREGATED as a duplicate endpoint role", (e) => (e.duplicateRoleEndpoints = [WorkerRole.AGGREGATED]), "UnsupportedDuplicateEndpointRole", "INVALID_REQUEST"],
    ["ENCODE as a duplicate endpoint role", (e) => (e.duplicateRoleEndpoints = [WorkerRole.ENCODE]), "UnsupportedDuplicateEndpointRole", "INVALID_REQUEST"],
    ["UNSPECIFIED as a duplicate endpoint role", (e) => (e.duplicateRoleEndpoints = [WorkerRole.UNSPECIFIED]), "WorkerRole", "INVALID_REQUEST"],
    ["DECODE twice as duplicate endpoint roles", (e) => (e.duplicateRoleEndpoints = [WorkerRole.DECODE, WorkerRole.DECODE]), "DuplicateWorkerRole", "INVALID_REQUEST"],
    ["a present role twice", (e) => (e.presentRoles = [WorkerRole.DECODE, WorkerRole.DECODE]), "DuplicateWorkerRole", "INVALID_REQUEST"],
    ["an adapter twice", (e) => e.adapters.push({ ...e.adapters[0]! }), "DuplicateAdapter", "INVALID_REQUEST"],
    ["an adapter of unknown state", (e) => (e.adapters[0]!.state = 7 as ServingReadinessState), "ReadinessState", "UNSUPPORTED_FEATURE"],
    ["an unknown state", (e) => (e.state = 9 as ServingReadinessState), "ReadinessState", "UNSUPPORTED_FEATURE"],
    ["an empty model id", (e) => (e.canonicalModelId = ""), "InvalidText", "INVALID_REQUEST"],
    ["a namespace with surrounding whitespace", (e) => (e.namespace = " prod"), "InvalidText", "INVALID_REQUEST"],
    ["a pool id of an unknown identity version", (e) => (e.members[0]!.poolId!.identityVersion = 2), "PoolId", "UNSUPPORTED_FEATURE"],
    ["a pool id with a short digest", (e) => (e.members[0]!.poolId!.indexerDomain!.cacheSemantics!.digest = new Uint8Array(15)), "PoolId", "INVALID_REQUEST"],
  ];
  for (const [what, mutate, code, reason] of cases) {
    it(`refuses ${what} (${code})`, () => {
      const entry = validEntry();
      mutate(entry);
      expect(refusal(entry)).to.deep.equal({ code, reason });
    });
  }
});

describe("topology: endpoints are checked when the config is read", function () {
  this.timeout(20_000);

  it("two pools of one model at the default endpoint are a config error naming both pools", async () => {
    const error = await expectRejection(startRelay({ pools: [{ name: "first" }, { name: "second" }] }), { type: ConfigError });
    expect(error.message).to.match(/relay\.pools\.1\.endpoint: pools "first" and "second" both serve model "mmgate-demo" at endpoint mmgate\.backend\.generate/);
    expect(error.message).to.include("DuplicateTopologyMember");
  });

  it("so is an adapter's pool at its base model's endpoint; other models, or endpoints of their own, are not", async () => {
    const adapter = await expectRejection(
      startRelay({ pools: [{ name: "base", models: [{ model: "m" }] }, { name: "lora", models: [{ model: "m-tenant", loraBase: "m" }] }] }),
      { type: ConfigError },
    );
    expect(adapter.message).to.match(/pools "base" and "lora" both serve model "m"/);
    const server = await startRelay({
      pools: [
        { name: "a", models: [{ model: "m" }] },
        { name: "b", models: [{ model: "n" }] },
        { name: "c", models: [{ model: "m" }], endpoint: { component: "other" } },
      ],
    });
    await server.close();
  });

  it("discovery: source etcd needs an etcd cluster; a key segment may not hold a /", async () => {
    const noCluster = await expectRejection(startRelay({ pools: [{ name: "p", discovery: { source: "etcd" } }] }), { type: ConfigError });
    expect(noCluster.message).to.match(/relay\.pools\.0\.discovery: source etcd needs etcd\.endpoints/);
    const slash = await expectRejection(
      startRelay({ discovery: { etcd: { endpoints: ["http://127.0.0.1:1"] } }, pools: [{ name: "p", endpoint: { component: "a/b" } }] }),
      { type: ConfigError },
    );
    expect(slash.message).to.match(/relay\.pools\.0\.discovery: etcd\.component: "a\/b" \(from the pool's endpoint\) contains a \//);
  });
});

/** Every shape the topology has: aggregated scale-out, PD with two prefill endpoints, encode, a LoRA adapter, a legacy card. */
const TOPOLOGY_POOLS = [
  { name: "agg-a", expectedBlocks: 64, models: [{ model: "m", aliases: ["m-alias"] }], endpoint: { component: "agg-a" } },
  { name: "agg-b", expectedBlocks: 64, models: [{ model: "m" }], endpoint: { component: "agg-b" } },
  { name: "prefill-1", expectedBlocks: 64, models: [{ model: "pd" }], roles: ["PREFILL"], endpoint: { component: "prefill-1" } },
  { name: "prefill-2", expectedBlocks: 64, models: [{ model: "pd" }, { model: "pd-tenant", loraBase: "pd" }], roles: ["PREFILL"], endpoint: { component: "prefill-2" } },
  { name: "decode", expectedBlocks: 64, models: [{ model: "pd" }, { model: "pd-tenant", loraBase: "pd" }], roles: ["DECODE"], endpoint: { component: "decode" } },
  { name: "encode", expectedBlocks: 64, models: [{ model: "pd" }], roles: ["ENCODE"], endpoint: { component: "encode" } },
  { name: "legacy", expectedBlocks: 64, models: [{ model: "old" }], roles: ["LEGACY"], endpoint: { component: "legacy" } },
];

type EntryView = {
  key: string;
  state: string;
  present: string[];
  missing: string[];
  members: string[];
  duplicates: string[];
  legacy: boolean;
  adapters: [string, string, string[]][];
};

function view(update: ServingReadinessUpdate): EntryView[] {
  const role = (r: WorkerRole) => WorkerRole[r];
  return update.entries.map((e) => ({
    key: `${e.namespace}/${e.canonicalModelId}`,
    state: ServingReadinessState[e.state],
    present: e.presentRoles.map(role),
    missing: e.missingRoles.map(role),
    members: e.members.map((m) => `${m.endpoint!.component}:${m.roles.map(role).join("+")}`),
    duplicates: e.duplicateRoleEndpoints.map(role),
    legacy: e.legacyFallbackActive,
    adapters: e.adapters.map((a): [string, string, string[]] => [a.canonicalModelId, ServingReadinessState[a.state], a.missingRoles.map(role)]),
  }));
}

describe("topology: what the readiness stream sends, over the network", function () {
  this.timeout(30_000);
  let server: RelayServer;
  before(async () => {
    server = await startRelay({ pools: TOPOLOGY_POOLS });
  });
  after(() => server?.close());

  const publish = async (pool: string, worker: bigint) => {
    await createClient(KvEventService, server.connectTransport).publish(
      (async function* () {
        yield create(PublishRequestSchema, { pool, events: [chain(worker, 1000n * worker, 2)] });
      })(),
    );
  };
  const expectValid = (update: ServingReadinessUpdate) => {
    for (const entry of update.entries) validateTopologyEntry(entry);
  };

  for (const stack of CLIENT_STACKS) {
    it(`before any event (${stack}): one entry per base model, adapters nested, every entry valid, all UNKNOWN with roles cleared`, async () => {
      const update = await readinessNow(server, stack);
      expectValid(update);
      expect(view(update)).to.deep.equal([
        { key: "mmgate/m", state: "UNKNOWN", present: [], missing: [], members: ["agg-a:AGGREGATED", "agg-b:AGGREGATED"], duplicates: [], legacy: false, adapters: [] },
        { key: "mmgate/old", state: "UNKNOWN", present: [], missing: [], members: ["legacy:LEGACY"], duplicates: [], legacy: true, adapters: [] },
        {
          key: "mmgate/pd",
          state: "UNKNOWN",
          present: [],
          missing: [],
          members: ["prefill-1:PREFILL", "prefill-2:PREFILL", "decode:DECODE", "encode:ENCODE"],
          // PREFILL at two endpoints is reported; AGGREGATED scale-out (m) never is.
          duplicates: ["PREFILL"],
          legacy: false,
          adapters: [["pd-tenant", "UNKNOWN", []]],
        },
      ]);
      expect(update.entries.every((e) => e.members.every((m) => m.poolId !== undefined))).to.equal(true);
    });
  }

  it("with events: READY where live workers cover every declared role, UNAVAILABLE with the missing ones, the adapter following its carriers", async () => {
    await publish("agg-a", 1n);
    await publish("prefill-1", 2n);
    await publish("decode", 3n);
    await publish("legacy", 4n);
    for (const stack of CLIENT_STACKS) {
      const update = await eventually(async () => {
        const now = await readinessNow(server, stack);
        expect(view(now).map((e) => e.state)).to.deep.equal(["READY", "READY", "UNAVAILABLE"]);
        return now;
      });
      expectValid(update);
      const [m, old, pd] = view(update);
      // agg-b never sent an event: with event recency it reads as not live, and agg-a alone covers AGGREGATED.
      expect(m).to.deep.include({ present: ["AGGREGATED"], missing: [] });
      expect(old).to.deep.include({ present: [], missing: [], legacy: true });
      // ENCODE is declared and no encode worker is live: the base is UNAVAILABLE, so is its adapter (whose carriers lack PREFILL too).
      expect(pd).to.deep.include({ present: ["PREFILL", "DECODE"], missing: ["ENCODE"], adapters: [["pd-tenant", "UNAVAILABLE", ["PREFILL"]]] });
    }
    await publish("encode", 5n);
    for (const stack of CLIENT_STACKS) {
      const update = await eventually(async () => {
        const now = await readinessNow(server, stack);
        expect(view(now)[2]!.state).to.equal("READY");
        return now;
      });
      expectValid(update);
      // The base is READY, but no live worker of a pool carrying the adapter provides PREFILL (prefill-2 sent nothing).
      expect(view(update)[2]).to.deep.include({ present: ["PREFILL", "DECODE", "ENCODE"], missing: [], adapters: [["pd-tenant", "UNAVAILABLE", ["PREFILL"]]] });
    }
    await publish("prefill-2", 6n);
    for (const stack of CLIENT_STACKS) {
      const update = await eventually(async () => {
        const now = await readinessNow(server, stack);
        expect(view(now)[2]!.adapters).to.deep.equal([["pd-tenant", "READY", []]]);
        return now;
      });
      expectValid(update);
    }
  });
});
