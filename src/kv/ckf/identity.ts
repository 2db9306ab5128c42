/**
 * Identity and publication types of the CKF producer (B.5, B.6): plain
 * readonly objects, u64 fields as bigint. The constructors validate ranges
 * once so that everything downstream can compare fields without re-checking.
 */
import type { DcCkfFormatIdentity } from "./config.js";
import { CkfError } from "./errors.js";
import { isU64 } from "./u64.js";

/** Where a digest came from; the wire's UNSPECIFIED is not a valid source. */
export type IdentitySource = "DefaultDerived" | "Explicit";

/** A 16-byte digest and its source; both take part in identity equality. */
export interface DigestIdentity {
  readonly digest: Uint8Array;
  readonly source: IdentitySource;
}

export interface IndexerDomainId {
  readonly cacheSemantics: DigestIdentity;
  readonly routingScope: DigestIdentity;
}

/** The pool a producer publishes for: identity version 1, indexer domain, datacenter. */
export interface PoolId {
  readonly identityVersion: 1;
  readonly indexerDomain: IndexerDomainId;
  readonly dcId: bigint;
}

/** One producer generation: a new incarnation or layout is a different producer. */
export interface ProducerIdentity {
  readonly poolId: PoolId;
  readonly producerIncarnation: bigint;
  /** Never 0 on the wire. */
  readonly layoutGeneration: bigint;
  readonly format: DcCkfFormatIdentity;
}

/** A consumer's claim on one physical lane. */
export interface LaneLease {
  readonly consumerInstance: bigint;
  /** u8. */
  readonly physicalLane: number;
  readonly assignmentEpoch: bigint;
}

/** One bucket's absolute value after a batch. */
export interface DcCkfBucketImage {
  readonly bucket: number;
  readonly value: bigint;
}

/**
 * Images as columns: the buckets, and their u64 words in the same order. A
 * batch the DC state drains carries its images this way, without an object or
 * a BigInt per image; `images` then makes the objects on first read.
 */
export interface DcCkfImageColumns {
  readonly buckets: Uint32Array;
  readonly values: BigUint64Array;
}

/** What a drain of the dirty window yields: the changed buckets, first-dirtied first. */
export interface DcCkfPublicationBatch {
  readonly images: readonly DcCkfBucketImage[];
  /** The same images as columns, when the batch has them (a drained one does): cheaper to read than `images`. */
  readonly columns?: DcCkfImageColumns | undefined;
}

/** A batch as published: sequence = baseSequence + 1 on the lease it was sent on. */
export interface DcCkfDelta {
  readonly identity: ProducerIdentity;
  readonly lease: LaneLease;
  readonly baseSequence: bigint;
  readonly sequence: bigint;
  readonly images: readonly DcCkfBucketImage[];
  /** The batch's columns, when it had them. */
  readonly columns?: DcCkfImageColumns | undefined;
}

/** How many images a batch or delta carries, read from its columns when it has them (`images` would make the objects). */
export function imageCount(batch: DcCkfPublicationBatch): number {
  return batch.columns === undefined ? batch.images.length : batch.columns.buckets.length;
}

/**
 * A batch over columns: `images` is made on first read (frozen, cached), so
 * a publication path that reads only the columns makes no object per image.
 */
export class ColumnBatch implements DcCkfPublicationBatch {
  #images: readonly DcCkfBucketImage[] | undefined;

  constructor(readonly columns: DcCkfImageColumns) {
    Object.freeze(this);
  }

