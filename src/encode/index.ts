// The three modules are defined in module.ts; worker.ts, token-worker.ts and hop.ts build their services.
export { defineTokenWorkerModule, encodeHopModule, encodeWorkerModule, tokenWorkerModule, type TokenWorkerSeams } from "./module.js";
export {
  consumeEncodeStream,
  EncodeHopError,
  EncoderRouter,
  type EncodeBinding,
  type EncodeMember,
  type EncodeTarget,
  type EncoderLifecycle,
  type EncoderRouterOptions,
  type FallbackCause,
  type HopCallOptions,
} from "./router.js";
export {
  createEncodeWorkerService,
  ENCODER_RESULT_SCHEMA_VERSION,
  encodeWorkerConfigSchema,
  type EncodeWorkerConfig,
  type EncodeWorkerDeps,
} from "./worker.js";
export { createTokenWorkerService, demoToken, tokenWorkerConfigSchema, type TokenWorkerConfig } from "./token-worker.js";
export {
  receiptToJson,
  receiverConfigSchema,
  TensorReceiver,
  type InboundCall,
  type Receipt,
  type ReceiptFailure,
  type ReceiverConfig,
  type ReceiverDeps,
  type ReceiverSeams,
} from "./receiver.js";
export { encodeHopConfigSchema, type EncodeHopConfig } from "./hop.js";
export { hopCommand, type HopCliIo } from "./cli.js";
export { ENCODE_WORKER_CARD, notAnEncodeCard } from "./card.js";
export { EncodeMembers, isRefused, memberKey, type CallOutcome, type HealthProbe, type MemberStateName, type MemberView, type OutlierOptions } from "./members.js";
export { ENCODE_LIFECYCLE_HEALTH } from "./hop.js";
