import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type ContextValues, type Transport } from "@connectrpc/connect";
import { Counter, Gauge, Histogram } from "prom-client";
import type { Registry } from "prom-client";
import type { Logger } from "pino";
import { z } from "zod";
import {
  EncodeHopService,
  EncodeWorkerService,
  GenerateResponseSchema,
  GetStatusResponseSchema,
  type GenerateResponse,
  Lifecycle,
  MemberSchema,
  MemberState,
} from "../../gen/mmgate/encode/v1/encode_pb.js";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { PreprocessedRequestSchema, type PreprocessedRequest } from "../../gen/mmgate/llm/v1/request_pb.js";
import {
  GenerateRequestSchema as TokenGenerateRequestSchema,
  TokenWorkerService,
  type GenerateRequest as TokenGenerateRequest,
  type GenerateResponse as TokenGenerateResponse,
} from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { EtcdResolver, etcdDiscoverySchema, etcdPoolPrefix, StaticResolver, staticDiscoverySchema, type Member, type Resolver } from "../discovery/index.js";
import { shouldEncode } from "../llm/index.js";
import { callContextOf, ChannelPool, channelConfigSchema, CONTEXT_HEADERS, inProcessTransport, isPassOnHeaderName, OneMessage, passedOnHeaders, withCallContext } from "../rpc/index.js";
import { bindService, ConfigError, hostPort, requestIdOf, type ModuleContext } from "../server/index.js";
import { openSpan, spanningStream } from "../telemetry/index.js";
import { delay, MAX_TIMER_MS, registeredMetric } from "../util/index.js";
import { acceptsEncoded, EncodedFrames, EncodedMessage, framedResponsesKey, requestEncoding } from "../wire/index.js";
import { EncoderRouter, type EncodeBinding, type EncodeTarget, type EncoderLifecycle, type FallbackCause } from "./router.js";
import { notAnEncodeCard } from "./card.js";
import { EncodeMembers, type HealthProbe, type MemberStateName, type MemberView, type OutlierOptions } from "./members.js";

/** "local": this process's own service, in memory; otherwise HOST:PORT. */
const targetAddress = z.union([z.literal("local"), hostPort]);

