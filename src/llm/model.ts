import type { PreprocessedRequest } from "../../gen/mmgate/llm/v1/request_pb.js";

/**
 * Whether an encode hop sends the request to an Encode worker: not a
 * probe, no encoder_result yet, and at least one non-empty media list.
 */
export function shouldEncode(request: PreprocessedRequest): boolean {
  if (request.isProbe || request.encoderResult !== undefined) return false;
  return Object.values(request.multiModalData).some((list) => list.items.length > 0);
}
