import { create } from "@bufbuild/protobuf";
import type { ContextValues, ServiceImpl } from "@connectrpc/connect";
import * as caps from "../../gen/mmgate/images/v1/capabilities_pb.js";
import * as svc from "../../gen/mmgate/images/v1/image_service_pb.js";
import type { ImageRequest, ImageResponse, ProviderEvent } from "./model.js";
import type { ImageRuntime } from "./runtime/runtime.js";
import { callerKey, callerLabelKey, requestIdOf } from "../server/index.js";
import { BoundedQueue } from "../util/index.js";
import { capabilitiesToProto, requestFromProto, responseToProto } from "./proto-convert.js";
import type { ProviderEventSink } from "./core/provider.js";
import { prepareRoutes, runRoutes, type RoutedRequest } from "./runtime/fallback.js";
import {
  IDEMPOTENCY_REPLAYED_HEADER,
  requestFingerprint,
  scopeOf,
  withHeaderKey,
  type IdempotencyStore,
} from "./runtime/idempotency.js";
import type { ImageQuotas } from "./quota/quotas.js";

export interface ImageServiceOptions {
  /** Absent: idempotency keys are validated but every call runs. In memory or shared (idempotency-nats.ts). */
  readonly idempotency?: IdempotencyStore;
  /** Absent: no call is charged (quota/quotas.ts). */
  readonly quotas?: ImageQuotas;
}

/** Work run for an idempotency key belongs to no caller: only its deadline and shutdown end it. */
const DETACHED = new AbortController().signal;

interface CallContext {
  readonly signal: AbortSignal;
  readonly requestHeader: Headers;
  readonly responseHeader: Headers;
  readonly values: ContextValues;
}

/** Charges the call to its caller's quota; throws `quota_exceeded`. */
async function chargeQuota(options: ImageServiceOptions, request: ImageRequest, ctx: CallContext): Promise<void> {
  await options.quotas?.charge(ctx.values.get(callerKey), ctx.values.get(callerLabelKey), request.parameters.n);
}

/**
 * Runs a prepared request through its routes (fallback.ts), once per
 * idempotency key when the request has one and a store is configured.
 * The caller's quota is charged when the work runs, so that a replayed or
 * joined call costs nothing. `admitted` hears when the call is past both:
 * charged and running, or answered by the store (replay, join).
 */
async function runOnce(
  runtime: ImageRuntime,
  options: ImageServiceOptions,
  request: ImageRequest,
  routed: RoutedRequest,
  ctx: CallContext,
  requestId: string,
  events?: ProviderEventSink,
  admitted: () => void = () => undefined,
): Promise<ImageResponse> {
  const policy = request.routing.fallbackPolicy ?? "on_unavailable";
  const withEvents = events ? { events } : {};
  const key = request.idempotencyKey;
  if (key === undefined || !options.idempotency) {
    await chargeQuota(options, request, ctx);
    admitted();
    return runRoutes(runtime, routed, policy, { requestId, signal: ctx.signal, ...withEvents });
  }
  // A refusal inside the work is a failure that never ran: the store forgets the key, and a retry runs.
  const work = async () => {
    await chargeQuota(options, request, ctx);
    admitted();
    return runRoutes(runtime, routed, policy, { requestId, signal: DETACHED, ...withEvents });
  };
  const result = await options.idempotency.run(scopeOf(ctx.requestHeader), key, requestFingerprint(request), ctx.signal, work, (answer) => {
    if (answer === "replayed" || answer === "joined") admitted();
  });
  if (result.replayed) ctx.responseHeader.set(IDEMPOTENCY_REPLAYED_HEADER, "true");
  return result.response;
}

/** Stream events buffered between the provider and a slow client. */
const STREAM_BUFFER = 4;

type StreamEvent = svc.GenerateStreamResponse["event"];

