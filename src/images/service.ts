import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import * as caps from "../../gen/mmgate/images/v1/capabilities_pb.js";
import * as svc from "../../gen/mmgate/images/v1/image_service_pb.js";
import type { ProviderEvent } from "./model.js";
import type { ImageRuntime } from "./runtime/runtime.js";
import { requestIdOf } from "../server/index.js";
import { BoundedQueue } from "../util/index.js";
import { capabilitiesToProto, requestFromProto, responseToProto } from "./proto-convert.js";

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
export function imageService(runtime: ImageRuntime, drainSignal: AbortSignal): Partial<ServiceImpl<typeof svc.ImageService>> {
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
      const request = requestFromProto(req.request, runtime.limits);
      const response = await runtime.execute(request, { requestId: requestIdOf(ctx), signal: ctx.signal });
      return create(svc.GenerateResponseSchema, { response: responseToProto(response, request.responseFormat) });
    },

    async *generateStream(req, ctx) {
      const requestId = requestIdOf(ctx);
      // An invalid request fails before `started`.
      const prepared = runtime.prepare(requestFromProto(req.request, runtime.limits));
      const request = prepared.request;
      yield create(svc.GenerateStreamResponseSchema, {
        event: { case: "started", value: create(svc.StartedSchema, { id: requestId, outputs: request.parameters.n }) },
      });
      // The provider waits while the buffer is full; a client that goes away closes it.
      const queue = new BoundedQueue<StreamEvent>({ maxItems: STREAM_BUFFER });
      const execution = runtime
        .run(prepared, {
          requestId,
          signal: ctx.signal,
          events: async (event) => {
            // While draining, previews are dropped so the result arrives sooner.
            if (drainSignal.aborted && event.type === "partial_image") return;
            const mapped = streamEventOf(event);
            if (mapped) await queue.push(mapped);
          },
        })
        .finally(() => queue.close());
      execution.catch(() => undefined);
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
