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
