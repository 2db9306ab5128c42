// The KV relay's publication side: the CBI1 codec that carries the Cuckoo
// filter across datacenters (cbi1/), and the per-pool hub that fans its
// frames out to subscribers (hub/).
export * from "./cbi1/index.js";
export * from "./hub/index.js";
