/**
 * One catalog update read into the consumer's terms (C.2, C.4 "Catalog
 * stream"): the envelope checked, every descriptor validated on its own, and
 * the pools keyed by PoolId. Pure; the consumer diffs the result against
 * what it holds.
 *
 * Each update is the complete catalog: a pool absent from it is withdrawn.
 * A descriptor this build cannot interpret (UNSUPPORTED_FEATURE) stays in the
 * catalog as a quarantined pool when its PoolId can be read; a malformed one
 * is left out (its pool, if the consumer held it, is withdrawn), and so are
 * both copies of a PoolId listed twice (the relay never merges duplicates).
 */
import type { KvPoolCatalogUpdate } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import type { PoolId } from "../../kv/index.js";
import { descriptorFromWire, isRelayError, poolIdFromWire, type PoolDescriptor, type RelayErrorReasonName } from "../wire/index.js";
import { checkRelayIdentity, checkResponseEnvelope, type RelayIncarnation } from "./envelope.js";
import { ConsumerError } from "./errors.js";

const hex = (bytes: Uint8Array): string => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("hex");

/**
 * A stable text key of a PoolId: "dc<dc id>:<source><cache semantics hex>:<source><routing scope hex>",
 * the source being E (explicit) or D (default-derived). Every field of the
 * PoolId takes part, so two keys are equal exactly when the PoolIds are.
 */
export function poolKey(id: PoolId): string {
  const { cacheSemantics, routingScope } = id.indexerDomain;
  const src = (source: string): string => (source === "Explicit" ? "E" : "D");
  return `dc${id.dcId}:${src(cacheSemantics.source)}${hex(cacheSemantics.digest)}:${src(routingScope.source)}${hex(routingScope.digest)}`;
}

/** A pool the catalog lists: with its descriptor, or quarantined when the descriptor is unsupported. */
export type CatalogPool =
  | { readonly key: string; readonly poolId: PoolId; readonly descriptor: PoolDescriptor; readonly unsupported?: undefined }
  | { readonly key: string; readonly poolId: PoolId; readonly descriptor?: undefined; readonly unsupported: string };

/** A catalog entry left out of the catalog. */
export interface CatalogRejection {
  /** Position in the update's pool list. */
  readonly index: number;
  /** The pool's key when its PoolId could be read. */
  readonly key: string | undefined;
  readonly reason: RelayErrorReasonName | "DUPLICATE_POOL";
  readonly message: string;
}

export interface CatalogSnapshot {
  readonly revision: bigint;
  readonly relay: RelayIncarnation;
  /** By pool key, in the update's order. */
  readonly pools: ReadonlyMap<string, CatalogPool>;
  readonly rejected: readonly CatalogRejection[];
}

/**
 * Reads one update of a catalog stream whose relay identity so far is
 * `streamRelay` (undefined for the first). Throws ConsumerError for an
 * envelope violation (marker, version, relay identity, no snapshot): the
 * whole update is refused and the stream must be reopened.
 */
export function readCatalogUpdate(update: KvPoolCatalogUpdate, streamRelay: RelayIncarnation | undefined): CatalogSnapshot {
  checkResponseEnvelope(update, "KvPoolCatalogUpdate");
  const relay = checkRelayIdentity(update.relay, streamRelay, "KvPoolCatalogUpdate");
  // An empty catalog is an empty snapshot message; a missing one is not read as "withdraw everything".
  if (update.snapshot === undefined) throw new ConsumerError("MalformedEnvelope", "KvPoolCatalogUpdate has no snapshot");
  const pools = new Map<string, CatalogPool>();
  const rejected: CatalogRejection[] = [];
  const duplicates = new Set<string>();
  update.snapshot.pools.forEach((wire, index) => {
    const what = `pools[${index}]`;
    let poolId: PoolId | undefined;
    try {
      poolId = poolIdFromWire(wire.producer?.poolId, `${what}.producer.pool_id`);
    } catch {
      poolId = undefined;
    }
    const key = poolId === undefined ? undefined : poolKey(poolId);
    let pool: CatalogPool | undefined;
    try {
      const descriptor = descriptorFromWire(wire, what);
      pool = { key: poolKey(descriptor.producer.poolId), poolId: descriptor.producer.poolId, descriptor };
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      if (isRelayError(error, "UNSUPPORTED_FEATURE") && poolId !== undefined && key !== undefined) {
        pool = { key, poolId, unsupported: message };
      } else {
        rejected.push({ index, key, reason: isRelayError(error) ? error.reason : "INVALID_REQUEST", message });
        return;
      }
    }
    if (duplicates.has(pool.key)) {
      rejected.push({ index, key: pool.key, reason: "DUPLICATE_POOL", message: `${what} repeats pool ${pool.key}` });
      return;
    }
    if (pools.has(pool.key)) {
      pools.delete(pool.key);
      duplicates.add(pool.key);
      rejected.push({ index, key: pool.key, reason: "DUPLICATE_POOL", message: `${what} repeats pool ${pool.key}; both entries are left out` });
      return;
    }
    pools.set(pool.key, pool);
  });
  return { revision: update.revision, relay, pools, rejected };
}
