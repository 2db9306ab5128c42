// Router events over NATS: a subscription that reads the reference router's
// event JSON and hands each event to the relay.
export {
  NatsEventSource,
  NatsSourceError,
  natsSourceConfigSchema,
  natsSourceMetrics,
  type NatsEventSourceOptions,
  type NatsEventSourceStats,
  type NatsSourceConfig,
  type NatsSourceConfigInput,
  type NatsSourceMetrics,
  type RouterEventSink,
} from "./source.js";
