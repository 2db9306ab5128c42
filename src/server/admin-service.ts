import type { JsonObject } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import { Code, ConnectError } from "@connectrpc/connect";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { authEnabled } from "./access/index.js";
import type { MmgateConfig } from "./config/index.js";
import { redactedConfig } from "./config/index.js";
import type { HealthRegistry } from "./health.js";
import { ServingStatus } from "./health.js";

export interface AdminState {
  version: string;
  startedAt: number;
  config: MmgateConfig;
  health: HealthRegistry;
  /** Starts the host's graceful shutdown (as SIGTERM does); called after the Drain answer is out. */
  drain: () => void;
}

/** JSON-safe copy: bigint becomes a decimal string, undefined is dropped. */
function toJsonObject(value: Record<string, unknown>): JsonObject {
  return JSON.parse(JSON.stringify(value, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v))) as JsonObject;
}

export { AdminService };

/** mmgate.admin.v1.AdminService over the host's state. */
export function adminService(state: AdminState): Partial<ServiceImpl<typeof AdminService>> {
  // Set by the first Drain: a second one in the same tick is "already draining" too.
  let drainRequested = false;
  return {
    getStatus() {
      return {
        version: state.version,
        uptimeSeconds: (Date.now() - state.startedAt) / 1000,
        draining: state.health.isDraining,
        services: state.health
          .names()
          .filter((name) => name !== "")
          .map((name) => ({ name, status: state.health.get(name) ?? ServingStatus.UNKNOWN })),
      };
    },
    getConfig() {
      return { config: toJsonObject(redactedConfig(state.config)) };
    },
    setServingStatus(req) {
      if (!state.health.has(req.service)) {
        throw new ConnectError(`unknown service "${req.service}"`, Code.NotFound);
      }
      if (state.health.isDraining) {
        throw new ConnectError("the server is draining; its status cannot change", Code.FailedPrecondition);
      }
      state.health.setOperatorServing(req.service, req.serving);
      return { status: state.health.get(req.service) ?? ServingStatus.UNKNOWN };
    },
    drain() {
      // With auth off every client is an admin: stopping the process is
      // not something to leave open by default.
      if (!authEnabled(state.config.auth)) {
        throw new ConnectError(
          "Drain needs auth on: auth.token, auth.keysFile or auth.certificates set (without it any client could stop the server); send SIGTERM instead",
          Code.FailedPrecondition,
        );
      }
      const alreadyDraining = drainRequested || state.health.isDraining;
      drainRequested = true;
      // The answer goes out first: the drain closes connections to new
      // streams, and this call is already one of the streams in flight.
      if (!alreadyDraining) setImmediate(state.drain);
      return { graceMs: state.config.shutdown.graceMs, alreadyDraining };
    },
  };
}
