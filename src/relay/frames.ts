import { imageCount, type DcCkfDelta, type DcCkfFormatIdentity } from "../kv/index.js";
import {
  encodeDelta,
  encodeSnapshotChunks,
  FilterFormat,
  FINGERPRINT_BITS,
  FORMAT_VERSION,
  MAX_DELTA_IMAGES,
  SLOTS_PER_BUCKET,
  snapshotChunkCount,
} from "./cbi1/index.js";
import { publicationFrame, type HubSnapshot, type PublicationFrame, type PublicationHub, type PublishDeltaResult } from "./hub/index.js";

/** Why a producer's publication cannot be put into CBI1 frames. */
export type PublicationFrameErrorCode = "UnsupportedFormatIdentity" | "SnapshotBucketCount" | "BucketIndexOverflow";

/**
 * The adapter's own failures, between the producer's types and the wire;
 * a value the codec refuses arrives as the codec's Cbi1Error.
 */
export class PublicationFrameError extends Error {
  override readonly name = "PublicationFrameError";
  constructor(
    readonly code: PublicationFrameErrorCode,
    message: string,
  ) {
    super(message);
  }
}

/** The largest bucket index a CBI1 delta image can carry. */
const MAX_WIRE_BUCKET = 0xffff_ffff;

/**
 * The wire format of a producer's format identity. CBI1 carries version 1
 * filters of 16-bit fingerprints in 4-slot buckets only; anything else is
 * UnsupportedFormatIdentity before the codec sees it.
 */
export function wireFormat(format: DcCkfFormatIdentity): FilterFormat {
  const { formatVersion, fingerprintBits, slotsPerBucket } = format;
  if (formatVersion !== FORMAT_VERSION || fingerprintBits !== FINGERPRINT_BITS || slotsPerBucket !== SLOTS_PER_BUCKET) {
    throw new PublicationFrameError(
      "UnsupportedFormatIdentity",
      `unsupported CKF format identity: version=${formatVersion}, fingerprint_bits=${fingerprintBits}, slots_per_bucket=${slotsPerBucket}`,
    );
  }
  return new FilterFormat(format.seed, format.bucketCount);
}

/** A snapshot's frames: how many there are, and each encoded only when it is taken. */
export interface SnapshotFrames extends IterableIterator<PublicationFrame> {
  readonly count: number;
}

/**
 * A hub snapshot as CBI1 snapshot chunks, one frame per chunk at the
 * snapshot's sequence (base = sequence), encoded lazily so that a
 * subscriber's queue, not the encoder, decides how many payloads exist at
 * once. The format identity and the bucket count are checked before the
 * first chunk.
 */
export function encodeSnapshot(snapshot: HubSnapshot): SnapshotFrames {
  const format = wireFormat(snapshot.identity.format);
  if (snapshot.buckets.length !== format.bucketCount) {
    throw new PublicationFrameError("SnapshotBucketCount", `snapshot has ${snapshot.buckets.length} buckets, format declares ${format.bucketCount}`);
  }
  const { identity, sequence } = snapshot;
  const chunks = encodeSnapshotChunks(format, identity.poolId.dcId, sequence, snapshot.buckets);
  const frames: SnapshotFrames = {
    count: snapshotChunkCount(format.bucketCount),
    next(): IteratorResult<PublicationFrame> {
      const chunk = chunks.next();
      if (chunk.done === true) return { done: true, value: undefined };
      return { done: false, value: publicationFrame({ identity, baseSequence: sequence, sequence, kind: "snapshot_chunk", payload: chunk.value }) };
    },
    [Symbol.iterator]() {
      return frames;
    },
  };
  return frames;
}

/** A producer delta as one CBI1 delta frame; a bucket index past u32 is BucketIndexOverflow. */
export function encodeDeltaFrame(delta: DcCkfDelta): PublicationFrame {
  const format = wireFormat(delta.identity.format);
  // Columns hold u32 buckets and u64 values by their types: only images need the check.
  const columns = delta.columns;
  if (columns === undefined) {
    for (const image of delta.images) {
      if (image.bucket > MAX_WIRE_BUCKET) {
        throw new PublicationFrameError("BucketIndexOverflow", `delta bucket index ${image.bucket} exceeds the CBI1 u32 address space`);
      }
    }
  }
  // The codec checks every image (a negative or fractional bucket, a value past u64, a bucket past the format's count) as it writes it.
  const payload = encodeDelta(format, delta.identity.poolId.dcId, delta.baseSequence, delta.sequence, columns ?? delta.images);
  return publicationFrame({ identity: delta.identity, baseSequence: delta.baseSequence, sequence: delta.sequence, kind: "delta", payload });
}

/**
 * Puts a producer delta through `hub`: as one delta frame, or, when it has
 * more images than one CBI1 frame can carry, as the hub's snapshot
 * recovery (subscribers closed as "recovery"; the owner publishes a fresh
 * barrier snapshot).
 */
export function publishDelta(hub: PublicationHub, delta: DcCkfDelta): PublishDeltaResult {
  return hub.publishDelta(delta, imageCount(delta) > MAX_DELTA_IMAGES ? undefined : encodeDeltaFrame(delta));
}
