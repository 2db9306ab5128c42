import type {
  FailurePolicy,
  ImageFailure,
  ImageRequest,
  ImageResponse,
  SessionMetadata,
  Usage,
} from "../contract/types.js";
import { zeroTimings } from "../contract/types.js";
import { ImageError } from "../core/errors.js";

export const WARNING_FANOUT = "emulated_multi_image_fanout";
export const WARNING_SEQUENTIAL = "sequential_multi_image_fanout";
export const WARNING_PARTIAL_FAILURE = "partial_output_failure";

/** The outcome of one chunk of a fan-out batch. */
export interface ChunkResult {
  readonly offset: number;
  readonly count: number;
  /** Includes the permit wait. */
  readonly elapsedMs: number;
  readonly response?: ImageResponse;
  readonly error?: ImageError;
}

function checkChunkIndices(response: ImageResponse, offset: number, count: number): void {
  const indices = [...response.data.map((image) => image.index), ...response.failures.map((failure) => failure.index)];
  indices.sort((a, b) => a - b);
  const exact = indices.length === count && indices.every((index, position) => index === position);
  if (!exact) {
    throw new ImageError("protocol", "fan-out subrequest returned an invalid output set", {
      details: { output_offset: offset },
    });
  }
}

function addOptional(left: number | undefined, right: number | undefined): number | undefined {
  if (left === undefined && right === undefined) return undefined;
  return Math.min(Number.MAX_SAFE_INTEGER, (left ?? 0) + (right ?? 0));
}

export function mergeUsage(target: Usage, next: Usage): Usage {
  const merged: Usage = { provider: { ...target.provider } };
  const input = addOptional(target.inputTokens, next.inputTokens);
  const output = addOptional(target.outputTokens, next.outputTokens);
  const total = addOptional(target.totalTokens, next.totalTokens);
  if (input !== undefined) merged.inputTokens = input;
  if (output !== undefined) merged.outputTokens = output;
  if (total !== undefined) merged.totalTokens = total;
  for (const [key, value] of Object.entries(next.provider)) {
    merged.provider[key] = Math.min(Number.MAX_SAFE_INTEGER, (merged.provider[key] ?? 0) + value);
  }
  return merged;
}

/** The first session, kept only when every response carries the same one. */
export function mergeSessions(responses: readonly ImageResponse[]): SessionMetadata | undefined {
  const first = responses[0]?.session;
  if (!first) return undefined;
  const agree = responses.every(
    (response) => response.session !== undefined && response.session.key === first.key && response.session.threadId === first.threadId,
  );
  return agree ? { ...first } : undefined;
}

/**
 * Merges chunk results (sorted by offset) into one response, or the error
 * that stands for the batch.
 */
export function aggregateChunks(
  request: ImageRequest,
  requestId: string,
  failurePolicy: FailurePolicy,
  results: readonly ChunkResult[],
  elapsedMs: number,
): ImageResponse {
  const successful: ImageResponse[] = [];
  const failures: ImageFailure[] = [];
  for (const result of results) {
    if (result.response) {
      const response = result.response;
      checkChunkIndices(response, result.offset, result.count);
      for (const image of response.data) {
        image.index += result.offset;
        image.generationMs ??= result.elapsedMs;
      }
      for (const failure of response.failures) failure.index += result.offset;
      successful.push(response);
    } else {
      const error = result.error ?? new ImageError("internal", "fan-out chunk ended without a result");
      for (let index = result.offset; index < result.offset + result.count; index += 1) {
        failures.push({ index, error: error.withDetail("output_index", index), generationMs: result.elapsedMs });
      }
    }
  }

  const first = successful[0];
  if (!first) {
    const base = failures[0]?.error ?? new ImageError("upstream", "all fan-out outputs failed");
    throw base.withDetail("all_outputs_failed", true).withDetail("failed_outputs", request.parameters.n);
  }
  if (successful.some((response) => response.provider !== first.provider || response.model !== first.model)) {
    throw new ImageError("protocol", "fan-out provider identity changed within one batch");
  }

  const warnings = new Set<string>([WARNING_FANOUT]);
  if (request.policies.batchExecution === "sequential") warnings.add(WARNING_SEQUENTIAL);
  let usage: Usage | undefined;
  let revisedPrompt: string | undefined;
  const session = mergeSessions(successful);
  const data = [];
  for (const response of successful) {
    data.push(...response.data);
    failures.push(...response.failures);
    for (const warning of response.warnings) warnings.add(warning);
    if (revisedPrompt === undefined && response.revisedPrompt !== undefined && response.revisedPrompt !== "") {
      revisedPrompt = response.revisedPrompt;
    }
    if (response.usage) usage = mergeUsage(usage ?? { provider: {} }, response.usage);
  }
  data.sort((a, b) => a.index - b.index);
  failures.sort((a, b) => a.index - b.index);
  if (failures.length > 0) {
    if (failurePolicy !== "best_effort") {
      throw new ImageError("protocol", "fan-out provider returned partial failures under fail-fast policy");
    }
    warnings.add(WARNING_PARTIAL_FAILURE);
  }

  const response: ImageResponse = {
    id: requestId,
    created: Math.floor(Date.now() / 1000),
    provider: first.provider,
    model: first.model,
    requested: { ...request.parameters },
    effective: { ...request.parameters },
    normalizations: [],
    data,
    failures,
    timings: { ...zeroTimings(), providerMs: elapsedMs, totalMs: elapsedMs },
    warnings: [...warnings].sort(),
  };
  if (revisedPrompt !== undefined) response.revisedPrompt = revisedPrompt;
  if (usage) response.usage = usage;
  if (session) response.session = session;
  return response;
}