export const encodeHopConfigSchema = z.strictObject({
  /** The token worker the hop forwards to: "local" (this process, e.g. under `mmgate serve`) or HOST:PORT. */
  downstream: targetAddress.default("local"),
  encoders: z
    .strictObject({
      /**
       * Where the Encode workers are: "local" (this process's encodeWorker
       * module), "static" (the `members` list), "etcd" (workers registered
       * under the `etcd` pool, watched live), or "off" (pass everything
       * through).
       */
      discovery: z.enum(["local", "static", "etcd", "off"]).default("local"),
      /** For "static": the Encode workers, `{id?, address, metadata?}` each. */
      members: staticDiscoverySchema.default([]),
      /** For "etcd": where the Encode workers register (endpoints, namespace, component, endpoint). */
      etcd: etcdDiscoverySchema.optional(),
    })
    .prefault({})
    .refine((e) => e.discovery !== "static" || e.members.length > 0, "encoders.members: static discovery needs at least one member")
    .refine((e) => e.discovery !== "etcd" || e.etcd !== undefined, "encoders.etcd: etcd discovery needs its endpoints, component and endpoint"),
  /**
   * Longest an encode call may take before the request falls back; the call
   * has its own context (a caller leaving mid-encode does not cut it, so no
   * tensor is orphaned), and 0 means no bound of its own.
   */
  encodeTimeoutMs: z.number().int().min(0).max(MAX_TIMER_MS).default(30_000),
  /** Outbound channel settings (TLS, keepalive, limits, a service credential) for the Encode workers, and for the downstream unless `downstreamChannel` is set. */
  channel: channelConfigSchema.prefault({}),
  /** Outbound channel settings for the downstream token worker; absent: `channel`'s. */
  downstreamChannel: channelConfigSchema.optional(),
  /**
   * Pass the inbound call's `authorization` on to remote Encode workers and
   * a remote downstream (one token domain), unless the channel has a
   * credential of its own (`token`/`tokenFile`), which replaces it. Calls to
   * this process's own services ("local") always carry it.
   */
  passAuthorization: z.boolean().default(true),
  /**
   * Context metadata passed on besides x-request-id and the W3C trace
   * context (traceparent, tracestate, baggage): further lower-case header
   * names; protocol and hop-by-hop headers are refused.
   */
  forwardHeaders: z
    .array(z.string().refine(isPassOnHeaderName, "a lower-case header name that is not a protocol or hop-by-hop header"))
    .default([]),
  /** Outlier ejection and active health checks of the Encode workers (not for discovery "local"). */
  outlier: z
    .strictObject({
      /** Transport failures or encode timeouts in a row that eject a member; a refused connection ejects at once. */
      consecutiveFailures: z.number().int().min(1).max(1000).default(3),
      /** First ejection's length; each further ejection in a row adds as much (5 s, 10 s, 15 s, ...). */
      baseEjectionMs: z.number().int().min(1).max(MAX_TIMER_MS).default(5000),
      /** Longest ejection. */
      maxEjectionMs: z.number().int().min(1).max(MAX_TIMER_MS).default(300_000),
      /** Most of the pool ejected at once, in percent; the members over it stay in rotation (their calls fall back). */
      maxEjectionPercent: z.number().int().min(0).max(100).default(50),
      /** How often each member's grpc.health.v1 status (service EncodeWorkerService) is checked; 0: never. */
      intervalMs: z.number().int().min(0).max(MAX_TIMER_MS).default(2000),
      /** Longest one health check may take. */
      checkTimeoutMs: z.number().int().min(1).max(MAX_TIMER_MS).default(1000),
    })
    .prefault({}),
  /**
   * Longest the downstream may take to answer an encoded request (its first
   * output) when the caller has left or its deadline has passed: the call
   * is not cut before the receiver has taken the encoded items (it releases
   * their tensors).
   */
  handoffTimeoutMs: z.number().int().min(1).max(MAX_TIMER_MS).default(30_000),
  /** How often the downstream's health is checked for the hop's readiness (remote downstream only); 0: never (always ready). */
  downstreamCheckIntervalMs: z.number().int().min(0).max(MAX_TIMER_MS).default(5000),
});

export type EncodeHopConfig = z.output<typeof encodeHopConfigSchema>;

const MEMBER_STATE: Record<MemberStateName, MemberState> = {
  checking: MemberState.CHECKING,
  admitted: MemberState.ADMITTED,
  ejected: MemberState.EJECTED,
};

const LIFECYCLE: Record<EncoderLifecycle, Lifecycle> = {
  pending: Lifecycle.PENDING,
  active: Lifecycle.ACTIVE,
  unavailable: Lifecycle.UNAVAILABLE,
};

/**
 * Fails start-up when this process does not serve `service`: a probe call
 * that answers UNIMPLEMENTED means the module behind it is not running here.
 */
async function requireLocal(transport: Transport, service: string, setting: string, module: string): Promise<void> {
  const probe = create(PreprocessedRequestSchema, { isProbe: true });
  try {
    const stream =
      service === TokenWorkerService.typeName
        ? createClient(TokenWorkerService, transport).generate({ request: probe }, { timeoutMs: 5000 })
        : createClient(EncodeWorkerService, transport).encode({ request: probe }, { timeoutMs: 5000 });
    for await (const _ of stream) void _;
  } catch (err) {
    if (ConnectError.from(err).code === Code.Unimplemented) {
      throw new ConfigError(`${setting} is "local" but this process does not serve ${service}: add "${module}" to modules, or point ${setting} elsewhere`);
    }
  }
}

/** The health service name under which the hop publishes its encode lifecycle (SERVING while Active). */
export const ENCODE_LIFECYCLE_HEALTH = `${EncodeHopService.typeName}/encoders`;

interface PoolTargetOptions {
  readonly id: string;
  readonly resolver: Resolver;
  readonly transportOf: (member: Member) => Transport;
  readonly probe?: HealthProbe;
  readonly checkBeforeAdmit: boolean;
  readonly accepts?: (member: Member) => boolean;
  readonly outlier: OutlierOptions;
  readonly logger: Logger;
  readonly onEjected?: (member: Member, reason: string) => void;
  readonly onIgnored?: (members: readonly Member[]) => void;
}

