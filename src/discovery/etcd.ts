/**
 * Pool membership in etcd. A worker registers itself under
 * `/mmgate/<namespace>/<component>/<endpoint>/<instance_id>` with a lease
 * it keeps alive (EtcdRegistration); a consumer watches that prefix
 * (EtcdResolver).
 *
 * The resolver only reports membership: a registered instance is a member
 * whether or not it is healthy yet. Admission (calling only members that
 * pass a health check) is the consumer's job — the encode hop checks each
 * member's health itself before it routes to it.
 */
import type * as Etcd3Module from "etcd3";
import type { Etcd3, IKeyValue, IOptions, IWatchCreateRequest, IWatchResponse, Lease, Watcher } from "etcd3";
import type { Logger } from "pino";
import { Counter, type Registry } from "prom-client";
import { z } from "zod";
import { hostPort } from "../server/index.js";
import { delay, errorOf, registeredMetric, settleWithin, whenAborted } from "../util/index.js";
import { MembershipCell, type Member, type Membership, type Resolver } from "./resolver.js";

/** One path segment of a key: non-empty, no `/`. */
const segment = z.string().regex(/^[^/]+$/, "must be non-empty and contain no /");

/**
 * Where a pool lives in etcd and how to reach etcd. Every error names its
 * field (`endpoints.0: Invalid URL`).
 */
export const etcdDiscoverySchema = z.strictObject({
  /** etcd client URLs, `http://HOST:PORT` or `https://HOST:PORT`. */
  endpoints: z.array(z.url({ protocol: /^https?$/, error: "expected an http:// or https:// URL" })).min(1),
  namespace: segment.default("default"),
  component: segment,
  endpoint: segment,
  /** Lease TTL of a registration: how long a worker that stops keeping alive stays a member. */
  leaseTtlSeconds: z.int().min(1).max(86400).default(10),
  /** How long connecting to etcd may take. */
  dialTimeoutMs: z.int().min(1).max(600000).default(5000),
});

export type EtcdDiscoveryConfig = z.output<typeof etcdDiscoverySchema>;
export type EtcdDiscoveryInput = z.input<typeof etcdDiscoverySchema>;

/** The pool a key belongs to. */
export interface EtcdPool {
  readonly namespace: string;
  readonly component: string;
  readonly endpoint: string;
}

/** `/mmgate/<namespace>/<component>/<endpoint>/`, the prefix every instance of a pool is under. */
export function etcdPoolPrefix(pool: EtcdPool): string {
  return `/mmgate/${pool.namespace}/${pool.component}/${pool.endpoint}/`;
}

/** The value a registration stores: `{ id, address, metadata }` as JSON. */
const memberValueSchema = z.object({
  id: segment,
  address: z.string().superRefine((value, ctx) => {
    const parsed = hostPort.safeParse(value);
    if (!parsed.success) ctx.addIssue({ code: "custom", message: parsed.error.issues[0]?.message ?? "expected HOST:PORT" });
  }),
  metadata: z.record(z.string(), z.string()).default({}),
});

type WatchBackoff = NonNullable<NonNullable<IOptions["faultHandling"]>["watchBackoff"]>;

/** Doubling delays from `ms`, capped at `maxMs`: how soon a lost watch stream reconnects. */
function cappedBackoff(ms: number, maxMs: number): WatchBackoff {
  return { duration: ms, next: () => cappedBackoff(Math.min(maxMs, ms * 2), maxMs) };
}

interface ConnectOptions {
  readonly endpoints: readonly string[];
  readonly dialTimeoutMs?: number;
  /** Longest pause between attempts to re-open a lost watch (2000 by default). */
  readonly reconnectMaxDelayMs?: number;
}

/** The etcd client library, loaded on first use: it is large, and most processes that use this folder never talk to etcd. */
let etcdModule: Promise<typeof Etcd3Module> | undefined;

async function connect(options: ConnectOptions): Promise<Etcd3> {
  etcdModule ??= import("etcd3");
  const { Etcd3 } = await etcdModule;
  return new Etcd3({
    hosts: [...options.endpoints],
    dialTimeout: options.dialTimeoutMs ?? 5000,
    faultHandling: { watchBackoff: cappedBackoff(100, options.reconnectMaxDelayMs ?? 2000) },
  });
}


