/**
 * What the server's and the client's wire code share: messages carried as
 * their encoding through a relay.
 */
export { acceptsEncoded, acceptsEncodedKey, EncodedMessage, encodedResponsesKey } from "./encoded-message.js";
