/**
 * LaneMirror: one subscription's copy of one producer's CKF lane, fed the
 * FilterUpdate messages of a SubscribeKvPool stream in order (C.7). Pure:
 * no I/O and no timers; the clock is a parameter.
 *
 *   assembling --(last snapshot chunk, epoch == sequence)--> ready
 *   assembling | ready --(any violation)--> failed (for good)
 *
 * Every update first passes the envelope: contract marker, protocol version,
 * the relay identity of the stream's first update, and a producer equal to
 * the expected one. Then:
 *
 * - assembling takes SNAPSHOT_CHUNK only, with base == sequence, decoded
 *   against FilterFormat(producer format) and absorbed in order into a
 *   SnapshotAssembly that writes straight into the mirror's lane; the last
 *   chunk installs the lane at sequence == its epoch.
 * - ready takes HEARTBEAT (base == sequence == installed, empty payload: it
 *   records liveness, nothing else) and DELTA (base == installed, sequence ==
 *   installed + 1, CBI1 flags delta with epoch == sequence, base epoch ==
 *   base, dc_id == the producer's, at least one image and no bucket twice);
 *   a SNAPSHOT_CHUNK is a violation in v1.
 *
 * A violation throws a ConsumerError and leaves the mirror failed: every
 * later `apply` throws Invalidated and the lane is no longer exposed. There
 * is no skipping a frame and no buffering across a gap; the caller closes the
 * stream and starts a new mirror from a fresh snapshot. A delta is checked
 * whole before its first image is written.
 */
import { FilterUpdateKind, type FilterUpdate } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { sameProducerIdentity, type ProducerIdentity } from "../../kv/index.js";
import { decode, FilterFormat, isCbi1Error, snapshotChunkCount, SnapshotAssembly, type Cbi1Frame } from "../cbi1/index.js";
import { producerFromWire } from "../wire/index.js";
import { checkRelayIdentity, checkResponseEnvelope, type RelayIncarnation } from "./envelope.js";
import { ConsumerError, isConsumerError } from "./errors.js";

export type LaneMirrorState = "assembling" | "ready" | "failed";

export interface LaneMirrorOptions {
  /** The local clock of `lastFrameAt`, in ms (default Date.now). Freshness is judged by receive time, never by send_ts_us. */
  readonly now?: () => number;
}

/** What one accepted update did. */
export type LaneMirrorStep =
  | { readonly kind: "chunk"; readonly chunkIndex: number; readonly chunksReceived: number; readonly chunksExpected: number }
  | { readonly kind: "ready"; readonly sequence: bigint; readonly chunksExpected: number }
  | { readonly kind: "heartbeat"; readonly sequence: bigint; readonly sendTsUs: bigint }
  | { readonly kind: "delta"; readonly sequence: bigint; readonly images: number };

/** Snapshot progress: chunks absorbed of the ceil(bucket_count / 524,288) a snapshot has. */
export interface SnapshotProgress {
  readonly chunksReceived: number;
  readonly chunksExpected: number;
}

const KIND_NAMES: Readonly<Record<number, string>> = {
  [FilterUpdateKind.SNAPSHOT_CHUNK]: "SNAPSHOT_CHUNK",
  [FilterUpdateKind.DELTA]: "DELTA",
  [FilterUpdateKind.HEARTBEAT]: "HEARTBEAT",
};

export class LaneMirror {
  /** The producer every update must carry. */
  readonly producer: ProducerIdentity;
  /** FilterFormat(producer format): what every CBI1 header must declare. */
  readonly format: FilterFormat;
  private readonly now: () => number;
  private readonly chunksExpected: number;
  private _state: LaneMirrorState = "assembling";
  /** Allocated with the first chunk, so a subscription that fails at once costs no lane. */
  private lane: BigUint64Array | undefined;
  private assembly: SnapshotAssembly | undefined;
  private installed: bigint | undefined;
  private relay: RelayIncarnation | undefined;
  private _lastFrameAt: number | undefined;
  private _lastSendTsUs: bigint | undefined;
  private _frames = 0;
  private _failure: ConsumerError | undefined;

