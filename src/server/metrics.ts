import { Counter, Histogram, Registry, collectDefaultMetrics } from "prom-client";

export type RpcType = "unary" | "client_stream" | "server_stream" | "bidi_stream" | "unknown";

/**
 * Per-RPC metrics under the names grpc-ecosystem's server interceptors use,
 * so existing dashboards work: started, handled (by code) and a latency
 * histogram (by code). Labels come from the registered method table, never
 * from the raw request path, so a client cannot grow their cardinality.
 */
export class RpcMetrics {
  readonly registry: Registry;
  private readonly started: Counter<"grpc_service" | "grpc_method" | "grpc_type">;
  private readonly handled: Counter<"grpc_service" | "grpc_method" | "grpc_type" | "grpc_code" | "caller">;
  private readonly latency: Histogram<"grpc_service" | "grpc_method" | "grpc_type" | "grpc_code">;
  private readonly msgReceived: Counter<"grpc_service" | "grpc_method" | "grpc_type">;
  private readonly msgSent: Counter<"grpc_service" | "grpc_method" | "grpc_type">;

  /** Calls the host's lean path took (the rest went through connect's handler). */
  readonly leanPathCalls: Counter;

  constructor(registry = new Registry()) {
    this.registry = registry;
    this.leanPathCalls = new Counter({
      name: "mmgate_rpc_lean_path_calls_total",
      help: "RPCs served by the host's lean request path rather than connect's handler.",
      registers: [registry],
    });
    collectDefaultMetrics({ register: registry });
    this.started = new Counter({
      name: "grpc_server_started_total",
      help: "RPCs started on the server.",
      labelNames: ["grpc_service", "grpc_method", "grpc_type"],
      registers: [registry],
    });
    this.handled = new Counter({
      name: "grpc_server_handled_total",
      help: "RPCs completed on the server, by status code and caller (an auth key's or certificate rule's name, anonymous, or other).",
      labelNames: ["grpc_service", "grpc_method", "grpc_type", "grpc_code", "caller"],
      registers: [registry],
    });
    this.msgReceived = new Counter({
      name: "grpc_server_msg_received_total",
      help: "Request messages received on the server (handed to the handler).",
      labelNames: ["grpc_service", "grpc_method", "grpc_type"],
      registers: [registry],
    });
    this.msgSent = new Counter({
      name: "grpc_server_msg_sent_total",
      help: "Response messages the handlers sent.",
      labelNames: ["grpc_service", "grpc_method", "grpc_type"],
      registers: [registry],
    });
    this.latency = new Histogram({
      name: "grpc_server_handling_seconds",
      help: "Time from the request's arrival to its last byte, by status code.",
      labelNames: ["grpc_service", "grpc_method", "grpc_type", "grpc_code"],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers: [registry],
    });
  }

  /**
   * The series of one method, bound once: label lookups hash their values
   * on every call otherwise, and this runs twice per RPC.
   */
  forMethod(service: string, method: string, type: RpcType): MethodMetrics {
    const key = `${service}/${method}/${type}`;
    let bound = this.bound.get(key);
    if (!bound) {
      const labels = { grpc_service: service, grpc_method: method, grpc_type: type };
      // The latency histogram is by code only: callers would multiply its buckets.
      const byCode = new Map<string, { handled: Map<string, Counter.Internal>; latency: Histogram.Internal<string> }>();
      const started = this.started.labels(labels);
      const received = this.msgReceived.labels(labels);
      const sent = this.msgSent.labels(labels);
      bound = {
        started: () => started.inc(),
        received: () => received.inc(),
        sent: (count = 1) => sent.inc(count),
        handled: (code, seconds, caller = "anonymous") => {
          let series = byCode.get(code);
          if (!series) {
            series = { handled: new Map(), latency: this.latency.labels({ ...labels, grpc_code: code }) };
            byCode.set(code, series);
          }
          let handled = series.handled.get(caller);
          if (!handled) {
            handled = this.handled.labels({ ...labels, grpc_code: code, caller });
            series.handled.set(caller, handled);
          }
          handled.inc();
          series.latency.observe(seconds);
        },
      };
      this.bound.set(key, bound);
    }
    return bound;
  }

  private readonly bound = new Map<string, MethodMetrics>();
}

/** One method's series: started, messages received and sent, and handled with its latency by code. */
export interface MethodMetrics {
  started(): void;
  received(): void;
  /** Counts `count` (default 1) messages sent. */
  sent(count?: number): void;
  /** Counts a completed call by code and caller label ("anonymous" by default), and its latency by code. */
  handled(code: string, seconds: number, caller?: string): void;
}
