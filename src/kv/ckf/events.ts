/**
 * The KV events the DC state applies (B.4): one worker rank's cache changes,
 * hashes as u64 bigints. `blockHash` and `parentHash` are the worker's own
 * ("external") block ids; `tokensHash` is the LocalBlockHash of the block's
 * tokens, from which the canonical sequence hash is chained.
 */
import { CkfError, describeValue } from "./errors.js";

/** Where a block's KV lives. Only the device tier is what the router routes to. */
export type StorageTier = "device" | "host_pinned" | "disk" | "external";

/**
 * Whose cache an event describes. "primary" is the serving cache the filter
 * indexes; "cache_owner" is an offload/cache-owner domain that publishes its
 * own view and must not enter the filter.
 */
export type ResidencyDomain = "primary" | "cache_owner";

export interface StoredBlock {
  /** The worker's id for the block (an external sequence block hash). */
  readonly blockHash: bigint;
  /** LocalBlockHash of the block's tokens (and multimodal objects). */
  readonly tokensHash: bigint;
  /** Multimodal details; carried, never read by the filter. */
  readonly mmExtraInfo?: unknown;
}

export type KvCacheEventData =
  | {
      readonly kind: "stored";
      /** The external hash of the block this run continues; absent for a run from the start of a sequence. */
      readonly parentHash?: bigint | undefined;
      /** Position of the first block; must be absent or 0 without a parent. */
      readonly startPosition?: number | undefined;
      readonly blocks: readonly StoredBlock[];
    }
  | { readonly kind: "removed"; readonly blockHashes: readonly bigint[] }
  | { readonly kind: "cleared" };

export interface RouterEvent {
  readonly workerId: bigint;
  /** Data-parallel rank within the worker (u32). */
  readonly dpRank: number;
  readonly eventId: bigint;
  readonly data: KvCacheEventData;
  /** Absent means "device". */
  readonly storageTier?: StorageTier | undefined;
  /** Absent means "primary". A string outside ResidencyDomain is an unsupported domain. */
  readonly residencyDomain?: ResidencyDomain | (string & {}) | undefined;
}

/**
 * B.4 step 1, the residency gate, without throwing: true to apply the event,
 * false to ignore it completely, or the error that rejects it. It reads only
 * the event's two residency fields, so it can run before the rest of the
 * event is checked. A domain or tier that is a string this build does not know
 * is UnsupportedResidencyDomain (guessing either way could publish a wrong
 * filter); a non-object event, or a residency field that is present but not a
 * string, cannot be read at all and is InvalidEvent.
 */
export function residencyGate(event: RouterEvent): boolean | CkfError {
  if (typeof event !== "object" || event === null) {
    return new CkfError("InvalidEvent", `an event is an object, not ${describeValue(event)}`);
  }
  const domain: unknown = event.residencyDomain;
  const tier: unknown = event.storageTier;
  if (domain !== undefined && typeof domain !== "string") {
    return new CkfError("InvalidEvent", `residency domain ${describeValue(domain)} is not a string`);
  }
  if (tier !== undefined && typeof tier !== "string") {
    return new CkfError("InvalidEvent", `storage tier ${describeValue(tier)} is not a string`);
  }
  if (domain !== undefined && domain !== "primary") {
    if (domain === "cache_owner") return false;
    return new CkfError("UnsupportedResidencyDomain", `residency domain ${describeValue(domain)} is not supported`);
  }
  switch (tier) {
    case undefined:
    case "device":
      return true;
    case "host_pinned":
    case "disk":
    case "external":
      return false;
    default:
      return new CkfError("UnsupportedResidencyDomain", `storage tier ${describeValue(tier)} is not supported`);
  }
}

/**
 * Whether the event changes the primary (device-tier, serving) cache: true
 * to apply it, false to ignore it completely. Throws what `residencyGate`
 * returns: CkfError UnsupportedResidencyDomain for a domain or tier this build
 * does not know, InvalidEvent for one that is not a string.
 */
export function targetsPrimary(event: RouterEvent): boolean {
  const verdict = residencyGate(event);
  if (typeof verdict === "boolean") return verdict;
  throw verdict;
}