  constructor(expected: ProducerIdentity, options: LaneMirrorOptions = {}) {
    this.producer = expected;
    this.format = new FilterFormat(expected.format.seed, expected.format.bucketCount);
    this.chunksExpected = snapshotChunkCount(this.format.bucketCount);
    this.now = options.now ?? Date.now;
  }

  get state(): LaneMirrorState {
    return this._state;
  }

  /** The installed sequence once ready; undefined while assembling and after a failure. */
  get installedSequence(): bigint | undefined {
    return this._state === "ready" ? this.installed : undefined;
  }

  /**
   * The lane as little-endian u64 bucket words, once ready; undefined
   * otherwise (a partial snapshot or a failed mirror is never exposed). The
   * mirror's own memory, for reading only: the next delta writes into it.
   */
  get words(): BigUint64Array | undefined {
    return this._state === "ready" ? this.lane : undefined;
  }

  get progress(): SnapshotProgress {
    const chunksReceived = this.installed !== undefined ? this.chunksExpected : (this.assembly?.nextChunk ?? 0);
    return { chunksReceived, chunksExpected: this.chunksExpected };
  }

  /** Local receive time (per `now`) of the last accepted update. */
  get lastFrameAt(): number | undefined {
    return this._lastFrameAt;
  }

  /** send_ts_us of the last accepted update: the producer's wall clock, for display, not for freshness. */
  get lastSendTsUs(): bigint | undefined {
    return this._lastSendTsUs;
  }

  /** Accepted updates. */
  get frames(): number {
    return this._frames;
  }

  /** The relay identity the stream started with. */
  get relayIdentity(): RelayIncarnation | undefined {
    return this.relay;
  }

  /** The violation that failed the mirror. */
  get failure(): ConsumerError | undefined {
    return this._failure;
  }

  /** Takes the stream's next update; throws ConsumerError (and fails the mirror for good) on any violation. */
  apply(update: FilterUpdate): LaneMirrorStep {
    if (this._failure !== undefined) {
      throw new ConsumerError("Invalidated", `the mirror failed (${this._failure.code}) and must be rebuilt from a fresh snapshot`, {}, { cause: this._failure });
    }
    try {
      const step = this.step(update);
      this._frames++;
      this._lastFrameAt = this.now();
      this._lastSendTsUs = update.sendTsUs;
      return step;
    } catch (error) {
      const failure = isConsumerError(error)
        ? error
        : new ConsumerError("MalformedFrame", `the update could not be applied: ${error instanceof Error ? error.message : String(error)}`, {}, { cause: error });
      this._failure = failure;
      this._state = "failed";
      this.assembly = undefined;
      this.lane = undefined;
      this.installed = undefined;
      throw failure;
    }
  }

  private step(update: FilterUpdate): LaneMirrorStep {
    checkResponseEnvelope(update, "FilterUpdate");
    this.relay = checkRelayIdentity(update.relay, this.relay, "FilterUpdate");
    this.checkProducer(update);
    const kind = update.kind;
    const name = KIND_NAMES[kind];
    if (name === undefined) throw new ConsumerError("UnknownKind", `FilterUpdate kind ${kind} is not a known kind`, { kind });
    if (this._state === "assembling") {
      if (kind !== FilterUpdateKind.SNAPSHOT_CHUNK) {
        throw new ConsumerError("UnexpectedKind", `a ${name} arrived before the snapshot was complete`, { kind: name, state: "assembling" });
      }
      return this.snapshotChunk(update);
    }
    if (kind === FilterUpdateKind.HEARTBEAT) return this.heartbeat(update);
    if (kind === FilterUpdateKind.DELTA) return this.delta(update);
    throw new ConsumerError("UnexpectedKind", "a SNAPSHOT_CHUNK arrived after the snapshot was installed", { kind: name, state: "ready" });
  }

