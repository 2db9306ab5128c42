import type { Logger } from "pino";
import type { MmgateConfig } from "./config/index.js";
import type { HealthRegistry } from "./health.js";
import type { RpcMetrics } from "./metrics.js";
import type { ServiceModule } from "./module.js";
import { Server } from "./server.js";

export interface HostOptions {
  config: MmgateConfig;
  /** Every known module; `config.modules` says which of them run. */
  modules: readonly ServiceModule[];
  logger: Logger;
  version: string;
}

/** A running server: its addresses, health, and the way to stop it. */
export interface Host {
  /** Bound gRPC address, `HOST:PORT`. */
  readonly address: string;
  /** Bound admin address, or "" when the admin listener is off. */
  readonly adminAddress: string;
  readonly health: HealthRegistry;
  readonly metrics: RpcMetrics;
  /** Fully qualified names of the services served, reflection and health included. */
  readonly serviceNames: readonly string[];
  readonly startedAt: number;
  readonly config: MmgateConfig;
  /** Drains, waits up to the grace, then closes everything. Idempotent. */
  shutdown(): Promise<void>;
  /** Resolves when shutdown completed. */
  readonly closed: Promise<void>;
}

/**
 * Starts the server (`Server` in server.ts): binds the listener, starts the
 * configured modules, registers their services plus health and reflection,
 * and serves gRPC, gRPC-Web, Connect and the modules' plain HTTP routes on
 * one port: HTTP/2 and HTTP/1.1 both, told apart by the HTTP/2 preface in
 * cleartext and by ALPN over TLS.
 */
export async function startHost(options: HostOptions): Promise<Host> {
  const server = new Server(options);
  await server.start();
  return {
    address: server.address,
    adminAddress: server.adminAddress,
    health: server.health,
    metrics: server.metrics,
    serviceNames: server.serviceNames,
    startedAt: server.startedAt,
    config: server.config,
    closed: server.closed,
    shutdown: () => server.shutdown(),
  };
}
