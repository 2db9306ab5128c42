/** The host's own settings (listener, TLS, auth, limits, shutdown, …) and the whole config's shape. */
import { z } from "zod";
import { MAX_TIMER_MS } from "../../util/index.js";
import { isAllowedHostEntry } from "../request-host.js";
import { certificateRulesSchema } from "../access/schema.js";

const MiB = 1024 * 1024;

/** `HOST:PORT` or `[IPv6]:PORT` → host (brackets removed) and port. */
export function splitHostPort(address: string): { host: string; port: number } {
  const at = address.lastIndexOf(":");
  return { host: address.slice(0, at).replace(/^\[(.*)\]$/, "$1"), port: Number(address.slice(at + 1)) };
}

/** `HOST:PORT`, `[IPv6]:PORT`; port 0 picks a free port. */
export const hostPort = z
  .string()
  .regex(/^(\[[0-9a-fA-F:.]+\]|[^\s:[\]]+):\d{1,5}$/, "expected HOST:PORT, e.g. 127.0.0.1:50051 or [::1]:50051")
  .refine((s) => splitHostPort(s).port <= 65535, "port must be 0..65535");

const bytes = (min: number, max: number) => z.number().int().min(min).max(max);
/** A duration in milliseconds that a Node timer can hold. */
const timerMs = z.number().int().min(0).max(MAX_TIMER_MS);

