/**
 * OpenAI's `model` as an ImageService route, the route's effective
 * capabilities, and the `model` values there are (`GET /v1/models`), all
 * read from the service itself (ListProviders, GetCapabilities) and kept
 * for a few seconds: they change only with the configuration, and a lookup
 * per request would double the RPCs counted for each image call.
 */
import type { Client } from "@connectrpc/connect";
import type { ProviderCapabilities } from "../../../gen/mmgate/images/v1/capabilities_pb.js";
import type { ImageService, ListProvidersResponse } from "../../../gen/mmgate/images/v1/image_service_pb.js";
import { OpenAiApiError } from "./errors.js";
import type { Routing } from "./request.js";

/** How long a lookup's answer is reused. */
export const CATALOG_TTL_MS = 10_000;
/** A lookup is shared by concurrent requests, so no single caller's signal may end it; this bounds it instead. */
const LOOKUP_TIMEOUT_MS = 10_000;

export interface ResolvedRoute {
  readonly routing: Routing;
  readonly capabilities: ProviderCapabilities;
  /** "provider (model)", for messages. */
  readonly label: string;
}

function modelNotFound(model: string, list: ListProvidersResponse): OpenAiApiError {
  const names = list.providers.flatMap((p) => [p.name, ...p.models.filter((m) => m !== p.name)]);
  const shown = names.slice(0, 20).join(", ");
  return new OpenAiApiError(
    404,
    `model ${JSON.stringify(model)} is not served here; use a provider name, one of its models, or provider/model (${shown}${names.length > 20 ? ", ..." : ""})`,
    "not_found_error",
    "model",
    "model_not_found",
  );
}

/**
 * The route for `model`, in this order: a provider's name (its own model);
 * a model some provider lists (the default provider first, then by name);
 * `provider/model`. Anything else is 404 model_not_found.
 */
export function routeForModel(model: string, list: ListProvidersResponse): Routing {
  const byName = list.providers.find((p) => p.name === model);
  if (byName) return { provider: byName.name };
  const serving = list.providers.filter((p) => p.models.includes(model));
  const chosen = serving.find((p) => p.default) ?? serving[0];
  if (chosen) return { provider: chosen.name, model };
  const slash = model.indexOf("/");
  if (slash > 0) {
    const provider = list.providers.find((p) => p.name === model.slice(0, slash));
    const rest = model.slice(slash + 1);
    if (provider && provider.models.includes(rest)) return { provider: provider.name, model: rest };
  }
  throw modelNotFound(model, list);
}

/**
 * `created` of every listed model: 0, the Unix epoch. When a provider's
 * model was made is not known here, and a constant keeps the answer the
 * same across calls, restarts and instances.
 */
export const MODEL_CREATED = 0;

/** A model as OpenAI's `GET /v1/models` answers it. */
export interface OpenAiModel {
  readonly id: string;
  readonly object: "model";
  readonly created: number;
  /** The provider the id routes to. */
  readonly owned_by: string;
}

/** `id` as OpenAI's model object, or 404 model_not_found: exactly what `routeForModel` accepts. */
export function modelOf(id: string, list: ListProvidersResponse): OpenAiModel {
  const routing = routeForModel(id, list);
  return { id, object: "model", created: MODEL_CREATED, owned_by: routing.provider ?? "mmgate" };
}

/** The model id of `/v1/models/{id}`: the rest of the path, percent-decoded (`provider%2Fmodel` and `provider/model` alike). */
export function modelIdOf(pathRest: string): string {
  try {
    return decodeURIComponent(pathRest);
  } catch {
    throw new OpenAiApiError(404, `model ${JSON.stringify(pathRest)} is not a valid percent-encoded id`, "not_found_error", "model", "model_not_found");
  }
}

/**
 * Every `model` value `routeForModel` accepts, provider by provider: its
 * name, its models, then `provider/model` for each. A model several
 * providers list appears once, owned by the provider it routes to.
 */
export function modelsOf(list: ListProvidersResponse): OpenAiModel[] {
  const ids = new Set<string>();
  for (const provider of list.providers) {
    ids.add(provider.name);
    // An empty model name is no `model` value: an empty `model` means the default provider.
    const models = provider.models.filter((m) => m !== "");
    for (const model of models) ids.add(model);
    for (const model of models) ids.add(`${provider.name}/${model}`);
  }
  ids.delete("");
  return [...ids].map((id) => modelOf(id, list));
}

interface Entry<T> {
  readonly at: number;
  readonly value: Promise<T>;
}

export class ProviderCatalog {
  private readonly entries = new Map<string, Entry<unknown>>();

  constructor(
    private readonly client: Client<typeof ImageService>,
    private readonly ttlMs = CATALOG_TTL_MS,
    private readonly now: () => number = Date.now,
  ) {}

  /** Shares one lookup while it is fresh; a failed lookup is forgotten at once. */
  private cached<T>(key: string, load: () => Promise<T>): Promise<T> {
    const entry = this.entries.get(key) as Entry<T> | undefined;
    if (entry && this.now() - entry.at < this.ttlMs) return entry.value;
    const fresh: Entry<T> = { at: this.now(), value: load() };
    this.entries.set(key, fresh);
    fresh.value.catch(() => {
      if (this.entries.get(key) === fresh) this.entries.delete(key);
    });
    return fresh.value;
  }

  /**
   * The registered providers. ListProviders is a public method whose answer
   * is the same for every caller, so one lookup serves all; `headers`
   * (the caller's authorization and request id) go with the lookup this
   * call makes, if it makes one, as a gRPC client's call would carry them.
   */
  providers(headers?: Readonly<Record<string, string>>): Promise<ListProvidersResponse> {
    return this.cached("providers", () => this.client.listProviders({}, { timeoutMs: LOOKUP_TIMEOUT_MS, ...(headers ? { headers } : {}) }));
  }

  private capabilitiesOf(routing: Routing): Promise<ProviderCapabilities> {
    const provider = routing.provider ?? "";
    const model = routing.model ?? "";
    return this.cached(`capabilities ${JSON.stringify([provider, model])}`, async () => {
      const answer = await this.client.getCapabilities({ provider, model }, { timeoutMs: LOOKUP_TIMEOUT_MS });
      if (!answer.capabilities) throw new OpenAiApiError(500, "the image service answered without capabilities", "server_error", null, "internal");
      return answer.capabilities;
    });
  }

  /** The route and capabilities for a request's `model` (absent: the default provider). */
  async resolve(model: string | undefined): Promise<ResolvedRoute> {
    const routing = model === undefined || model === "" ? {} : routeForModel(model, await this.providers());
    const capabilities = await this.capabilitiesOf(routing);
    const label = capabilities.model !== undefined && capabilities.model !== "" ? `${capabilities.provider} (${capabilities.model})` : capabilities.provider;
    return { routing, capabilities, label };
  }
}
