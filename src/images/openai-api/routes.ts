/**
 * The routes: `POST /v1/images/generations` (JSON) and `POST
 * /v1/images/edits` (multipart), each read, checked, and run as one
 * ImageService call through the in-process transport, so that auth,
 * admission, validation, fan-out, interceptors and metrics are those of a
 * gRPC client's call; and `GET /v1/models`, `GET /v1/models/{model}`: the
 * `model` values those two accept.
 */
import { randomUUID } from "node:crypto";
import { ConnectError, createClient, type CallOptions, type Client, type Transport } from "@connectrpc/connect";
import { ImageService } from "../../../gen/mmgate/images/v1/image_service_pb.js";
import type { HttpRoute, HttpRouteContext, HttpRouteRequest, HttpRouteResponse } from "../../server/index.js";
import { cancelledOnExit } from "../../util/index.js";
import { fromRpcError, invalidParam, OpenAiApiError } from "./errors.js";
import { headerOf, readJson, sendError, sendJson } from "./http.js";
import { modelIdOf, modelOf, modelsOf, ProviderCatalog, type ResolvedRoute } from "./models.js";
import { readMultipart } from "./multipart.js";
import { editParams, generationParams, type ImageParams, type Operation } from "./params.js";
import { toImageRequest, type ImageRequestInit } from "./request.js";
import { completedEvents, imagesResponseOf, partialImageEvent, requestedSettings } from "./response.js";
import { SseWriter } from "./sse.js";

export const GENERATIONS_PATH = "/v1/images/generations";
export const EDITS_PATH = "/v1/images/edits";
export const MODELS_PATH = "/v1/models";

/** Text fields an edit form may carry, and their size: every known parameter fits, with room for a long prompt. */
const MAX_FORM_FIELDS = 64;
const MAX_FORM_FIELD_BYTES = 1024 * 1024;
/** The host's rule for a usable x-request-id; anything else gets a fresh one. */
const REQUEST_ID = /^[A-Za-z0-9._:@/+=-]{1,128}$/;

export interface OpenAiRoutesOptions {
  /** Reaches this process's ImageService (an in-process transport over the host's routes and interceptors). */
  readonly transport: Transport;
  /** Files one edit may upload (source images and mask together): the service's `limits.maxInputs`. */
  readonly maxInputFiles: number;
  /** Quiet time before an SSE keep-alive comment (default 15 s). */
  readonly heartbeatMs?: number;
}

/**
 * Checks what depends on the route: the provider must do the operation and
 * accept `n`. Returns the partial images to ask for: none unless streaming,
 * and at most what the provider advertises (OpenAI allows fewer than asked).
 */
function partialImagesFor(params: ImageParams, route: ResolvedRoute): number {
  const caps = route.capabilities;
  if (params.operation === "edit" && !caps.edits) {
    throw invalidParam("model", `${route.label} does not edit images; choose a model whose provider does`, "unsupported_operation");
  }
  if (params.operation === "generate" && !caps.generation) {
    throw invalidParam("model", `${route.label} does not generate images from a prompt alone; choose another model`, "unsupported_operation");
  }
  const n = params.n ?? 1;
  const min = caps.count?.min ?? 1;
  const max = caps.count?.max ?? 1;
  if (n < min || n > max) throw invalidParam("n", `n must be between ${min} and ${max} for ${route.label}, not ${n}`);
  return params.stream ? Math.min(params.partialImages, caps.partialImages?.max ?? 0) : 0;
}

class ImagesApi {
  private readonly client: Client<typeof ImageService>;
  private readonly catalog: ProviderCatalog;

  constructor(private readonly options: OpenAiRoutesOptions) {
    this.client = createClient(ImageService, options.transport);
    this.catalog = new ProviderCatalog(this.client);
  }

  private async readParams(operation: Operation, req: HttpRouteRequest, ctx: HttpRouteContext): Promise<ImageParams> {
    if (operation === "generate") return generationParams(await readJson(req, ctx.readMaxBytes, ctx.signal));
    const form = await readMultipart(
      req,
      { maxBytes: ctx.readMaxBytes, maxFiles: this.options.maxInputFiles, maxFields: MAX_FORM_FIELDS, maxFieldBytes: MAX_FORM_FIELD_BYTES },
      ctx.signal,
    );
    return editParams(form.fields, form.files);
  }

  async handle(operation: Operation, req: HttpRouteRequest, res: HttpRouteResponse, ctx: HttpRouteContext): Promise<void> {
    const requestId = requestIdOf(req);
    const authorization = headerOf(req, "authorization");
    const idempotencyKey = headerOf(req, "idempotency-key");
    const answerHeaders: Record<string, string> = { "x-request-id": requestId };
    try {
      const params = await this.readParams(operation, req, ctx);
      const route = await this.catalog.resolve(params.model);
      const request = toImageRequest(params, route.routing, partialImagesFor(params, route));
      // The service reads the caller, the idempotency key and the request id from these, as for a gRPC call.
      const headers: Record<string, string> = { "x-request-id": requestId };
      if (authorization !== undefined) headers["authorization"] = authorization;
      if (idempotencyKey !== undefined) headers["idempotency-key"] = idempotencyKey;
      const call: CallOptions = {
        signal: ctx.signal,
        headers,
        // A retried key's answer says it is a replay, as over gRPC; it arrives before the first stream event.
        onHeader: (header) => {
          const replayed = header.get("idempotency-replayed");
          if (replayed !== null) answerHeaders["idempotency-replayed"] = replayed;
        },
      };
      if (params.stream) {
        await this.stream(params, request, call, res, ctx, answerHeaders, authorization !== undefined);
        return;
      }
      const answer = await this.client.generate({ request }, call);
      if (!answer.response) throw new OpenAiApiError(500, "the image service answered without a response", "server_error", null, "internal");
      sendJson(res, 200, imagesResponseOf(answer.response, params.responseFormat), answerHeaders);
    } catch (error) {
      // A client that went away gets no answer; the host logs the request as cut.
      if (ctx.signal.aborted) return;
      sendError(res, this.apiError(error, ctx, requestId, authorization !== undefined), answerHeaders);
    }
  }

