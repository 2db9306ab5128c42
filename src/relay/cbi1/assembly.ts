/**
 * SnapshotAssembly (spec A.7): reassembles a snapshot's chunks, strictly in
 * order, into one buffer allocated up front, and hands the whole lane back
 * when the last chunk completes coverage. Any sequence or coverage fault
 * aborts the assembly; the contract then calls for a new subscription.
 *
 * The reference collects the nonzero words as sparse images that the
 * consumer writes over a zeroed lane. Dense words are the same result: the
 * chunks must be contiguous from bucket 0 to bucket_count, so on completion
 * every bucket of the buffer has been written by this snapshot (zeros
 * included) and no zeroing on reset is needed. `sparseImages` gives the
 * reference's form when a caller wants it.
 */
import { WORD_LEN } from "./constants.js";
import { decode, type Cbi1Frame } from "./decode.js";
import type { BucketImage } from "./encode.js";
import { Cbi1Error } from "./errors.js";
import { formatArg, type FilterFormat } from "./format.js";
import { assertLittleEndianHost } from "./u64.js";

/** A completed snapshot: the sequence and the whole lane as LE u64 words. */
export interface AssembledSnapshot {
  readonly epoch: bigint;
  /**
   * The assembly's buffer (or the `into` buffer), not a copy: valid until the
   * next chunk 0 is absorbed. Copy it, or swap lanes, before then.
   */
  readonly words: BigUint64Array;
}

export interface SnapshotAssemblyOptions {
  /** Where to rebuild the lane (bucketCount words, e.g. a staging lane's `words()`); default: allocated here. */
  readonly into?: BigUint64Array;
}

export class SnapshotAssembly {
  readonly format: FilterFormat;
  private readonly buffer: BigUint64Array;
  /** The same memory as `buffer`, for byte copies at any source alignment. */
  private readonly bytes: Uint8Array;
  private _epoch = 0n;
  private _chunkCount = 0;
  private _nextChunk = 0;
  private _nextBucket = 0;

  constructor(format: FilterFormat, options: SnapshotAssemblyOptions = {}) {
    this.format = formatArg(format);
    assertLittleEndianHost();
    const into = options.into;
    if (into !== undefined && (!(into instanceof BigUint64Array) || into.length !== format.bucketCount)) {
      throw new Cbi1Error("InvalidArgument", `an assembly buffer holds exactly ${format.bucketCount} words`, { expected: format.bucketCount });
    }
    this.buffer = into ?? new BigUint64Array(format.bucketCount);
    this.bytes = new Uint8Array(this.buffer.buffer, this.buffer.byteOffset, this.buffer.byteLength);
  }

  get epoch(): bigint {
    return this._epoch;
  }
  get chunkCount(): number {
    return this._chunkCount;
  }
  get nextChunk(): number {
    return this._nextChunk;
  }
  get nextBucket(): number {
    return this._nextBucket;
  }
  /** True between an accepted chunk 0 and the completing (or failing) chunk. */
  get inProgress(): boolean {
    return this._chunkCount !== 0;
  }

  /** Back to the empty state. The buffer keeps its bytes: the next complete snapshot overwrites all of them. */
  reset(): void {
    this._epoch = 0n;
    this._chunkCount = 0;
    this._nextChunk = 0;
    this._nextBucket = 0;
  }

  /** `decode` with this assembly's format, then `absorb`. */
  absorbBytes(frame: Uint8Array): AssembledSnapshot | undefined {
    return this.absorb(decode(this.format, frame));
  }

  /**
   * Takes the next decoded frame: undefined while chunks are missing, the
   * snapshot once the last chunk has covered every bucket. Throws
   * ChunkSequence or IncompleteCoverage (after a reset, except for a frame
   * that is not a snapshot chunk, which leaves the state as it was).
   */
  absorb(frame: Cbi1Frame): AssembledSnapshot | undefined {
    if (frame?.kind !== "snapshotChunk") throw new Cbi1Error("ChunkSequence", "a delta cannot take part in a snapshot assembly", { kind: "delta" });
    const { header, chunkIndex, chunkCount, bucketOffset, wordCount } = frame;
    if (chunkCount === 0 || chunkIndex >= chunkCount) {
      this.reset();
      throw new Cbi1Error("ChunkSequence", `chunk ${chunkIndex} of ${chunkCount} does not exist`, { chunkIndex, chunkCount });
    }
    // Chunk 0 always restarts, whatever was in progress.
    if (chunkIndex === 0) {
      this.reset();
      this._epoch = header.epoch;
      this._chunkCount = chunkCount;
    }
    const fault =
      chunkIndex !== this._nextChunk
        ? `chunk ${chunkIndex} arrived, chunk ${this._nextChunk} was next`
        : chunkCount !== this._chunkCount
          ? `chunk count ${chunkCount} differs from the snapshot's ${this._chunkCount}`
          : header.epoch !== this._epoch
            ? `epoch ${header.epoch} differs from the snapshot's ${this._epoch}`
            : header.bucketCount !== this.format.bucketCount
              ? `bucket count ${header.bucketCount} differs from the format's ${this.format.bucketCount}`
              : bucketOffset !== this._nextBucket
                ? `bucket offset ${bucketOffset} is not the next bucket ${this._nextBucket}`
                : undefined;
    if (fault !== undefined) {
      const details = { chunkIndex, chunkCount, epoch: header.epoch, bucketOffset, nextChunk: this._nextChunk, nextBucket: this._nextBucket };
      this.reset();
      throw new Cbi1Error("ChunkSequence", fault, details);
    }
    // Bucket indices fit u32 by construction (bucketCount <= 2^24), so the
    // reference's Malformed for an index beyond u32 cannot arise here.
    if (bucketOffset + wordCount > this.format.bucketCount) {
      this.reset();
      throw new Cbi1Error("Malformed", `words ${bucketOffset}..${bucketOffset + wordCount} exceed the ${this.format.bucketCount} buckets`, {
        bucketOffset,
        wordCount,
      });
    }
    // One memcpy whatever the frame's alignment: a byte copy has none to respect.
    this.bytes.set(frame.wordBytes, bucketOffset * WORD_LEN);
    this._nextBucket += wordCount;
    this._nextChunk += 1;
    if (this._nextChunk < this._chunkCount) return undefined;
    if (this._nextBucket !== this.format.bucketCount) {
      const details = { covered: this._nextBucket, bucketCount: this.format.bucketCount };
      this.reset();
      throw new Cbi1Error("IncompleteCoverage", `the chunks covered ${details.covered} of ${details.bucketCount} buckets`, details);
    }
    const snapshot: AssembledSnapshot = { epoch: this._epoch, words: this.buffer };
    this.reset();
    return snapshot;
  }
}

/** The reference's sparse form of a lane: (bucket, word) for every nonzero word, in bucket order. */
export function* sparseImages(words: BigUint64Array): IterableIterator<BucketImage> {
  for (let bucket = 0; bucket < words.length; bucket++) {
    const value = words[bucket]!;
    if (value !== 0n) yield { bucket, value };
  }
}
