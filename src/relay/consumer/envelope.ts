/**
 * The response envelope every relay message carries (C.1): a consumer
 * rejects a response whose contract marker or protocol version is wrong
 * before it applies anything from it, and holds each stream to the relay
 * identity it started with.
 */
import type { RelayIdentity } from "../../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { RELAY_CONTRACT_MARKER, RELAY_PROTOCOL_VERSION } from "../wire/index.js";
import { ConsumerError } from "./errors.js";

/** A relay process incarnation, as plain values. */
export interface RelayIncarnation {
  readonly drtInstanceId: bigint;
  readonly relayIncarnation: bigint;
}

const hex32 = (value: number): string => `0x${(value >>> 0).toString(16).padStart(8, "0")}`;

/** Marker first (it names the contract), then the version; `what` names the message in the error. */
export function checkResponseEnvelope(message: { readonly contractMarker: number; readonly protocolVersion: number }, what: string): void {
  if (message.contractMarker !== RELAY_CONTRACT_MARKER) {
    throw new ConsumerError("ContractMarker", `${what} carries contract marker ${hex32(message.contractMarker)}, not ${hex32(RELAY_CONTRACT_MARKER)}`, {
      marker: message.contractMarker,
    });
  }
  if (message.protocolVersion !== RELAY_PROTOCOL_VERSION) {
    throw new ConsumerError("ProtocolVersion", `${what} carries protocol version ${message.protocolVersion}, not ${RELAY_PROTOCOL_VERSION}`, {
      version: message.protocolVersion,
    });
  }
}

/**
 * The relay identity of a message, held to `first` when the stream already
 * has one: a different incarnation mid-stream is RelayDrift, a missing one
 * MalformedEnvelope. Returns the identity the stream keeps.
 */
export function checkRelayIdentity(relay: RelayIdentity | undefined, first: RelayIncarnation | undefined, what: string): RelayIncarnation {
  if (relay === undefined) throw new ConsumerError("MalformedEnvelope", `${what} has no relay identity`);
  if (first === undefined) return Object.freeze({ drtInstanceId: relay.drtInstanceId, relayIncarnation: relay.relayIncarnation });
  if (relay.drtInstanceId !== first.drtInstanceId || relay.relayIncarnation !== first.relayIncarnation) {
    throw new ConsumerError(
      "RelayDrift",
      `${what} comes from relay ${relay.drtInstanceId}/${relay.relayIncarnation}, the stream started with ${first.drtInstanceId}/${first.relayIncarnation}`,
      { drtInstanceId: relay.drtInstanceId, relayIncarnation: relay.relayIncarnation },
    );
  }
  return first;
}
