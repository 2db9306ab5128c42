/**
 * The router as a host module: mirrors every pool of the configured relays
 * (one RelayConsumer per relay, each a supervised task) and serves
 * `mmgate.kvrouter.v1.OverlapService` over them. Ready while at least one
 * pool of any relay is ready. `mmgate router --relay HOST:PORT` runs it; it
 * is not one of the modules plain `mmgate serve` knows, since it cannot run
 * without relays.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { OverlapService, PoolReadiness } from "../../../gen/mmgate/kvrouter/v1/kvrouter_pb.js";
import { KvHashError } from "../../kv/index.js";
import { ChannelPool } from "../../rpc/index.js";
import { bindService, ConfigError, defineModule } from "../../server/index.js";
import type { RelayConsumerEvent } from "../consumer/index.js";
import { routerConfigSchema } from "./config.js";
import { RouterMetrics } from "./metrics.js";
import type { RelayStateEvent } from "./relay-state.js";
import { KvRouter, RouterError } from "./router.js";

function routerErrorToConnect(error: unknown): ConnectError | undefined {
  if (error instanceof RouterError || error instanceof KvHashError) return new ConnectError(error.message, Code.InvalidArgument, undefined, undefined, error);
  return undefined;
}

/** What the router module gives other modules and tests. */
export interface RouterModuleExports {
  readonly router: KvRouter;
}

/** Events after which the set of ready pools may have changed. */
const READINESS_EVENTS: ReadonlySet<RelayConsumerEvent["type"]> = new Set(["catalog", "ready", "invalidated", "quarantined", "withdrawn", "subscribing", "stopped"]);

