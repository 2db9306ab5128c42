/**
 * The numbers of the envelope gRPC, gRPC-Web and Connect streams put before
 * every message, and the sizes at which the server's and the client's wire
 * code change how they write one.
 */

/** An envelope's header: one flags byte and a big-endian u32 length. */
export const ENVELOPE_HEADER_BYTES = 5;

/** The message is compressed with the stream's encoding (every protocol). */
export const FLAG_COMPRESSED = 0x01;
/** Connect streaming: the envelope is the end-of-stream message (the status, as JSON). */
export const FLAG_END_STREAM = 0x02;
/** gRPC-Web: the envelope holds the trailers (the status, as HTTP header lines). */
export const FLAG_TRAILERS = 0x80;

/** Messages up to this size are copied behind their header into one write (one DATA frame); larger ones are written as they are. */
export const COPY_MAX_BYTES = 16 * 1024;

/** A top-level bytes field from this size on is written from its own buffer, not copied into the message's (message-chunks.ts). */
export const CHUNKED_MIN_BYTES = 64 * 1024;