  get images(): readonly DcCkfBucketImage[] {
    return (this.#images ??= imagesOf(this.columns));
  }
}

/** Columns as a frozen array of frozen images. */
export function imagesOf(columns: DcCkfImageColumns): readonly DcCkfBucketImage[] {
  const { buckets, values } = columns;
  const images = new Array<DcCkfBucketImage>(buckets.length);
  for (let i = 0; i < buckets.length; i++) images[i] = Object.freeze({ bucket: buckets[i]!, value: values[i]! });
  return Object.freeze(images);
}

/** The whole lane at `sequence`; the first delta after it is sequence -> sequence + 1. */
export interface DcCkfSnapshot {
  readonly identity: ProducerIdentity;
  readonly lease: LaneLease;
  readonly sequence: bigint;
  readonly buckets: BigUint64Array;
}

/** The sequence a consumer must have installed when the producer drains for good. */
export interface ConsumerDrainMarker {
  readonly lease: LaneLease;
  readonly expectedSequence: bigint;
}

function u64(value: bigint, what: string): bigint {
  if (!isU64(value)) throw new CkfError("InvalidIdentity", `${what} ${String(value)} is not a u64`);
  return value;
}

export function digestIdentity(digest: Uint8Array, source: IdentitySource): DigestIdentity {
  if (!(digest instanceof Uint8Array) || digest.length !== 16) {
    throw new CkfError("InvalidIdentity", `a digest identity is exactly 16 bytes, not ${String(digest?.length)}`);
  }
  if (source !== "DefaultDerived" && source !== "Explicit") throw new CkfError("InvalidIdentity", `unknown identity source ${String(source)}`);
  // Copied so that a caller reusing its buffer cannot change a frozen identity.
  return Object.freeze({ digest: digest.slice(), source });
}

export function poolId(init: { cacheSemantics: DigestIdentity; routingScope: DigestIdentity; dcId: bigint }): PoolId {
  const cacheSemantics = digestIdentity(init.cacheSemantics.digest, init.cacheSemantics.source);
  const routingScope = digestIdentity(init.routingScope.digest, init.routingScope.source);
  return Object.freeze({
    identityVersion: 1,
    indexerDomain: Object.freeze({ cacheSemantics, routingScope }),
    dcId: u64(init.dcId, "dcId"),
  });
}

export function producerIdentity(init: {
  poolId: PoolId;
  producerIncarnation: bigint;
  layoutGeneration: bigint;
  format: DcCkfFormatIdentity;
}): ProducerIdentity {
  u64(init.producerIncarnation, "producerIncarnation");
  if (u64(init.layoutGeneration, "layoutGeneration") === 0n) throw new CkfError("InvalidIdentity", "layoutGeneration must not be 0");
  return Object.freeze({
    poolId: init.poolId,
    producerIncarnation: init.producerIncarnation,
    layoutGeneration: init.layoutGeneration,
    format: init.format,
  });
}

export function laneLease(init: { consumerInstance: bigint; physicalLane: number; assignmentEpoch: bigint }): LaneLease {
  if (!Number.isInteger(init.physicalLane) || init.physicalLane < 0 || init.physicalLane > 0xff) {
    throw new CkfError("InvalidIdentity", `physicalLane ${init.physicalLane} is not a u8`);
  }
  return Object.freeze({
    consumerInstance: u64(init.consumerInstance, "consumerInstance"),
    physicalLane: init.physicalLane,
    assignmentEpoch: u64(init.assignmentEpoch, "assignmentEpoch"),
  });
}

/**
 * The lease the relay takes on its own producer: consumer instance = the
 * producer incarnation, lane 0, assignment epoch = the layout generation.
 */
export function relayLease(identity: ProducerIdentity): LaneLease {
  return laneLease({ consumerInstance: identity.producerIncarnation, physicalLane: 0, assignmentEpoch: identity.layoutGeneration });
}

function sameDigest(a: DigestIdentity, b: DigestIdentity): boolean {
  if (a.source !== b.source || a.digest.length !== b.digest.length) return false;
  for (let i = 0; i < a.digest.length; i++) if (a.digest[i] !== b.digest[i]) return false;
  return true;
}

export function sameFormat(a: DcCkfFormatIdentity, b: DcCkfFormatIdentity): boolean {
  return (
    a.formatVersion === b.formatVersion &&
    a.seed === b.seed &&
    a.bucketCount === b.bucketCount &&
    a.fingerprintBits === b.fingerprintBits &&
    a.slotsPerBucket === b.slotsPerBucket
  );
}

export function samePoolId(a: PoolId, b: PoolId): boolean {
  return (
    a.identityVersion === b.identityVersion &&
    a.dcId === b.dcId &&
    sameDigest(a.indexerDomain.cacheSemantics, b.indexerDomain.cacheSemantics) &&
    sameDigest(a.indexerDomain.routingScope, b.indexerDomain.routingScope)
  );
}

/** Field-by-field equality: the relay's frozen ProducerKey compares exactly these. */
export function sameProducerIdentity(a: ProducerIdentity, b: ProducerIdentity): boolean {
  return (
    samePoolId(a.poolId, b.poolId) &&
    a.producerIncarnation === b.producerIncarnation &&
    a.layoutGeneration === b.layoutGeneration &&
    sameFormat(a.format, b.format)
  );
}

export function sameLease(a: LaneLease, b: LaneLease): boolean {
  return a.consumerInstance === b.consumerInstance && a.physicalLane === b.physicalLane && a.assignmentEpoch === b.assignmentEpoch;
}
