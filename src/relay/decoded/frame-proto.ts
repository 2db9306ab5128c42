/**
 * CBI1 frames between their bytes and `mmgate.kvrelay.v1.Cbi1Frame`: decoded
 * by the codec (every check a consumer makes), encoded by the codec (the same
 * bytes the relay writes). Nothing here reads or writes a byte of the format
 * itself; the codec owns the layout.
 */
import { create } from "@bufbuild/protobuf";
import {
  BucketImageSchema,
  Cbi1Flags,
  Cbi1FrameSchema,
  DeltaSchema,
  SnapshotChunkSchema,
  type BucketImage as WireBucketImage,
  type Cbi1Frame as WireCbi1Frame,
} from "../../../gen/mmgate/kvrelay/v1/cbi1_pb.js";
import {
  Cbi1Error,
  decode,
  encodeDelta,
  encodeSnapshotChunk,
  FilterFormat,
  FINGERPRINT_BITS,
  FORMAT_VERSION,
  IMAGES_HEADER_LEN,
  IMAGES_WIRE_VERSION,
  MAX_DELTA_IMAGES,
  peekFormat,
  SLOTS_PER_BUCKET,
  SNAPSHOT_CHUNK_BUCKETS,
  type Cbi1Frame,
} from "../cbi1/index.js";

export interface FrameToProtoOptions {
  /** The layout the frame must carry; default the frame's own (read from its header). */
  readonly format?: FilterFormat | undefined;
  /** A snapshot chunk's non-zero words only. */
  readonly sparse?: boolean | undefined;
}

/** The words of a decoded chunk, whatever the alignment of its bytes. */
function chunkWords(frame: Extract<Cbi1Frame, { kind: "snapshotChunk" }>): BigUint64Array {
  if (frame.words !== undefined) return frame.words;
  // An unaligned view cannot be a BigUint64Array: copy the bytes once.
  const copy = new Uint8Array(frame.wordBytes);
  return new BigUint64Array(copy.buffer, 0, frame.wordCount);
}

/** A frame's bytes as a Cbi1Frame message; throws the codec's Cbi1Error for anything it refuses. */
export function frameToProto(bytes: Uint8Array, options: FrameToProtoOptions = {}): WireCbi1Frame {
  const format = options.format ?? peekFormat(bytes);
  const frame = decode(format, bytes);
  const h = frame.header;
  const message = create(Cbi1FrameSchema, {
    wireVersion: h.wireVersion,
    flags: h.flags as Cbi1Flags,
    fingerprintBits: h.fingerprintBits,
    slotsPerBucket: h.slotsPerBucket,
    formatVersion: h.formatVersion,
    seed: h.seed,
    bucketCount: BigInt(h.bucketCount),
    dcId: h.dcId,
    epoch: h.epoch,
    checksum: h.checksum,
  });
  if (frame.kind === "delta") {
    const images: WireBucketImage[] = new Array<WireBucketImage>(frame.images.length);
    for (let i = 0; i < frame.images.length; i++) images[i] = create(BucketImageSchema, { bucket: frame.images.bucket(i), value: frame.images.value(i) });
    message.body = { case: "delta", value: create(DeltaSchema, { baseEpoch: frame.baseEpoch, images }) };
    return message;
  }
  const words = chunkWords(frame);
  const chunk = create(SnapshotChunkSchema, {
    chunkIndex: frame.chunkIndex,
    chunkCount: frame.chunkCount,
    bucketOffset: BigInt(frame.bucketOffset),
    wordCount: frame.wordCount,
    sparse: options.sparse === true,
  });
  if (options.sparse === true) {
    for (let i = 0; i < words.length; i++) {
      const value = words[i]!;
      if (value !== 0n) chunk.nonzero.push(create(BucketImageSchema, { bucket: frame.bucketOffset + i, value }));
    }
  } else {
    chunk.words = Array.from(words);
  }
  message.body = { case: "snapshotChunk", value: chunk };
  return message;
}

function invalid(message: string): Cbi1Error {
  return new Cbi1Error("InvalidArgument", message);
}

/**
 * A Cbi1Frame message as bytes, through the codec's encoder: byte-identical
 * to what the relay writes for the same frame. The header fields the format
 * fixes (wire version, fingerprint bits, slots per bucket, format version)
 * must be 0 (taken as given) or their one valid value; a non-zero checksum
 * must be the encoded body's; a snapshot chunk sits at chunk_index * 524288
 * and covers word_count buckets (its dense words, or zeros but for the
 * sparse non-zero ones). Throws Cbi1Error.
 */
