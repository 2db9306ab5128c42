import type { HandlerContext } from "@connectrpc/connect";
import { Code, ConnectError, createContextKey } from "@connectrpc/connect";
import { envelopeLengthAt, writeLimitError } from "./envelope.js";
import { ENVELOPE_HEADER_BYTES } from "./protocol.js";

/**
 * A message's binary encoding, carried in place of the message itself where
 * both ends of a relay agree to: a server stream read with
 * `encodedResponses` set yields these instead of parsed messages, and a
 * handler whose call `acceptsEncoded` may yield them, to be written as they
 * are. A hop that passes a downstream's output on unchanged then neither
 * parses nor serializes it; the bytes must be a valid encoding of the
 * method's output type (for a relay: a message of the same wire shape).
 */
export class EncodedMessage {
  constructor(readonly bytes: Uint8Array) {}
}

/**
 * Whole gRPC length-prefixed messages (flags 0, uncompressed), back to back,
 * as they arrived on a response stream: `count` frames in `bytes`. A relay
 * whose two ends speak gRPC with messages of the same wire shape passes them
 * on with one write per run instead of one per message, parsing, copying and
 * framing nothing (the lean client yields them when asked with
 * `framedResponsesKey`; the lean gRPC path writes them as they are).
 */
export class EncodedFrames {
  constructor(
    readonly bytes: Uint8Array,
    readonly count: number,
  ) {}
}

/**
 * Checks that `frames` is whole frames, each message within `writeMaxBytes`
 * (writeLimitError as for one message), before any of it is written.
 */
export function checkFrames(frames: EncodedFrames, writeMaxBytes: number): void {
  const bytes = frames.bytes;
  let at = 0;
  let count = 0;
  while (at + ENVELOPE_HEADER_BYTES <= bytes.length) {
    const length = envelopeLengthAt(bytes, at);
    if (length > writeMaxBytes) throw writeLimitError(length, writeMaxBytes);
    at += ENVELOPE_HEADER_BYTES + length;
    count += 1;
  }
  if (at !== bytes.length || count !== frames.count) throw new ConnectError(`relayed frames are not ${frames.count} whole messages`, Code.Internal);
}

/** Client call option (context value): yield a server stream's messages as EncodedFrames, runs of whole frames as they arrived. Transports that cannot ignore it. */
export const framedResponsesKey = createContextKey<boolean>(false, { description: "mmgate: server stream responses as EncodedFrames" });

/** Client call option (context value): yield a server stream's messages as EncodedMessage. Transports that cannot ignore it. */
export const encodedResponsesKey = createContextKey<boolean>(false, { description: "mmgate: server stream responses as EncodedMessage" });

/** Set on a call whose server path writes an EncodedMessage or EncodedFrames a handler yields as it is (the lean gRPC path). */
export const acceptsEncodedKey = createContextKey<boolean>(false, { description: "mmgate: the call writes EncodedMessage as it is" });

/** Whether the handler's call writes an EncodedMessage or EncodedFrames it yields as it is. */
export function acceptsEncoded(ctx: HandlerContext): boolean {
  return ctx.values.get(acceptsEncodedKey);
}

/**
 * Set by the lean gRPC path on a call with one request message: that
 * message's encoding as it arrived. A hop that passes the request on
 * unchanged to a method of the same input wire shape sends these bytes
 * (as an EncodedMessage) instead of serializing the parsed message again.
 */
export const requestEncodingKey = createContextKey<Uint8Array | undefined>(undefined, { description: "mmgate: the request message's encoding as it arrived" });

/** The handler's request message as it arrived, where the path keeps it (the lean gRPC path); undefined elsewhere. */
export function requestEncoding(ctx: HandlerContext): Uint8Array | undefined {
  return ctx.values.get(requestEncodingKey);
}

/** A client stream's request messages that can be read as their encoding (EncodedMessage) instead of parsed. */
export interface EncodedRequests {
  /** From the next message on, yield each as EncodedMessage. */
  readEncoded(): void;
}

/** Set by the lean gRPC path on a client-streaming call: its request stream (see readsEncodedRequests). */
export const encodedRequestsKey = createContextKey<EncodedRequests | undefined>(undefined, { description: "mmgate: a client stream whose messages can come as their encoding" });

/**
 * Asks the handler's call for its request messages as their encoding
 * (EncodedMessage: a view of what arrived, unparsed), for a handler that
 * decodes them itself; call it before reading the first. True when they
 * will come so (a client stream on the lean gRPC path); false when they
 * come parsed as usual (connect's handler, any other protocol), and the
 * handler reads them as messages.
 */
export function readsEncodedRequests(ctx: HandlerContext): boolean {
  const requests = ctx.values.get(encodedRequestsKey);
  if (requests === undefined) return false;
  requests.readEncoded();
  return true;
}
