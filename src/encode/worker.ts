import { hostname } from "node:os";
import { randomBytes } from "node:crypto";
import { create, type JsonObject, type JsonValue, type MessageInitShape } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Logger } from "pino";
import { z } from "zod";
import { EncodeResponseSchema, type EncodeRequest, type EncodeResponse, type EncodeWorkerService } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { TraceLinkSchema, type TraceLink } from "../../gen/mmgate/llm/v1/common_pb.js";
import type { MediaDataDescriptor, MultimodalData } from "../../gen/mmgate/llm/v1/media_pb.js";
import { FinishReason_Kind, OutputType, type AnnotatedOutputSchema } from "../../gen/mmgate/llm/v1/output_pb.js";
import { descriptorToJsonValue, encodeTerminal } from "../llm/index.js";
import type { MediaPipeline } from "../media/index.js";
import { etcdDiscoverySchema } from "../discovery/index.js";
import { inSpan } from "../telemetry/index.js";
import { Semaphore, stringifyJson } from "../util/index.js";

/** The `encodeWorker` config section; every key defaulted, so `{}` parses. */
export const encodeWorkerConfigSchema = z.strictObject({
  /** Most media items one request may carry; a request beyond it gets an error item. */
  maxItemsPerRequest: z.number().int().min(1).max(4096).default(64),
  /** Encode calls worked on at once; more wait (until their deadline or cancellation). */
  maxConcurrentRequests: z.number().int().min(1).max(1024).default(16),
  /**
   * Registers this worker in etcd (under `/mmgate/<namespace>/<component>/<endpoint>/<instanceId>`,
   * with a lease) so that hops watching the pool route to it; revoked first
   * on drain, so traffic moves before the worker stops. Off when absent.
   */
  register: etcdDiscoverySchema
    .extend({
      /** Unique in the pool; the host name and process id by default. */
      instanceId: z
        .string()
        .regex(/^[A-Za-z0-9._-]{1,128}$/, "letters, digits, '.', '_' and '-' only")
        .default(`${hostname().replace(/[^A-Za-z0-9._-]/g, "-").slice(0, 100)}-${process.pid}`),
    })
    .optional(),
});

export type EncodeWorkerConfig = z.output<typeof encodeWorkerConfigSchema>;

/** Version of the encoder_result object this worker writes. */
export const ENCODER_RESULT_SCHEMA_VERSION = 1;

/** One media item of a request, in the order the worker encodes them. */
interface MediaItem {
  readonly modality: string;
  readonly index: number;
  readonly item: MultimodalData;
}

/** Media items by modality in key order, then item order. */
function mediaItems(request: EncodeRequest["request"]): MediaItem[] {
  const items: MediaItem[] = [];
  const byModality = request?.multiModalData ?? {};
  for (const modality of Object.keys(byModality).sort()) {
    byModality[modality]!.items.forEach((item, index) => items.push({ modality, index, item }));
  }
  return items;
}

/** A failure that makes the worker answer with an error item (the hop then falls back). */
class BadMediaError extends Error {
  override readonly name = "BadMediaError";
}

const TRACE_ID = /^[0-9a-f]{32}$/;

/** A new span of this worker, in the caller's trace when the request links one. */
function workerTraceLink(link: TraceLink | undefined): { traceId: string; spanId: string } {
  const traceId = link !== undefined && TRACE_ID.test(link.traceId) && !/^0+$/.test(link.traceId) ? link.traceId : randomBytes(16).toString("hex");
  return { traceId, spanId: randomBytes(8).toString("hex") };
}

/** JSON with u64 values as numbers (handles and sizes the store issues are exact in a double). */
function plainJson(text: string): JsonObject {
  return JSON.parse(text) as JsonObject;
}

