import type { Server as HttpServer } from "node:http";
import type { Logger } from "pino";
import { AccessControl } from "./access/index.js";
import { createAdminServer } from "./admin-http.js";
import { AdminService, adminService } from "./admin-service.js";
import type { MmgateConfig } from "./config/index.js";
import { adminServerTimeouts } from "./connections.js";
import { Dispatch } from "./dispatch.js";
import type { RoutedService } from "./dispatch.js";
import { Health, HealthRegistry, ServingStatus, healthService } from "./health.js";
import type { HostOptions } from "./host.js";
import { bindServer, closeServer, Listener } from "./listener.js";
import { RpcMetrics } from "./metrics.js";
import type { ServiceBinding } from "./module.js";
import { planModules } from "./module-plan.js";
import { ModuleRuntime } from "./module-runtime.js";
import { reflectionServices } from "./reflection.js";
import { RpcObserver } from "./rpc-observer.js";
import { ABANDONED_TASK_STOP_MS, DrainMetrics, ShutdownSignals, TASK_STOP_MS } from "./shutdown.js";
import { delay, settleWithin } from "../util/index.js";
import { shutdownTracing } from "../telemetry/index.js";

/**
 * The host as a server in grpc-js's manner: the parts (listener, module
 * runtime, dispatch, shutdown signals) are built up front, and each step
 * of the life is a method: `start` runs `listen`, `buildModules`,
 * `bindRoutes`, `serveAdmin`, `startModules` and `markServing`;
 * `shutdown` runs `drain` and then `stop`, once.
 */
export class Server {
  readonly config: MmgateConfig;
  readonly startedAt: number;
  readonly health: HealthRegistry;
  readonly metrics: RpcMetrics;
  /** Resolves when shutdown completed. */
  readonly closed: Promise<void>;

  private readonly logger: Logger;
  private readonly version: string;
  private readonly signals: ShutdownSignals;
  private readonly modules: ModuleRuntime;
  private readonly dispatch: Dispatch;
  private readonly listener: Listener;
  private readonly drainMetrics: DrainMetrics;
  private readonly access: AccessControl;
  private readonly tls: boolean;
  private admin: HttpServer | undefined = undefined;
  private boundAddress = "";
  private boundAdminAddress = "";
  private servedNames: readonly string[] = [];
  private shutdownStarted: Promise<void> | undefined = undefined;
  private resolveClosed!: () => void;

  /** Builds the parts; binds nothing. A module plan, TLS file or keys file that does not work is a config error here. */
  constructor(options: HostOptions) {
    const { config, logger } = options;
    // A cycle or an unknown requirement is a config error before anything binds.
    const plan = planModules(options.modules, config.modules);
    this.config = config;
    this.logger = logger;
    this.version = options.version;
    this.startedAt = Date.now();
    this.health = new HealthRegistry();
    this.metrics = new RpcMetrics();
    // The keys file is read here: a bad one stops the start before anything binds.
    this.access = new AccessControl({ auth: config.auth, logger, registry: this.metrics.registry });
    const observer = new RpcObserver(logger, this.metrics, (name) => this.access.callerLabel(name));
    this.signals = new ShutdownSignals();
    this.tls = config.tls.certFile !== "";
    this.dispatch = new Dispatch({ config, tls: this.tls, logger, metrics: this.metrics, observer, signals: this.signals, access: this.access });
    this.listener = new Listener({
      config,
      tls: this.tls,
      logger,
      registry: this.metrics.registry,
      onRequest: this.dispatch.onRequest,
      drainingSignal: this.signals.drainingSignal,
    });
    this.modules = new ModuleRuntime(plan, {
      config,
      logger,
      registry: this.metrics.registry,
      health: this.health,
      drainingSignal: this.signals.drainingSignal,
    });
    this.drainMetrics = new DrainMetrics(this.metrics.registry, config.shutdown);
    this.closed = new Promise<void>((resolve) => (this.resolveClosed = resolve));
  }

  /** Bound gRPC address, `HOST:PORT`, once listening. */
  get address(): string {
    return this.boundAddress;
  }