/**
 * A target over a membership: its binding is an EncodeMembers (admission
 * from the watch, health checks, outlier ejection, a picker rebuilt on any
 * change of id or address), run until the binding is retired.
 */
function poolTarget(options: PoolTargetOptions): EncodeTarget & { members(): EncodeMembers | undefined } {
  let current: EncodeMembers | undefined;
  return {
    id: options.id,
    members: () => current,
    async bind(_signal, events): Promise<EncodeBinding> {
      const members = new EncodeMembers({
        resolver: options.resolver,
        outlier: options.outlier,
        checkBeforeAdmit: options.checkBeforeAdmit,
        logger: options.logger,
        onAdmitted: (count) => events?.admitted(count),
        ...(options.probe ? { probe: options.probe } : {}),
        ...(options.accepts ? { accepts: options.accepts } : {}),
        ...(options.onEjected ? { onEjected: options.onEjected } : {}),
        ...(options.onIgnored ? { onIgnored: options.onIgnored } : {}),
      });
      events?.admitted(members.admittedCount);
      current = members;
      const retired = new AbortController();
      void members.run(retired.signal).catch((err: unknown) => options.logger.error({ err }, "Encode pool watch failed"));
      return {
        pick() {
          if (retired.signal.aborted) return undefined;
          const picked = members.pick();
          return picked && { id: picked.member.id, key: picked.key, transport: options.transportOf(picked.member) };
        },
        report: (key, outcome) => members.report(key, outcome),
        close() {
          retired.abort();
          members.close();
          if (current === members) current = undefined;
        },
      };
    },
  };
}

function hopMetrics(registry: Registry, lifecycle: () => EncoderLifecycle, views: () => readonly MemberView[]) {
  const counter = (name: string, help: string, labelNames: string[] = []) =>
    registeredMetric(registry, name, Counter, () => new Counter({ name, help, labelNames, registers: [registry] }));
  registeredMetric(
    registry,
    "encode_hop_lifecycle",
    Gauge,
    () =>
      new Gauge({
        name: "encode_hop_lifecycle",
        help: "The hop's lifecycle: 1 for the current state, 0 for the others.",
        labelNames: ["state"],
        registers: [registry],
        collect() {
          for (const state of ["pending", "active", "unavailable"] as const) this.set({ state }, lifecycle() === state ? 1 : 0);
        },
      }),
  );
  return {
    duration: registeredMetric(
      registry,
      "encode_duration_seconds",
      Histogram,
      () =>
        new Histogram({
          name: "encode_duration_seconds",
          help: "Time spent in the Encode hop before forwarding (encode call and stream), by outcome.",
          labelNames: ["outcome"],
          buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
          registers: [registry],
        }),
    ),
    attempts: counter("encode_attempts_total", "Multimodal requests the hop sent to an Encode worker."),
    fallbacks: counter("encode_fallbacks_total", "Requests forwarded without an encoder result after the encode failed, by cause.", ["cause"]),
    perMember: counter("encode_member_requests_total", "Encode calls that succeeded, by Encode worker.", ["member"]),
    passthrough: counter("encode_passthrough_total", "Requests forwarded unchanged (text only, probes, already encoded, or the hop not active)."),
    unavailable: counter("encode_unavailable_passthrough_total", "Multimodal requests forwarded unencoded because no Encode worker was admitted (the hop not Active)."),
    ejections: counter("encode_member_ejections_total", "Encode workers taken out of rotation by outlier ejection, by member and reason (refused, consecutive_failures).", ["member", "reason"]),
    ignored: registeredMetric(registry, "encode_members_ignored", Gauge, () => new Gauge({ name: "encode_members_ignored", help: "Registrations under the Encode pool's prefix that are not Encode worker cards, ignored.", registers: [registry] })),
    byState: registeredMetric(
      registry,
      "encode_members",
      Gauge,
      () =>
        new Gauge({
          name: "encode_members",
          help: "Members of the Encode pool by state (admitted, checking, ejected).",
          labelNames: ["state"],
          registers: [registry],
          collect() {
            const counts: Record<MemberStateName, number> = { admitted: 0, checking: 0, ejected: 0 };
            for (const view of views()) counts[view.state] += 1;
            for (const [state, n] of Object.entries(counts)) this.set({ state }, n);
          },
        }),
    ),
  };
}

