/**
 * `mmgate.kvevents.v1.KvEventService.Publish`: a client stream of router
 * events into one named pool. Events apply in order; one that the filter
 * state refuses is counted and reported, and the stream goes on. What is
 * still pending when the stream ends is published then.
 */
import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import type { KvEventService} from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { PublishResponseSchema, type PublishRequest, type RouterEvent as WireRouterEvent } from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { CkfError, type KvCacheEventData, type RouterEvent, type StorageTier } from "../../kv/index.js";
import type { RelayMetrics } from "./metrics.js";
import type { RelayPool } from "./pool.js";
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

/** A wire event as the filter state takes it; a missing body is an InvalidEvent the state reports. */
export function routerEventFromWire(event: WireRouterEvent): RouterEvent | CkfError {
  let data: KvCacheEventData;
  const body = event.data;
  switch (body.case) {
    case "stored":
      data = {
        kind: "stored",
        parentHash: body.value.parentHash,
        startPosition: body.value.startPosition,
        blocks: body.value.blocks.map((block) => ({ blockHash: block.blockHash, tokensHash: block.tokensHash })),
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

export interface IngestServiceOptions {
  readonly relay: Relay;
  readonly metrics: RelayMetrics;
}

export function ingestService(options: IngestServiceOptions): Partial<ServiceImpl<typeof KvEventService>> {
  const { relay, metrics } = options;
  const { maxIngestStreams, maxEventsPerMessage } = relay.config;
  let open = 0;
  return {
    async publish(requests: AsyncIterable<PublishRequest>) {
      if (open >= maxIngestStreams) throw new IngestError("StreamLimit", `the relay takes at most ${maxIngestStreams} ingest streams at once`);
      open += 1;
      let pool: RelayPool | undefined;
      let index = 0n;
      let applied = 0n;
      let rejected = 0n;
      const rejections: { index: bigint; code: string; message: string }[] = [];
      let deltasAtStart = 0;
      try {
        for await (const request of requests) {
          if (pool === undefined) {
            if (request.pool === "") throw new IngestError("MissingPool", "the first message must name the pool");
            pool = relay.pool(request.pool);
            if (pool === undefined) throw new IngestError("PoolNotFound", `no pool named ${JSON.stringify(request.pool)}; this relay has ${relay.allPools().map((p) => p.name).join(", ")}`);
            deltasAtStart = pool.deltasPublished;
          } else if (request.pool !== "" && request.pool !== pool.name) {
            throw new IngestError("PoolMismatch", `the stream publishes to ${JSON.stringify(pool.name)}, not ${JSON.stringify(request.pool)}`);
          }
          if (request.events.length > maxEventsPerMessage) {
            throw new IngestError("TooManyEvents", `a message carries at most ${maxEventsPerMessage} events, not ${request.events.length}`);
          }
          let messageApplied = 0;
          let messageRejected = 0;
          for (const wire of request.events) {
            const event = routerEventFromWire(wire);
            const error = event instanceof CkfError ? event : pool.apply(event);
            if (error === undefined) {
              messageApplied += 1;
            } else {
              messageRejected += 1;
              if (rejections.length < MAX_REPORTED_REJECTIONS) rejections.push({ index, code: error.code, message: error.message });
            }
            index += 1n;
          }
          applied += BigInt(messageApplied);
          rejected += BigInt(messageRejected);
          if (messageApplied > 0) metrics.ingestEvents.inc({ pool: pool.name, result: "applied" }, messageApplied);
          if (messageRejected > 0) metrics.ingestEvents.inc({ pool: pool.name, result: "rejected" }, messageRejected);
        }
        if (pool === undefined) throw new IngestError("MissingPool", "the stream ended before naming a pool");
        pool.flush();
        const published = pool.deltasPublished - deltasAtStart;
        return create(PublishResponseSchema, { applied, rejected, rejections, deltasPublished: BigInt(Math.max(0, published)), sequence: pool.sequence });
      } finally {
        open -= 1;
      }
    },
  };
}