  /** Bound admin address, or "" while (or when) the admin listener is off. */
  get adminAddress(): string {
    return this.boundAdminAddress;
  }

  /** Fully qualified names of the services served, reflection and health included, once the routes are bound. */
  get serviceNames(): readonly string[] {
    return this.servedNames;
  }

  /**
   * Binds the listener, builds the configured modules, registers their
   * services plus health and reflection, and serves gRPC, gRPC-Web,
   * Connect and the modules' plain HTTP routes on one port: HTTP/2 and
   * HTTP/1.1 both, told apart by the HTTP/2 preface in cleartext and by
   * ALPN over TLS. A failure part way undoes what started.
   */
  async start(): Promise<void> {
    await this.listen();
    const bindings = await this.buildModules();
    this.bindRoutes(bindings);
    try {
      await this.serveAdmin();
      await this.startModules();
    } catch (err) {
      await this.abandonStart();
      throw err;
    }
    this.markServing();
  }

  /** Drains, waits up to the grace, then closes everything. Idempotent: AdminService.Drain starts the same shutdown. */
  shutdown(): Promise<void> {
    this.shutdownStarted ??= this.drainThenStop();
    return this.shutdownStarted;
  }

  /** Binds the gRPC port; until `bindRoutes`, requests get 503. */
  private async listen(): Promise<void> {
    this.boundAddress = await this.listener.listen(this.config.listen);
  }

  /** Creates the modules in dependency order; returns the service bindings of the served ones. */
  private async buildModules(): Promise<ServiceBinding[]> {
    try {
      return await this.modules.build({
        advertisedAddress: this.config.advertiseAddress || this.address,
        localRoutes: this.dispatch.localRoutes,
      });
    } catch (err) {
      // Whatever started is stopped again: tasks, timers, the listener, and
      // connections clients opened meanwhile (they got 503s), which would
      // otherwise keep the listener from closing.
      await this.abandonStart();
      throw err;
    }
  }

  /**
   * Makes the routes live: the modules' services, the host's own (health,
   * AdminService, reflection), the plain HTTP routes; health entries for
   * every service. In-process calls work from here.
   */
  private bindRoutes(bindings: readonly ServiceBinding[]): void {
    const reflected = [...bindings.map((b) => b.service), Health, AdminService];
    this.servedNames = [...reflected, ...reflectionServices].map((s) => s.typeName).sort();
    // The host's own services are always SERVING; a module's follow its readiness.
    for (const s of [Health, AdminService, ...reflectionServices]) this.health.set(s.typeName, ServingStatus.SERVING);
    this.modules.followReadiness();
    const services: RoutedService[] = [
      ...bindings,
      { service: Health, implementation: healthService(this.health, this.signals.drainingSignal) },
      {
        service: AdminService,
        implementation: adminService({
          version: this.version,
          startedAt: this.startedAt,
          config: this.config,
          health: this.health,
          drain: () => {
            this.logger.info({ reason: "AdminService.Drain" }, "shutdown requested");
            void this.shutdown();
          },
        }),
      },
    ];
    this.dispatch.bind(
      {
        services,
        reflected,
        httpRoutes: this.modules.httpRoutes(),
        mapperFor: (typeName) => this.modules.mapperFor(typeName),
        decoratorFor: (typeName) => this.modules.decoratorFor(typeName),
      },
      this.listener,
    );
    // Watched from here, its scopes checked against what is served.
    this.access.start(services.map((s) => s.service));
  }

  /** The admin listener (metrics, /healthz, /readyz), when `adminListen` is set. */
  private async serveAdmin(): Promise<void> {
    if (this.config.adminListen === "") return;
    this.admin = createAdminServer(this.metrics.registry, this.health, adminServerTimeouts(this.config.admin));
    this.boundAdminAddress = await bindServer(this.admin, this.config.adminListen);
  }

  /** The routes are live: modules may now register, watch and call each other. */
  private async startModules(): Promise<void> {
    await this.modules.start();
  }

