/** Shared builders for the hub tests (no tests of its own). */
import {
  digestIdentity,
  formatIdentity,
  poolId,
  producerIdentity,
  relayLease,
  type DcCkfBucketImage,
  type DcCkfDelta,
  type DcCkfSnapshot,
  type LaneLease,
  type ProducerIdentity,
} from "../../src/kv/index.js";
import { publicationFrame, type PublicationFrame } from "../../src/relay/hub/index.js";

export const BUCKETS = 16;

export function identity(seed = 1, incarnation = 11n): ProducerIdentity {
  return producerIdentity({
    poolId: poolId({
      cacheSemantics: digestIdentity(new Uint8Array(16).fill(seed), "Explicit"),
      routingScope: digestIdentity(new Uint8Array(16).fill(seed + 1), "Explicit"),
      dcId: 7n,
    }),
    producerIncarnation: incarnation,
    layoutGeneration: 1n,
    format: formatIdentity(0x5eedn, BUCKETS),
  });
}

export const ID = identity();
export const LEASE = relayLease(ID);

export function snapshot(sequence = 5n, fill = 0n, id: ProducerIdentity = ID, lease: LaneLease = LEASE): DcCkfSnapshot {
  return { identity: id, lease, sequence, buckets: new BigUint64Array(BUCKETS).fill(fill) };
}

export function delta(base: bigint, images: readonly DcCkfBucketImage[] = [{ bucket: Number(base % BigInt(BUCKETS)), value: base + 1n }], init: Partial<DcCkfDelta> = {}): DcCkfDelta {
  return { identity: ID, lease: LEASE, baseSequence: base, sequence: base + 1n, images, ...init };
}

/** The frame of `d` with an arbitrary payload of `payloadBytes` (the codec is not needed here). */
export function frameOf(d: DcCkfDelta, payloadBytes = 60 + 12 * d.images.length): PublicationFrame {
  const payload = new Uint8Array(payloadBytes);
  payload.fill(Number(d.sequence % 251n));
  return publicationFrame({ identity: d.identity, baseSequence: d.baseSequence, sequence: d.sequence, kind: "delta", payload });
}

export { prng } from "../support/index.js";
