/**
 * An OpenAI-shaped image API (`/v1/images/generations`, `/v1/images/edits`,
 * and `/v1/models` for the `model` values they take) served on the gRPC
 * port as plain HTTP routes of the images module, each request at most
 * one ImageService call in process. See docs/images.md, "OpenAI-compatible
 * HTTP API".
 */
import type { Registry } from "prom-client";
import { inProcessTransport } from "../../rpc/index.js";
import type { HttpRoute, LocalRoutes } from "../../server/index.js";
import { openAiImageRoutes } from "./routes.js";

export { EDITS_PATH, GENERATIONS_PATH, MODELS_PATH, openAiImageRoutes, type OpenAiRoutesOptions } from "./routes.js";
export { fromRpcError, OpenAiApiError, openAiParamOf, type OpenAiErrorBody } from "./errors.js";
export { editParams, generationParams, type ImageParams } from "./params.js";
export { toImageRequest } from "./request.js";
export { completedEvents, imagesResponseOf, partialImageEvent } from "./response.js";
export { MODEL_CREATED, modelOf, modelsOf, routeForModel, ProviderCatalog, type OpenAiModel } from "./models.js";

export interface OpenAiImageApiOptions {
  /** The host's routes and interceptors (`ctx.localRoutes`): live once the module starts, before any request arrives. */
  readonly localRoutes: LocalRoutes;
  /** Client metrics of the in-process calls go here, as for a channel. */
  readonly metrics: Registry;
  /** Files one edit may upload: `images.limits.maxInputs`. */
  readonly maxInputFiles: number;
}

/**
 * The routes, calling this process's ImageService through an in-process
 * transport with the listener's interceptors (auth, drain, error mapping).
 * The host's message limits are left off it: the body limit applies to the
 * HTTP request, and the answer is JSON, not a gRPC message.
 */
export function openAiImageApi(options: OpenAiImageApiOptions): HttpRoute[] {
  const transport = inProcessTransport({
    routes: options.localRoutes.routes,
    interceptors: options.localRoutes.interceptors,
    registry: options.metrics,
  });
  return openAiImageRoutes({ transport, maxInputFiles: options.maxInputFiles });
}
