/** The test helpers, in one import. */
export * from "./cli.js";
export * from "./clock.js";
export * from "./eventually.js";
export * from "./rejection.js";
export * from "./server.js";
export * from "./split.js";
export * from "./tls.js";
export * from "./etcd.js";
export * from "./nats.js";
export * from "./random.js";
export * from "./metrics.js";
