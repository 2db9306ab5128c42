/**
 * `mmgate.kvevents.v1.KvEventService.Publish`: a client stream of router
 * events into one named pool. Events apply in order; one that the filter
 * state refuses is counted and reported, and the stream goes on. What is
 * still pending when the stream ends is published then.
 *
 * Applying is sliced so that the event loop keeps turning (health checks,
 * subscriber streams, timers): a message is applied as one task of the
 * relay's slicer (one message at a time across every stream, pool and NATS
 * source, in arrival order), which yields the loop whenever its slice is
 * spent: between events, and between the blocks of a large event
 * (DcCkfState.applyEventInSteps, the same code as an unpaused application,
 * so the filter state and every event's outcome are what applying the same
 * events in the same order without a pause gives). An event over
 * `maxBlocksPerEvent` is rejected (EventTooLarge) like any refused event.
 * A stream takes its next message only once the previous one is applied:
 * what it holds in flight is one decoded message, and on the lean gRPC path
 * at most 1 MiB of undecoded ones read ahead (then HTTP/2 flow control holds
 * the client back). There the messages come as their bytes and are decoded
 * here (publish-decode.ts): the pool and the event count from the top-level
 * fields first, so that a refused message builds nothing, then the events
 * straight into what the filter state takes.
 */
import { create } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { KvEventService} from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { PublishResponseSchema, type PublishRequest, type RouterEvent as WireRouterEvent } from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { CkfError, type KvCacheEventData, type RouterEvent, type StorageTier } from "../../kv/index.js";
import type { WorkSlicer } from "../../util/index.js";
import { EncodedMessage, readsEncodedRequests } from "../../wire/index.js";
import type { RelayMetrics } from "./metrics.js";
import { APPLY_PAUSED, type RelayPool } from "./pool.js";
import { decodePublishRequest, scanPublishRequest } from "./publish-decode.js";
import type { Relay } from "./relay.js";

/** Rejections a summary reports one by one; the rest are only counted. */
export const MAX_REPORTED_REJECTIONS = 16;

export type IngestErrorCode = "MissingPool" | "PoolMismatch" | "PoolNotFound" | "TooManyEvents" | "StreamLimit";

/** Why an ingest stream was refused as a whole. */
export class IngestError extends Error {
  override readonly name = "IngestError";
  constructor(
    readonly code: IngestErrorCode,
    message: string,
  ) {
    super(message);
  }
}

/**
 * A wire event as the filter state takes it; a missing body is an InvalidEvent
 * the state reports. The blocks and hashes are the wire message's own (a
 * StoredBlock already has the two fields the state reads), not copies.
 */
export function routerEventFromWire(event: WireRouterEvent): RouterEvent | CkfError {
  let data: KvCacheEventData;
  const body = event.data;
  switch (body.case) {
    case "stored":
      data = {
        kind: "stored",
        parentHash: body.value.parentHash,
        startPosition: body.value.startPosition,
        blocks: body.value.blocks,
      };
      break;
    case "removed":
      data = { kind: "removed", blockHashes: body.value.blockHashes };
      break;
    case "cleared":
      data = { kind: "cleared" };
      break;
    default:
      return new CkfError("InvalidEvent", "the event has no data (stored, removed or cleared)");
  }
  return {
    workerId: event.workerId,
    dpRank: event.dpRank,
    eventId: event.eventId,
    data,
    storageTier: event.storageTier === "" ? undefined : (event.storageTier as StorageTier),
    residencyDomain: event.residencyDomain === "" ? undefined : event.residencyDomain,
  };
}

/** What one message did: events applied and rejected, each rejection with its stream position. */
export interface MessageOutcome {
  applied: number;
  rejected: number;
}

/**
 * Applies one message's events (each as routerEventFromWire or the
 * Publish decoder gives it: an event, or the error that refuses it) to
 * `pool`, in order, yielding the loop whenever the slicer's slice is spent;
 * reports each rejection with its position in the stream (`first` is the
 * position of the message's first event). Run it as one task of
 * `slicer.exclusive`, so that no other event work interleaves with it.
 */
export async function applyEvents(
  pool: RelayPool,
  slicer: WorkSlicer,
  events: readonly (RouterEvent | CkfError)[],
  first: bigint,
  reject: (index: bigint, error: CkfError) => void,
): Promise<MessageOutcome> {
  const outcome: MessageOutcome = { applied: 0, rejected: 0 };
  for (let i = 0; i < events.length; i++) {
    const event = events[i]!;
    let error: CkfError | undefined;
    if (event instanceof CkfError) {
      error = event;
    } else {
      // RelayPool.applyInSteps through the slicer, without a generator per event: a turn between pauses.
      let done = pool.applyUntil(event, slicer.due);
      while (done === APPLY_PAUSED) {
        await slicer.yieldTurn();
        done = pool.continueApply(slicer.due);
      }
      error = done;
    }
    if (error === undefined) {
      outcome.applied += 1;
    } else {
      outcome.rejected += 1;
      reject(first + BigInt(i), error);
    }
    if (slicer.due()) await slicer.yieldTurn();
  }
  return outcome;
}

