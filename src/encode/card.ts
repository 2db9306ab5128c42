/**
 * The card an Encode worker registers with, and the gate the hop applies:
 * in the reference an Encode worker is a card with worker_type Encode, no
 * model_type and model_input Tokens, registered for readiness only and
 * reached only through the encoder router. Other registrations under the
 * pool's prefix are not Encode workers and are ignored.
 */
import type { Member } from "../discovery/index.js";

/** The card an Encode worker registers with (the reference's Encode worker card: worker_type Encode, no model_type, model_input Tokens). */
export const ENCODE_WORKER_CARD: Readonly<Record<string, string>> = Object.freeze({ worker_type: "encode", model_type: "", model_input: "tokens" });

/** Why a registered member is not an Encode worker the hop may use; undefined when it is. */
export function notAnEncodeCard(member: Member): string | undefined {
  const type = member.metadata["worker_type"];
  if (type === undefined) return "no worker card";
  if (type.toLowerCase() !== "encode") return `worker_type ${type}`;
  const input = member.metadata["model_input"] ?? "tokens";
  if (input.toLowerCase() !== "tokens") return `model_input ${input}`;
  return undefined;
}

