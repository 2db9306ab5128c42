// The KV relay's publication side: the CBI1 codec that carries the Cuckoo
// filter across datacenters (cbi1/), and the per-pool hub that fans its
// frames out to subscribers (hub/); the publication frames between the
// producer and the wire (frames.ts), and `mmgate cbi1`.
export * from "./cbi1/index.js";
export * from "./hub/index.js";
export { cbi1Command, type Cbi1CliIo } from "./cli.js";
export { encodeDeltaFrame, encodeSnapshot, publishDelta, PublicationFrameError, wireFormat, type PublicationFrameErrorCode, type SnapshotFrames } from "./frames.js";
// The consumer side: per-pool lane mirrors fed from a relay, overlap queries over them.
export * from "./consumer/index.js";
export * from "./wire/index.js";
export * from "./service/index.js";
export * from "./nats/index.js";
export * from "./decoded/index.js";
// The router module (`mmgate router`) and the relay's client commands (`mmgate kv publish`, `mmgate relay`).
export { routerModule } from "./router/index.js";
export { kvPublishCommand, routerEventToWire } from "./publish-cli.js";
export { relayCommand } from "./watch-cli.js";
