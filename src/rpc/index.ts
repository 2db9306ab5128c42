/**
 * Outbound gRPC: channels to HOST:PORT targets (h2c or TLS) with deadline
 * and request-id propagation and client metrics, a pool of them keyed by
 * target, the round-robin picker, the in-process transport, and the option
 * helpers of the client subcommands.
 */
export { channelConfigSchema, channelDefaults, ChannelConfigError } from "./config.js";
export type { ChannelConfigInput, ChannelOptions } from "./config.js";
export { createChannel, readTokenFile } from "./channel.js";
export type { Channel, ChannelDeps } from "./channel.js";
export { ChannelPool } from "./pool.js";
export { OneMessage } from "./one-message.js";
export type { ChannelFactory } from "./pool.js";
export { RoundRobinPicker } from "./picker.js";
export type { PickerOptions } from "./picker.js";
export { callContextOf, CONTEXT_HEADERS, isPassOnHeaderName, outboundContextValues, passedOnHeaders, withCallContext } from "./context.js";
export type { CallContext } from "./context.js";
export { inProcessTransport } from "./in-process.js";
export type { InProcessOptions } from "./in-process.js";
export {
  addrOption,
  caOption,
  CliError,
  clientCertificateOptions,
  clientTransport,
  connectionContext,
  EXIT,
  exitCodesHelp,
  formatError,
  hasExitCodesHelp,
  ioError,
  parseTimeout,
  plainMessage,
  reportError,
  reportWarning,
  snakeCodeName,
  timeoutOption,
  STATUS_TIMEOUT_MS,
  tlsMismatch,
  tlsOption,
  tokenOption,
  usageError,
  withConnectionOptions,
  withExitCodes,
} from "./cli-options.js";
export type { ConnectionOptions } from "./cli-options.js";
