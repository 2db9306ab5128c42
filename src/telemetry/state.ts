import type { Tracer } from "@opentelemetry/api";
import { trace } from "@opentelemetry/api";
import type { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";

/** The process's tracing, once started (sdk.ts); one object so every hook reads the same flag. */
export const state: { enabled: boolean; starting: boolean; provider: NodeTracerProvider | undefined; tracer: Tracer } = {
  enabled: false,
  /** While startTracing loads the SDK. */
  starting: false,
  provider: undefined,
  tracer: trace.getTracer("mmgate"),
};