function decodedEntry(modality: string, index: number, descriptor: MediaDataDescriptor): JsonObject {
  return {
    modality,
    index,
    content_hash: descriptor.contentHash ?? null,
    shape: descriptor.shape.map((d) => Number(d)),
    dtype: "UINT8",
    descriptor: plainJson(stringifyJson(descriptorToJsonValue(descriptor))),
  };
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function response(output: MessageInitShape<typeof AnnotatedOutputSchema>): EncodeResponse {
  return create(EncodeResponseSchema, { output });
}

export interface EncodeWorkerDeps {
  readonly config: EncodeWorkerConfig;
  readonly media: MediaPipeline;
  readonly logger: Logger;
}

/**
 * EncodeWorkerService: fetches and decodes every media item of a request
 * through the media pipeline, keeps each tensor in the tensor store and
 * answers with one terminal (finish_reason stop, index 0) whose
 * encoder_result lists the items and their transfer descriptors. Media that
 * cannot be fetched or decoded is answered with an error item on a stream
 * that ends normally, so the hop falls back to inline encoding downstream.
 */
export function createEncodeWorkerService(deps: EncodeWorkerDeps): ServiceImpl<typeof EncodeWorkerService> {
  const { config, media, logger } = deps;
  const slots = new Semaphore(config.maxConcurrentRequests);

  async function encodeItems(items: readonly MediaItem[], signal: AbortSignal, stored: bigint[]): Promise<JsonObject[]> {
    const entries: JsonObject[] = [];
    for (const item of items) {
      signal.throwIfAborted();
      // One span per item (tracing on): its fetch, decode and hash are the media pipeline's spans under it.
      const attributes = { "mmgate.media.modality": item.modality, "mmgate.media.index": item.index, "mmgate.media.source": item.item.data.case ?? "none" };
      entries.push(await inSpan("encode.item", attributes, () => encodeItem(item, signal, stored)));
    }
    return entries;
  }

  async function encodeItem({ modality, index, item }: MediaItem, signal: AbortSignal, stored: bigint[]): Promise<JsonObject> {
    const where = `${modality}[${index}]`;
    switch (item.data.case) {
      case "decoded":
        return decodedEntry(modality, index, item.data.value);
      case "url":
      case "rawUrl": {
        const url = item.data.value;
        const decoded = await media.decode({ url }, {}, signal).catch((error: unknown) => {
          if (signal.aborted) throw error;
          throw new BadMediaError(`${where}: ${messageOf(error)}`, { cause: error });
        });
        signal.throwIfAborted();
        const kept = media.store(decoded);
        stored.push(kept.handle);
        const descriptor = plainJson(kept.descriptorJson);
        return {
          modality,
          index,
          content_hash: (descriptor["content_hash"] as JsonValue | undefined) ?? null,
          shape: [...decoded.tensorInfo.shape],
          dtype: decoded.tensorInfo.dtype,
          descriptor,
        };
      }
      default:
        throw new BadMediaError(`${where}: the media item has no data`);
    }
  }

  async function* encode(req: EncodeRequest, ctx: HandlerContext): AsyncGenerator<EncodeResponse> {
    const permit = await slots.acquire(ctx.signal);
    const stored: bigint[] = [];
    let done = false;
    try {
      const items = mediaItems(req.request);
      let entries: JsonObject[];
      try {
        if (items.length > config.maxItemsPerRequest) {
          throw new BadMediaError(`the request has ${items.length} media items, more than the limit of ${config.maxItemsPerRequest}`);
        }
        entries = await encodeItems(items, ctx.signal, stored);
      } catch (error) {
        if (!(error instanceof BadMediaError)) throw error;
        logger.warn({ err: error.cause ?? error }, "encode failed; answering with an error item");
        yield response({
          event: "error",
          comment: [error.message],
          data: { outputType: OutputType.TEXT, finishReason: { kind: FinishReason_Kind.ERROR, errorMessage: error.message }, index: 0 },
        });
        return;
      }
      const terminal = encodeTerminal({ schema_version: ENCODER_RESULT_SCHEMA_VERSION, items: entries });
      terminal.workerTraceLink = create(TraceLinkSchema, workerTraceLink(req.request?.migrationLink));
      done = true;
      yield response({ data: terminal });
    } finally {
      permit.release();
      // Tensors of a request that produced no result have no receiver to release them.
      if (!done) for (const handle of stored) media.tensors.release(handle);
    }
  }

  return { encode };
}
