/**
 * Which tracing a process runs, from its config section and the standard
 * OTEL_* variables. Pure: reads only what it is given.
 */

/** The config file's `telemetry.tracing` section, as validated by the host's schema. */
export interface TracingSection {
  readonly enabled: boolean;
  /** The collector's OTLP/HTTP base URL (`/v1/traces` is appended); "" for the OTLP default. */
  readonly endpoint: string;
  readonly protocol: TracingProtocol;
  readonly serviceName: string;
  /** Share of new traces recorded (a caller's sampled flag decides for the rest). */
  readonly sampleRatio: number;
}

export type TracingProtocol = "http/protobuf" | "http/json";

/** What `startTracing` needs: everything decided, nothing left to read. */
export interface TracingSettings {
  readonly enabled: boolean;
  /** Where spans are posted (the whole URL, `/v1/traces` included). */
  readonly url: string;
  readonly protocol: TracingProtocol;
  /** service.name, unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES name another (the SDK's resource detection applies those). */
  readonly serviceName: string;
  /** A ratio for parent-based ratio sampling, or "env" when OTEL_TRACES_SAMPLER decides (the SDK reads it). */
  readonly sampler: number | "env";
  /** Why tracing is on or off, for the start-up log. */
  readonly reason: string;
}

/** A tracing setting that cannot be used; the message names the variable or key. */
export class TelemetryConfigError extends Error {
  override readonly name = "TelemetryConfigError";
}

/** The OTLP/HTTP default collector, as the specification gives it. */
export const DEFAULT_OTLP_ENDPOINT = "http://localhost:4318";
const TRACES_PATH = "v1/traces";

const SAMPLERS = new Set(["always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"]);

function set(env: Readonly<Record<string, string | undefined>>, name: string): string | undefined {
  const value = env[name]?.trim();
  return value === undefined || value === "" ? undefined : value;
}

function httpUrl(value: string, origin: string): URL {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new TelemetryConfigError(`${origin}: "${value}" is not a URL`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw new TelemetryConfigError(`${origin}: expected an http:// or https:// URL, got ${url.protocol}`);
  return url;
}

/** `base` + `v1/traces`, as the specification builds the signal URL from OTEL_EXPORTER_OTLP_ENDPOINT. */
function tracesUrl(base: string, origin: string): string {
  const url = httpUrl(base, origin);
  if (!url.pathname.endsWith("/")) url.pathname += "/";
  url.pathname += TRACES_PATH;
  return url.toString();
}

function protocolOf(value: string, origin: string): TracingProtocol {
  if (value === "http/protobuf" || value === "http/json") return value;
  const hint = value === "grpc" ? " (OTLP over gRPC is not built in: point it at the collector's OTLP/HTTP port, 4318 by default)" : "";
  throw new TelemetryConfigError(`${origin}: "${value}" is not supported; use http/protobuf or http/json${hint}`);
}

/**
 * Tracing is off unless the section enables it or OTEL_EXPORTER_OTLP_ENDPOINT
 * (or ..._TRACES_ENDPOINT) is set; OTEL_SDK_DISABLED=true and
 * OTEL_TRACES_EXPORTER=none turn it off whatever else says. The variables
 * win over the file, as MMGATE_* ones do.
 */
export function resolveTracingSettings(section: TracingSection, env: Readonly<Record<string, string | undefined>>): TracingSettings {
  const tracesEndpoint = set(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
  const endpoint = set(env, "OTEL_EXPORTER_OTLP_ENDPOINT");
  const url = tracesEndpoint
    ? httpUrl(tracesEndpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").toString()
    : endpoint
      ? tracesUrl(endpoint, "OTEL_EXPORTER_OTLP_ENDPOINT")
      : tracesUrl(section.endpoint === "" ? DEFAULT_OTLP_ENDPOINT : section.endpoint, "telemetry.tracing.endpoint");
  const protocolVar = set(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") !== undefined ? "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" : "OTEL_EXPORTER_OTLP_PROTOCOL";
  const protocolText = set(env, protocolVar);
  const protocol = protocolText === undefined ? section.protocol : protocolOf(protocolText, protocolVar);
  const samplerName = set(env, "OTEL_TRACES_SAMPLER");
  if (samplerName !== undefined && !SAMPLERS.has(samplerName)) {
    throw new TelemetryConfigError(`OTEL_TRACES_SAMPLER: "${samplerName}" is not one of ${[...SAMPLERS].join(", ")}`);
  }
  const ratioText = set(env, "OTEL_TRACES_SAMPLER_ARG");
  if (samplerName?.endsWith("traceidratio") && ratioText !== undefined) {
    const ratio = Number(ratioText);
    if (!(ratio >= 0 && ratio <= 1)) throw new TelemetryConfigError(`OTEL_TRACES_SAMPLER_ARG: "${ratioText}" is not a ratio between 0 and 1`);
  }
  const exporter = set(env, "OTEL_TRACES_EXPORTER");
  if (exporter !== undefined && exporter !== "otlp" && exporter !== "none") {
    throw new TelemetryConfigError(`OTEL_TRACES_EXPORTER: "${exporter}" is not supported; use otlp (or none to turn tracing off)`);
  }
  const base = { url, protocol, serviceName: set(env, "OTEL_SERVICE_NAME") ?? section.serviceName, sampler: samplerName !== undefined ? ("env" as const) : section.sampleRatio };
  if (set(env, "OTEL_SDK_DISABLED")?.toLowerCase() === "true") return { ...base, enabled: false, reason: "OTEL_SDK_DISABLED=true" };
  if (exporter === "none") return { ...base, enabled: false, reason: "OTEL_TRACES_EXPORTER=none" };
  if (tracesEndpoint !== undefined) return { ...base, enabled: true, reason: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set" };
  if (endpoint !== undefined) return { ...base, enabled: true, reason: "OTEL_EXPORTER_OTLP_ENDPOINT is set" };
  return { ...base, enabled: section.enabled, reason: section.enabled ? "telemetry.tracing.enabled" : "off by default" };
}