/** Settings of the host itself; each module adds its own section. */
export const hostConfigSchema = z.strictObject({
  /** The gRPC / gRPC-Web / Connect listener. */
  listen: hostPort.default("127.0.0.1:50051"),
  /** The HTTP/1.1 admin listener (/metrics, /healthz, /readyz); "" turns it off. */
  adminListen: z.union([hostPort, z.literal("")]).default("127.0.0.1:9464"),
  /** The address other processes use to reach this one; defaults to the bound listen address. */
  advertiseAddress: z.string().default(""),
  tls: z
    .strictObject({
      certFile: z.string().default(""),
      keyFile: z.string().default(""),
      /** PEM file of the CA(s) that sign client certificates (mutual TLS); needs clientAuth request or require. */
      clientCaFile: z.string().default(""),
      /**
       * Client certificates: "none" (default) asks for none; "request" asks,
       * lets a client without one in (anonymous) and refuses a connection
       * whose certificate does not verify against clientCaFile; "require"
       * refuses any connection without a verified certificate.
       */
      clientAuth: z.enum(["none", "request", "require"]).default("none"),
      /**
       * How often the files are checked for a change a file-system
       * notification missed (they are watched too); a changed certificate,
       * key or client CA is used for new connections without a restart.
       * 0: notifications only.
       */
      reloadIntervalMs: timerMs.default(60_000),
    })
    .prefault({})
    .refine((t) => (t.certFile === "") === (t.keyFile === ""), "tls.certFile and tls.keyFile go together")
    .superRefine((t, ctx) => {
      if (t.clientAuth !== "none" && t.clientCaFile === "") {
        ctx.addIssue({ code: "custom", path: ["clientCaFile"], message: `clientAuth ${t.clientAuth} needs tls.clientCaFile, the CA that signs client certificates` });
      }
      if (t.clientAuth === "none" && t.clientCaFile !== "") {
        ctx.addIssue({ code: "custom", path: ["clientAuth"], message: "tls.clientCaFile is set but clientAuth is none: set clientAuth to request or require (or leave clientCaFile out)" });
      }
      if (t.clientAuth !== "none" && t.certFile === "") {
        ctx.addIssue({ code: "custom", path: ["clientAuth"], message: `clientAuth ${t.clientAuth} needs TLS: set tls.certFile and tls.keyFile` });
      }
    }),
  limits: z
    .strictObject({
      /** Largest request message accepted, after decompression. */
      maxReceiveMessageBytes: bytes(1024, 1024 * MiB).default(8 * MiB),
      /** Largest response message sent. */
      maxSendMessageBytes: bytes(1024, 1024 * MiB).default(8 * MiB),
      /** HTTP/2 streams one connection may have open at once. */
      maxConcurrentStreams: z.number().int().min(1).max(2 ** 31 - 1).default(1000),
      /** HTTP/2 initial stream flow-control window (the protocol default is 64 KiB). */
      streamWindowBytes: bytes(65535, 2 ** 31 - 1).default(4 * MiB),
      /** HTTP/2 connection flow-control window. */
      connectionWindowBytes: bytes(65535, 2 ** 31 - 1).default(16 * MiB),
      /** Upper bound on a client's deadline; 0 means none. */
      maxTimeoutMs: z.number().int().min(0).default(0),
    })
    .prefault({}),
  rpc: z
    .strictObject({
      /**
       * Serve unary and server-streaming gRPC calls, and unary Connect calls,
       * on the host's lean path (the same interceptors, limits and wire, a
       * fraction of the per-call cost); false sends every call through
       * connect's handler.
       */
      leanPath: z.boolean().default(true),
      /**
       * Compress responses of at least this many bytes when the client
       * accepts gzip or br; 0 (the default) never compresses them. Tensors
       * and filter frames barely compress and cost CPU to try.
       */
      responseCompressionMinBytes: z.number().int().min(0).max(2 ** 32 - 1).default(0),
    })
    .prefault({}),
  connections: z
    .strictObject({
      /**
       * An HTTP/2 session with no open stream (GOAWAY), or an HTTP/1.1
       * connection with no request, is closed after this long; 0 turns it off.
       */
      idleTimeoutMs: timerMs.default(300_000),
      /** A session silent for this long gets a PING; 0 turns keepalive off. */
      keepaliveTimeMs: timerMs.default(7_200_000),
      /** A keepalive PING not acknowledged within this is the end of the session. */
      keepaliveTimeoutMs: timerMs.min(1).default(20_000),
      /** A client PING sooner than this after the previous one is a strike; 0 allows any rate. */
      minPingIntervalMs: timerMs.default(10_000),
      /** Strikes in a row allowed before GOAWAY ENHANCE_YOUR_CALM (grpc's default: 2). */
      maxPingStrikes: z.number().int().min(0).default(2),
      /**
       * A connection must finish its TLS handshake and HTTP/2 preface (over
       * HTTP/1.1: each request's headers) within this; 0 turns it off.
       */
      handshakeTimeoutMs: timerMs.default(10_000),
      /** Open connections at most; a new one over it is closed at once. 0 means no cap. */
      maxConnections: z.number().int().min(0).default(0),
    })
    .prefault({}),
  server: z
    .strictObject({
      /**
       * The hosts requests may name (Host, :authority): names or addresses,
       * ".example.com" for a domain and its subdomains, "*" for any. Empty
       * (the default): the loopback names when the listener is on loopback,
       * any host otherwise. Others are refused (403, PERMISSION_DENIED),
       * which stops DNS rebinding from a web page.
       */
      allowedHosts: z
        .array(
          z
            .string()
            .min(1)
            .refine(isAllowedHostEntry, 'expected a host name, an address, ".domain" or "*"'),
        )
        .default([]),
    })
    .prefault({}),
  cors: z
    .strictObject({
      /**
       * Origins browser clients may call from, e.g. "https://app.example.com";
       * "*" allows any origin. Empty (the default) turns CORS off: no CORS
       * headers, and preflights are refused.
       */
      allowedOrigins: z.array(z.string().min(1)).default([]),
      /** How long a browser may cache a preflight's answer (Access-Control-Max-Age). */
      maxAgeSeconds: z.number().int().min(0).max(86_400).default(7200),
    })
    .prefault({}),
  admin: z
    .strictObject({
      /** How long a client may take to send a request's headers on the admin listener; 0: no limit. */
      headersTimeoutMs: timerMs.default(10_000),
      /** How long a client may take to send a whole request on the admin listener; 0: no limit. */
      requestTimeoutMs: timerMs.default(30_000),
      /** How long an idle keep-alive connection to the admin listener stays open. */
      keepAliveTimeoutMs: timerMs.default(5_000),
    })
    .prefault({})
    .refine(
      (a) => a.requestTimeoutMs === 0 || a.headersTimeoutMs === 0 || a.headersTimeoutMs <= a.requestTimeoutMs,
      "admin.headersTimeoutMs must not exceed admin.requestTimeoutMs",
    ),
  auth: z
    .strictObject({
      /** Bearer token that mutating and admin methods require; "" disables auth. */
      token: z
        .preprocess((v) => (typeof v === "number" ? String(v) : v), z.string())
        .refine((t) => t === "" || t.length >= 16, "a token needs at least 16 characters")
        .refine((t) => !/\s/.test(t), "a token cannot contain white space")
        .default(""),
      /**
       * A YAML (or .json) file of named keys with scopes, stored as digests
       * (`mmgate keys add` writes it); watched, and reloaded on change. With
       * auth.token set too, both apply (the token as the key "token").
       */
      keysFile: z.string().default(""),
      /** Callers known by a verified client certificate (mutual TLS): a name, the subject and/or SAN to match, scopes. */
      certificates: certificateRulesSchema.default([]),
    })
    .prefault({}),
  log: z
    .strictObject({
      level: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
      /** "json": one JSON object a line; "pretty": readable lines; "auto": pretty when stdout is a terminal, else JSON. */
      format: z.enum(["auto", "json", "pretty"]).default("auto"),
    })
    .prefault({}),
  telemetry: z
    .strictObject({
      /**
       * OpenTelemetry tracing (src/telemetry): spans exported over OTLP/HTTP.
       * The standard OTEL_* variables win over these keys, and setting
       * OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) alone turns it on.
       */
      tracing: z
        .strictObject({
          /** Off by default; OTEL_SDK_DISABLED=true turns it off whatever is set. */
          enabled: z.boolean().default(false),
          /** The collector's OTLP/HTTP base URL, `/v1/traces` appended; "" is http://localhost:4318. */
          endpoint: z.union([z.literal(""), z.url({ protocol: /^https?$/ })]).default(""),
          /** OTLP encoding of the export requests. */
          protocol: z.enum(["http/protobuf", "http/json"]).default("http/protobuf"),
          /** service.name of the spans (OTEL_SERVICE_NAME wins). */
          serviceName: z.string().min(1).default("mmgate"),
          /** Share of new traces recorded, 0..1; a caller's sampled flag decides for its calls (OTEL_TRACES_SAMPLER wins). */
          sampleRatio: z.number().min(0).max(1).default(1),
        })
        .prefault({}),
    })
    .prefault({}),
  shutdown: z
    .strictObject({
      /** How long server streams and unary calls get to finish after SIGTERM. */
      graceMs: z.number().int().min(0).max(600_000).default(10_000),
      /**
       * How long the server keeps serving after SIGTERM, with health already
       * NOT_SERVING (and /readyz 503), before it stops taking calls: the time
       * peers (load balancers, a hop's health checks, the other roles of a
       * stack stopped all at once) need to stop sending to it, as a
       * Kubernetes preStop pause gives. 0 (default): stop taking calls at once.
       */
      delayMs: z.number().int().min(0).max(600_000).default(0),
    })
    .prefault({}),
});

export type HostConfig = z.output<typeof hostConfigSchema>;

/** The whole configuration: host settings, the module list, module sections. */
export interface MmgateConfig extends HostConfig {
  /** Names of the modules to run (and serve). */
  modules: string[];
  /** One validated section per known module, keyed by module name. */
  sections: Record<string, unknown>;
}
