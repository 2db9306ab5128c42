// The LLM request/response model of the reference (PreprocessedRequest,
// LLMEngineOutput, FinishReason, Annotated) as mmgate.llm.v1 messages, and
// lossless conversion from and to the reference's JSON.
export {
  PROBE_KEY,
  descriptorFromJson,
  descriptorToJsonValue,
  multimodalDataFromJson,
  multimodalDataToJson,
  preprocessedRequestFromJson,
  preprocessedRequestFromJsonValue,
  preprocessedRequestToJsonValue,
  traceLinkFromJson,
  traceLinkToJson,
} from "./request.js";
export {
  annotatedError,
  annotatedFromJson,
  annotatedFromJsonValue,
  annotatedToJsonValue,
  encodeTerminal,
  finishReasonFromJson,
  finishReasonToJson,
  formatFinishReason,
  llmEngineOutputFromJson,
  llmEngineOutputFromJsonValue,
  llmEngineOutputToJsonValue,
} from "./output.js";
export { shouldEncode } from "./model.js";