export interface EtcdRegistrationOptions extends EtcdPool, ConnectOptions {
  /** Unique in the pool; the last segment of the key. */
  readonly instanceId: string;
  /** `HOST:PORT` consumers reach the instance at. */
  readonly address: string;
  readonly metadata?: Readonly<Record<string, string>>;
  /** 10 by default. */
  readonly leaseTtlSeconds?: number;
  /** Pause before registering again after a failed attempt (1000 by default). */
  readonly retryDelayMs?: number;
  readonly logger?: Logger;
}

/**
 * One instance's entry in a pool: a key under a lease that is kept alive
 * while the process runs. `run(signal)` is the loop a module runs as a
 * supervised task: it registers, registers again with a new lease whenever
 * the lease is lost (etcd unreachable for longer than the TTL, the lease
 * expired), and revokes when `signal` fires. `revoke()` (on drain) deletes
 * the key at once so consumers stop picking the instance before it stops;
 * the loop then stays idle until its signal.
 */
export class EtcdRegistration {
  readonly key: string;
  /** The etcd client this registration owns; `close()` closes it. */
  readonly client: Etcd3;
  private readonly value: string;
  private readonly ttl: number;
  private readonly retryDelayMs: number;
  private readonly logger: Logger | undefined;
  private lease: Lease | undefined;
  private revoked = false;
  private wake: (() => void) | undefined;

  /** Validates the options and connects (nothing is written until `register` or `run`). */
  static async create(options: EtcdRegistrationOptions): Promise<EtcdRegistration> {
    return new EtcdRegistration(options, await connect(options));
  }

  private constructor(options: EtcdRegistrationOptions, client: Etcd3) {
    const member = memberValueSchema.parse({ id: options.instanceId, address: options.address, metadata: options.metadata ?? {} });
    for (const name of ["namespace", "component", "endpoint"] as const) segment.parse(options[name]);
    this.key = etcdPoolPrefix(options) + member.id;
    this.value = JSON.stringify(member);
    this.ttl = options.leaseTtlSeconds ?? 10;
    this.retryDelayMs = options.retryDelayMs ?? 1000;
    this.logger = options.logger?.child({ etcdKey: this.key });
    this.client = client;
  }

  /**
   * Grants a lease, starts its keep-alive and puts the key under it (what
   * `run` does each time; call it directly only when nothing runs the loop).
   * Resolves once the key is written, with `lost`: resolves when the lease
   * is lost. Rejects when etcd refuses or cannot be reached.
   */
  async register(): Promise<{ lost: Promise<Error> }> {
    if (this.revoked) throw new Error("the registration is revoked");
    const lease = this.client.lease(this.ttl);
    this.lease = lease;
    const lost = new Promise<Error>((resolve) => lease.once("lost", (error: unknown) => resolve(errorOf(error))));
    try {
      await lease.put(this.key).value(this.value).exec();
    } catch (error) {
      // Stop keeping a lease alive that holds nothing; it expires on its own.
      lease.release();
      if (this.lease === lease) this.lease = undefined;
      throw error;
    }
    return { lost };
  }

  /** Registers and keeps the registration until `signal` fires, then revokes it. */
  async run(signal: AbortSignal): Promise<void> {
    try {
      while (!signal.aborted && !this.revoked) {
        let lost: Promise<Error>;
        try {
          ({ lost } = await this.register());
          if (this.revoked) break;
          this.logger?.info({ leaseTtlSeconds: this.ttl }, "registered in etcd");
        } catch (error) {
          if (signal.aborted || this.revoked) break;
          this.logger?.warn({ err: errorOf(error) }, "etcd registration failed; retrying");
          await delay(this.retryDelayMs, signal).catch(() => undefined);
          continue;
        }
        const woken = new Promise<void>((resolve) => (this.wake = resolve));
        const outcome = await Promise.race([lost, whenAborted(signal, lost), woken]);
        this.wake = undefined;
        if (outcome instanceof Error && !signal.aborted && !this.revoked) {
          this.logger?.warn({ err: outcome }, "etcd lease lost; registering again");
        }
      }
      // Revoked on drain: nothing to do until the task is stopped.
      if (!signal.aborted) await whenAborted(signal, new Promise<never>(() => undefined));
    } finally {
      await this.revoke().catch((error: unknown) => this.logger?.warn({ err: errorOf(error) }, "etcd lease revoke failed; the key expires with its lease"));
    }
  }

