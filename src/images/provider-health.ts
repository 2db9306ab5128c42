import type { ModuleHealth } from "../server/index.js";
import { ServingStatus } from "../server/index.js";
import { delay } from "../util/index.js";
import type { ImageRuntime } from "./runtime/runtime.js";

/** How often the open-to-half-open transition (which is time-based) is noticed. */
const REFRESH_MS = 1000;

/** Health name of one provider: the service name, a slash, the provider name. */
export function providerHealthName(serviceName: string, provider: string): string {
  return `${serviceName}/${provider}`;
}

/**
 * Publishes each provider's circuit in grpc.health.v1 under
 * `mmgate.images.v1.ImageService/<provider>`: NOT_SERVING while its circuit
 * is open, SERVING otherwise. The service's own entry is left to the host
 * and to operators (AdminService.SetServingStatus), so the two never fight.
 * `refresh` publishes at once (after each outcome); `watch` is the module's
 * supervised task that notices the time-based open-to-half-open transition.
 */
export function publishProviderHealth(runtime: ImageRuntime, health: ModuleHealth, serviceName: string): {
  refresh: () => void;
  watch: (signal: AbortSignal) => Promise<void>;
} {
  const refresh = () => {
    for (const entry of runtime.registry.list()) {
      const open = entry.breaker.snapshot().state === "open";
      const name = providerHealthName(serviceName, entry.name);
      const status = open ? ServingStatus.NOT_SERVING : ServingStatus.SERVING;
      if (health.get(name) !== status) health.set(name, status);
    }
  };
  refresh();
  return {
    refresh,
    async watch(signal) {
      for (;;) {
        await delay(REFRESH_MS, signal).catch(() => undefined);
        if (signal.aborted) return;
        refresh();
      }
    },
  };
}