  private checkProducer(update: FilterUpdate): void {
    let producer: ProducerIdentity;
    try {
      producer = producerFromWire(update.producer, "FilterUpdate.producer");
    } catch (error) {
      throw new ConsumerError("MalformedEnvelope", `FilterUpdate.producer: ${error instanceof Error ? error.message : String(error)}`, {}, { cause: error });
    }
    if (!sameProducerIdentity(producer, this.producer)) {
      throw new ConsumerError("ProducerDrift", "FilterUpdate.producer is not the producer the subscription expects", {
        dcId: producer.poolId.dcId,
        producerIncarnation: producer.producerIncarnation,
        layoutGeneration: producer.layoutGeneration,
      });
    }
  }

  /** decode() against the producer's format; a codec error becomes the consumer's verdict. */
  private decode(payload: Uint8Array): Cbi1Frame {
    try {
      return decode(this.format, payload);
    } catch (error) {
      throw frameError(error);
    }
  }

  private checkDc(frame: Cbi1Frame): void {
    const expected = this.producer.poolId.dcId;
    if (frame.header.dcId !== expected) {
      throw new ConsumerError("DcMismatch", `the frame's dc_id ${frame.header.dcId} is not the producer's ${expected}`, { dcId: frame.header.dcId, expected });
    }
  }

  private snapshotChunk(update: FilterUpdate): LaneMirrorStep {
    const { baseSequence, sequence } = update;
    if (baseSequence !== sequence) {
      throw new ConsumerError("SequenceGap", `a snapshot chunk has base_sequence ${baseSequence} and sequence ${sequence}; they must be equal`, {
        baseSequence,
        sequence,
      });
    }
    const frame = this.decode(update.payload);
    if (frame.kind !== "snapshotChunk") throw new ConsumerError("KindMismatch", "a SNAPSHOT_CHUNK update carries a CBI1 delta", { flags: frame.header.flags });
    if (frame.header.epoch !== sequence) {
      throw new ConsumerError("EpochMismatch", `a snapshot chunk's epoch ${frame.header.epoch} is not its sequence ${sequence}`, {
        epoch: frame.header.epoch,
        sequence,
      });
    }
    this.checkDc(frame);
    // Stricter than SnapshotAssembly on purpose: one subscription sends one
    // snapshot, in order, in exactly ceil(B / 524,288) chunks; a restart at
    // chunk 0 or a padded chunk count is a relay fault, not a new snapshot.
    const next = this.assembly?.nextChunk ?? 0;
    if (frame.chunkCount !== this.chunksExpected || frame.chunkIndex !== next) {
      throw new ConsumerError(
        "ChunkSequence",
        `chunk ${frame.chunkIndex} of ${frame.chunkCount} arrived; chunk ${next} of ${this.chunksExpected} was next`,
        { chunkIndex: frame.chunkIndex, chunkCount: frame.chunkCount, nextChunk: next, chunksExpected: this.chunksExpected },
      );
    }
    if (this.assembly === undefined) {
      this.lane = new BigUint64Array(this.format.bucketCount);
      this.assembly = new SnapshotAssembly(this.format, { into: this.lane });
    }
    let assembled;
    try {
      assembled = this.assembly.absorb(frame);
    } catch (error) {
      throw frameError(error);
    }
    if (assembled === undefined) {
      return { kind: "chunk", chunkIndex: frame.chunkIndex, chunksReceived: this.assembly.nextChunk, chunksExpected: this.chunksExpected };
    }
    if (assembled.epoch !== sequence) {
      throw new ConsumerError("EpochMismatch", `the snapshot completed at epoch ${assembled.epoch}, its last update has sequence ${sequence}`, {
        epoch: assembled.epoch,
        sequence,
      });
    }
    // The assembly wrote every bucket of the lane (zeros included): that is the reset image.
    this.assembly = undefined;
    this.installed = sequence;
    this._state = "ready";
    return { kind: "ready", sequence, chunksExpected: this.chunksExpected };
  }

