import { createHash } from "node:crypto";

/** Longest sub-request id kept in the readable form. */
const MAX_SUBREQUEST_ID_BYTES = 128;

/**
 * The id of the chunk starting at `offset`: `<id>:output:<offset>`, or
 * `fanout:<32 hex of SHA-256(id)>:<offset>` when that would exceed 128 bytes.
 */
export function subrequestId(requestId: string, offset: number): string {
  const readable = `${requestId}:output:${offset}`;
  if (Buffer.byteLength(readable, "utf8") <= MAX_SUBREQUEST_ID_BYTES) return readable;
  const digest = createHash("sha256").update(requestId, "utf8").digest("hex");
  return `fanout:${digest.slice(0, 32)}:${offset}`;
}

export interface ChunkSpec {
  readonly offset: number;
  readonly count: number;
}

/** Splits [0, total) into consecutive chunks of at most `nativeMax`. */
export function planChunks(total: number, nativeMax: number): ChunkSpec[] {
  const chunks: ChunkSpec[] = [];
  for (let offset = 0; offset < total; ) {
    const count = Math.min(nativeMax, total - offset);
    chunks.push({ offset, count });
    offset += count;
  }
  return chunks;
}