export function frameFromProto(message: WireCbi1Frame): Uint8Array {
  const fixed: [string, number, number][] = [
    ["wire_version", message.wireVersion, IMAGES_WIRE_VERSION],
    ["fingerprint_bits", message.fingerprintBits, FINGERPRINT_BITS],
    ["slots_per_bucket", message.slotsPerBucket, SLOTS_PER_BUCKET],
    ["format_version", message.formatVersion, FORMAT_VERSION],
  ];
  for (const [name, value, only] of fixed) {
    if (value !== 0 && value !== only) throw new Cbi1Error("Format", `${name} ${value} is not ${only}`);
  }
  if (message.bucketCount > BigInt(Number.MAX_SAFE_INTEGER)) throw new Cbi1Error("Format", `bucket_count ${message.bucketCount} is not a power of two in range`);
  const format = new FilterFormat(message.seed, Number(message.bucketCount));
  const body = message.body;
  let bytes: Uint8Array;
  switch (body.case) {
    case "delta": {
      if (message.flags !== Cbi1Flags.DELTA && message.flags !== Cbi1Flags.UNSPECIFIED) throw new Cbi1Error("Flags", `a delta body with flags ${message.flags}`);
      if (body.value.images.length > MAX_DELTA_IMAGES) {
        throw new Cbi1Error("DeltaImageCount", `${body.value.images.length} images; a frame carries at most ${MAX_DELTA_IMAGES}`);
      }
      bytes = encodeDelta(format, message.dcId, body.value.baseEpoch, message.epoch, body.value.images);
      break;
    }
    case "snapshotChunk": {
      if (message.flags !== Cbi1Flags.SNAPSHOT_CHUNK && message.flags !== Cbi1Flags.UNSPECIFIED) {
        throw new Cbi1Error("Flags", `a snapshot chunk body with flags ${message.flags}`);
      }
      const chunk = body.value;
      const start = chunk.chunkIndex * SNAPSHOT_CHUNK_BUCKETS;
      if (chunk.bucketOffset !== BigInt(start)) {
        throw new Cbi1Error("Malformed", `bucket_offset ${chunk.bucketOffset} is not chunk_index * ${SNAPSHOT_CHUNK_BUCKETS} (${start})`);
      }
      let words: BigUint64Array;
      if (chunk.sparse || chunk.nonzero.length > 0) {
        if (chunk.words.length > 0) throw invalid("a snapshot chunk gives either words or nonzero, not both");
        if (chunk.wordCount > SNAPSHOT_CHUNK_BUCKETS) {
          throw new Cbi1Error("SnapshotChunkWordCount", `word_count ${chunk.wordCount} exceeds ${SNAPSHOT_CHUNK_BUCKETS}`);
        }
        words = new BigUint64Array(chunk.wordCount);
        for (const image of chunk.nonzero) {
          const at = image.bucket - start;
          if (at < 0 || at >= chunk.wordCount) {
            throw new Cbi1Error("BucketIndex", `bucket ${image.bucket} is outside the chunk's buckets ${start}..${start + chunk.wordCount - 1}`);
          }
          words[at] = image.value;
        }
      } else {
        if (chunk.wordCount !== 0 && chunk.wordCount !== chunk.words.length) {
          throw new Cbi1Error("Malformed", `word_count ${chunk.wordCount} but ${chunk.words.length} words`);
        }
        if (chunk.words.length > SNAPSHOT_CHUNK_BUCKETS) {
          throw new Cbi1Error("SnapshotChunkWordCount", `${chunk.words.length} words exceed ${SNAPSHOT_CHUNK_BUCKETS}`);
        }
        words = BigUint64Array.from(chunk.words);
      }
      bytes = encodeSnapshotChunk(format, message.dcId, message.epoch, chunk.chunkIndex, chunk.chunkCount, words);
      break;
    }
    default:
      throw invalid("the frame has no body (snapshot_chunk or delta)");
  }
  if (message.checksum !== 0) {
    // The checksum is the header's last four bytes.
    const written = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength).getUint32(IMAGES_HEADER_LEN - 4, true);
    if (written !== message.checksum) throw new Cbi1Error("Checksum", `checksum ${message.checksum} is not the body's ${written}`);
  }
  return bytes;
}
