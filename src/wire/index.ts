/**
 * What the server's and the client's wire code share: the envelope codec,
 * the protocol's numbers, message (de)serialization with big bytes fields
 * sent uncopied, HTTP/2 header and reset helpers, and messages carried as
 * their encoding through a relay. The lean path (src/server/lean) and the
 * lean client (src/rpc/lean-transport.ts) take these from here, neither
 * from the other.
 */
export {
  acceptsEncoded,
  acceptsEncodedKey,
  checkFrames,
  EncodedFrames,
  EncodedMessage,
  type EncodedRequests,
  encodedRequestsKey,
  encodedResponsesKey,
  framedResponsesKey,
  readsEncodedRequests,
  requestEncoding,
  requestEncodingKey,
} from "./encoded-message.js";
export {
  allocEnvelope,
  compressedEnvelopeError,
  encodeEnvelope,
  EnvelopeReader,
  incompleteEnvelopeError,
  readLimitError,
  writeEnvelope,
  writeLimitError,
  type EnvelopeSink,
} from "./envelope.js";
export { byteLengthOf, parseMessage, serializeMessage } from "./binary.js";
export { serializeChunked } from "./message-chunks.js";
export { incomingHeaderValue, isConnectionHeader, requestHeaderValue, requestHeaderValueKey, webHeadersOf } from "./h2-headers.js";
export { h2ResetError } from "./h2-reset.js";
export { ENVELOPE_HEADER_BYTES, FLAG_COMPRESSED, FLAG_END_STREAM, FLAG_TRAILERS } from "./protocol.js";
