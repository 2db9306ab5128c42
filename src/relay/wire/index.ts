// The relay contract's envelope, errors and identity messages (kv-relay-contract
// C.1-C.3): shared by the relay service and its consumer.
export { DIGEST_BYTES, MAX_SUBSCRIBER_ID_BYTES, POOL_IDENTITY_VERSION, RELAY_CONTRACT_MARKER, RELAY_ERROR_REASON_TRAILER, RELAY_PROTOCOL_VERSION } from "./constants.js";
export { isRelayError, RELAY_ERROR_REASONS, RelayError, relayErrorCode, relayReasonEnum, relayReasonOf, relayReasonValueName, withRelayReason, type RelayErrorReasonName } from "./errors.js";
export {
  checkContractMarker,
  checkSubscriberId,
  descriptorFromWire,
  descriptorToWire,
  endpointFromWire,
  endpointName,
  endpointToWire,
  poolIdFromWire,
  poolIdToWire,
  poolRolesFromWire,
  producerFromWire,
  producerToWire,
  querySemanticsFromWire,
  querySemanticsToWire,
  registrationFromWire,
  registrationToWire,
  roleFromWire,
  roleToWire,
  WORKER_ROLES,
  type EndpointId,
  type PoolDescriptor,
  type WorkerRoleName,
} from "./identity.js";
export { TOPOLOGY_ERROR_CODES, TopologyError, validateTopologyEntry, type TopologyErrorCode } from "./topology.js";
