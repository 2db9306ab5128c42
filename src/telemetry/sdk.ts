import type { DiagLogger } from "@opentelemetry/api";
import { context, diag, DiagLogLevel, propagation, trace } from "@opentelemetry/api";
import { CompositePropagator, W3CBaggagePropagator, W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPTraceExporter as OtlpJsonExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { OTLPTraceExporter as OtlpProtoExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { defaultResource, detectResources, envDetector, resourceFromAttributes } from "@opentelemetry/resources";
import type { Sampler } from "@opentelemetry/sdk-trace-base";
import { AlwaysOnSampler, BatchSpanProcessor, ParentBasedSampler, TraceIdRatioBasedSampler } from "@opentelemetry/sdk-trace-base";
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from "@opentelemetry/semantic-conventions";
import type { Logger } from "pino";
import type { TracingSettings } from "./settings.js";
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

function samplerOf(settings: TracingSettings): Sampler | undefined {
  // undefined: the SDK builds the sampler from OTEL_TRACES_SAMPLER / _ARG itself.
  if (settings.sampler === "env") return undefined;
  // Parent-based: a caller's sampled flag decides, so a trace is whole or absent.
  return new ParentBasedSampler({ root: settings.sampler >= 1 ? new AlwaysOnSampler() : new TraceIdRatioBasedSampler(settings.sampler) });
}

/**
 * Registers the OpenTelemetry SDK for this process: a batch span processor
 * exporting over OTLP/HTTP, W3C trace context and baggage, and an
 * AsyncLocalStorage context manager. Nothing is patched: mmgate makes its
 * spans itself (server and client interceptors, span hooks). Once started,
 * `tracingEnabled()` is true; the host calls `shutdownTracing()` last.
 */
export function startTracing(settings: TracingSettings, options: StartTracingOptions): void {
  if (state.provider !== undefined) throw new Error("tracing is started already");
  diag.setLogger(diagLogger(options.logger), DiagLogLevel.WARN);
  const exporter = settings.protocol === "http/json" ? new OtlpJsonExporter({ url: settings.url }) : new OtlpProtoExporter({ url: settings.url });
  // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (envDetector) win over the config's name.
  const resource = defaultResource()
    .merge(resourceFromAttributes({ [ATTR_SERVICE_NAME]: settings.serviceName, [ATTR_SERVICE_VERSION]: options.version }))
    .merge(detectResources({ detectors: [envDetector] }));
  const sampler = samplerOf(settings);
  const provider = new NodeTracerProvider({
    resource,
    ...(sampler ? { sampler } : {}),
    // OTEL_BSP_* (delay, batch and queue sizes) are read by the processor.
    spanProcessors: [new BatchSpanProcessor(exporter)],
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
