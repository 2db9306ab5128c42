export {
  checkNatsCredentials,
  natsConnectionOptions,
  natsCredentialFields,
  natsReconnectWaitSchema,
  natsServerProblem,
  natsServersSchema,
  type NatsConnectionSettings,
} from "./connection.js";
