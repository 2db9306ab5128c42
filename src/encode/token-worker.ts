import { create, fromJson, type MessageInitShape } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { z } from "zod";
import { FinishReason_Kind, OutputType, type LLMEngineOutputSchema } from "../../gen/mmgate/llm/v1/output_pb.js";
import type { PreprocessedRequest } from "../../gen/mmgate/llm/v1/request_pb.js";
import {
  GenerateResponseSchema,
  type GenerateRequest,
  type GenerateResponse,
  type TokenWorkerService,
} from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { delay } from "../util/index.js";
import { receiptToJson, receiverConfigSchema, type Receipt, type TensorReceiver } from "./receiver.js";

/** The `tokenWorker` config section; every key defaulted, so `{}` parses. */
export const tokenWorkerConfigSchema = z.strictObject({
  /** Most tokens one request may generate; a larger stop_conditions.max_tokens is capped to it. */
  maxTokens: z.number().int().min(0).max(65_536).default(256),
  /** Tokens generated when the request sets no max_tokens. */
  defaultMaxTokens: z.number().int().min(0).max(65_536).default(8),
  /** Token ids are drawn from [0, vocabSize). */
  vocabSize: z.number().int().min(1).max(2 ** 32 - 1).default(32_000),
  /**
   * Pause before each generated token, standing in for an engine's decode
   * step when trying the system or measuring what the hop adds to a real
   * call; 0 (the default) streams as fast as it can.
   */
  tokenIntervalMs: z.number().int().min(0).max(60_000).default(0),
  /**
   * How the worker receives an encoder result's tensors: reads each from the
   * tensor store its descriptor names, checks its content hash and releases
   * it (docs/encode.md, "The demo token worker as a receiver").
   */
  receiver: receiverConfigSchema.prefault({}),
});

export type TokenWorkerConfig = z.output<typeof tokenWorkerConfigSchema>;

const FNV_OFFSET = 0x811c9dc5;
const FNV_PRIME = 0x01000193;

function fnv1a(hash: number, value: number): number {
  let h = hash;
  for (let shift = 0; shift < 32; shift += 8) {
    h ^= (value >>> shift) & 0xff;
    h = Math.imul(h, FNV_PRIME) >>> 0;
  }
  return h;
}

/** FNV-1a over the prompt token ids: the seed every generated token is derived from. */
function promptSeed(tokenIds: readonly number[]): number {
  let h = FNV_OFFSET;
  h = fnv1a(h, tokenIds.length);
  for (const id of tokenIds) h = fnv1a(h, id);
  return h;
}

/** The token at `position` of a prompt with `seed`: the same prompt always yields the same tokens. */
export function demoToken(seed: number, position: number, vocabSize: number): number {
  return fnv1a(seed, position) % vocabSize;
}

/**
 * What the final output reports: whether the hop attached an encoder
 * result, how many media and encoder-result items there were, and, with an
 * encoder result, one receipt per item.
 */
function mediaReport(request: PreprocessedRequest | undefined, receipts: readonly Receipt[] | undefined) {
  const mediaItems = Object.values(request?.multiModalData ?? {}).reduce((n, list) => n + list.items.length, 0);
  const encoderResult = request?.encoderResult;
  const items = encoderResult?.["items"];
  return {
    encoder_result_present: encoderResult !== undefined,
    media_items: mediaItems,
    encoder_items: Array.isArray(items) ? items.length : 0,
    ...(receipts !== undefined ? { receipts: receipts.map(receiptToJson) } : {}),
  };
}

function output(data: MessageInitShape<typeof LLMEngineOutputSchema>): GenerateResponse {
  return create(GenerateResponseSchema, { output: { data } });
}

/**
 * TokenWorkerService as a deterministic stand-in for an engine: receives
 * the tensors of the request's encoder result first (as an engine reads its
 * embeddings before prefill), then one output per generated token (ids
 * derived from the prompt and the position), then a final output with
 * finish_reason length whose extra_args reports what media and encoder
 * result reached it, with a receipt per item. A probe gets one final output
 * (stop). Without a `receiver`, an encoder result is only counted.
 */
export function createTokenWorkerService(config: TokenWorkerConfig, receiver?: TensorReceiver): ServiceImpl<typeof TokenWorkerService> {
  async function* generate(req: GenerateRequest, ctx: HandlerContext): AsyncGenerator<GenerateResponse> {
    const request = req.request;
    if (request?.isProbe) {
      yield output({ outputType: OutputType.TEXT, finishReason: { kind: FinishReason_Kind.STOP }, index: 0 });
      return;
    }
    // Never throws; every tensor named by the result is released before it resolves.
    const receipts = request?.encoderResult !== undefined && receiver !== undefined ? await receiver.receive(request.encoderResult, ctx) : undefined;
    const requested = request?.stopConditions?.maxTokens ?? config.defaultMaxTokens;
    const count = Math.min(requested, config.maxTokens);
    const seed = promptSeed(request?.tokenIds ?? []);
    for (let position = 0; position < count; position++) {
      if (config.tokenIntervalMs > 0) await delay(config.tokenIntervalMs, ctx.signal);
      ctx.signal.throwIfAborted();
      yield output({ outputType: OutputType.TEXT, tokenIds: [demoToken(seed, position, config.vocabSize)], index: 0 });
    }
    ctx.signal.throwIfAborted();
    yield output({
      outputType: OutputType.TEXT,
      finishReason: { kind: FinishReason_Kind.LENGTH },
      index: 0,
      extraArgs: fromJson(ValueSchema, mediaReport(request, receipts)),
    });
  }
  return { generate };
}
