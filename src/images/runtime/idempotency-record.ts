/**
 * What the shared idempotency store (idempotency-nats.ts) writes: one small
 * JSON record per key, and a completed response as one binary blob split
 * into chunks. Every reader checks sizes before it allocates and validates
 * what it parses: the bucket is shared, so a record may come from another
 * version of mmgate, or be damaged.
 *
 * Record (the value of `r.<id>`, at most MAX_RECORD_BYTES of UTF-8 JSON,
 * `v` 1), by state:
 * - `pending`: a replica claimed the key and runs it (`claim` names the
 *   run, `owner` the replica, `leaseMs` how long a waiting replica lets the
 *   claim go unrefreshed before it takes it over).
 * - `completed`: the response, `size` bytes with SHA-256 `sha256`, in
 *   `chunks` values of `chunkBytes` (the last one shorter) under
 *   `d.<id>.<claim>.<i>`; replayed until `expiresAt`.
 * - `failed`: an error replayed until `expiresAt` (an unknown outcome, or a
 *   response that could not be kept).
 * - `released`: the run of `claim` failed definitely; the key is free (a
 *   new call claims it over this record), and the calls that waited for
 *   that run get its `error`.
 *
 * Response blob: `MIR1`, the header's length (u32, big-endian), the header
 * (the response as JSON with each image's bytes replaced by their length,
 * `dataBytes`, and each failure's error as a StoredError), then the images'
 * bytes one after the other.
 */
import { createHash } from "node:crypto";
import { z } from "zod";
import type { GeneratedImage, ImageFailure, ImageResponse, JsonValue } from "../model.js";
import { ERROR_CODES, ImageError } from "../core/errors.js";

/** Stable codes of IdempotencyRecordError. */
export type IdempotencyRecordErrorCode =
  /** A value, a header or a blob is larger than its limit (or than the reader accepts). */
  | "TOO_LARGE"
  /** Not a record or blob of this format: bad JSON, a missing field, lengths that do not add up. */
  | "MALFORMED"
  /** A record or blob of a version this process does not read. */
  | "UNSUPPORTED_VERSION"
  /** The reassembled response does not have the SHA-256 its record names. */
  | "DIGEST_MISMATCH";

export class IdempotencyRecordError extends Error {
  override readonly name = "IdempotencyRecordError";
  constructor(
    readonly code: IdempotencyRecordErrorCode,
    message: string,
  ) {
    super(message);
  }
}

export const RECORD_VERSION = 1;
/** Largest record value read or written. */
export const MAX_RECORD_BYTES = 64 * 1024;
/** Largest response header (the response without its image bytes). */
const MAX_HEADER_BYTES = 16 * 1024 * 1024;
const BLOB_MAGIC = Buffer.from("MIR1", "ascii");
const BLOB_PREFIX_BYTES = BLOB_MAGIC.byteLength + 4;
/** What a stored error's message and suggestions are cut to, so that an error record always fits. */
const MAX_TEXT_CHARS = 2048;

const jsonObject = z.record(z.string(), z.json());
const sha256Hex = z.string().regex(/^[0-9a-f]{64}$/);
const token = z.string().regex(/^[0-9a-f]{8,64}$/);
const epochMs = z.int().min(0).max(Number.MAX_SAFE_INTEGER);

const storedErrorSchema = z.strictObject({
  code: z.enum(ERROR_CODES),
  message: z.string().max(MAX_TEXT_CHARS),
  retryable: z.boolean(),
  provider: z.string().optional(),
  upstreamRequestId: z.string().optional(),
  details: jsonObject,
  suggestions: z.array(z.string().max(MAX_TEXT_CHARS)).max(16),
});

/** An ImageError as stored (its cause is not: it may hold anything). */
export type StoredError = z.output<typeof storedErrorSchema>;

const recordSchema = z.discriminatedUnion("state", [
  z.strictObject({
    v: z.literal(RECORD_VERSION),
    state: z.literal("pending"),
    fingerprint: sha256Hex,
    claim: token,
    owner: z.string().max(256),
    heartbeatAt: epochMs,
    leaseMs: z.int().min(1),
  }),
  z.strictObject({
    v: z.literal(RECORD_VERSION),
    state: z.literal("completed"),
    fingerprint: sha256Hex,
    claim: token,
    expiresAt: epochMs,
    size: z.int().min(BLOB_PREFIX_BYTES),
    sha256: sha256Hex,
    chunkBytes: z.int().min(1),
    chunks: z.int().min(1),
  }),
  z.strictObject({
    v: z.literal(RECORD_VERSION),
    state: z.literal("failed"),
    fingerprint: sha256Hex,
    expiresAt: epochMs,
    error: storedErrorSchema,
  }),
  z.strictObject({
    v: z.literal(RECORD_VERSION),
    state: z.literal("released"),
    fingerprint: sha256Hex,
    claim: token,
    error: storedErrorSchema,
  }),
]);

