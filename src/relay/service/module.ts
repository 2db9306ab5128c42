/**
 * The relay as a host module: `dynamo.kvrelay.v1.KvEventRelay` for remote
 * subscribers and `mmgate.kvevents.v1.KvEventService` for the workers' KV
 * events, over the pools its config declares (one named "default" on the
 * embedded defaults).
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { KvEventRelay } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { KvEventService } from "../../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { Cbi1Service, DecodedRelayService } from "../../../gen/mmgate/kvrelay/v1/cbi1_pb.js";
import { Cbi1Error } from "../cbi1/index.js";
import { cbi1ErrorToConnect, cbi1Service, decodedRelayService } from "../decoded/index.js";
import { bindService, defineModule } from "../../server/index.js";
import { NatsEventSource } from "../nats/index.js";
import { RelayError } from "../wire/index.js";
import { RELAY_ENV, relayConfigSchema } from "./config.js";
import { IngestError, ingestService, type IngestErrorCode } from "./ingest.js";
import { RelayMetrics } from "./metrics.js";
import { Relay } from "./relay.js";
import { relayService } from "./service.js";

const INGEST_CODES: Record<IngestErrorCode, Code> = {
  MissingPool: Code.InvalidArgument,
  PoolMismatch: Code.InvalidArgument,
  TooManyEvents: Code.InvalidArgument,
  PoolNotFound: Code.NotFound,
  StreamLimit: Code.ResourceExhausted,
};

function relayErrorToConnect(error: unknown): ConnectError | undefined {
  if (error instanceof RelayError) return error.toConnectError();
  if (error instanceof IngestError) return new ConnectError(error.message, INGEST_CODES[error.code], undefined, undefined, error);
  if (error instanceof Cbi1Error) return cbi1ErrorToConnect(error);
  return undefined;
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
