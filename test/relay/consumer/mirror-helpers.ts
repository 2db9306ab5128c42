/** Shared builders of the consumer tests: producers, descriptors and FilterUpdate messages built with the real encoder. */
import { create } from "@bufbuild/protobuf";
import { FilterUpdateKind, FilterUpdateSchema, RelayIdentitySchema, type FilterUpdate, type RelayIdentity } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import {
  canonicalModelId,
  createKvQuerySemantics,
  createRegistration,
  digestIdentity,
  formatIdentity,
  poolId,
  producerIdentity,
  type CanonicalModelRegistration,
  type KvQueryHashFormat,
  type ProducerIdentity,
} from "../../../src/kv/index.js";
import { encodeDelta, encodeSnapshotChunks, FilterFormat, type BucketImage } from "../../../src/relay/index.js";
import { producerToWire, RELAY_CONTRACT_MARKER, RELAY_PROTOCOL_VERSION, type PoolDescriptor } from "../../../src/relay/wire/index.js";
import { prng } from "../../support/index.js";

export { prng };

export const FORMAT_SEED = 0x5eedn;

export interface ProducerInit {
  /** Fills the two digests (pool identity). */
  readonly pool?: number;
  readonly dcId?: bigint;
  readonly incarnation?: bigint;
  readonly layoutGeneration?: bigint;
  readonly bucketCount?: number;
  readonly seed?: bigint;
}

export function producer(init: ProducerInit = {}): ProducerIdentity {
  const pool = init.pool ?? 1;
  return producerIdentity({
    poolId: poolId({
      cacheSemantics: digestIdentity(new Uint8Array(16).fill(pool), "Explicit"),
      routingScope: digestIdentity(new Uint8Array(16).fill(pool + 100), "DefaultDerived"),
      dcId: init.dcId ?? 7n,
    }),
    producerIncarnation: init.incarnation ?? 11n,
    layoutGeneration: init.layoutGeneration ?? 1n,
    format: formatIdentity(init.seed ?? FORMAT_SEED, init.bucketCount ?? 16),
  });
}

export function filterFormat(id: ProducerIdentity): FilterFormat {
  return new FilterFormat(id.format.seed, id.format.bucketCount);
}

export const RELAY: RelayIdentity = create(RelayIdentitySchema, { drtInstanceId: 1n, relayIncarnation: 0xabcn });

/** A FilterUpdate with a valid envelope for `id`; `init` overrides any field. */
export function update(id: ProducerIdentity, init: Partial<Omit<FilterUpdate, "$typeName">> = {}): FilterUpdate {
  return create(FilterUpdateSchema, {
    protocolVersion: RELAY_PROTOCOL_VERSION,
    relay: RELAY,
    producer: producerToWire(id),
    sendTsUs: 1_700_000_000_000_000n,
    contractMarker: RELAY_CONTRACT_MARKER,
    ...init,
  });
}

/** The snapshot chunks of `words` at `sequence`, as the relay sends them. */
export function snapshotUpdates(id: ProducerIdentity, sequence: bigint, words: BigUint64Array, init: Partial<Omit<FilterUpdate, "$typeName">> = {}): FilterUpdate[] {
  return [...encodeSnapshotChunks(filterFormat(id), id.poolId.dcId, sequence, words)].map((payload) =>
    update(id, { kind: FilterUpdateKind.SNAPSHOT_CHUNK, baseSequence: sequence, sequence, payload, ...init }),
  );
}

export function deltaUpdate(id: ProducerIdentity, base: bigint, images: readonly BucketImage[], init: Partial<Omit<FilterUpdate, "$typeName">> = {}): FilterUpdate {
  const payload = encodeDelta(filterFormat(id), id.poolId.dcId, base, base + 1n, images);
  return update(id, { kind: FilterUpdateKind.DELTA, baseSequence: base, sequence: base + 1n, payload, ...init });
}

export function heartbeatUpdate(id: ProducerIdentity, sequence: bigint, init: Partial<Omit<FilterUpdate, "$typeName">> = {}): FilterUpdate {
  return update(id, { kind: FilterUpdateKind.HEARTBEAT, baseSequence: sequence, sequence, ...init });
}


/** A random u64 word with some empty slots, as a lane holds them. */
export function randomWord(random: () => number): bigint {
  let word = 0n;
  for (let slot = 0; slot < 4; slot++) {
    const fp = random() < 0.5 ? 0 : 1 + Math.floor(random() * 0xffff);
    word |= BigInt(fp) << BigInt(16 * slot);
  }
  return word;
}

/** `count` images over distinct buckets, with random (possibly zero) words. */
export function randomImages(random: () => number, bucketCount: number, count: number): BucketImage[] {
  const buckets = new Set<number>();
  while (buckets.size < Math.min(count, bucketCount)) buckets.add(Math.floor(random() * bucketCount));
  return [...buckets].map((bucket) => ({ bucket, value: randomWord(random) }));
}

export function applyImages(words: BigUint64Array, images: readonly BucketImage[]): void {
  for (const { bucket, value } of images) words[bucket] = value;
}

export function sameBytes(a: BigUint64Array | undefined, b: BigUint64Array): boolean {
  if (a === undefined) return false;
  return Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));
}

export const MODEL = canonicalModelId("base-model");

export function descriptor(
  id: ProducerIdentity,
  init: { registrations?: readonly CanonicalModelRegistration[]; blockSize?: number; hashFormat?: KvQueryHashFormat; endpoint?: string } = {},
): PoolDescriptor {
  return Object.freeze({
    producer: id,
    servingEndpoint: Object.freeze({ namespace: "ns", component: "backend", endpoint: init.endpoint ?? "generate" }),
    registrations: init.registrations ?? [createRegistration(MODEL)],
    querySemantics: createKvQuerySemantics(init.blockSize ?? 4, init.hashFormat ?? "DYNAMO_STANDARD_V1"),
    poolRoles: Object.freeze(["AGGREGATED" as const]),
  });
}
