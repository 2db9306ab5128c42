/**
 * The serving topology's validation (kv-relay-contract C.2 "Topology"), as
 * the reference's `validate_topology_entry` checks a TopologyEntry: the
 * relay runs every entry it is about to send through it (an entry the
 * reference would reject is never emitted), and a consumer runs every entry
 * it receives through it.
 *
 * Checks, in the reference's order: namespace and canonical model id are
 * text (non-empty, no surrounding whitespace); the state is a known value
 * (UNKNOWN is one); present, missing and duplicate-endpoint roles are role
 * sets (known, not UNSPECIFIED, no repeats), the duplicate-endpoint ones
 * PREFILL or DECODE only; at least one member; each member has an endpoint
 * whose parts are text and whose namespace is the entry's, a non-empty role
 * set, a valid pool id when it has one, and an endpoint triple no other
 * member has; adapters have a text id, a known state, a role set of missing
 * roles, and ids no other adapter has.
 *
 * A failure is a TopologyError with the reference's error name as its code.
 * `reason` separates what this build cannot interpret (an unknown enum value
 * or pool identity version: UNSUPPORTED_FEATURE, quarantine the entry) from
 * what is malformed (INVALID_REQUEST, invalidate the entry).
 */
import {
  ServingReadinessState,
  WorkerRole as WireWorkerRole,
  type TopologyEntry as WireTopologyEntry,
} from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { isRelayError } from "./errors.js";
import { poolIdFromWire } from "./identity.js";

export const TOPOLOGY_ERROR_CODES = [
  /** A text field is empty or starts or ends with whitespace. */
  "InvalidText",
  /** A required message is missing (a member's endpoint). */
  "MissingField",
  /** The state (of the entry or an adapter) is not a known ServingReadinessState. */
  "ReadinessState",
  /** A role is UNSPECIFIED or not a known WorkerRole. */
  "WorkerRole",
  /** A role set repeats a role. */
  "DuplicateWorkerRole",
  /** A member's role set is empty. */
  "MissingWorkerRoles",
  /** duplicate_role_endpoints names a role other than PREFILL or DECODE. */
  "UnsupportedDuplicateEndpointRole",
  /** The entry has no member. */
  "MissingTopologyMembers",
  /** Two members share an endpoint triple. */
  "DuplicateTopologyMember",
  /** A member's namespace is not the entry's. */
  "TopologyNamespaceMismatch",
  /** Two adapters share a canonical model id. */
  "DuplicateAdapter",
  /** A member's pool id is not a valid KvPoolId. */
  "PoolId",
] as const;

export type TopologyErrorCode = (typeof TOPOLOGY_ERROR_CODES)[number];

export class TopologyError extends Error {
  override readonly name = "TopologyError";
  constructor(
    readonly code: TopologyErrorCode,
    /** UNSUPPORTED_FEATURE: a value this build cannot interpret; INVALID_REQUEST: malformed. */
    readonly reason: "INVALID_REQUEST" | "UNSUPPORTED_FEATURE",
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

const malformed = (code: TopologyErrorCode, message: string): TopologyError => new TopologyError(code, "INVALID_REQUEST", message);

const SURROUNDING_WHITESPACE = /^\p{White_Space}|\p{White_Space}$/u;

function text(value: string, what: string): void {
  if (value === "" || SURROUNDING_WHITESPACE.test(value)) throw malformed("InvalidText", `${what} must not be empty or contain surrounding whitespace`);
}

function readinessState(value: number, what: string): void {
  if (ServingReadinessState[value] === undefined) throw new TopologyError("ReadinessState", "UNSUPPORTED_FEATURE", `${what} ${value} is not a known readiness state`);
}

/** Known, not UNSPECIFIED, no repeats; returns the roles' names. */
function roleSet(roles: readonly number[], what: string): string[] {
  const seen = new Set<number>();
  const names: string[] = [];
  for (const role of roles) {
    const name = WireWorkerRole[role] as string | undefined;
    if (name === undefined) throw new TopologyError("WorkerRole", "UNSUPPORTED_FEATURE", `${what} holds ${role}, not a known worker role`);
    if (role === WireWorkerRole.UNSPECIFIED) throw malformed("WorkerRole", `${what} must not hold UNSPECIFIED`);
    if (seen.has(role)) throw malformed("DuplicateWorkerRole", `${what} repeats ${name}`);
    seen.add(role);
    names.push(name);
  }
  return names;
}

/** Throws TopologyError unless `entry` passes every C.2 topology rule. */
export function validateTopologyEntry(entry: WireTopologyEntry): void {
  text(entry.namespace, "topology namespace");
  text(entry.canonicalModelId, "topology canonical model ID");
  readinessState(entry.state, "topology state");
  roleSet(entry.presentRoles, "present_roles");
  roleSet(entry.missingRoles, "missing_roles");
  for (const name of roleSet(entry.duplicateRoleEndpoints, "duplicate_role_endpoints")) {
    if (name !== "PREFILL" && name !== "DECODE") throw malformed("UnsupportedDuplicateEndpointRole", `duplicate endpoint role ${name} is not supported (only PREFILL or DECODE)`);
  }
  if (entry.members.length === 0) throw malformed("MissingTopologyMembers", "serving topology must contain at least one member");
  const endpoints = new Set<string>();
  entry.members.forEach((member, i) => {
    const endpoint = member.endpoint;
    if (endpoint === undefined) throw malformed("MissingField", `members[${i}].endpoint is missing`);
    text(endpoint.namespace, "endpoint namespace");
    text(endpoint.component, "endpoint component");
    text(endpoint.endpoint, "endpoint name");
    if (endpoint.namespace !== entry.namespace) {
      throw malformed("TopologyNamespaceMismatch", `topology namespace ${JSON.stringify(entry.namespace)} does not match member namespace ${JSON.stringify(endpoint.namespace)}`);
    }
    if (member.roles.length === 0) throw malformed("MissingWorkerRoles", `members[${i}].roles must not be empty`);
    roleSet(member.roles, `members[${i}].roles`);
    if (member.poolId !== undefined) {
      try {
        poolIdFromWire(member.poolId, `members[${i}].pool_id`);
      } catch (error) {
        const reason = isRelayError(error, "UNSUPPORTED_FEATURE") ? "UNSUPPORTED_FEATURE" : "INVALID_REQUEST";
        throw new TopologyError("PoolId", reason, error instanceof Error ? error.message : String(error), { cause: error });
      }
    }
    const key = `${endpoint.namespace}.${endpoint.component}.${endpoint.endpoint}`;
    if (endpoints.has(key)) throw malformed("DuplicateTopologyMember", `serving topology repeats endpoint ${JSON.stringify(key)}`);
    endpoints.add(key);
  });
  const adapters = new Set<string>();
  entry.adapters.forEach((adapter, i) => {
    text(adapter.canonicalModelId, "adapter canonical model ID");
    readinessState(adapter.state, `adapters[${i}].state`);
    roleSet(adapter.missingRoles, `adapters[${i}].missing_roles`);
    if (adapters.has(adapter.canonicalModelId)) throw malformed("DuplicateAdapter", `serving topology repeats adapter ${JSON.stringify(adapter.canonicalModelId)}`);
    adapters.add(adapter.canonicalModelId);
  });
}