  /**
   * Deletes the key now by revoking its lease, and stops registering again.
   * When etcd cannot be reached it rejects, and the key expires with its
   * lease (keep-alive has stopped).
   */
  async revoke(): Promise<void> {
    this.revoked = true;
    this.wake?.();
    const lease = this.lease;
    this.lease = undefined;
    if (lease !== undefined) await lease.revoke();
  }

  /** Revokes (best effort) and closes the client. */
  async close(): Promise<void> {
    try {
      await this.revoke();
    } finally {
      this.client.close();
    }
  }
}

export interface EtcdResolverOptions extends EtcdPool, ConnectOptions {
  readonly logger?: Logger;
  /** Counts errors as `mmgate_discovery_errors_total{resolver="etcd"}`. */
  readonly registry?: Registry;
  /** Called with each error talking to etcd (a lost watch, a failed reload). */
  readonly onError?: (error: Error) => void;
}

function discoveryErrors(registry: Registry): Counter<"resolver"> {
  const name = "mmgate_discovery_errors_total";
  return registeredMetric(
    registry,
    name,
    Counter<"resolver">,
    () =>
      new Counter({
        name,
        help: "Errors talking to the membership source (lost watches, failed reloads), by resolver",
        labelNames: ["resolver"] as const,
        registers: [registry],
      }),
  );
}

/**
 * Membership from etcd: every valid instance under the pool's prefix.
 * Start-up reads the prefix, committing generation 1, and watches from the
 * revision after that read, so no change between the two is lost. Each
 * watch response that changes the members commits the next generation.
 * When etcd is unreachable the last membership stays current and the
 * watch resumes from the revision after the last one applied. A value
 * that is not a valid `{ id, address, metadata }` for its key is ignored
 * with a warning.
 */
export class EtcdResolver implements Resolver {
  /** The etcd client this resolver owns; `close()` closes it. */
  readonly client: Etcd3;
  readonly prefix: string;
  private readonly cell: MembershipCell;
  private readonly entries: Map<string, Member>;
  private readonly logger: Logger | undefined;
  private readonly reportError: (error: Error) => void;
  /** The revision every event up to which is applied. */
  private revision: bigint;
  private watcher: Watcher | undefined;
  private connected = true;
  private closing = false;
  private resyncing: Promise<void> | undefined;

  private constructor(client: Etcd3, prefix: string, options: EtcdResolverOptions, entries: Map<string, Member>, revision: bigint) {
    this.client = client;
    this.prefix = prefix;
    this.entries = entries;
    this.revision = revision;
    this.cell = new MembershipCell([...entries.values()]);
    this.logger = options.logger?.child({ resolver: "etcd", prefix });
    const counter = options.registry === undefined ? undefined : discoveryErrors(options.registry).labels("etcd");
    counter?.inc(0);
    this.reportError = (error) => {
      counter?.inc();
      options.onError?.(error);
    };
  }

  /** Reads the pool's members and starts watching; rejects when etcd cannot be read. */
  static async create(options: EtcdResolverOptions): Promise<EtcdResolver> {
    for (const name of ["namespace", "component", "endpoint"] as const) segment.parse(options[name]);
    const prefix = etcdPoolPrefix(options);
    const client = await connect(options);
    try {
      const logger = options.logger?.child({ resolver: "etcd", prefix });
      const { entries, revision } = await EtcdResolver.load(client, prefix, logger);
      const resolver = new EtcdResolver(client, prefix, options, entries, revision);
      resolver.startWatch();
      return resolver;
    } catch (error) {
      client.close();
      throw error;
    }
  }

  private static async load(client: Etcd3, prefix: string, logger: Logger | undefined): Promise<{ entries: Map<string, Member>; revision: bigint }> {
    const response = await client.getAll().prefix(prefix).exec();
    const entries = new Map<string, Member>();
    for (const kv of response.kvs) {
      const member = parseMember(prefix, kv, logger);
      if (member !== undefined) entries.set(kv.key.toString(), member);
    }
    return { entries, revision: BigInt(response.header.revision) };
  }

