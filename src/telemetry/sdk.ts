import type { DiagLogger } from "@opentelemetry/api";
import { context, diag, DiagLogLevel, propagation, trace } from "@opentelemetry/api";
import type * as SdkTraceBase from "@opentelemetry/sdk-trace-base";
import type { Logger } from "pino";
import type { TracingSettings } from "./settings.js";
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from "./attributes.js";
import { state } from "./state.js";

/** Longest the host waits for the last spans to be exported at shutdown. */
const SHUTDOWN_MS = 5000;

export interface StartTracingOptions {
  /** Where the SDK's own warnings go (a collector that cannot be reached, say). */
  readonly logger: Logger;
  /** service.version */
  readonly version: string;
}

/** The SDK's diagnostics as log lines of the process's own logger. */
function diagLogger(logger: Logger): DiagLogger {
  const log = logger.child({ component: "opentelemetry" });
  const line = (level: "error" | "warn" | "info" | "debug") => (message: string, ...args: unknown[]) =>
    log[level]({ detail: args.length > 0 ? args.map(String).join(" ").slice(0, 1000) : undefined }, message);
  return { error: line("error"), warn: line("warn"), info: line("info"), debug: line("debug"), verbose: line("debug") };
}

function samplerOf(settings: TracingSettings, base: typeof SdkTraceBase): SdkTraceBase.Sampler | undefined {
  // undefined: the SDK builds the sampler from OTEL_TRACES_SAMPLER / _ARG itself.
  if (settings.sampler === "env") return undefined;
  // Parent-based: a caller's sampled flag decides, so a trace is whole or absent.
  return new base.ParentBasedSampler({ root: settings.sampler >= 1 ? new base.AlwaysOnSampler() : new base.TraceIdRatioBasedSampler(settings.sampler) });
}

/**
 * Registers the OpenTelemetry SDK for this process: a batch span processor
 * exporting over OTLP/HTTP, W3C trace context and baggage, and an
 * AsyncLocalStorage context manager. Nothing is patched: mmgate makes its
 * spans itself (server and client interceptors, span hooks). Once started,
 * `tracingEnabled()` is true; the host calls `shutdownTracing()` last.
 *
 * The SDK, its exporters and their protobuf code are loaded here, only when
 * tracing is turned on: loaded, they are about 5 MB more heap for the
 * garbage collector to walk in every process, a cost a process that makes
 * no spans would pay on every call.
 */
export async function startTracing(settings: TracingSettings, options: StartTracingOptions): Promise<void> {
  if (state.provider !== undefined || state.starting) throw new Error("tracing is started already");
  state.starting = true;
  const [core, resources, base, node, exporters] = await Promise.all([
    import("@opentelemetry/core"),
    import("@opentelemetry/resources"),
    import("@opentelemetry/sdk-trace-base"),
    import("@opentelemetry/sdk-trace-node"),
    settings.protocol === "http/json"
      ? import("@opentelemetry/exporter-trace-otlp-http").then((m) => m.OTLPTraceExporter)
      : import("@opentelemetry/exporter-trace-otlp-proto").then((m) => m.OTLPTraceExporter),
  ]).finally(() => (state.starting = false));
  const { CompositePropagator, W3CBaggagePropagator, W3CTraceContextPropagator } = core;
  const { defaultResource, detectResources, envDetector, resourceFromAttributes } = resources;
  diag.setLogger(diagLogger(options.logger), DiagLogLevel.WARN);
  const exporter = new exporters({ url: settings.url });
  // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (envDetector) win over the config's name.
  const resource = defaultResource()
    .merge(resourceFromAttributes({ [ATTR_SERVICE_NAME]: settings.serviceName, [ATTR_SERVICE_VERSION]: options.version }))
    .merge(detectResources({ detectors: [envDetector] }));
  const sampler = samplerOf(settings, base);
  const provider = new node.NodeTracerProvider({
    resource,
    ...(sampler ? { sampler } : {}),
    // OTEL_BSP_* (delay, batch and queue sizes) are read by the processor.
    spanProcessors: [new base.BatchSpanProcessor(exporter)],
  });
  provider.register({ propagator: new CompositePropagator({ propagators: [new W3CTraceContextPropagator(), new W3CBaggagePropagator()] }) });
  state.provider = provider;
  state.tracer = trace.getTracer("mmgate", options.version);
  state.enabled = true;
  options.logger.info(
    { endpoint: settings.url, protocol: settings.protocol, serviceName: resource.attributes[ATTR_SERVICE_NAME], sampler: settings.sampler === "env" ? process.env["OTEL_TRACES_SAMPLER"] : settings.sampler, reason: settings.reason },
    "tracing on: spans exported over OTLP",
  );
}

/** Whether spans are made: one boolean, read where a hook decides whether to install itself. */
export function tracingEnabled(): boolean {
  return state.enabled;
}

/**
 * Exports what is still buffered and stops the SDK (at most 5 s); the
 * process's span hooks then make no more spans. Does nothing when tracing
 * was never started; safe to call twice.
 */
export async function shutdownTracing(): Promise<void> {
  const provider = state.provider;
  if (provider === undefined) return;
  state.provider = undefined;
  state.enabled = false;
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([provider.shutdown(), new Promise<void>((resolve) => (timer = setTimeout(resolve, SHUTDOWN_MS)))]);
  } catch (err) {
    diag.warn(`tracing shutdown failed: ${(err as Error).message}`);
  } finally {
    clearTimeout(timer);
    trace.disable();
    context.disable();
    propagation.disable();
    diag.disable();
  }
}
