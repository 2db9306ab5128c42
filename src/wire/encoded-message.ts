import type { HandlerContext } from "@connectrpc/connect";
import { createContextKey } from "@connectrpc/connect";

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

/** Client call option (context value): yield a server stream's messages as EncodedMessage. Transports that cannot ignore it. */
export const encodedResponsesKey = createContextKey<boolean>(false, { description: "mmgate: server stream responses as EncodedMessage" });

/** Set on a call whose server path writes an EncodedMessage a handler yields as it is (the lean gRPC path). */
export const acceptsEncodedKey = createContextKey<boolean>(false, { description: "mmgate: the call writes EncodedMessage as it is" });

/** Whether the handler's call writes an EncodedMessage it yields as it is. */
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
