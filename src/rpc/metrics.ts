import { Code, ConnectError } from "@connectrpc/connect";
import type { DescMethod } from "@bufbuild/protobuf";
import type { Interceptor } from "@connectrpc/connect";
import { Counter, Histogram } from "prom-client";
import type { Registry } from "prom-client";
import { codeName } from "../server/index.js";
import { observeStream } from "../util/index.js";
import { registeredMetric } from "../util/index.js";

type Labels = "grpc_service" | "grpc_method";

/** Client-side RPC metrics, under the names grpc-ecosystem's client interceptors use. */
export interface ClientMetrics {
  readonly handled: Counter<Labels | "grpc_code">;
  readonly latency: Histogram<Labels>;
}

const HANDLED = "grpc_client_handled_total";
const LATENCY = "grpc_client_handling_seconds";
const BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

const byRegistry = new WeakMap<Registry, ClientMetrics>();

/** The client metrics of `registry`, created on first use; later calls (and other channels) share them. */
export function clientMetrics(registry: Registry): ClientMetrics {
  const known = byRegistry.get(registry);
  if (known) return known;
  const handled = registeredMetric(
    registry,
    HANDLED,
    Counter,
    () =>
      new Counter({
        name: HANDLED,
        help: "RPCs completed by this process as a client, by status code.",
        labelNames: ["grpc_service", "grpc_method", "grpc_code"],
        registers: [registry],
      }),
  );
  const latency = registeredMetric(
    registry,
    LATENCY,
    Histogram,
    () =>
      new Histogram({
        name: LATENCY,
        help: "Time from the start of a client call to its status (a stream's end).",
        labelNames: ["grpc_service", "grpc_method"],
        buckets: BUCKETS,
        registers: [registry],
      }),
  );
  const metrics: ClientMetrics = { handled: handled as Counter<Labels | "grpc_code">, latency: latency as Histogram<Labels> };
  byRegistry.set(registry, metrics);
  return metrics;
}

/** "NOT_FOUND" style names, as the gRPC status documentation spells them. */

/**
 * The status a failed call ended with. When the call's own signal fired
 * (its deadline, or the caller cancelling), that reason decides.
 */
function codeOf(error: unknown, signal: AbortSignal): Code {
  if (signal.aborted) {
    const reason: unknown = signal.reason;
    if (reason instanceof ConnectError) return reason.code;
    if (reason !== undefined) return Code.Canceled;
  }
  return ConnectError.from(error).code;
}

/** Records one call of `method` that starts now: the returned function counts it once, with its status, and its time. */
export function callRecorder(metrics: ClientMetrics, method: DescMethod): (code: Code | 0) => void {
  const labels = { grpc_service: method.parent.typeName, grpc_method: method.name };
  const started = performance.now();
  let recorded = false;
  return (code) => {
    if (recorded) return;
    recorded = true;
    metrics.handled.inc({ ...labels, grpc_code: codeName(code) });
    metrics.latency.observe(labels, (performance.now() - started) / 1000);
  };
}

/**
 * Counts each call once, when its status is known: a unary call when it
 * settles, a stream when its last response has been read (or it failed, or
 * was cancelled).
 */
export function metricsInterceptor(metrics: ClientMetrics): Interceptor {
  return (next) => async (req) => {
    const record = callRecorder(metrics, req.method);
    const signal = req.signal;
    // The call's signal also fires when a call completes; by then the status is recorded.
    const onAbort = () => record(codeOf(undefined, signal));
    signal.addEventListener("abort", onAbort, { once: true });
    let res;
    try {
      res = await next(req);
    } catch (error) {
      record(codeOf(error, signal));
      throw error;
    }
    if (!res.stream) {
      record(0);
      return res;
    }
    return {
      ...res,
      message: observeStream(res.message, {
        error: (error) => {
          record(codeOf(error, signal));
          return error;
        },
        end: () => record(0),
        cancel: () => record(Code.Canceled),
      }),
    };
  };
}
