import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { Counter, Gauge, Histogram } from "prom-client";
import type { Registry } from "prom-client";
import { z } from "zod";
import {
  EncodeHopService,
  EncodeWorkerService,
  GetStatusResponseSchema,
  Lifecycle,
  MemberSchema,
} from "../../gen/mmgate/encode/v1/encode_pb.js";
import { Health, HealthCheckResponse_ServingStatus as ServingStatus } from "../../gen/grpc/health/v1/health_pb.js";
import { PreprocessedRequestSchema } from "../../gen/mmgate/llm/v1/request_pb.js";
import { TokenWorkerService } from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { EtcdResolver, etcdDiscoverySchema, etcdPoolPrefix, StaticResolver, staticDiscoverySchema, type Member, type Resolver } from "../discovery/index.js";
import { shouldEncode } from "../llm/index.js";
import { ChannelPool, channelConfigSchema, inProcessTransport, outboundContextValues, RoundRobinPicker } from "../rpc/index.js";
import { bindService, ConfigError, defineModule, hostPort, requestIdOf, type ModuleContext } from "../server/index.js";
import { delay, MAX_TIMER_MS, registeredMetric } from "../util/index.js";
import { EncoderRouter, type EncodeBinding, type EncodeTarget, type EncoderLifecycle, type FallbackCause } from "./router.js";

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
  /** Longest an encode call may take before the request falls back (0: the caller's deadline only). */
  encodeTimeoutMs: z.number().int().min(0).max(MAX_TIMER_MS).default(30_000),
  /** Outbound channel settings (TLS, keepalive, limits) for remote workers. */
  channel: channelConfigSchema.prefault({}),
});

export type EncodeHopConfig = z.output<typeof encodeHopConfigSchema>;

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

/** Decides whether a discovered member may take traffic (a health check). */
export type AdmissionCheck = (member: Member, signal: AbortSignal) => Promise<boolean>;

/**
 * A target over a membership: each pick reads the current members, so
 * changes apply at once and the rotation is kept. With `admit`, a member
 * joins the rotation only once its check passes (checked again every
 * `retryMs` until it does, while it stays a member).
 */
function membershipTarget(
  id: string,
  resolver: Resolver,
  transportOf: (member: Member) => Transport,
  admit?: AdmissionCheck,
  retryMs = 1000,
): EncodeTarget & { admitted(): readonly Member[] } {
  let current: (() => readonly Member[]) | undefined;
  return {
    id,
    admitted: () => current?.() ?? [],
    async bind(): Promise<EncodeBinding> {
      const retired = new AbortController();
      const passed = new Set<string>();
      const checking = new Set<string>();
      const present = (memberId: string) => resolver.current().members.some((m) => m.id === memberId);
      const check = (member: Member) => {
        if (!admit || passed.has(member.id) || checking.has(member.id)) return;
        checking.add(member.id);
        void (async () => {
          try {
            while (!retired.signal.aborted && present(member.id)) {
              if (await admit(member, retired.signal).catch(() => false)) {
                passed.add(member.id);
                return;
              }
              await delay(retryMs, retired.signal).catch(() => undefined);
            }
          } finally {
            checking.delete(member.id);
          }
        })();
      };
      const admittedNow = () => {
        const members = resolver.current().members;
        for (const m of members) check(m);
        for (const memberId of passed) if (!members.some((m) => m.id === memberId)) passed.delete(memberId);
        return admit ? members.filter((m) => passed.has(m.id)) : members;
      };
      current = admittedNow;
      let picker = new RoundRobinPicker(admittedNow());
      return {
        pick() {
          if (retired.signal.aborted) return undefined;
          const now = admittedNow();
          if (now.map((m) => m.id).join() !== picker.endpoints.map((m) => m.id).join()) picker = picker.rebuild(now);
          const member = picker.pick();
          return member && { id: member.id, transport: transportOf(member) };
        },
        close() {
          retired.abort();
        },
      };
    },
  };
}

function hopMetrics(registry: Registry, lifecycle: () => EncoderLifecycle) {
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
  };
}

/** Points where a test holds a call (never set in production). */
export interface HopSeams {
  /** Runs after the encode step and before the downstream call; `encoded` when the request now carries a result. */
  readonly afterEncode?: (call: { readonly encoded: boolean; readonly signal: AbortSignal }) => Promise<void>;
}

