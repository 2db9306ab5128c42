import type { FailurePolicy, GeneratedImage, ImageFailure, ImageRequest, ImageResponse, SessionMetadata, Usage } from "../model.js";
import { zeroTimings } from "../model.js";
import { ImageError } from "../core/errors.js";

const WARNING_FANOUT = "emulated_multi_image_fanout";
const WARNING_SEQUENTIAL = "sequential_multi_image_fanout";
const WARNING_PARTIAL_FAILURE = "partial_output_failure";

interface ChunkPlace {
  readonly offset: number;
  readonly count: number;
  /** Includes the permit wait. */
  readonly elapsedMs: number;
}

/** The outcome of one chunk of a fan-out batch: its response, or its error. */
export type ChunkResult =
  | (ChunkPlace & { readonly ok: true; readonly response: ImageResponse })
  | (ChunkPlace & { readonly ok: false; readonly error: ImageError });

/** Marks `index` in `seen`; false when it is out of range or seen before. */
function markOnce(seen: Uint8Array, index: number): boolean {
  if (!Number.isInteger(index) || index < 0 || index >= seen.length || seen[index] !== 0) return false;
  seen[index] = 1;
  return true;
}

/** Whether a chunk's data and failures cover exactly 0..count, each once. */
function coversExactly(response: ImageResponse, count: number): boolean {
  if (response.data.length + response.failures.length !== count) return false;
  if (count === 1) return (response.data[0] ?? response.failures[0])!.index === 0;
  const seen = new Uint8Array(count);
  for (const image of response.data) if (!markOnce(seen, image.index)) return false;
  for (const failure of response.failures) if (!markOnce(seen, failure.index)) return false;
  return true;
}

function checkChunkIndices(response: ImageResponse, offset: number, count: number): void {
  if (!coversExactly(response, count)) {
    throw new ImageError("protocol", "fan-out subrequest returned an invalid output set", {
      details: { output_offset: offset },
    });
  }
}

function addOptional(left: number | undefined, right: number | undefined): number | undefined {
  if (left === undefined && right === undefined) return undefined;
  return Math.min(Number.MAX_SAFE_INTEGER, (left ?? 0) + (right ?? 0));
}

function mergeUsage(target: Usage, next: Usage): Usage {
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
function mergeSessions(responses: readonly ImageResponse[]): SessionMetadata | undefined {
  const first = responses[0]?.session;
  if (!first) return undefined;
  const agree = responses.every(
    (response) => response.session !== undefined && response.session.key === first.key && response.session.threadId === first.threadId,
  );
  return agree ? { ...first } : undefined;
}

/**
 * Merges chunk results (in offset order) into one response, or the error
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
    if (result.ok) {
      const response = result.response;
      checkChunkIndices(response, result.offset, result.count);
      for (const image of response.data) {
        image.index += result.offset;
        image.generationMs ??= result.elapsedMs;
      }
      for (const failure of response.failures) failure.index += result.offset;
      successful.push(response);
    } else {
      const error = result.error;
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
  const data: GeneratedImage[] = [];
  for (const response of successful) {
    for (const image of response.data) data.push(image);
    for (const failure of response.failures) failures.push(failure);
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