  /** Started: "" may turn SERVING once every module is ready; the start-up is logged. */
  private markServing(): void {
    const { config, logger, dispatch } = this;
    this.modules.markStarted();
    logger.info(
      {
        address: this.address,
        adminAddress: this.adminAddress || undefined,
        tls: this.tls,
        protocols: this.tls ? "h2, http/1.1 (ALPN)" : "h2c, http/1.1",
        ...dispatch.describe(),
        modules: this.modules.describe(),
        notReady: Object.fromEntries(this.modules.pending()),
        version: this.version,
      },
      "mmgate serving",
    );
    if (dispatch.hosts.allowsAny && config.server.allowedHosts.length === 0) {
      logger.info({ listen: config.listen }, "the listener is not on loopback: requests naming any host are served (list the names clients use in server.allowedHosts to check them)");
    }
    if (!this.access.enabled) {
      logger.warn("no auth configured (auth.token, auth.keysFile, auth.certificates): mutating and admin methods are open to every client (AdminService.Drain is refused until one is)");
    } else if (this.access.current.keyCount === 0 && !this.access.current.hasCertificates) {
      logger.warn({ keysFile: this.access.keysFile }, "auth is on but no key is configured yet: mutating and admin methods are refused to every client until the keys file holds one");
    }
    if (config.auth.certificates.length > 0 && !this.tls) {
      logger.warn("auth.certificates is set but the listener does not serve TLS: no client certificate can match it");
    }
  }

  /** Undoes a start-up that failed part way. */
  private async abandonStart(): Promise<void> {
    this.access.close();
    this.signals.beginDraining();
    await this.modules.stopTasks(ABANDONED_TASK_STOP_MS);
    await this.modules.close();
    await this.listener.abandon();
    if (this.admin?.listening) await closeServer(this.admin);
  }

  private async drainThenStop(): Promise<void> {
    await this.drain();
    await this.stop();
  }

  /**
   * The drain: health NOT_SERVING at once; after `shutdown.delayMs` (calls
   * still taken while peers notice) draining begins: new calls refused,
   * GOAWAY, modules' `drain`; up to `shutdown.graceMs` for the listener's
   * connections and the modules to finish, after which the calls still
   * running are cancelled and the connections cut.
   */
  private async drain(): Promise<void> {
    const { graceMs, delayMs } = this.config.shutdown;
    const { logger, listener } = this;
    this.drainMetrics.began();
    this.health.drain();
    if (delayMs > 0) {
      // Health says NOT_SERVING already; calls are still taken until peers have seen it.
      logger.info({ delayMs }, "not serving: still taking calls while peers notice");
      await delay(delayMs);
    }
    logger.info({ graceMs, openSessions: listener.openSessions }, "draining");
    this.signals.beginDraining();
    const listenerClosed = listener.drain();
    // Modules drain alongside the listener (revoke leases, end subscribers
    // with their status); both get the same grace. Their signal fires when
    // it is over (or everything drained first).
    const moduleGrace = new AbortController();
    const moduleDrains = this.modules.drain(moduleGrace.signal);
    const drained = await settleWithin(Promise.all([listenerClosed, moduleDrains]), graceMs);
    moduleGrace.abort();
    if (!drained) {
      logger.warn({ openSessions: listener.openSessions, openSockets: listener.openSockets }, "grace period over: cancelling the calls still running");
      this.signals.endGrace();
      await delay(50);
      listener.destroyConnections();
      await listenerClosed;
    }
  }

  /** After the drain: tasks stopped, modules closed (reverse order), the admin listener closed, the last spans sent. */
  private async stop(): Promise<void> {
    this.access.close();
    await this.listener.closeHttp1();
    await this.modules.stopTasks(TASK_STOP_MS);
    await this.modules.close();
    if (this.admin) {
      this.admin.closeAllConnections();
      await closeServer(this.admin);
    }
    // The last spans (the drain's own calls included) go out before the process exits.
    await shutdownTracing();
    this.logger.info("stopped");
    this.resolveClosed();
  }
}