function streamEventOf(event: ProviderEvent): StreamEvent | undefined {
  switch (event.type) {
    case "progress":
      return { case: "progress", value: create(svc.ProgressSchema, { index: event.index ?? 0, stage: event.stage }) };
    case "partial_image":
      return {
        case: "partialImage",
        value: create(svc.PartialImageSchema, { index: event.index, partialIndex: event.partialIndex, image: event.image }),
      };
    case "started":
    case "completed":
      // The service sends its own.
      return undefined;
  }
}

/**
 * mmgate.images.v1.ImageService over an ImageRuntime. Handlers throw
 * ImageError; the module's error mapper turns it into the status.
 */
export function imageService(
  runtime: ImageRuntime,
  drainSignal: AbortSignal,
  options: ImageServiceOptions = {},
): Partial<ServiceImpl<typeof svc.ImageService>> {
  return {
    async listProviders() {
      const registry = runtime.registry;
      return create(svc.ListProvidersResponseSchema, {
        defaultProvider: registry.defaultProvider,
        providers: registry.list().map((entry) => {
          const d = entry.provider.descriptor();
          return create(caps.ProviderDescriptorSchema, {
            name: entry.name,
            displayName: d.displayName,
            version: d.version,
            experimental: d.experimental,
            models: [...d.models],
            default: entry.name === registry.defaultProvider,
            circuitState: entry.breaker.snapshot().state,
          });
        }),
      });
    },

    async getCapabilities(req) {
      const capabilities = await runtime.capabilities(req.provider || undefined, req.model || undefined);
      return create(svc.GetCapabilitiesResponseSchema, { capabilities: capabilitiesToProto(capabilities) });
    },

    async generate(req, ctx) {
      const request = withHeaderKey(requestFromProto(req.request, runtime.limits), ctx.requestHeader);
      const response = await runOnce(runtime, options, request, prepareRoutes(runtime, request), ctx, requestIdOf(ctx));
      return create(svc.GenerateResponseSchema, { response: responseToProto(response, request.responseFormat) });
    },

    async *generateStream(req, ctx) {
      const requestId = requestIdOf(ctx);
      // An invalid request fails before `started`.
      const request = withHeaderKey(requestFromProto(req.request, runtime.limits), ctx.requestHeader);
      const routed = prepareRoutes(runtime, request);
      // The provider waits while the buffer is full; a client that goes away closes it.
      const queue = new BoundedQueue<StreamEvent>({ maxItems: STREAM_BUFFER });
      // Work for an idempotency key outlives its caller: events then go nowhere, without blocking it.
      const closeQueue = () => queue.close();
      ctx.signal.addEventListener("abort", closeQueue, { once: true });
      const events: ProviderEventSink = async (event) => {
        // While draining, previews are dropped so the result arrives sooner.
        if (drainSignal.aborted && event.type === "partial_image") return;
        const mapped = streamEventOf(event);
        if (mapped) await queue.push(mapped);
      };
      // Events wait in the queue until `started` is out.
      let admit: () => void = () => undefined;
      const admitted = new Promise<void>((resolve) => (admit = resolve));
      // A replayed or joined call streams no previews: started, then completed.
      const execution = runOnce(runtime, options, request, routed, ctx, requestId, events, () => admit()).finally(() => {
        ctx.signal.removeEventListener("abort", closeQueue);
        queue.close();
      });
      execution.catch(() => undefined);
      // A call refused before it runs (its quota, its idempotency key used
      // with another request) fails before `started` too: a status without
      // messages, which the OpenAI-shaped routes answer with its HTTP status.
      await Promise.race([admitted, execution]);
      yield create(svc.GenerateStreamResponseSchema, {
        event: { case: "started", value: create(svc.StartedSchema, { id: requestId, outputs: request.parameters.n }) },
      });
      for await (const event of queue) {
        yield create(svc.GenerateStreamResponseSchema, { event });
      }
      const response = await execution;
      yield create(svc.GenerateStreamResponseSchema, {
        event: {
          case: "completed",
          value: create(svc.CompletedSchema, { response: responseToProto(response, request.responseFormat) }),
        },
      });
    },
  };
}