type WithoutVersion<R> = R extends unknown ? Omit<R, "v"> : never;
/** A record as the store reads and writes it (without its version). */
export type StoredRecord = WithoutVersion<z.output<typeof recordSchema>>;
export type PendingRecord = Extract<StoredRecord, { state: "pending" }>;
export type CompletedRecord = Extract<StoredRecord, { state: "completed" }>;

const cut = (text: string) => (text.length > MAX_TEXT_CHARS ? `${text.slice(0, MAX_TEXT_CHARS - 1)}…` : text);

export function storedError(error: ImageError): StoredError {
  return {
    code: error.code,
    message: cut(error.message),
    retryable: error.retryable,
    ...(error.provider === undefined ? {} : { provider: error.provider }),
    ...(error.upstreamRequestId === undefined ? {} : { upstreamRequestId: error.upstreamRequestId }),
    details: { ...error.details },
    suggestions: error.suggestions.slice(0, 16).map(cut),
  };
}

export function errorFromStored(stored: StoredError): ImageError {
  return new ImageError(stored.code, stored.message, {
    retryable: stored.retryable,
    ...(stored.provider === undefined ? {} : { provider: stored.provider }),
    ...(stored.upstreamRequestId === undefined ? {} : { upstreamRequestId: stored.upstreamRequestId }),
    details: stored.details as Record<string, JsonValue>,
    suggestions: stored.suggestions,
  });
}

/**
 * The record as stored, within `maxBytes`. An error too large to store
 * whole keeps only its code, a shortened message and `outcome` of its
 * details (what decides how the key is answered), so that an unknown
 * outcome is always recorded.
 */
export function encodeRecord(record: StoredRecord, maxBytes = MAX_RECORD_BYTES): Uint8Array {
  const bytes = Buffer.from(JSON.stringify({ v: RECORD_VERSION, ...record }));
  if (bytes.byteLength <= maxBytes) return bytes;
  if (record.state === "failed" || record.state === "released") {
    const outcome = record.error.details["outcome"];
    const slim: StoredError = {
      code: record.error.code,
      message: record.error.message.slice(0, 512),
      retryable: record.error.retryable,
      details: outcome === undefined ? {} : { outcome },
      suggestions: [],
    };
    const slimmed = Buffer.from(JSON.stringify({ v: RECORD_VERSION, ...record, error: slim }));
    if (slimmed.byteLength <= maxBytes) return slimmed;
  }
  throw new IdempotencyRecordError("TOO_LARGE", `an idempotency record of ${bytes.byteLength} bytes is over ${maxBytes}`);
}

export function decodeRecord(value: Uint8Array): StoredRecord {
  if (value.byteLength > MAX_RECORD_BYTES) throw new IdempotencyRecordError("TOO_LARGE", `an idempotency record of ${value.byteLength} bytes is over ${MAX_RECORD_BYTES}`);
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString("utf8"));
  } catch {
    throw new IdempotencyRecordError("MALFORMED", "an idempotency record is not JSON");
  }
  if (typeof parsed === "object" && parsed !== null && "v" in parsed && parsed.v !== RECORD_VERSION) {
    throw new IdempotencyRecordError("UNSUPPORTED_VERSION", `idempotency record version ${String(parsed.v)} is not ${RECORD_VERSION}`);
  }
  const result = recordSchema.safeParse(parsed);
  if (!result.success) throw new IdempotencyRecordError("MALFORMED", `an idempotency record does not fit its format: ${result.error.issues[0]?.message ?? "invalid"}`);
  const { v: _version, ...record } = result.data;
  return record as StoredRecord;
}

// ---------------------------------------------------------------- responses

const headerSchema = z.looseObject({
  v: z.literal(RECORD_VERSION),
  response: z.looseObject({
    id: z.string(),
    data: z.array(z.looseObject({ dataBytes: z.int().min(0).nullable() })),
    failures: z.array(z.looseObject({ index: z.int(), generationMs: z.number(), error: storedErrorSchema })),
  }),
});