export interface IngestServiceOptions {
  readonly relay: Relay;
  readonly metrics: RelayMetrics;
}

export function ingestService(options: IngestServiceOptions): Partial<ServiceImpl<typeof KvEventService>> {
  const { relay, metrics } = options;
  const { maxIngestStreams, maxEventsPerMessage } = relay.config;
  const slicer = relay.slicer;
  let open = 0;
  return {
    async publish(requests: AsyncIterable<PublishRequest>, ctx: HandlerContext) {
      if (open >= maxIngestStreams) throw new IngestError("StreamLimit", `the relay takes at most ${maxIngestStreams} ingest streams at once`);
      // Where the call gives its messages as their bytes (the lean gRPC path), they are decoded here, straight into
      // the events the filter state takes (publish-decode.ts); elsewhere they come parsed.
      readsEncodedRequests(ctx);
      open += 1;
      let pool: RelayPool | undefined;
      let index = 0n;
      let applied = 0n;
      let rejected = 0n;
      const rejections: { index: bigint; code: string; message: string }[] = [];
      let deltasAtStart = 0;
      try {
        for await (const message of requests as AsyncIterable<PublishRequest | EncodedMessage>) {
          // The pool and the event count first, from the top-level fields alone: nothing is built for a message refused.
          const request = message instanceof EncodedMessage ? scanPublishRequest(message.bytes) : { pool: message.pool, events: message.events.length };
          if (pool === undefined) {
            if (request.pool === "") throw new IngestError("MissingPool", "the first message must name the pool");
            pool = relay.pool(request.pool);
            if (pool === undefined) throw new IngestError("PoolNotFound", `no pool named ${JSON.stringify(request.pool)}; this relay has ${relay.allPools().map((p) => p.name).join(", ")}`);
            deltasAtStart = pool.deltasPublished;
          } else if (request.pool !== "" && request.pool !== pool.name) {
            throw new IngestError("PoolMismatch", `the stream publishes to ${JSON.stringify(pool.name)}, not ${JSON.stringify(request.pool)}`);
          }
          if (request.events > maxEventsPerMessage) {
            throw new IngestError("TooManyEvents", `a message carries at most ${maxEventsPerMessage} events, not ${request.events}`);
          }
          const events = message instanceof EncodedMessage ? decodePublishRequest(message.bytes).events : message.events.map(routerEventFromWire);
          const target = pool;
          const { applied: messageApplied, rejected: messageRejected } = await slicer.exclusive(async () => {
            // The message's events publish together, however many turns applying them takes.
            const release = target.hold();
            try {
              return await applyEvents(target, slicer, events, index, (at, error) => {
                if (rejections.length < MAX_REPORTED_REJECTIONS) rejections.push({ index: at, code: error.code, message: error.message });
              });
            } finally {
              release();
            }
          });
          index += BigInt(events.length);
          applied += BigInt(messageApplied);
          rejected += BigInt(messageRejected);
          if (messageApplied > 0) metrics.ingestEvents.inc({ pool: pool.name, result: "applied" }, messageApplied);
          if (messageRejected > 0) metrics.ingestEvents.inc({ pool: pool.name, result: "rejected" }, messageRejected);
          // The transport decodes the next message when it is asked for it, in one piece: not in a turn whose
          // slice applying has spent. Within the slice the next message goes on in the same turn, so a burst of
          // small messages (one event each, a delta each) is published in one turn, and every subscriber's
          // frames leave in one write; a turn still holds at most one slice and one decode, as before.
          if (slicer.busy && slicer.due(0)) await slicer.yieldTurn();
        }
        if (pool === undefined) throw new IngestError("MissingPool", "the stream ended before naming a pool");
        // In the queue too: an event of another task may be mid-way, and this stream's summary counts its own last delta.
        const done = pool;
        await slicer.exclusive(() => done.flush());
        const published = pool.deltasPublished - deltasAtStart;
        return create(PublishResponseSchema, { applied, rejected, rejections, deltasPublished: BigInt(Math.max(0, published)), sequence: pool.sequence });
      } finally {
        open -= 1;
      }
    },
  };
}
