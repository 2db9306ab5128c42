/**
 * The config file of each mmgate role of a stack: loopback on a port the
 * kernel picks, the stack's token, its server certificate (unless TLS is
 * off), JSON logs (the stack reads the "mmgate serving" line), a short drain,
 * and the role's modules and outbound channels (TLS with the stack's CA).
 */
import { writeFileSync } from "node:fs";
import { stringify as toYaml } from "yaml";

/** The kinds of process a stack runs. */
export type RoleKind = "etcd" | "nats" | "relay" | "router" | "encoder" | "token-worker" | "hop" | "images";

/** The etcd pool the Encode workers register in and the hop watches. */
export const ENCODER_POOL = Object.freeze({ namespace: "stack", component: "encoder", endpoint: "encode" });

/** The relay's one pool, and the NATS subject it also takes router events from. */
export const RELAY_POOL = "default";
export const NATS_SUBJECT = "kv.events.default";

/**
 * The pool reads NATS through JetStream (nats-server runs with it on): the
 * stream the relay creates on that subject, kept on disk (every default of
 * `relay.pools[].nats.jetstream`: 24 h, 1 GiB), and the relay's durable
 * consumer, named for the pool (one per relay process and pool). Events
 * published while the relay is down wait there, and a relay that starts
 * replays the stream into its empty filter.
 */
export const NATS_STREAM = "MMGATE_KV_EVENTS";
export const NATS_DURABLE = `mmgate-relay-${RELAY_POOL}`;

/** How long a role's calls get to finish when it is stopped (`shutdown.graceMs`). */
export const ROLE_GRACE_MS = 3000;

/** How long a role still takes calls after SIGTERM, health NOT_SERVING (`shutdown.delayMs`). */
export const ROLE_SHUTDOWN_DELAY_MS = 1000;

export interface CommonSettings {
  readonly token: string;
  /** Undefined with TLS off. */
  readonly tls?: { readonly certFile: string; readonly keyFile: string; readonly caFile: string };
  readonly logLevel: string;
  /** `shutdown.graceMs` of every role. */
  readonly graceMs: number;
  /** The Encode workers' etcd lease TTL (`encodeWorker.register.leaseTtlSeconds`); undefined: the default (10 s). */
  readonly leaseTtlSeconds?: number;
}

/** What a role's peers are, for its config. */
export interface Peers {
  /** etcd's client URL, `http://127.0.0.1:PORT`. */
  readonly etcdEndpoint?: string;
  /** nats-server's `127.0.0.1:PORT`. */
  readonly natsAddress?: string;
  readonly relayAddress?: string;
  readonly tokenWorkerAddress?: string;
  /** The encoder's index (1..N), for its instance id. */
  readonly encoderIndex?: number;
}

/** The command (after `bin/mmgate.js`) that runs a role's config file: `serve`, or the router's own role command. */
export function roleSubcommand(kind: RoleKind): string {
  // `serve` does not know the router module: `mmgate router` brings it.
  return kind === "router" ? "router" : "serve";
}

/** An outbound channel to stack roles: TLS with the stack's CA, or cleartext. */
function channel(common: CommonSettings): Record<string, unknown> {
  return common.tls ? { tls: true, caFile: common.tls.caFile } : { tls: false };
}

/** The settings every role shares. */
function base(common: CommonSettings): Record<string, unknown> {
  return {
    listen: "127.0.0.1:0",
    adminListen: "127.0.0.1:0",
    ...(common.tls ? { tls: { certFile: common.tls.certFile, keyFile: common.tls.keyFile } } : {}),
    auth: { token: common.token },
    log: { level: common.logLevel, format: "json" },
    // Every role keeps taking calls for a moment after SIGTERM (health NOT_SERVING first), so that
    // a stack stopped all at once (SIGTERM to every process, as a cluster does) finishes what is in flight.
    shutdown: { graceMs: common.graceMs, delayMs: ROLE_SHUTDOWN_DELAY_MS },
  };
}

function need<T>(value: T | undefined, what: string): T {
  if (value === undefined) throw new Error(`stack: ${what} is not known yet`);
  return value;
}

/** A role's configuration, as the object its YAML file holds. */
export function roleConfig(kind: RoleKind, common: CommonSettings, peers: Peers): Record<string, unknown> {
  switch (kind) {
    case "relay":
      return {
        ...base(common),
        modules: ["relay"],
        relay: {
          pools: [
            {
              name: RELAY_POOL,
              nats: { servers: [need(peers.natsAddress, "nats-server's address")], subject: NATS_SUBJECT, jetstream: { stream: NATS_STREAM, durable: NATS_DURABLE } },
            },
          ],
        },
      };
    case "router":
      // The role command sets the modules (router); the file does not name them.
      return { ...base(common), router: { relays: [need(peers.relayAddress, "the relay's address")], channel: channel(common) } };
    case "encoder":
      return {
        ...base(common),
        modules: ["media", "encodeWorker"],
        encodeWorker: {
          register: {
            endpoints: [need(peers.etcdEndpoint, "etcd's endpoint")],
            ...ENCODER_POOL,
            instanceId: `encoder-${need(peers.encoderIndex, "the encoder's index")}`,
            ...(common.leaseTtlSeconds !== undefined ? { leaseTtlSeconds: common.leaseTtlSeconds } : {}),
          },
        },
      };
    case "token-worker":
      // The receiver reads and releases tensors in the Encode workers' stores, over TLS.
      return { ...base(common), modules: ["tokenWorker"], tokenWorker: { receiver: { channel: channel(common) } } };
    case "hop":
      return {
        ...base(common),
        modules: ["encodeHop"],
        encodeHop: {
          downstream: need(peers.tokenWorkerAddress, "the token worker's address"),
          encoders: { discovery: "etcd", etcd: { endpoints: [need(peers.etcdEndpoint, "etcd's endpoint")], ...ENCODER_POOL } },
          channel: channel(common),
        },
      };
    case "images":
      // The embedded reference provider: deterministic images, no network.
      return { ...base(common), modules: ["images"] };
    default:
      throw new Error(`stack: ${kind} has no mmgate config`);
  }
}

/** Writes `config` as YAML to `file` (0600: it holds the token), with a header saying how it runs. */
export function writeRoleConfig(file: string, name: string, kind: RoleKind, config: Record<string, unknown>): void {
  const header = [
    `# mmgate stack: the ${name} role, written by \`mmgate stack up\` (rewritten at every start).`,
    `# It runs as: node bin/mmgate.js ${roleSubcommand(kind)} -c ${file}`,
    "# listen 127.0.0.1:0 lets the kernel pick the port; the stack reads the bound one from the",
    '# "mmgate serving" log line. Holds the stack\'s token: keep it 0600.',
    "",
  ].join("\n");
  writeFileSync(file, header + toYaml(config), { mode: 0o600 });
}
