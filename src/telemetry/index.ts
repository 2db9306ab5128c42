/**
 * OpenTelemetry tracing, made explicitly (nothing is patched): the SDK
 * configured from `telemetry.tracing` and the standard OTEL_* variables,
 * the host's server interceptor and the channels' client interceptor, span
 * hooks for the work inside a call, HTTP client and route spans, and the
 * log mixin. Off by default; while off, `tracingEnabled()` is false, the
 * interceptors are not installed and every `open…`/`inSpan` hook costs a
 * boolean check.
 */
export { DEFAULT_OTLP_ENDPOINT, resolveTracingSettings, TelemetryConfigError } from "./settings.js";
export type { TracingProtocol, TracingSection, TracingSettings } from "./settings.js";
export { shutdownTracing, startTracing, tracingEnabled } from "./sdk.js";
export type { StartTracingOptions } from "./sdk.js";
export { clientTracingInterceptor, serverTracingInterceptor } from "./rpc.js";
export type { ServerSpanHook } from "./rpc.js";
export {
  extractContext,
  HttpClientSpan,
  inSpan,
  inSpanSync,
  openHttpClientSpan,
  openSpan,
  redactedUrl,
  setCurrentSpanAttribute,
  spanningStream,
  TRACE_CONTEXT_HEADERS,
  traceHeaders,
  traceHttpRoute,
  traceLogFields,
  TraceSpan,
  within,
} from "./spans.js";
export { SpanKind } from "@opentelemetry/api";
