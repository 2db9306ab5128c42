/**
 * The relay as a host module: `dynamo.kvrelay.v1.KvEventRelay` for remote
 * subscribers and `mmgate.kvevents.v1.KvEventService` for the workers' KV
 * events, over the pools its config declares (one named "default" on the
 * embedded defaults).
 */
import { ConnectError } from "@connectrpc/connect";
import { Counter, Gauge } from "prom-client";
import { KvEventRelay } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { KvEventService } from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { Cbi1Service, DecodedRelayService } from "../../../gen/mmgate/kvrelay/v1/cbi1_pb.js";
import { Cbi1Error } from "../cbi1/index.js";
import { cbi1ErrorToConnect, cbi1Service, decodedRelayService } from "../decoded/index.js";
import { bindService, defineModule, type HostStatusOrigin } from "../../server/index.js";
import { NatsEventSource } from "../nats/index.js";
import { registeredMetric } from "../../util/index.js";
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
      catalogPoolCount: () => relay.catalogPoolCount(),
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
      onInvalidTopology: (entry, error) => {
        invalidTopology.inc();
        ctx.logger.error({ namespace: entry.namespace, model: entry.canonicalModelId, err: error }, "a serving topology entry fails the contract's topology rules; left out of readiness");
      },
      onLoadFailure: (error) => ctx.logger.error({ err: error }, "a load window could not be made; the open load streams end PUBLICATION_UNAVAILABLE"),
    });
    ctx.logger.info(
      {
        pools: relay.allPools().map((p) => ({
          name: p.name,
          buckets: p.producer.format.bucketCount,
          layoutGeneration: String(p.producer.layoutGeneration),
          // Where readiness takes the pool's liveness from: its workers' registrations, or event recency.
          liveness: relay.liveness(p).source,
        })),
      },
      "relay pools ready",
    );
    const invalidTopology = registeredMetric(
      ctx.metrics,
      "mmgate_relay_topology_entries_rejected_total",
      Counter,
      () =>
        new Counter({
          name: "mmgate_relay_topology_entries_rejected_total",
          help: "Serving topology entries left out of a readiness update because they fail the contract's topology rules",
          registers: [ctx.metrics],
        }),
    );
    registeredMetric(
      ctx.metrics,
      "mmgate_relay_pool_live_workers",
      Gauge,
      () =>
        new Gauge({
          name: "mmgate_relay_pool_live_workers",
          help: "Live workers of each pool as readiness counts them, by where liveness comes from (source: discovery, events)",
          labelNames: ["pool", "source"],
          registers: [ctx.metrics],
          collect(this: Gauge) {
            this.reset();
            for (const pool of relay.allPools()) {
              const view = relay.liveness(pool);
              // No series while the view is not authoritative (UNKNOWN): 0 would read as "known dead".
              if (view.authoritative) this.set({ pool: pool.name, source: view.source }, view.liveWorkers);
            }
          },
        }),
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
        for (const watch of relay.discoveryWatches()) {
          const logger = ctx.logger.child({ pool: watch.pool, etcdPrefix: watch.prefix });
          logger.info({ endpoints: watch.discovery.endpoints }, "pool readiness follows its workers' etcd registrations");
          // Until the prefix is read the pool's entries are UNKNOWN; a run that cannot reach etcd is restarted with backoff.
          ctx.tasks.run(`relay discovery of pool ${watch.pool}`, (signal) => watch.run(signal, { logger, registry: ctx.metrics }));
        }
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