/** Points where a test holds a call (never set in production). */
export interface HopSeams {
  /** Runs after the encode step and before the downstream call; `encoded` when the request now carries a result. */
  readonly afterEncode?: (call: { readonly encoded: boolean; readonly signal: AbortSignal }) => Promise<void>;
}

/** A downstream message as the hop's own: its encoding unchanged (the same wire shape), or its output copied over. */
function relayed(res: TokenGenerateResponse | EncodedFrames): GenerateResponse {
  if (res instanceof EncodedFrames) return res as unknown as GenerateResponse;
  return create(GenerateResponseSchema, res.output ? { output: res.output } : {});
}

/**
 * The encode hop's instance: EncodeHopService, the router over the Encode
 * pool as its exports, and the hooks that bind it and watch its pool.
 */
export function createHop(ctx: ModuleContext<EncodeHopConfig>, seams: HopSeams) {
  const config = ctx.config;
  // The lifecycle gauge reads the router at scrape time; it exists by then.
  const holder: { router?: EncoderRouter; views?: () => readonly MemberView[] } = {};
  const metrics = hopMetrics(ctx.metrics, () => holder.router?.state ?? "unavailable", () => holder.views?.() ?? []);
  const counts = { passthrough: 0n, encoded: 0n, fallbacks: new Map<string, bigint>(), members: new Map<string, { requests: bigint; failures: bigint }>() };
  const memberCount = (id: string) => {
    let c = counts.members.get(id);
    if (!c) counts.members.set(id, (c = { requests: 0n, failures: 0n }));
    return c;
  };
  const local = inProcessTransport({ routes: ctx.localRoutes.routes, interceptors: ctx.localRoutes.interceptors, registry: ctx.metrics });
  const pool = new ChannelPool(config.channel, { registry: ctx.metrics, logger: ctx.logger });
  // The downstream gets a pool of its own only when its settings differ (another credential, say).
  const downstreamPool = config.downstreamChannel === undefined ? pool : new ChannelPool(config.downstreamChannel, { registry: ctx.metrics, logger: ctx.logger });
  const transportOf = (address: string): Transport => (address === "local" ? local : pool.get(address));
  const downstreamTransport = config.downstream === "local" ? local : downstreamPool.get(config.downstream);
  /** Whether the downstream call writes a request's EncodedMessage as it is: the lean client does (server streams always take it). */
  const sendsEncoded = config.downstream !== "local" && (config.downstreamChannel ?? config.channel).leanPath;
  const contextHeaders = [...CONTEXT_HEADERS, ...config.forwardHeaders];

  const setLifecycleHealth = (state: EncoderLifecycle) =>
    ctx.health.set(ENCODE_LIFECYCLE_HEALTH, state === "active" ? ServingStatus.SERVING : ServingStatus.NOT_SERVING);
  const router = new EncoderRouter({
    logger: ctx.logger,
    // The encode lifecycle has its own health entry: the hop stays ready (it passes traffic through) whatever it is.
    onLifecycle: (state) => {
      setLifecycleHealth(state);
      ctx.logger.info({ lifecycle: state }, "encode lifecycle");
    },
    onUnavailable: () => {
      metrics.unavailable.inc();
      ctx.logger.debug("no Encode worker admitted: multimodal request passed through unencoded");
    },
    onFallback: (cause: FallbackCause, member) => {
      metrics.fallbacks.inc({ cause });
      counts.fallbacks.set(cause, (counts.fallbacks.get(cause) ?? 0n) + 1n);
      if (member !== undefined) {
        memberCount(member).requests += 1n;
        memberCount(member).failures += 1n;
      }
    },
    onEncoded: (member) => {
      metrics.perMember.inc({ member });
      counts.encoded += 1n;
      memberCount(member).requests += 1n;
    },
  });
  holder.router = router;
  setLifecycleHealth(router.state);
  const outlier: OutlierOptions = config.outlier;
  /**
   * A member's grpc.health.v1 status for EncodeWorkerService; the channel's
   * credential goes with it. A worker without the health service, or
   * without an entry for the service, answered: it is reachable, and counts
   * as serving (its calls still count against it).
   */
  const probe: HealthProbe = async (member, signal) => {
    try {
      const { status } = await createClient(Health, transportOf(member.address)).check(
        { service: EncodeWorkerService.typeName },
        { signal, timeoutMs: config.outlier.checkTimeoutMs },
      );
      return status === ServingStatus.SERVING ? "serving" : "not_serving";
    } catch (err) {
      const code = ConnectError.from(err).code;
      if (code === Code.Unimplemented || code === Code.NotFound) return "serving";
      throw err;
    }
  };
  const onEjected = (member: Member, reason: string) =>
    metrics.ejections.inc({ member: member.id, reason: reason === "connection refused" ? "refused" : "consecutive_failures" });
  // The membership the hop routes over; for etcd it exists once the
  // discovery task has connected.
  let resolver: Resolver | undefined =
    config.encoders.discovery === "static"
      ? new StaticResolver(config.encoders.members)
      : config.encoders.discovery === "local"
        ? new StaticResolver([{ id: "local", address: "127.0.0.1:1", metadata: { transport: "in-process" } }])
        : undefined;
  let poolView: ReturnType<typeof poolTarget> | undefined =
    resolver === undefined
      ? undefined
      : config.encoders.discovery === "local"
        ? poolTarget({ id: "local", resolver, transportOf: () => local, checkBeforeAdmit: false, outlier: { ...outlier, intervalMs: 0 }, logger: ctx.logger })
        : // Configured members take traffic at once; the checks and ejection take out those that fail.
          poolTarget({ id: "static", resolver, transportOf: (m) => transportOf(m.address), probe, checkBeforeAdmit: false, outlier, logger: ctx.logger, onEjected });
  const target = poolView;
  /** Connects to etcd, routes over its admitted members until the signal fires, then lets go. */
  const etcdDiscovery = async (signal: AbortSignal): Promise<void> => {
    const etcdPool = config.encoders.etcd!;
    const watched = await EtcdResolver.create({ ...etcdPool, logger: ctx.logger, registry: ctx.metrics });
    resolver = watched;
    // A registered worker takes traffic once its health says SERVING; only Encode worker cards join.
    poolView = poolTarget({
      id: `etcd:${etcdPoolPrefix(etcdPool)}`,
      resolver: watched,
      transportOf: (m) => transportOf(m.address),
      probe,
      checkBeforeAdmit: true,
      accepts: (m) => notAnEncodeCard(m) === undefined,
      outlier,
      logger: ctx.logger,
      onEjected,
      onIgnored: (ignored) => {
        metrics.ignored.set(ignored.length);
        for (const m of ignored) ctx.logger.debug({ member: m.id, why: notAnEncodeCard(m) }, "registration under the Encode pool ignored");
      },
    });
    router.setTarget(poolView);
    try {
      await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
    } finally {
      await watched.close();
    }
  };
  // Ready once started: the hop passes traffic through whatever its encode lifecycle (see ENCODE_LIFECYCLE_HEALTH).
  ctx.health.setReady(false, "starting");
  /** Readiness follows whether the downstream answers its health check (a remote downstream only). */
  const downstreamCheck = async (signal: AbortSignal): Promise<void> => {
    while (!signal.aborted) {
      try {
        const { status } = await createClient(Health, downstreamTransport).check(
          { service: TokenWorkerService.typeName },
          { signal, timeoutMs: Math.min(config.downstreamCheckIntervalMs, 5000) },
        );
        ctx.health.setReady(status === ServingStatus.SERVING, status === ServingStatus.SERVING ? undefined : `downstream ${config.downstream} is not serving`);
      } catch (err) {
        if (signal.aborted) return;
        const code = ConnectError.from(err).code;
        // A downstream without the health service still takes calls.
        ctx.health.setReady(code === Code.Unimplemented, code === Code.Unimplemented ? undefined : `downstream ${config.downstream} unreachable: ${ConnectError.from(err).rawMessage}`);
      }
      await delay(config.downstreamCheckIntervalMs, signal).catch(() => undefined);
    }
  };
  /**
   * The downstream's output for `request`. When the hop's own call writes
   * encoded messages as they are (the lean gRPC path) and the downstream
   * transport reads them so (the lean client), the frames are relayed as
   * they arrived, a run of them with one write, none parsed, serialized or
   * framed again: the two GenerateResponse messages have the same wire
   * shape. Otherwise they come parsed, and are copied into the hop's
   * message type. The transport is called directly, without a promise
   * client's per-message generator.
   */
  const downstreamOutput = async (
    request: PreprocessedRequest,
    contextValues: ContextValues,
    signal: AbortSignal,
    relayEncoded: boolean,
    inboundEncoding?: Uint8Array,
  ): Promise<AsyncIterable<TokenGenerateResponse | EncodedFrames>> => {
    if (relayEncoded) contextValues.set(framedResponsesKey, true);
    // A request passed on unchanged goes as the bytes it came in (the two GenerateRequest types share a wire shape).
    // (Typed as the message: only the lean client, which sendsEncoded stands for, is given the encoding.)
    const input = new OneMessage(inboundEncoding !== undefined && sendsEncoded ? (new EncodedMessage(inboundEncoding) as unknown as TokenGenerateRequest) : create(TokenGenerateRequestSchema, { request }));
    // The forward step's span (tracing on) lasts until the downstream's stream ends; the call is its child.
    const forward = openSpan("hop.forward", { "mmgate.hop.downstream": config.downstream, "mmgate.hop.encoded": request.encoderResult !== undefined });
    if (forward === undefined) {
      const res = await downstreamTransport.stream(TokenWorkerService.method.generate, signal, undefined, undefined, input, contextValues);
      return res.message as AsyncIterable<TokenGenerateResponse | EncodedFrames>;
    }
    try {
      const res = await forward.run(() => downstreamTransport.stream(TokenWorkerService.method.generate, signal, undefined, undefined, input, contextValues));
      return spanningStream(forward, res.message as AsyncIterable<TokenGenerateResponse | EncodedFrames>);
    } catch (error) {
      forward.end(error);
      throw error;
    }
  };
  /** The members of the pool the hop routes over now, with their counts, for GetStatus and the gauge. */
  const memberViews = (): MemberView[] => poolView?.members()?.views() ?? [];
  holder.views = memberViews;

  const service = bindService(EncodeHopService, {
    async *generate(req, handler) {
      const request = req.request ?? create(PreprocessedRequestSchema);
      const requestId = requestIdOf(handler);
      const encodable = shouldEncode(request);
      const attempted = router.state === "active" && encodable;
      if (!attempted) {
        metrics.passthrough.inc();
        counts.passthrough += 1n;
      } else {
        metrics.attempts.inc();
      }
      // The encode call's own bound (the caller's deadline only when the hop sets none).
      const timeoutMs = config.encodeTimeoutMs > 0 ? config.encodeTimeoutMs : handler.timeoutMs();
      // Credentials (unless the channel has its own) and trace context go on to both calls;
      // an in-process call always carries the caller's auth context.
      const headers = passedOnHeaders(handler, contextHeaders, config.passAuthorization);
      const localHeaders = config.passAuthorization ? headers : passedOnHeaders(handler, contextHeaders, true);
      const started = performance.now();
      // A request with nothing to encode (text only, already encoded) goes on without the router's turn.
      const prepared = encodable
        ? await router.prepare(request, {
            requestId,
            headers: config.encoders.discovery === "local" ? localHeaders : headers,
            ...(timeoutMs !== undefined ? { timeoutMs } : {}),
          })
        : request;
      if (attempted) metrics.duration.observe({ outcome: prepared === request ? "fallback" : "encoded" }, (performance.now() - started) / 1000);
      if (seams.afterEncode !== undefined) await seams.afterEncode({ encoded: prepared !== request, signal: handler.signal });
      const downstreamHeaders = config.downstream === "local" ? localHeaders : headers;
      const relayEncoded = acceptsEncoded(handler);
      if (prepared === request) {
        const values = withCallContext({ ...callContextOf(handler), headers: downstreamHeaders });
        // Unchanged and as sent (not a default made for a request without one): its bytes go on as they came.
        const inbound = req.request !== undefined ? requestEncoding(handler) : undefined;
        for await (const res of await downstreamOutput(prepared, values, handler.signal, relayEncoded, inbound)) yield relayed(res);
        return;
      }
      // Encoded: the Encode worker handed out transfer handles that only the
      // receiver releases, so the downstream call must reach it even if the
      // caller leaves (or its deadline passes) before then. Until the first
      // output (the receiver has taken the items by then) the call has its
      // own context, bounded by the hand-off timeout; from then on it ends
      // with the caller.
      const handoff = new AbortController();
      const handoffTimer = setTimeout(
        () => handoff.abort(new ConnectError("the downstream did not take the encoded request in time", Code.DeadlineExceeded)),
        config.handoffTimeoutMs,
      );
      let received = false;
      const onCallerGone = () => {
        if (received) handoff.abort(handler.signal.reason);
      };
      handler.signal.addEventListener("abort", onCallerGone, { once: true });
      const values = withCallContext({ requestId, headers: downstreamHeaders });
      try {
        for await (const res of await downstreamOutput(prepared, values, handoff.signal, relayEncoded)) {
          if (!received) {
            received = true;
            clearTimeout(handoffTimer);
            if (handler.signal.aborted) {
              handoff.abort(handler.signal.reason);
              return;
            }
          }
          // Nobody to yield to: the receiver has what it needs, the rest of the output goes nowhere.
          if (handler.signal.aborted) return;
          yield relayed(res);
        }
      } catch (err) {
        if (handler.signal.aborted) {
          ctx.logger.debug({ err, requestId }, "downstream call for a departed caller ended");
          return;
        }
        throw err;
      } finally {
        clearTimeout(handoffTimer);
        handler.signal.removeEventListener("abort", onCallerGone);
        // Ended early (the caller left): the downstream call is cancelled, once its receiver had the request.
        if (!handoff.signal.aborted && received) handoff.abort();
      }
    },
    getStatus() {
      const view = resolver?.current() ?? { generation: 0n, members: [] };
      return create(GetStatusResponseSchema, {
        lifecycle: LIFECYCLE[router.state],
        targetId: router.targetId ?? "",
        generation: config.encoders.discovery === "local" ? 0n : view.generation,
        members: memberViews().map((m) =>
          create(MemberSchema, {
            id: m.member.id,
            address: config.encoders.discovery === "local" ? "local" : m.member.address,
            requests: counts.members.get(m.member.id)?.requests ?? 0n,
            failures: counts.members.get(m.member.id)?.failures ?? 0n,
            state: MEMBER_STATE[m.state],
            ejectedUntilUnixMs: m.ejectedUntil === undefined ? 0n : BigInt(m.ejectedUntil),
            reason: m.reason,
            consecutiveFailures: m.consecutiveFailures,
            ejections: m.ejections,
          }),
        ),
        fallbacks: Object.fromEntries(counts.fallbacks),
        passthrough: counts.passthrough,
        encoded: counts.encoded,
      });
    },
  });

  return {
    services: [service],
    exports: router,
    async start() {
      // "local" means this process serves the other end: say so at start-up
      // when it does not, rather than fail every request.
      if (config.downstream === "local") await requireLocal(local, TokenWorkerService.typeName, "encodeHop.downstream", "tokenWorker");
      if (config.encoders.discovery === "local") {
        await requireLocal(local, EncodeWorkerService.typeName, "encodeHop.encoders.discovery", "encodeWorker");
      }
      ctx.tasks.run("encode-binding", (signal) => router.run(signal));
      if (config.encoders.discovery === "etcd") ctx.tasks.run("etcd-discovery", etcdDiscovery);
      else router.setTarget(target);
      if (config.downstream === "local" || config.downstreamCheckIntervalMs === 0) ctx.health.setReady(true);
      else ctx.tasks.run("downstream-check", downstreamCheck);
    },
    async close() {
      router.close();
      pool.abort();
      if (downstreamPool !== pool) downstreamPool.abort();
    },
  };
}
