/**
 * The encode capability's three modules: the Encode worker, the demo token
 * worker and the Encode hop. Their services are built in worker.ts,
 * token-worker.ts and hop.ts; index.ts re-exports what is defined here.
 */
import { EncodeWorkerService } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { TokenWorkerService } from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { EtcdRegistration } from "../discovery/index.js";
import { mediaModule } from "../media/index.js";
import { bindService, defineModule } from "../server/index.js";
import { ENCODE_WORKER_CARD } from "./card.js";
import { createHop, encodeHopConfigSchema, type HopSeams } from "./hop.js";
import { TensorReceiver, type ReceiverSeams } from "./receiver.js";
import { createTokenWorkerService, tokenWorkerConfigSchema } from "./token-worker.js";
import { createEncodeWorkerService, encodeWorkerConfigSchema } from "./worker.js";

/** The `encodeWorker` module: EncodeWorkerService over the media module's pipeline. */
export const encodeWorkerModule = defineModule({
  name: "encodeWorker",
  description: "Encode worker: fetches and decodes a request's media and hands the tensors over by descriptor",
  configSchema: encodeWorkerConfigSchema,
  requires: { media: mediaModule },
  create(ctx) {
    const register = ctx.config.register;
    let registration: EtcdRegistration | undefined;
    return {
      services: [bindService(EncodeWorkerService, createEncodeWorkerService({ config: ctx.config, media: ctx.deps.media, logger: ctx.logger }))],
      async start() {
        if (register === undefined) return;
        // Registered once the routes are live, under the address other processes reach this one at.
        const created = await EtcdRegistration.create({
          ...register,
          address: ctx.advertisedAddress,
          // The card hops admit by (see card.ts).
          metadata: { ...ENCODE_WORKER_CARD, component: register.component, endpoint: register.endpoint },
          logger: ctx.logger,
        });
        registration = created;
        ctx.tasks.run("etcd-registration", (signal) => created.run(signal));
      },
      async drain() {
        // Hops stop picking this worker at once; calls in flight still finish.
        await registration?.revoke().catch((err: unknown) => ctx.logger.warn({ err }, "etcd revoke failed; the key expires with its lease"));
      },
      async close() {
        await registration?.close().catch(() => undefined);
      },
    };
  },
});

/** Points where a test holds or alters the token worker's work (never set in production). */
export type TokenWorkerSeams = ReceiverSeams;

/** The `tokenWorker` module with test seams (tokenWorkerModule has none). */
export function defineTokenWorkerModule(seams: TokenWorkerSeams = {}) {
  return defineModule({
    name: "tokenWorker",
    description: "Demo token worker: reads and verifies the encoder result's tensors, deterministic tokens, a report with a receipt per item",
    configSchema: tokenWorkerConfigSchema,
    create(ctx) {
      const receiver = new TensorReceiver({
        config: ctx.config.receiver,
        logger: ctx.logger,
        metrics: ctx.metrics,
        advertisedAddress: ctx.advertisedAddress,
        localRoutes: ctx.localRoutes,
        seams,
      });
      return {
        services: [bindService(TokenWorkerService, createTokenWorkerService(ctx.config, receiver))],
        close() {
          receiver.close();
        },
      };
    },
  });
}

/** The `tokenWorker` module: a deterministic TokenWorkerService, the demo downstream (and receiver) of the encode hop. */
export const tokenWorkerModule = defineTokenWorkerModule();

/**
 * The `encodeHop` module: EncodeHopService in front of a token worker.
 * Multimodal requests are encoded by an Encode worker (this process's, or
 * a static pool) and forwarded with the encoder result; everything else,
 * and everything the hop cannot encode, is forwarded unchanged.
 */
export const encodeHopModule = defineEncodeHopModule();

/** The `encodeHop` module with test seams (encodeHopModule has none). */
export function defineEncodeHopModule(seams: HopSeams = {}) {
  return defineModule({
    name: "encodeHop",
    description: "The multimodal Encode hop in front of a token worker",
    configSchema: encodeHopConfigSchema,
    create: (ctx) => createHop(ctx, seams),
  });
}
