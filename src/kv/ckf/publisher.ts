/**
 * The publication envelope of one producer lane (B.5): turns drained batches
 * into sequenced deltas on the current lease, and fences itself when it can
 * no longer vouch for the sequence. Sequence numbers count emitted batches,
 * not events; a consumer that installed snapshot N expects exactly N -> N+1.
 */
import { CkfError, type FenceReason } from "./errors.js";
import { imageCount, sameFormat, type ConsumerDrainMarker, type DcCkfDelta, type DcCkfPublicationBatch, type DcCkfSnapshot, type LaneLease, type ProducerIdentity } from "./identity.js";
import type { BarrierCopy } from "./barrier-copy.js";
import type { DcCkfState } from "./state.js";
import { isU64, U64_MAX } from "./u64.js";

/**
 * Where deltas go, in order. "rejected" (or a throw) means the delta may or
 * may not have reached the consumer: the publisher fences DeliveryUncertain.
 */
export type DeliverySink = (delta: DcCkfDelta) => "accepted" | "rejected";

export type PublishResult =
  /** Sent: the sequence advanced to delta.sequence. */
  | { readonly kind: "published"; readonly delta: DcCkfDelta }
  /** No lease, so nobody to send to: the batch is dropped and the sequence stays. */
  | { readonly kind: "no_subscriber"; readonly sequence: bigint };

export interface DcCkfPublisherOptions {
  /** The sequence the next delta continues from. */
  readonly lastSequence: bigint;
  readonly sink: DeliverySink;
  readonly lease?: LaneLease | undefined;
}

export class DcCkfPublisher {
  readonly identity: ProducerIdentity;
  private leaseValue: LaneLease | undefined;
  private last: bigint;
  private fenceValue: FenceReason | undefined;
  private readonly sink: DeliverySink;

  constructor(identity: ProducerIdentity, options: DcCkfPublisherOptions) {
    if (!isU64(options.lastSequence)) throw new CkfError("InvalidIdentity", `lastSequence ${String(options.lastSequence)} is not a u64`);
    this.identity = identity;
    this.last = options.lastSequence;
    this.sink = options.sink;
    this.leaseValue = options.lease;
  }

  get lease(): LaneLease | undefined {
    return this.leaseValue;
  }

  get lastSequence(): bigint {
    return this.last;
  }

  /** Why the publisher is fenced, if it is. */
  get fenced(): FenceReason | undefined {
    return this.fenceValue;
  }

  /** Fences from outside (the actor uses this when a lease stalls); cleared by the next barrier snapshot. */
  fence(reason: FenceReason): void {
    this.fenceValue ??= reason;
  }

  /**
   * Publishes one batch as delta last -> last+1. Throws CkfError Fenced when
   * the publisher is or becomes fenced (the sequence never advances then), and
   * EmptyDelta for a batch without images, before anything else: a consumer
   * deactivates on an empty delta (B.9), so one is a caller's bug whatever
   * the publisher's state, and it neither fences nor advances.
   */
  publish(batch: DcCkfPublicationBatch): PublishResult {
    if (imageCount(batch) === 0) {
      throw new CkfError("EmptyDelta", "a delta needs at least one image: the consumer deactivates on an empty one");
    }
    if (this.fenceValue !== undefined) throw fencedError(this.fenceValue);
    const lease = this.leaseValue;
    if (lease === undefined) return { kind: "no_subscriber", sequence: this.last };
    if (this.last === U64_MAX) {
      this.fenceValue = "SequenceExhausted";
      throw fencedError(this.fenceValue);
    }
    const next = this.last + 1n;
    const identity = this.identity;
    const baseSequence = this.last;
    const columns = batch.columns;
    // A batch with columns keeps its images unmade until someone reads them.
    const delta: DcCkfDelta =
      columns === undefined
        ? Object.freeze({ identity, lease, baseSequence, sequence: next, images: batch.images })
        : Object.freeze({
            identity,
            lease,
            baseSequence,
            sequence: next,
            get images() {
              return batch.images;
            },
            columns,
          });
    let verdict: "accepted" | "rejected";
    try {
      verdict = this.sink(delta);
    } catch {
      // A sink that throws may have half-delivered; that is exactly "uncertain".
      verdict = "rejected";
    }
    if (verdict !== "accepted") {
      this.fenceValue = "DeliveryUncertain";
      throw fencedError(this.fenceValue);
    }
    this.last = next;
    return { kind: "published", delta };
  }

  /**
   * A consistent restart point for `newLease`: the state's barrier snapshot,
   * with the pending tail first published on the old lease (so the old
   * subscriber's last delta matches the snapshot's sequence), then the new
   * lease installed and any fence cleared. Throws SequenceExhausted when no
   * sequence is left to continue from, and FormatMismatch when the state's
   * format is not the identity's: consumers would read its words with the
   * identity's seed and bucket count. Both are checked before the barrier, so
   * a refusal drains and publishes nothing.
   */
  snapshotAfterBarrier(state: DcCkfState, newLease: LaneLease): DcCkfSnapshot {
    const { sequence, value: words } = this.barrier(newLease, state, () => state.barrierSnapshot());
    return Object.freeze({ identity: this.identity, lease: newLease, sequence, buckets: words });
  }

  /**
   * snapshotAfterBarrier with the lane copied in steps (DcCkfState.
   * beginBarrierCopy): the same checks, tail and lease; the snapshot is at
   * `sequence` once `copy` is done, and the deltas published meanwhile
   * continue from it.
   */
  barrierInSteps(state: DcCkfState, newLease: LaneLease): { readonly sequence: bigint; readonly copy: BarrierCopy } {
    const { sequence, value: copy } = this.barrier(newLease, state, () => state.beginBarrierCopy());
    return { sequence, copy };
  }

  private barrier<T>(newLease: LaneLease, state: DcCkfState, take: () => [DcCkfPublicationBatch | undefined, T]): { sequence: bigint; value: T } {
    const format = state.format();
    if (!sameFormat(format, this.identity.format)) {
      throw new CkfError(
        "FormatMismatch",
        `the state's format (seed ${format.seed}, ${format.bucketCount} buckets) is not the publisher's ` +
          `(seed ${this.identity.format.seed}, ${this.identity.format.bucketCount} buckets)`,
      );
    }
    if (this.last === U64_MAX || this.fenceValue === "SequenceExhausted") {
      throw new CkfError("SequenceExhausted", "the publication sequence is exhausted; start a new producer generation");
    }
    const [tail, value] = take();
    if (this.fenceValue === undefined && tail !== undefined) {
      try {
        this.publish(tail);
      } catch (error) {
        // The old lease's consumer loses the tail either way; it has to resubscribe,
        // and the snapshot below carries the tail's changes for the new lease.
        if (!(error instanceof CkfError) || error.code !== "Fenced") throw error;
      }
    }
    this.leaseValue = newLease;
    this.fenceValue = undefined;
    return { sequence: this.last, value };
  }

  /** The lease and the sequence its consumer must end at, if there is a lease. */
  exactDrainMarker(): ConsumerDrainMarker | undefined {
    const lease = this.leaseValue;
    return lease === undefined ? undefined : Object.freeze({ lease, expectedSequence: this.last });
  }
}

function fencedError(reason: FenceReason): CkfError {
  return new CkfError("Fenced", `the publisher is fenced (${reason}); a barrier snapshot on a new lease clears it`, { fence: reason });
}