  current(): Membership {
    return this.cell.current();
  }

  watch(signal: AbortSignal): AsyncIterable<Membership> {
    return this.cell.watch(signal);
  }

  /** Ends the etcd watch and every consumer's watch, and closes the client. */
  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    this.cell.close();
    await this.resyncing;
    const watcher = this.watcher;
    this.watcher = undefined;
    // Cancelling first leaves the client nothing to reconnect; bounded, as etcd may be gone.
    if (watcher !== undefined) await settleWithin(watcher.cancel(), 1000);
    watcher?.removeAllListeners();
    this.client.close();
  }

  private startWatch(): void {
    const watcher = this.client.watch().prefix(this.prefix).startRevision((this.revision + 1n).toString()).watcher();
    this.watcher = watcher;
    // Each (re)connection resumes after the last revision applied here.
    // (The event carries the create request, typed as its envelope.)
    watcher.on("connecting", (request) => {
      (request as IWatchCreateRequest).start_revision = (this.revision + 1n).toString();
    });
    watcher.on("data", (response) => this.apply(response));
    watcher.on("connected", () => {
      if (!this.connected) this.logger?.info({ revision: this.revision.toString() }, "etcd watch resumed");
      this.connected = true;
    });
    watcher.on("disconnected", (error) => {
      if (this.closing) return;
      this.reportError(error);
      if (this.connected) this.logger?.warn({ err: error, generation: this.cell.current().generation.toString() }, "etcd watch lost; keeping the last membership");
      this.connected = false;
    });
    watcher.on("error", (error) => {
      // etcd cancelled the watch (its revision compacted away, say): read the prefix again.
      if (this.closing) return;
      this.reportError(error);
      this.logger?.warn({ err: error }, "etcd watch cancelled; reloading the membership");
      this.resyncing = this.resync(watcher).finally(() => (this.resyncing = undefined));
    });
  }

  private async resync(cancelled: Watcher): Promise<void> {
    cancelled.removeAllListeners();
    if (this.watcher === cancelled) this.watcher = undefined;
    let pause = 100;
    while (!this.closing) {
      try {
        const { entries, revision } = await EtcdResolver.load(this.client, this.prefix, this.logger);
        if (this.closing) return;
        this.entries.clear();
        for (const [key, member] of entries) this.entries.set(key, member);
        this.revision = revision;
        this.cell.commit([...this.entries.values()]);
        this.startWatch();
        return;
      } catch (error) {
        if (this.closing) return;
        this.reportError(errorOf(error));
        await delay(pause);
        pause = Math.min(2000, pause * 2);
      }
    }
  }

  /** Applies one watch response's events and commits the result as one change. */
  private apply(response: IWatchResponse): void {
    if (this.closing) return;
    let last = this.revision;
    for (const event of response.events) {
      const revision = BigInt(event.kv.mod_revision);
      if (revision <= this.revision) continue; // seen already, before a reconnect
      if (revision > last) last = revision;
      const key = event.kv.key.toString();
      if (event.type === "Delete") {
        this.entries.delete(key);
        continue;
      }
      const member = parseMember(this.prefix, event.kv, this.logger);
      if (member === undefined) this.entries.delete(key);
      else this.entries.set(key, member);
    }
    this.revision = last;
    this.cell.commit([...this.entries.values()]);
  }
}

/** The member a key holds, or undefined (with a warning) when its value is not valid for that key. */
function parseMember(prefix: string, kv: IKeyValue, logger: Logger | undefined): Member | undefined {
  const key = kv.key.toString();
  const instanceId = key.slice(prefix.length);
  let reason: string;
  try {
    const parsed = memberValueSchema.safeParse(JSON.parse(kv.value.toString()));
    if (!parsed.success) {
      reason = parsed.error.issues.map((i) => `${i.path.join(".") || "value"}: ${i.message}`).join("; ");
    } else if (parsed.data.id !== instanceId) {
      reason = `id "${parsed.data.id}" is not the key's instance id "${instanceId}"`;
    } else {
      return parsed.data;
    }
  } catch (error) {
    reason = `not JSON: ${errorOf(error).message}`;
  }
  logger?.warn({ key, reason }, "ignoring a malformed member in etcd");
  return undefined;
}
