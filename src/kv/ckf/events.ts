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
 * B.4 step 1, the residency gate (the reference's `RouterEvent::targets_primary`),
 * without throwing: true to apply the event, false to ignore it completely, or
 * the error that rejects it. It reads only the event's two residency fields
 * and its data kind, so it can run before the rest of the event is checked.
 *
 * - A domain or tier that is a string this build does not know is
 *   UnsupportedResidencyDomain, whatever the kind (guessing either way could
 *   publish a wrong filter); a non-object event, or a residency field that is
 *   present but not a string, cannot be read at all and is InvalidEvent.
 * - Cleared has no physical tier (the reference resolves it to a reset scope):
 *   it applies whatever its storage tier, unless it is scoped to the
 *   cache-owner domain, which it leaves alone (ignored).
 * - Stored / Removed (and an event whose kind cannot be read, which the shape
 *   check refuses later if the gate lets it through): the cache-owner domain on
 *   the device tier is UnsupportedResidencyDomain (a cache owner publishes no
 *   device residency); otherwise the event applies only on the device tier, in
 *   the primary domain, and is ignored on any other tier, in either domain.
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
  if (domain !== undefined && domain !== "primary" && domain !== "cache_owner") {
    return new CkfError("UnsupportedResidencyDomain", `residency domain ${describeValue(domain)} is not supported`);
  }
  let onDevice: boolean;
  switch (tier) {
    case undefined:
    case "device":
      onDevice = true;
      break;
    case "host_pinned":
    case "disk":
    case "external":
      onDevice = false;
      break;
    default:
      return new CkfError("UnsupportedResidencyDomain", `storage tier ${describeValue(tier)} is not supported`);
  }
  const cacheOwner = domain === "cache_owner";
  if (isCleared(event)) return !cacheOwner;
  if (cacheOwner) {
    if (onDevice) return new CkfError("UnsupportedResidencyDomain", `residency domain "cache_owner" has no device-tier residency`);
    return false;
  }
  return onDevice;
}

/** Whether the event's data is readably a Cleared (the gate reads nothing else of the body). */
function isCleared(event: RouterEvent): boolean {
  const data: unknown = event.data;
  return typeof data === "object" && data !== null && (data as { kind?: unknown }).kind === "cleared";
}

/**
 * Whether the event changes the primary (device-tier, serving) cache: true
 * to apply it, false to ignore it completely. Throws what `residencyGate`
 * returns: CkfError UnsupportedResidencyDomain for a domain or tier this build
 * does not know or a cache-owner Stored/Removed on the device tier,
 * InvalidEvent for a residency field that is not a string.
 */
export function targetsPrimary(event: RouterEvent): boolean {
  const verdict = residencyGate(event);
  if (typeof verdict === "boolean") return verdict;
  throw verdict;
}
