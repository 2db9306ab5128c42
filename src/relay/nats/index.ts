// Router events over NATS: a subscription (core NATS, at most once) or a
// durable JetStream consumer (at least once, replayed on start) that reads
// the reference router's event JSON and hands each event to the relay.
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
export {
  EventKeyWindow,
  JETSTREAM_DEFAULTS,
  JetStreamSourceError,
  jetStreamConfigSchema,
  jetStreamMetrics,
  MAX_ACK_PENDING_LIMIT,
  MAX_DEDUPE_WINDOW,
  routerEventMessageId,
  type JetStreamConfig,
  type JetStreamMetrics,
  type JetStreamStats,
} from "./jetstream.js";