  /**
   * `GET /v1/models` (no `ctx.pathRest`) and `GET /v1/models/{model}`, from
   * the catalog the image routes resolve `model` with, so that what is
   * listed is what they accept.
   */
  async models(req: HttpRouteRequest, res: HttpRouteResponse, ctx: HttpRouteContext): Promise<void> {
    const requestId = requestIdOf(req);
    const authorization = headerOf(req, "authorization");
    const answerHeaders: Record<string, string> = { "x-request-id": requestId };
    try {
      const headers: Record<string, string> = { "x-request-id": requestId };
      if (authorization !== undefined) headers["authorization"] = authorization;
      const list = await this.catalog.providers(headers);
      const body = ctx.pathRest === undefined ? { object: "list", data: modelsOf(list) } : modelOf(modelIdOf(ctx.pathRest), list);
      sendJson(res, 200, body, answerHeaders);
    } catch (error) {
      if (ctx.signal.aborted) return;
      sendError(res, this.apiError(error, ctx, requestId, authorization !== undefined), answerHeaders);
    }
  }

  /** The answer for a failure; anything but our own and the service's errors is a bug, logged and answered without its text. */
  private apiError(error: unknown, ctx: HttpRouteContext, requestId: string, authorizationSent: boolean): OpenAiApiError {
    if (!(error instanceof OpenAiApiError) && !(error instanceof ConnectError)) {
      ctx.logger.error({ err: error, requestId }, "openai images route failed unexpectedly");
      return new OpenAiApiError(500, `internal error (request id ${requestId})`, "server_error", null, "internal");
    }
    const mapped = fromRpcError(error, { authorizationSent });
    if (mapped.status >= 500) ctx.logger.warn({ requestId, status: mapped.status, code: mapped.code, message: mapped.message }, "openai images request failed");
    return mapped;
  }

  /**
   * GenerateStream as server-sent events. The status goes out with the
   * first event (`started`), so a request the service refuses at once
   * still gets its HTTP error status; a failure after that is an `error`
   * event ending the stream.
   */
  private async stream(
    params: ImageParams,
    request: ImageRequestInit,
    call: CallOptions,
    res: HttpRouteResponse,
    ctx: HttpRouteContext,
    answerHeaders: Record<string, string>,
    authorizationSent: boolean,
  ): Promise<void> {
    const sse = new SseWriter(res, ctx.signal, this.options.heartbeatMs !== undefined ? { heartbeatMs: this.options.heartbeatMs } : {});
    const settings = requestedSettings(params);
    let opened = false;
    try {
      let completed = false;
      // Left early (an event that cannot be written), the stream is cancelled: ctx.signal fires only if the client goes.
      for await (const message of cancelledOnExit(call.signal, (signal) => this.client.generateStream({ request }, { ...call, signal }))) {
        if (!opened) {
          sse.open(answerHeaders);
          opened = true;
        }
        const event = message.event;
        if (event.case === "partialImage") {
          const { index, partialIndex, image } = event.value;
          const created = Math.floor(Date.now() / 1000);
          await sse.event(...named(partialImageEvent(params.operation, settings, { index, partialIndex, bytes: image }, created)));
        } else if (event.case === "completed" && event.value.response) {
          for (const done of completedEvents(params.operation, event.value.response)) await sse.event(...named(done));
          completed = true;
        }
      }
      if (!completed) throw new OpenAiApiError(500, "the image stream ended without a result", "server_error", null, "internal");
    } catch (error) {
      if (!opened || ctx.signal.aborted) throw error;
      await sse.error(this.apiError(error, ctx, answerHeaders["x-request-id"] ?? "", authorizationSent));
    } finally {
      if (opened) sse.end();
    }
  }
}

/** The client's x-request-id when it is usable, else a fresh one. */
function requestIdOf(req: HttpRouteRequest): string {
  const given = headerOf(req, "x-request-id");
  return given !== undefined && REQUEST_ID.test(given) ? given : randomUUID();
}

/** An event as (name, data): OpenAI names each SSE event after its `type`. */
function named<T extends { type: string }>(event: T): [string, T] {
  return [event.type, event];
}

/** The OpenAI-shaped image and model routes over an ImageService reached through `options.transport`. */
export function openAiImageRoutes(options: OpenAiRoutesOptions): HttpRoute[] {
  const api = new ImagesApi(options);
  const models: HttpRoute["handle"] = (req, res, ctx) => api.models(req, res, ctx);
  return [
    { method: "POST", path: GENERATIONS_PATH, name: "openai.images.generations", handle: (req, res, ctx) => api.handle("generate", req, res, ctx) },
    { method: "POST", path: EDITS_PATH, name: "openai.images.edits", handle: (req, res, ctx) => api.handle("edit", req, res, ctx) },
    { method: "GET", path: MODELS_PATH, name: "openai.models.list", handle: models },
    // Ids may hold "/" (provider/model), so the route takes everything under the prefix.
    { method: "GET", path: `${MODELS_PATH}/*`, name: "openai.models.retrieve", handle: models },
  ];
}
