import { ImageError } from "../core/errors.js";
import type { OutputFanoutProvider } from "../fanout/provider.js";
import type { AdmissionGate } from "./admission.js";
import type { CircuitBreaker } from "./circuit-breaker.js";

const PROVIDER_NAME_PATTERN = /^[a-z][a-z0-9-]{0,63}$/;

/** A provider, behind its fan-out decorator, with its own bulkhead and breaker. */
export interface RegisteredProvider {
  readonly name: string;
  readonly provider: OutputFanoutProvider;
  readonly gate: AdmissionGate;
  readonly breaker: CircuitBreaker;
}

/** Immutable, name-ordered set of providers with a default. */
export class ProviderRegistry {
  private readonly entries: ReadonlyMap<string, RegisteredProvider>;

  constructor(
    providers: readonly RegisteredProvider[],
    readonly defaultProvider: string,
  ) {
    const map = new Map<string, RegisteredProvider>();
    for (const entry of [...providers].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) {
      if (!PROVIDER_NAME_PATTERN.test(entry.name)) {
        throw new ImageError("configuration", `provider name ${JSON.stringify(entry.name)} is invalid`);
      }
      if (map.has(entry.name)) throw new ImageError("configuration", `provider ${entry.name} is registered twice`);
      map.set(entry.name, entry);
    }
    if (!map.has(defaultProvider)) {
      throw new ImageError("configuration", `default provider ${defaultProvider} is not registered`);
    }
    this.entries = map;
  }

  list(): RegisteredProvider[] {
    return [...this.entries.values()];
  }

  /** The named provider, or the default when no name is given. */
  resolve(name?: string): RegisteredProvider {
    const entry = this.entries.get(name ?? this.defaultProvider);
    if (!entry) {
      throw new ImageError("configuration", "requested provider is not registered", {
        details: { provider: name ?? "", field: "routing.provider" },
        suggestions: ["Call ListProviders for the registered names."],
      });
    }
    return entry;
  }
}
