import type { DescMessage } from "@bufbuild/protobuf";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { serializeChunked } from "./message-chunks.js";
import { CHUNKED_MIN_BYTES } from "./protocol.js";

/**
 * A message's protobuf binary encoding as the lean path and the lean client
 * write it: one buffer, or, when a top-level bytes field holds
 * CHUNKED_MIN_BYTES or more, chunks that concatenate to it, the field's
 * buffer among them uncopied (message-chunks.ts). A failure is connect's
 * INTERNAL "serialize binary".
 */
export function serializeMessage(desc: DescMessage, message: unknown): Uint8Array | Uint8Array[] {
  try {
    return serializeChunked(desc, message as Record<string, unknown>, CHUNKED_MIN_BYTES) ?? toBinary(desc, message as never);
  } catch (e) {
    throw new ConnectError(`serialize binary: ${e instanceof Error ? e.message : String(e)}`, Code.Internal);
  }
}

/** The size of what serializeMessage gave. */
export function byteLengthOf(bytes: Uint8Array | readonly Uint8Array[]): number {
  if (!Array.isArray(bytes)) return (bytes as Uint8Array).byteLength;
  let length = 0;
  for (const part of bytes as readonly Uint8Array[]) length += part.byteLength;
  return length;
}

/** A `desc` message from its binary encoding; a failure is connect's INTERNAL "parse binary". */
export function parseMessage(desc: DescMessage, bytes: Uint8Array): unknown {
  try {
    return fromBinary(desc, bytes);
  } catch (e) {
    throw new ConnectError(`parse binary: ${e instanceof Error ? e.message : String(e)}`, Code.Internal);
  }
}