/** The response as one blob (see the file's header). */
export function encodeResponse(response: ImageResponse): Buffer {
  const images: Uint8Array[] = [];
  const data = response.data.map((image) => {
    const { data: bytes, ...rest } = image;
    if (bytes !== undefined) images.push(bytes);
    return { ...rest, dataBytes: bytes === undefined ? null : bytes.byteLength };
  });
  const failures = response.failures.map((failure) => ({ ...failure, error: storedError(failure.error) }));
  const header = Buffer.from(JSON.stringify({ v: RECORD_VERSION, response: { ...response, data, failures } }));
  const prefix = Buffer.alloc(BLOB_PREFIX_BYTES);
  BLOB_MAGIC.copy(prefix);
  prefix.writeUInt32BE(header.byteLength, BLOB_MAGIC.byteLength);
  return Buffer.concat([prefix, header, ...images]);
}

/** The response a blob holds; the images are views of `blob`. */
export function decodeResponse(blob: Uint8Array): ImageResponse {
  const bytes = Buffer.from(blob.buffer, blob.byteOffset, blob.byteLength);
  if (bytes.byteLength < BLOB_PREFIX_BYTES || !bytes.subarray(0, BLOB_MAGIC.byteLength).equals(BLOB_MAGIC)) {
    throw new IdempotencyRecordError(bytes.byteLength >= 4 && bytes.toString("ascii", 0, 3) === "MIR" ? "UNSUPPORTED_VERSION" : "MALFORMED", "not a stored response");
  }
  const headerBytes = bytes.readUInt32BE(BLOB_MAGIC.byteLength);
  if (headerBytes > MAX_HEADER_BYTES) throw new IdempotencyRecordError("TOO_LARGE", `a stored response header of ${headerBytes} bytes is over ${MAX_HEADER_BYTES}`);
  if (headerBytes > bytes.byteLength - BLOB_PREFIX_BYTES) throw new IdempotencyRecordError("MALFORMED", "a stored response is shorter than its header");
  let parsed: unknown;
  try {
    parsed = JSON.parse(bytes.toString("utf8", BLOB_PREFIX_BYTES, BLOB_PREFIX_BYTES + headerBytes));
  } catch {
    throw new IdempotencyRecordError("MALFORMED", "a stored response header is not JSON");
  }
  const header = headerSchema.safeParse(parsed);
  if (!header.success) throw new IdempotencyRecordError("MALFORMED", `a stored response header does not fit its format: ${header.error.issues[0]?.message ?? "invalid"}`);
  let offset = BLOB_PREFIX_BYTES + headerBytes;
  const data = header.data.response.data.map((entry) => {
    const { dataBytes, ...image } = entry;
    if (dataBytes === null) return image as unknown as GeneratedImage;
    if (dataBytes > bytes.byteLength - offset) throw new IdempotencyRecordError("MALFORMED", "a stored response is shorter than its images");
    const view = blob.subarray(offset, offset + dataBytes);
    offset += dataBytes;
    return { ...image, data: view } as unknown as GeneratedImage;
  });
  if (offset !== bytes.byteLength) throw new IdempotencyRecordError("MALFORMED", "a stored response is longer than its images");
  const failures: ImageFailure[] = header.data.response.failures.map((failure) => ({ ...failure, error: errorFromStored(failure.error) }));
  return { ...(header.data.response as unknown as ImageResponse), data, failures };
}

export function sha256Of(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/**
 * How a completed record's blob is laid out, checked before anything is
 * allocated: its size within `maxBytes` (what this reader accepts), and
 * chunk sizes and count that add up to it.
 */
export function checkLayout(record: CompletedRecord, maxBytes: number, maxChunkBytes: number): void {
  if (record.size > maxBytes) throw new IdempotencyRecordError("TOO_LARGE", `a stored response of ${record.size} bytes is over ${maxBytes}`);
  if (record.chunkBytes > maxChunkBytes) throw new IdempotencyRecordError("TOO_LARGE", `stored chunks of ${record.chunkBytes} bytes are over ${maxChunkBytes}`);
  if (record.chunks !== Math.ceil(record.size / record.chunkBytes)) throw new IdempotencyRecordError("MALFORMED", "a stored response's chunk count does not match its size");
}

/** The length chunk `index` of a completed record must have. */
export function chunkLength(record: CompletedRecord, index: number): number {
  return Math.min(record.chunkBytes, record.size - index * record.chunkBytes);
}
