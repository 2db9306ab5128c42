/**
 * The serving topology the readiness stream sends (kv-relay-contract G,
 * C.2): one entry per (namespace, canonical base model) over the relay's
 * pools, evaluated as the reference's `Model::evaluate_namespace` does:
 *
 * - members: one per pool that registers the model or an adapter of it
 *   (endpoint, declared roles, pool id); config refuses two such pools at
 *   one endpoint (DuplicateTopologyMember);
 * - present: typed roles (PREFILL, DECODE, ENCODE, AGGREGATED) live workers
 *   provide; missing: declared typed roles none provides;
 * - READY when some worker is live and nothing is missing; with a LEGACY
 *   member (a card without a worker type) strict gating is off: READY when
 *   some worker is live, and legacy_fallback_active says so;
 * - UNKNOWN while some member's liveness is not authoritative yet, with
 *   present and missing cleared (a discovery member: until its prefix was
 *   read; the event-fed members: until any of them received an event, as
 *   before discovery existed, after which a pool without recent events reads
 *   as having no live worker); UNAVAILABLE otherwise;
 * - duplicate_role_endpoints: PREFILL or DECODE declared by more than one
 *   member (an observable fact; duplicated AGGREGATED endpoints are scale-out
 *   and never reported);
 * - adapters: each LoRA adapter of the model, nested (never an entry of its
 *   own): READY when the base is READY and live workers of pools carrying it
 *   provide each adapter-bearing role the base declares (PREFILL, DECODE,
 *   AGGREGATED; ENCODE is a base dependency only).
 *
 * Every entry goes through validateTopologyEntry before it is sent; one that
 * fails is left out and reported, never emitted.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { ServingReadinessState, TopologyEntrySchema, type TopologyEntry as WireTopologyEntry } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { endpointToWire, poolIdToWire, roleToWire, validateTopologyEntry, WORKER_ROLES, type PoolDescriptor, type WorkerRoleName } from "../wire/index.js";
import type { LivenessSource, PoolLivenessView } from "./liveness.js";

export type ReadinessState = "UNKNOWN" | "UNAVAILABLE" | "READY";

/** What the topology reads of a pool. */
export interface TopologyPool {
  readonly name: string;
  readonly descriptor: PoolDescriptor;
}

export interface TopologyMemberValue {
  readonly pool: TopologyPool;
  readonly roles: readonly WorkerRoleName[];
  readonly liveness: PoolLivenessView;
}

export interface AdapterReadinessValue {
  readonly canonicalModelId: string;
  readonly state: ReadinessState;
  readonly missingRoles: readonly WorkerRoleName[];
}

/** One (namespace, model) of the serving topology. */
export interface TopologyEntryValue {
  readonly namespace: string;
  readonly canonicalModelId: string;
  readonly state: ReadinessState;
  readonly presentRoles: readonly WorkerRoleName[];
  readonly missingRoles: readonly WorkerRoleName[];
  readonly members: readonly TopologyMemberValue[];
  readonly duplicateRoleEndpoints: readonly WorkerRoleName[];
  readonly legacyFallbackActive: boolean;
  readonly adapters: readonly AdapterReadinessValue[];
  /** Where the members' liveness came from (not on the wire: the proto has no field for it). */
  readonly livenessSources: readonly LivenessSource[];
}

const TYPED: ReadonlySet<WorkerRoleName> = new Set(["PREFILL", "DECODE", "ENCODE", "AGGREGATED"]);
const ADAPTER_BEARING: ReadonlySet<WorkerRoleName> = new Set(["PREFILL", "DECODE", "AGGREGATED"]);
const DUPLICATE_REPORTED: readonly WorkerRoleName[] = ["PREFILL", "DECODE"];

/** `roles` in the contract's enum order, each once. */
function ordered(roles: Iterable<WorkerRoleName>): readonly WorkerRoleName[] {
  const set = new Set(roles);
  return Object.freeze(WORKER_ROLES.filter((role) => set.has(role)));
}

function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

interface Participant {
  readonly pool: TopologyPool;
  readonly liveness: PoolLivenessView;
  readonly adapters: Set<string>;
}

/** The topology over `pools` (in their order), entries sorted by namespace then model. */
export function buildTopology(pools: readonly { readonly pool: TopologyPool; readonly liveness: PoolLivenessView }[]): readonly TopologyEntryValue[] {
  const groups = new Map<string, { namespace: string; model: string; members: Map<string, Participant> }>();
  for (const { pool, liveness } of pools) {
    const namespace = pool.descriptor.servingEndpoint.namespace;
    for (const registration of pool.descriptor.registrations) {
      const target = registration.target;
      const model = target.kind === "base" ? registration.model : target.baseModel;
      const key = `${namespace}\0${model}`;
      let group = groups.get(key);
      if (group === undefined) groups.set(key, (group = { namespace, model, members: new Map() }));
      let member = group.members.get(pool.name);
      if (member === undefined) group.members.set(pool.name, (member = { pool, liveness, adapters: new Set() }));
      if (target.kind === "lora") member.adapters.add(registration.model);
    }
  }
  const sorted = [...groups.values()].sort((a, b) => (a.namespace === b.namespace ? cmp(a.model, b.model) : cmp(a.namespace, b.namespace)));
  return Object.freeze(sorted.map((group) => entryOf(group.namespace, group.model, [...group.members.values()])));
}