  private heartbeat(update: FilterUpdate): LaneMirrorStep {
    const { baseSequence, sequence } = update;
    const installed = this.installed!;
    if (baseSequence !== installed || sequence !== installed) {
      throw new ConsumerError("SequenceGap", `a heartbeat at ${baseSequence} -> ${sequence}; the installed sequence is ${installed}`, {
        baseSequence,
        sequence,
        installed,
      });
    }
    if (update.payload.length !== 0) {
      throw new ConsumerError("MalformedFrame", `a heartbeat carries a ${update.payload.length}-byte payload; it has none`, { payload: update.payload.length });
    }
    return { kind: "heartbeat", sequence, sendTsUs: update.sendTsUs };
  }

  private delta(update: FilterUpdate): LaneMirrorStep {
    const { baseSequence, sequence } = update;
    const installed = this.installed!;
    if (baseSequence !== installed || sequence !== installed + 1n) {
      throw new ConsumerError("SequenceGap", `a delta ${baseSequence} -> ${sequence} does not continue the installed sequence ${installed}`, {
        baseSequence,
        sequence,
        installed,
      });
    }
    const frame = this.decode(update.payload);
    if (frame.kind !== "delta") throw new ConsumerError("KindMismatch", "a DELTA update carries a CBI1 snapshot chunk", { flags: frame.header.flags });
    if (frame.header.epoch !== sequence) {
      throw new ConsumerError("EpochMismatch", `a delta's epoch ${frame.header.epoch} is not its sequence ${sequence}`, { epoch: frame.header.epoch, sequence });
    }
    if (frame.baseEpoch !== baseSequence) {
      throw new ConsumerError("EpochMismatch", `a delta's base epoch ${frame.baseEpoch} is not its base sequence ${baseSequence}`, {
        baseEpoch: frame.baseEpoch,
        baseSequence,
      });
    }
    this.checkDc(frame);
    const images = frame.images;
    const count = images.length;
    if (count === 0) throw new ConsumerError("EmptyDelta", `the delta ${baseSequence} -> ${sequence} has no images`, { sequence });
    // decode() has bounded every bucket by bucket_count; duplicates are ours to refuse (B.9).
    const duplicate = firstDuplicateBucket(images);
    if (duplicate !== undefined) {
      throw new ConsumerError("DuplicateBucket", `the delta ${baseSequence} -> ${sequence} names bucket ${duplicate} more than once`, { bucket: duplicate });
    }
    const lane = this.lane!;
    for (let i = 0; i < count; i++) lane[images.bucket(i)] = images.value(i);
    this.installed = sequence;
    return { kind: "delta", sequence, images: count };
  }
}

/** A codec error as the consumer's verdict: format faults, assembly faults, and everything else is a malformed frame. */
function frameError(error: unknown): ConsumerError {
  if (isCbi1Error(error)) {
    const code = error.code === "Format" ? "FormatMismatch" : error.code === "ChunkSequence" || error.code === "IncompleteCoverage" ? "ChunkSequence" : "MalformedFrame";
    return new ConsumerError(code, `CBI1 ${error.code}: ${error.message}`, { cbi1: error.code }, { cause: error });
  }
  return new ConsumerError("MalformedFrame", `the payload could not be decoded: ${error instanceof Error ? error.message : String(error)}`, {}, { cause: error });
}

/** The first bucket named twice, if any: sorted copy of the buckets, then neighbours (n log n, n <= 349,525). */
function firstDuplicateBucket(images: { readonly length: number; bucket(i: number): number }): number | undefined {
  const n = images.length;
  if (n < 2) return undefined;
  const buckets = new Uint32Array(n);
  for (let i = 0; i < n; i++) buckets[i] = images.bucket(i);
  buckets.sort();
  for (let i = 1; i < n; i++) if (buckets[i] === buckets[i - 1]) return buckets[i];
  return undefined;
}
