/**
 * The relay as a host module: `dynamo.kvrelay.v1.KvEventRelay` for remote
 * subscribers and `mmgate.kvevents.v1.KvEventService` for the workers' KV
 * events, over the pools its config declares (one named "default" on the
 * embedded defaults).
 */
import { ConnectError } from "@connectrpc/connect";
import { KvEventRelay } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { KvEventService } from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { Cbi1Service, DecodedRelayService } from "../../../gen/mmgate/kvrelay/v1/cbi1_pb.js";
import { Cbi1Error } from "../cbi1/index.js";
import { cbi1ErrorToConnect, cbi1Service, decodedRelayService } from "../decoded/index.js";
import { bindService, defineModule, type HostStatusOrigin } from "../../server/index.js";
import { NatsEventSource } from "../nats/index.js";
import { RelayError, relayErrorCode, withRelayReason, type RelayErrorReasonName } from "../wire/index.js";
import { RELAY_ENV, relayConfigSchema } from "./config.js";
import { IngestError, ingestService, type IngestErrorCode } from "./ingest.js";
import { RelayMetrics } from "./metrics.js";
import { Relay } from "./relay.js";
import { relayService } from "./service.js";

/** The C.3 reason of each ingest refusal; its gRPC code is the reason's. */
const INGEST_REASONS: Record<IngestErrorCode, RelayErrorReasonName> = {
  MissingPool: "INVALID_REQUEST",
  PoolMismatch: "INVALID_REQUEST",
  TooManyEvents: "INVALID_REQUEST",
  PoolNotFound: "POOL_NOT_FOUND",
  StreamLimit: "RESOURCE_LIMIT",
};

/**
 * Every error of the relay's services carries the `kv-relay-error-reason`
 * trailer (C.3): relay errors name their own reason, ingest refusals and
 * CBI1 codec errors theirs. What this does not claim the host logs and
 * answers INTERNAL, and `relayHostStatus` adds the INTERNAL reason to that.
 */
function relayErrorToConnect(error: unknown): ConnectError | undefined {
  if (error instanceof RelayError) return error.toConnectError();
  if (error instanceof IngestError) {
    const reason = INGEST_REASONS[error.code];
    return withRelayReason(new ConnectError(error.message, relayErrorCode(reason), undefined, undefined, error), reason);
  }
  if (error instanceof Cbi1Error) return withRelayReason(cbi1ErrorToConnect(error), "INVALID_REQUEST");
  return undefined;
}

/**
 * The reason trailer on the statuses the host builds for the relay's
 * services: INTERNAL for an unexpected error, PUBLICATION_UNAVAILABLE
 * (UNAVAILABLE: reconnect, to another relay) for a call refused while the
 * server drains.
 */
function relayHostStatus(status: ConnectError, origin: HostStatusOrigin): ConnectError {
  return withRelayReason(status, origin === "draining" ? "PUBLICATION_UNAVAILABLE" : "INTERNAL");
}

/** What the relay module gives other modules and tests. */
export interface RelayModuleExports {
  readonly relay: Relay;
}

export const relayModule = defineModule({
  name: "relay",
  description:
    "KV event relay: dynamo.kvrelay.v1.KvEventRelay (pool catalog, CBI1 filter streams, readiness, load), mmgate.kvevents.v1.KvEventService ingest, and CBI1 as protobuf (mmgate.kvrelay.v1.Cbi1Service, DecodedRelayService)",
  configSchema: relayConfigSchema.prefault({}),
  env: RELAY_ENV,
  mapError: relayErrorToConnect,
  decorateHostStatus: relayHostStatus,
  create(ctx) {
    // Read at scrape time and on events only, once `relay` exists.
    const metrics: RelayMetrics = new RelayMetrics(ctx.metrics, {
      catalogPoolCount: () => relay.allPools().length,
      hubCounts: () => relay.hubCounts(),
      topologyCounts: () => relay.topologyCounts(),
      degradedLoadPools: () => relay.degradedLoadPools(),
    });
    const relay = new Relay(ctx.config, {
      onTerminalFailure: (pool, error) => {
        metrics.terminalFailures.inc();
        ctx.logger.error({ pool: pool.name, err: error }, "publication failed terminally; the pool moves to a new layout generation");
      },
      onDelta: (pool) => metrics.deltasPublished.inc({ pool: pool.name }),
    });
    ctx.logger.info(
      { pools: relay.allPools().map((p) => ({ name: p.name, buckets: p.producer.format.bucketCount, layoutGeneration: String(p.producer.layoutGeneration) })) },
      "relay pools ready",
    );
    const relayImpl = relayService({ relay, metrics, drainSignal: ctx.drainSignal });
    return {
      services: [
        bindService(KvEventRelay, relayImpl),
        // Decoded in one turn of the event loop before ingest slices it: bounded here.
        bindService(KvEventService, ingestService({ relay, metrics }), { readMaxBytes: relay.config.maxIngestMessageBytes }),
        // CBI1 as protobuf, beside the wire-compatible contract: single frames, and the pool streams decoded.
        bindService(Cbi1Service, cbi1Service()),
        bindService(DecodedRelayService, decodedRelayService(relayImpl)),
      ],
      exports: { relay } satisfies RelayModuleExports,
      start() {
        relay.start();
        for (const pool of relay.allPools()) {
          const nats = pool.config.nats;
          if (nats === undefined) continue;
          // The same sliced application as the ingest streams': one message at a time through the relay's slicer.
          const source = new NatsEventSource(nats, (event) => pool.applyInSteps(event, relay.slicer.due), {
            logger: ctx.logger.child({ pool: pool.name }),
            registry: ctx.metrics,
            slicer: relay.slicer,
            aroundMessage: () => pool.hold(),
          });
          // A source that cannot connect, or loses its connection for good, is restarted with backoff.
          ctx.tasks.run(`relay NATS source of pool ${pool.name}`, (signal) => source.run(signal));
        }
      },
      close() {
        relay.close();
      },
    };
  },
});