/** Whether the members' liveness is authoritative: every discovery member's, and the event-fed members' together once any of them received an event. */
function known(members: readonly Participant[]): boolean {
  let events = 0;
  let eventsKnown = false;
  for (const { liveness } of members) {
    if (liveness.source === "discovery" && !liveness.authoritative) return false;
    if (liveness.source === "events") {
      events += 1;
      if (liveness.authoritative) eventsKnown = true;
    }
  }
  return events === 0 || eventsKnown;
}

function entryOf(namespace: string, model: string, members: readonly Participant[]): TopologyEntryValue {
  const declared = new Set<WorkerRoleName>();
  const present = new Set<WorkerRoleName>();
  let legacy = false;
  const authoritative = known(members);
  let anyLive = false;
  const declaring = new Map<WorkerRoleName, number>();
  for (const { pool, liveness } of members) {
    const roles = pool.descriptor.poolRoles;
    for (const role of roles) {
      if (role === "LEGACY") legacy = true;
      if (TYPED.has(role)) declared.add(role);
      declaring.set(role, (declaring.get(role) ?? 0) + 1);
    }
    if (liveness.liveWorkers > 0) {
      anyLive = true;
      for (const role of liveness.liveRoles) if (TYPED.has(role)) present.add(role);
    }
  }
  const missing = [...declared].filter((role) => !present.has(role));
  const state: ReadinessState = !authoritative ? "UNKNOWN" : anyLive && (legacy || missing.length === 0) ? "READY" : "UNAVAILABLE";
  const adapterIds = [...new Set(members.flatMap((m) => [...m.adapters]))].sort(cmp);
  const adapters = adapterIds.map((adapter): AdapterReadinessValue => {
    const carriers = members.filter((m) => m.adapters.has(adapter));
    const applicable = [...declared].filter((role) => ADAPTER_BEARING.has(role));
    const provided = new Set<WorkerRoleName>();
    let carried = false;
    for (const { liveness } of carriers) {
      if (liveness.liveWorkers === 0) continue;
      carried = true;
      for (const role of liveness.liveRoles) provided.add(role);
    }
    const adapterMissing = ordered(applicable.filter((role) => !provided.has(role)));
    if (state === "UNKNOWN") return Object.freeze({ canonicalModelId: adapter, state: "UNKNOWN", missingRoles: Object.freeze([]) });
    const ready = state === "READY" && carried && (legacy || adapterMissing.length === 0);
    return Object.freeze({ canonicalModelId: adapter, state: ready ? "READY" : "UNAVAILABLE", missingRoles: adapterMissing });
  });
  return Object.freeze({
    namespace,
    canonicalModelId: model,
    state,
    // The contract clears both while the state is UNKNOWN.
    presentRoles: state === "UNKNOWN" ? Object.freeze([]) : ordered(present),
    missingRoles: state === "UNKNOWN" ? Object.freeze([]) : ordered(missing),
    members: Object.freeze(members.map(({ pool, liveness }) => Object.freeze({ pool, roles: pool.descriptor.poolRoles, liveness }))),
    duplicateRoleEndpoints: ordered(DUPLICATE_REPORTED.filter((role) => (declaring.get(role) ?? 0) > 1)),
    legacyFallbackActive: legacy,
    adapters: Object.freeze(adapters),
    livenessSources: Object.freeze([...new Set(members.map((m) => m.liveness.source))].sort(cmp)),
  });
}

type TopologyEntryInit = MessageInitShape<typeof TopologyEntrySchema>;

/** One entry as the wire carries it. */
export function topologyEntryToWire(entry: TopologyEntryValue): WireTopologyEntry {
  const init: TopologyEntryInit = {
    namespace: entry.namespace,
    canonicalModelId: entry.canonicalModelId,
    state: ServingReadinessState[entry.state],
    presentRoles: entry.presentRoles.map(roleToWire),
    missingRoles: entry.missingRoles.map(roleToWire),
    members: entry.members.map((member) => ({
      endpoint: endpointToWire(member.pool.descriptor.servingEndpoint),
      roles: member.roles.map(roleToWire),
      poolId: poolIdToWire(member.pool.descriptor.producer.poolId),
    })),
    duplicateRoleEndpoints: entry.duplicateRoleEndpoints.map(roleToWire),
    legacyFallbackActive: entry.legacyFallbackActive,
    adapters: entry.adapters.map((adapter) => ({
      canonicalModelId: adapter.canonicalModelId,
      state: ServingReadinessState[adapter.state],
      missingRoles: adapter.missingRoles.map(roleToWire),
    })),
  };
  return create(TopologyEntrySchema, init);
}

/**
 * The entries as the wire carries them, each checked by the contract's
 * topology rules; one the reference would reject is left out (and handed to
 * `onInvalid`), never sent.
 */
export function emittableTopology(entries: readonly TopologyEntryValue[], onInvalid: (entry: TopologyEntryValue, error: unknown) => void): WireTopologyEntry[] {
  const wire: WireTopologyEntry[] = [];
  for (const entry of entries) {
    const message = topologyEntryToWire(entry);
    try {
      validateTopologyEntry(message);
    } catch (error) {
      onInvalid(entry, error);
      continue;
    }
    wire.push(message);
  }
  return wire;
}
