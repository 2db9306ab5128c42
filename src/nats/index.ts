export {
  checkNatsCredentials,
  natsConnectionOptions,
  natsCredentialFields,
  natsReconnectWaitSchema,
  natsServerProblem,
  natsServersSchema,
  type NatsConnectionSettings,
} from "./connection.js";
export { jetStreamErrorCode, noResponders, streamCreatedMeanwhile } from "./jetstream-errors.js";