export const routerModule = defineModule({
  name: "router",
  description: "KV overlap router: mirrors the pools of one or more KV relays and serves mmgate.kvrouter.v1.OverlapService over them",
  configSchema: routerConfigSchema.prefault({}),
  mapError: routerErrorToConnect,
  create(ctx) {
    const config = ctx.config;
    if (config.relays.length === 0) throw new ConfigError("router.relays: at least one relay address is needed (mmgate router --relay HOST:PORT)");
    const channels = new ChannelPool(config.channel, { registry: ctx.metrics });
    const logger = ctx.logger;
    /** Per relay, the catalog failure last logged at warn: a relay that stays down is not logged again at every retry. */
    const catalogFailure = new Map<string, string>();
    /** Per relay, the catalog revision last logged (a catalog is resent unchanged on the relay's heartbeat). */
    const loggedRevision = new Map<string, bigint>();
    // Ready while some pool has a ready mirror and is not reported UNAVAILABLE for every model it serves.
    const updateReadiness = () => {
      const ready = router.routablePools() > 0;
      ctx.health.setReady(ready, ready ? undefined : "no KV pool of any relay is ready yet");
    };
    /** Per relay and stream, the failure last logged at warn. */
    const stateFailure = new Map<string, string>();
    /** Per relay, the readiness rejections last logged. */
    const loggedRejections = new Map<string, string>();
    const onStateEvent = (relay: string, event: RelayStateEvent) => {
      switch (event.type) {
        case "readiness": {
          updateReadiness();
          if (stateFailure.delete(`${relay}\0readiness`)) logger.info({ relay }, "relay readiness stream open");
          const rejected = JSON.stringify(event.projection.rejected.map((r) => [r.key, r.code]));
          if (event.projection.rejected.length > 0 && loggedRejections.get(relay) !== rejected) {
            logger.warn({ relay, revision: String(event.projection.revision), rejected: event.projection.rejected }, "relay readiness entries refused by the contract's topology rules; their pools read UNKNOWN");
          }
          loggedRejections.set(relay, rejected);
          return;
        }
        case "load":
          stateFailure.delete(`${relay}\0load`);
          return;
        case "stream-error": {
          if (event.stream === "readiness") updateReadiness();
          const key = `${relay}\0${event.stream}`;
          const text = `${event.error.reason}: ${event.error.message}`;
          const level = stateFailure.get(key) === text ? "debug" : "warn";
          stateFailure.set(key, text);
          logger[level]({ relay, stream: event.stream, reason: event.error.reason, error: event.error.message, retryInMs: event.retryInMs }, `relay ${event.stream} stream failed`);
          return;
        }
      }
    };
    const onEvent = (relay: string, event: RelayConsumerEvent) => {
      metrics.onEvent(relay, event);
      if (READINESS_EVENTS.has(event.type)) updateReadiness();
      switch (event.type) {
        case "catalog":
          if (catalogFailure.delete(relay)) logger.info({ relay }, "relay catalog stream open again");
          if (event.added.length + event.removed.length + event.replaced.length > 0 || (event.rejected.length > 0 && loggedRevision.get(relay) !== event.revision)) {
            loggedRevision.set(relay, event.revision);
            logger.info(
              { relay, revision: String(event.revision), pools: event.pools, added: event.added, removed: event.removed, replaced: event.replaced, rejected: event.rejected },
              "relay catalog changed",
            );
          }
          return;
        case "catalog-error": {
          const text = `${event.error.reason}: ${event.error.message}`;
          const level = catalogFailure.get(relay) === text ? "debug" : "warn";
          catalogFailure.set(relay, text);
          logger[level]({ relay, reason: event.error.reason, error: event.error.message, retryInMs: event.retryInMs }, "relay catalog stream failed");
          return;
        }
        case "ready":
          logger.info({ relay, pool: event.pool, sequence: String(event.sequence) }, "pool mirror ready");
          return;
        case "invalidated":
          logger.warn({ relay, pool: event.pool, reason: event.error.reason, error: event.error.message, retryInMs: event.retryInMs }, "pool mirror invalidated; resubscribing");
          return;
        case "quarantined":
          logger.warn({ relay, pool: event.pool, reason: event.error.reason, error: event.error.message }, "pool quarantined until its producer changes");
          return;
        case "stopped":
          logger.error({ relay, reason: event.error.reason, error: event.error.message }, "relay refused the contract; its consumer stopped");
          return;
        default:
          return;
      }
    };
    const router: KvRouter = new KvRouter({
      relays: config.relays,
      transportOf: (relay) => channels.get(relay),
      subscriberId: config.subscriberId,
      backoff: config.backoff,
      onEvent,
      onConsumer: updateReadiness,
      onStateEvent,
    });
    const metrics: RouterMetrics = new RouterMetrics(ctx.metrics, {
      relays: router.relays,
      pools: () => router.pools(),
      connected: (relay) => router.connected(relay),
      servingState: (view) => router.servingState(view),
      streamConnected: (relay, stream) => {
        const state = router.relayState(relay);
        return stream === "readiness" ? state?.readinessConnected === true : state?.loadConnected === true;
      },
      now: Date.now,
    });
    ctx.health.setReady(false, "no KV pool of any relay is ready yet");
    return {
      services: [
        bindService(OverlapService, {
          overlap(req) {
            const routed = router.route(req.tokens, req.model);
            return {
              pools: routed.pools.map((answer) => ({
                relay: answer.relay,
                dcId: answer.dcId,
                endpoint: answer.endpoint,
                matchedBlocks: answer.matchedBlocks,
                totalBlocks: answer.totalBlocks,
                blockSize: answer.blockSize,
                sequence: answer.sequence,
                canonicalModelId: answer.canonicalModelId,
                readiness: PoolReadiness[answer.readiness],
                ...(answer.load === undefined
                  ? {}
                  : {
                      load: {
                        windowSequence: answer.load.windowSequence,
                        kvUsedBlocks: answer.load.kvUsedBlocks,
                        totalKvBlocks: answer.load.totalKvBlocks,
                        kvObservedRanks: answer.load.kvObservedRanks,
                        kvExpectedRanks: answer.load.kvExpectedRanks,
                      },
                    }),
              })),
              excluded: routed.excluded.map((pool) => ({
                relay: pool.relay,
                dcId: pool.dcId,
                endpoint: pool.endpoint,
                canonicalModelId: pool.canonicalModelId,
                readiness: PoolReadiness[pool.readiness],
                detail: pool.detail,
              })),
            };
          },
        }),
      ],
      exports: { router } satisfies RouterModuleExports,
      start() {
        for (const relay of router.relays) ctx.tasks.run(`relay consumer ${relay}`, (signal) => router.runRelay(relay, signal));
      },
      async close() {
        await channels.close();
      },
    };
  },
});
