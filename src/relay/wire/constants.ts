/** The relay contract's envelope constants (kv-relay-contract C.1). */

/** `protocol_version` of every response. */
export const RELAY_PROTOCOL_VERSION = 1;
/** ASCII "KVR1", fixed32 at field 127 of every top-level request and response. */
export const RELAY_CONTRACT_MARKER = 0x4b565231;
/** `KvPoolId.identity_version`. */
export const POOL_IDENTITY_VERSION = 1;
/** The ASCII trailer that carries a failure's RelayErrorReason value name. */
export const RELAY_ERROR_REASON_TRAILER = "kv-relay-error-reason";
/** subscriber_id is at most this many UTF-8 bytes (never truncated). */
export const MAX_SUBSCRIBER_ID_BYTES = 128;
/** Every digest identity is exactly this many bytes. */
export const DIGEST_BYTES = 16;