function createHop(ctx: ModuleContext<EncodeHopConfig>, seams: HopSeams) {
  const config = ctx.config;
  // The lifecycle gauge reads the router at scrape time; it exists by then.
  const holder: { router?: EncoderRouter } = {};
  const metrics = hopMetrics(ctx.metrics, () => holder.router?.state ?? "unavailable");
  const counts = { passthrough: 0n, encoded: 0n, fallbacks: new Map<string, bigint>(), members: new Map<string, { requests: bigint; failures: bigint }>() };
  const memberCount = (id: string) => {
    let c = counts.members.get(id);
    if (!c) counts.members.set(id, (c = { requests: 0n, failures: 0n }));
    return c;
  };
  const local = inProcessTransport({ routes: ctx.localRoutes.routes, interceptors: ctx.localRoutes.interceptors, registry: ctx.metrics });
  const pool = new ChannelPool(config.channel, { registry: ctx.metrics });
  const transportOf = (address: string): Transport => (address === "local" ? local : pool.get(address));

  const router = new EncoderRouter({
    logger: ctx.logger,
    onLifecycle: (state) => ctx.health.setReady(state === "active" || config.encoders.discovery === "off", `encode target ${state}`),
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
  // The membership the hop routes over; for etcd it exists once the
  // discovery task has connected.
  let resolver: Resolver | undefined =
    config.encoders.discovery === "static"
      ? new StaticResolver(config.encoders.members)
      : config.encoders.discovery === "local"
        ? new StaticResolver([{ id: "local", address: "127.0.0.1:1", metadata: { transport: "in-process" } }])
        : undefined;
  const target =
    resolver === undefined
      ? undefined
      : membershipTarget(config.encoders.discovery, resolver, (member) =>
          config.encoders.discovery === "local" ? local : transportOf(member.address),
        );
  let etcdTarget: ReturnType<typeof membershipTarget> | undefined;
  /** Connects to etcd, routes over its admitted members until the signal fires, then lets go. */
  const etcdDiscovery = async (signal: AbortSignal): Promise<void> => {
    const pool = config.encoders.etcd!;
    const watched = await EtcdResolver.create({ ...pool, logger: ctx.logger, registry: ctx.metrics });
    resolver = watched;
    // A registered worker takes traffic once its health says SERVING.
    const admit: AdmissionCheck = async (member, signal) =>
      (
        await createClient(Health, transportOf(member.address)).check(
          { service: EncodeWorkerService.typeName },
          { signal, timeoutMs: 2000 },
        )
      ).status === ServingStatus.SERVING;
    etcdTarget = membershipTarget(`etcd:${etcdPoolPrefix(pool)}`, watched, (member) => transportOf(member.address), admit);
    router.setTarget(etcdTarget);
    try {
      await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
    } finally {
      await watched.close();
    }
  };
  ctx.health.setReady(config.encoders.discovery === "off", "encode target pending");
  const downstream = createClient(TokenWorkerService, transportOf(config.downstream));

  const service = bindService(EncodeHopService, {
    async *generate(req, handler) {
      const request = req.request ?? create(PreprocessedRequestSchema);
      const requestId = requestIdOf(handler);
      if (!(router.state === "active" && shouldEncode(request))) {
        metrics.passthrough.inc();
        counts.passthrough += 1n;
      } else {
        metrics.attempts.inc();
      }
      const remaining = handler.timeoutMs();
      const encodeTimeout = config.encodeTimeoutMs > 0 ? config.encodeTimeoutMs : undefined;
      const timeoutMs = remaining === undefined ? encodeTimeout : Math.min(remaining, encodeTimeout ?? remaining);
      const attempted = router.state === "active" && shouldEncode(request);
      const started = performance.now();
      const prepared = await router.prepare(request, { requestId, signal: handler.signal, ...(timeoutMs !== undefined ? { timeoutMs } : {}) });
      if (attempted) metrics.duration.observe({ outcome: prepared === request ? "fallback" : "encoded" }, (performance.now() - started) / 1000);
      await seams.afterEncode?.({ encoded: prepared !== request, signal: handler.signal });
      const call = { headers: { "x-request-id": requestId }, contextValues: outboundContextValues(handler) };
      if (prepared !== request && handler.signal.aborted) {
        // The Encode worker handed out a transfer handle: the receiver must
        // get it even though the caller has gone, to complete the transfer
        // and release the buffers. Its output goes nowhere.
        void (async () => {
          for await (const _ of downstream.generate({ request: prepared }, call)) void _;
        })().catch((err: unknown) => ctx.logger.warn({ err, requestId }, "downstream call for a departed caller failed"));
        return;
      }
      for await (const res of downstream.generate({ request: prepared }, { ...call, signal: handler.signal })) {
        yield { ...(res.output ? { output: res.output } : {}) };
      }
    },
    getStatus() {
      const view = resolver?.current() ?? { generation: 0n, members: [] };
      return create(GetStatusResponseSchema, {
        lifecycle: LIFECYCLE[router.state],
        targetId: router.targetId ?? "",
        generation: config.encoders.discovery === "local" ? 0n : view.generation,
        members:
          config.encoders.discovery === "off"
            ? []
            : (etcdTarget ? etcdTarget.admitted() : view.members).map((m) =>
                create(MemberSchema, {
                  id: m.id,
                  address: config.encoders.discovery === "local" ? "local" : m.address,
                  requests: counts.members.get(m.id)?.requests ?? 0n,
                  failures: counts.members.get(m.id)?.failures ?? 0n,
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
    },
    async close() {
      router.close();
      pool.abort();
    },
  };
}

/**
 * The `encodeHop` module: EncodeHopService in front of a token worker.
 * Multimodal requests are encoded by an Encode worker (this process's, or
 * a static pool) and forwarded with the encoder result; everything else,
 * and everything the hop cannot encode, is forwarded unchanged.
 */
export const encodeHopModule = defineEncodeHopModule();

/** The `encodeHop` module with test seams (encodeHopModule has none). */
export function defineEncodeHopModule(seams: HopSeams = {}) {
  return defineModule({
    name: "encodeHop",
    description: "The multimodal Encode hop in front of a token worker",
    configSchema: encodeHopConfigSchema,
    create: (ctx) => createHop(ctx, seams),
  });
}
