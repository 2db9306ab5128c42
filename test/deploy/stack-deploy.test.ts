/**
 * The whole stack of `mmgate stack up` as container and cluster recipes:
 * deploy/compose/ (Docker Compose) and deploy/kubernetes/stack/ (a
 * kustomization). Like manifests.test.ts these are static checks against the
 * code, with no docker or kubectl: every role's config file loads through
 * the real config loader and has the keys src/stack/configs.ts writes for
 * that role; every address one role gives for another names a service of
 * the same recipe, of the right role, on the port that role listens on;
 * commands and health checks parse with the executable's own subcommands;
 * the roles are those of src/stack (ROLE_KINDS), so a role added to the
 * stack fails here until both recipes have it. Compose keeps the stack's one
 * token; the Kubernetes recipe replaces it with named keys (a mounted
 * Secret) and mutual TLS between the roles, held to the access module: the
 * files the configs name are the mounted Secrets' files, every scope names
 * something, and each call one role makes to another (the methods its code
 * calls) is granted by a certificate rule of the callee for the caller's
 * certificate, and by no other rule. One check runs: the token worker's
 * config (client certificates required) in this process, with certificates
 * made by openssl as cert-manager/ asks for them (skipped without openssl):
 * its probes answer over plain HTTP, a client without a certificate is
 * turned away, the hop's channel gets its calls in as "hop", another
 * role's certificate does not.
 */
import { expect } from "chai";
import { execFileSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join, posix, relative, resolve } from "node:path";
import type { PeerCertificate } from "node:tls";
import { fileURLToPath } from "node:url";
import type { DescMethod, DescService } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import type { Command } from "commander";
import { pino } from "pino";
import { Registry } from "prom-client";
import { parse as parseYaml, parseAllDocuments } from "yaml";
import { KvEventRelay } from "../../gen/dynamo/kvrelay/v1/relay_pb.js";
import { Health } from "../../gen/grpc/health/v1/health_pb.js";
import { EncodeWorkerService } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { TokenWorkerService } from "../../gen/mmgate/llm/v1/token_worker_pb.js";
import { MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import { program, subcommands } from "../../src/cli/main.js";
import { serveRoles } from "../../src/cli/serve.js";
import { peakMemoryBytes, type MediaConfig } from "../../src/media/index.js";
import { builtinModules } from "../../src/modules.js";
import { Access, AccessControl, KEY_PREFIX, methodAccess, scopeCatalog, validateKeys, type KeyEntry } from "../../src/server/access/index.js";
import { gatherRawConfig } from "../../src/server/config/index.js";
import { loadConfig, splitHostPort, type MmgateConfig, type ServiceModule } from "../../src/server/index.js";
import { ChannelPool, type ChannelOptions } from "../../src/rpc/index.js";
import { MAX_WORKERS, MIN_WORKERS, ROLE_GRACE_MS, ROLE_KINDS, roleConfig, roleSubcommand, type RoleKind } from "../../src/stack/index.js";
import { eventually, startServer, type InProcessServer } from "../support/index.js";
import type { Certificate, Container, Kustomization, Pdb, Secret, Service, Volume, Workload } from "../support/k8s.js";
import { opensslAvailable } from "../support/pki.js";

const repoRoot = fileURLToPath(new URL("../../", import.meta.url));
const composeDir = join(repoRoot, "deploy", "compose");
const kubeDir = join(repoRoot, "deploy", "kubernetes", "stack");
/** A stand-in for the token the recipes take from the environment or a Secret. */
const TOKEN = "0123456789abcdef0123";
const MiB = 2 ** 20;
/** What a stop may take beyond the drain (closing the modules, the process exit). */
const STOP_MARGIN_MS = 5000;

type Obj = Record<string, unknown>;

// The code's side: what `mmgate stack up` writes for each role.

/** Each peer as a host no recipe uses, so that a value naming one is known to be that peer's address. */
const peerHost = (kind: RoleKind) => `${kind}.peer.invalid`;
const PEERS = {
  etcdEndpoint: `http://${peerHost("etcd")}:1`,
  natsAddress: `${peerHost("nats")}:1`,
  relayAddress: `${peerHost("relay")}:1`,
  tokenWorkerAddress: `${peerHost("token-worker")}:1`,
};

type StackTls = Parameters<typeof roleConfig>[1]["tls"];

/** The stack's config for a role: TLS off (as Compose runs it), or on with the certificate, key and CA at `tls`'s paths. */
function stackConfig(kind: RoleKind, encoderIndex = 1, tls?: StackTls): Obj {
  return roleConfig(kind, { token: TOKEN, ...(tls ? { tls } : {}), logLevel: "info", graceMs: ROLE_GRACE_MS }, { ...PEERS, encoderIndex });
}

/** Values a recipe sets its own way: where it listens, and how long it drains. */
const RECIPE_PATHS = new Set(["listen", "adminListen", "shutdown.graceMs", "shutdown.delayMs"]);

/**
 * What the Kubernetes recipe sets beyond the stack's keys, for its access
 * control (in place of the stack's auth.token): the client certificates its
 * listener asks for, the keys file and the certificate rules, the
 * certificate its channels present and the name they check the Encode
 * workers' against, the hop's channel to the token worker, and the hop
 * keeping its callers' keys to itself. The access tests check each.
 */
const ACCESS_PATHS: readonly RegExp[] = [
  /^tls\.(clientCaFile|clientAuth)$/,
  /^auth\.(keysFile|certificates\..+)$/,
  /(^|\.)channel\.(certFile|keyFile|serverName)$/,
  /^encodeHop\.downstreamChannel\..+$/,
  /^encodeHop\.passAuthorization$/,
];

/** A config's values by dotted path: objects and lists of objects are descended into (`relay.pools.0.name`), lists of scalars kept whole. */
function leaves(value: unknown, prefix = "", out = new Map<string, unknown>()): Map<string, unknown> {
  const at = (key: string | number) => (prefix === "" ? String(key) : `${prefix}.${key}`);
  if (Array.isArray(value) && value.some((v) => typeof v === "object" && v !== null)) value.forEach((v, i) => leaves(v, at(i), out));
  else if (value !== null && typeof value === "object" && !Array.isArray(value)) for (const [k, v] of Object.entries(value)) leaves(v, at(k), out);
  else out.set(prefix, value);
  return out;
}

/** The peer kinds a stack value names (one per address), or undefined when it names none. */
function peerKinds(value: unknown): RoleKind[] | undefined {
  const values = Array.isArray(value) ? value : [value];
  const kinds = values.map((v) => (typeof v === "string" ? /([a-z-]+)\.peer\.invalid/.exec(v)?.[1] : undefined));
  if (kinds.length === 0 || kinds.some((k) => k === undefined)) return undefined;
  return kinds as RoleKind[];
}

/** `http://h:p`, `nats://h:p` or `h:p` → host and port. */
function hostPortOf(address: string): { host: string; port: number } {
  if (address.includes("://")) {
    const url = new URL(address);
    return { host: url.hostname, port: Number(url.port) };
  }
  return splitHostPort(address);
}

/** The value following `flag` (or `flag=value`) in an argument list. */
function flagValue(args: readonly string[], ...flags: string[]): string | undefined {
  for (let i = 0; i < args.length; i++) {
    for (const flag of flags) {
      if (args[i] === flag) return args[i + 1];
      if (args[i]!.startsWith(`${flag}=`)) return args[i]!.slice(flag.length + 1);
    }
  }
  return undefined;
}

/** A role's config file loaded as `mmgate <its subcommand> -c FILE` loads it, with `env`. */
interface LoadedRole {
  readonly config: MmgateConfig;
  /** The file and the environment merged, before validation. */
  readonly raw: Obj;
  readonly modules: readonly ServiceModule[];
  readonly warnings: readonly string[];
}

async function loadRole(kind: RoleKind, file: string, env: Readonly<Record<string, string>>): Promise<LoadedRole> {
  const role = serveRoles.find((r) => r.name === roleSubcommand(kind));
  const modules = [...builtinModules, ...((await role?.extraModules?.()) ?? [])];
  // A role command's modules beat the file, as `mmgate router` sets them.
  const overrides = role ? { modules: [...role.modules] } : {};
  const warnings: string[] = [];
  const config = loadConfig({ file, env, overrides, onWarning: (w) => warnings.push(w) }, modules);
  return { config, raw: gatherRawConfig({ file, env }, undefined, modules).values, modules, warnings };
}

/** How long a role may take to stop after SIGTERM: health NOT_SERVING, then the drain (the image API's own grace runs alongside). */
function drainMs(config: MmgateConfig): number {
  const images = config.modules.includes("images") ? (config.sections.images as { shutdownGraceMs: number }).shutdownGraceMs : 0;
  return config.shutdown.delayMs + Math.max(config.shutdown.graceMs, images);
}

/**
 * The executable's command tree for `mmgate SUB ARGS`, loaded as main.ts
 * loads it, with ARGS parsed into the subcommand's options (none unknown).
 */
async function parseCli(label: string, argv: readonly string[]): Promise<Command> {
  const [sub, ...args] = argv;
  expect(
    subcommands.map((s) => s.name),
    `${label}: \`mmgate ${sub}\` is a subcommand of the executable (src/cli/main.ts)`,
  ).to.include(sub);
  const root = await program(argv);
  const command = root.commands.find((c) => c.name() === sub)!;
  // A bad option throws here instead of ending the process.
  command.exitOverride();
  command.configureOutput({ writeOut: () => undefined, writeErr: () => undefined });
  const { operands, unknown } = command.parseOptions([...args]);
  expect(unknown, `${label}: options \`mmgate ${sub}\` does not know`).to.deep.equal([]);
  expect(operands, `${label}: operands`).to.deep.equal([]);
  return command;
}

interface ShapeOptions {
  readonly encoderIndex?: number;
  readonly exempt?: readonly string[];
  /** Compare with the stack's config with TLS on, at these paths. */
  readonly tls?: StackTls;
  /** The recipe replaces auth.token with the access control of ACCESS_PATHS. */
  readonly access?: boolean;
}

/**
 * Checks a recipe's role config against the stack's for that role: the same
 * keys (an Encode worker may add advertiseAddress; with `access`, the
 * ACCESS_PATHS for auth.token), the same values but for RECIPE_PATHS,
 * `exempt` and peer addresses; returns the peer addresses, by path, with the
 * kind each must name.
 */
function expectStackShape(label: string, kind: RoleKind, raw: Obj, options: ShapeOptions = {}) {
  const stack = leaves(stackConfig(kind, options.encoderIndex, options.tls));
  if (options.access) stack.delete("auth.token");
  const recipe = leaves(raw);
  const extra = (k: string) => (kind === "encoder" && k === "advertiseAddress") || (options.access === true && ACCESS_PATHS.some((p) => p.test(k)));
  expect(
    [...recipe.keys()].filter((k) => !extra(k)).sort(),
    `${label}: the keys \`mmgate stack up\` writes for ${kind} (src/stack/configs.ts)`,
  ).to.deep.equal([...stack.keys()].sort());
  const exempt = new Set([...RECIPE_PATHS, ...(options.exempt ?? [])]);
  const peers: { path: string; kind: RoleKind; addresses: string[] }[] = [];
  for (const [path, value] of stack) {
    const kinds = peerKinds(value);
    if (kinds !== undefined) {
      const given = recipe.get(path);
      const addresses = (Array.isArray(given) ? given : [given]).map(String);
      expect(addresses.length, `${label}: ${path}`).to.be.greaterThan(0);
      peers.push({ path, kind: kinds[0]!, addresses });
    } else if (!exempt.has(path)) {
      expect(recipe.get(path), `${label}: ${path}, as the stack sets it`).to.deep.equal(value);
    }
  }
  return peers;
}

/** A duration as Compose writes it (`20s`, `1m30s`, `500ms`), in ms. */
function durationMs(text: string): number {
  const units: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
  const parts = [...text.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h)/g)];
  expect(parts.map((p) => p[0]).join(""), `a duration: ${text}`).to.equal(text);
  return parts.reduce((sum, p) => sum + Number(p[1]) * units[p[2]!]!, 0);
}

/** A Kubernetes memory quantity ("4Gi", "512Mi") in bytes. */
function quantityBytes(q: unknown): number {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(String(q));
  if (!m) throw new Error(`not a memory quantity: ${String(q)}`);
  const unit = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, k: 1e3, M: 1e6, G: 1e9, T: 1e12 }[m[2] ?? ""] ?? 1;
  return Number(m[1]) * unit;
}

/** An image reference pinned to a version: a tag, and not `latest`. */
function expectPinned(label: string, image: unknown): void {
  expect(image, `${label}: image`).to.be.a("string");
  const tag = /:([^/:@]+)$/.exec(image as string)?.[1];
  expect(tag, `${label}: ${String(image)} has a tag`).to.be.a("string");
  expect(tag, `${label}: ${String(image)} is pinned`).to.not.equal("latest");
  expect(tag, `${label}: ${String(image)} names a version`).to.match(/^v?\d+\.\d+\.\d+/);
}

/** The port etcd serves clients on, from its flags. */
function etcdClientPort(args: readonly string[]): number {
  const urls = flagValue(args, "--listen-client-urls");
  expect(urls, "etcd --listen-client-urls").to.be.a("string");
  return Number(new URL(urls!.split(",")[0]!).port);
}

/** nats-server's client and monitoring ports, from its flags. */
function natsPorts(args: readonly string[]): { client: number; monitor: number } {
  const client = Number(flagValue(args, "--port", "-p") ?? 4222);
  const monitor = Number(flagValue(args, "--http_port", "-m"));
  expect(monitor, "nats-server --http_port (its /healthz)").to.be.greaterThan(0);
  return { client, monitor };
}

// ---------------------------------------------------------------- Compose

interface ComposeService {
  image?: string;
  build?: string | { context: string; dockerfile?: string };
  command?: string[] | string;
  environment?: Record<string, string | number | boolean | null> | string[];
  volumes?: (string | Obj)[];
  ports?: (string | Obj)[];
  depends_on?: Record<string, { condition?: string }> | string[];
  healthcheck?: { test?: string[] | string; timeout?: string; disable?: boolean };
  stop_grace_period?: string;
  read_only?: boolean;
  tmpfs?: string[] | string;
  user?: string;
}

interface ComposeRole {
  readonly name: string;
  readonly kind: RoleKind;
  readonly service: ComposeService;
  readonly argv: readonly string[];
  /** The port its clients use: gRPC for mmgate, etcd's and nats-server's client ports. */
  readonly port: number;
  /** mmgate roles: the loaded config and its file. */
  readonly loaded?: LoadedRole;
  readonly configFile?: string;
}

/** The variables compose.yaml may interpolate, as a user sets them. */
const COMPOSE_VARS: Readonly<Record<string, string>> = { MMGATE_AUTH_TOKEN: TOKEN };

/** Compose's `${VAR}`, `${VAR:?message}`, `${VAR:-default}` in every string value, as `up` resolves them. */
function interpolate(value: unknown, label = ""): unknown {
  if (typeof value === "string") {
    const out = value.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-?+][^}]*)?\}/g, (_, name: string) => {
      expect(COMPOSE_VARS, `${label}: \${${name}} is a variable the README tells users to set`).to.have.property(name);
      return COMPOSE_VARS[name]!;
    });
    expect(out, `${label}: no other interpolation`).to.not.include("$");
    return out;
  }
  if (Array.isArray(value)) return value.map((v, i) => interpolate(v, `${label}.${i}`));
  if (value !== null && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, interpolate(v, `${label}.${k}`)]));
  return value;
}

function composeText(): string {
  return readFileSync(join(composeDir, "compose.yaml"), "utf8");
}

/** compose.yaml as Compose reads it: `<<` merge keys applied, variables not yet interpolated. */
function composeRaw(): { services: Record<string, ComposeService>; volumes?: Obj } {
  return parseYaml(composeText(), { merge: true }) as { services: Record<string, ComposeService>; volumes?: Obj };
}

function composeKind(name: string): RoleKind {
  const kind = /^encoder-\d+$/.test(name) ? "encoder" : name;
  expect(ROLE_KINDS, `compose service ${name} is a role of the stack (src/stack, named as the stack names its processes)`).to.include(kind);
  return kind as RoleKind;
}

function composeEnv(service: ComposeService): Record<string, string> {
  const env: Record<string, string> = {};
  const entries = Array.isArray(service.environment)
    ? service.environment.map((e) => [e.slice(0, e.indexOf("=")), e.slice(e.indexOf("=") + 1)] as const)
    : Object.entries(service.environment ?? {});
  for (const [name, value] of entries) if (value !== null && value !== undefined) env[name] = String(value);
  return env;
}

function argvOf(command: string[] | string | undefined): string[] {
  if (command === undefined) return [];
  // The shell form would put sh, not node, at PID 1: SIGTERM would not reach the server.
  expect(command, "a command in exec form (a list)").to.be.an("array");
  return command as string[];
}

/** A bind mount `./config/x.yaml:/etc/mmgate/x.yaml:ro` (or the long form) → source (absolute) and target. */
function bindMount(volume: string | Obj): { source: string; target: string; readOnly: boolean } | undefined {
  if (typeof volume === "string") {
    const [source, target, mode] = volume.split(":");
    if (!source!.startsWith(".") && !source!.startsWith("/")) return undefined;
    return { source: resolve(composeDir, source!), target: target!, readOnly: mode === "ro" };
  }
  if (volume.type !== "bind") return undefined;
  return { source: resolve(composeDir, String(volume.source)), target: String(volume.target), readOnly: volume.read_only === true };
}

async function composeRoles(): Promise<ComposeRole[]> {
  const { services } = composeRaw();
  const roles: ComposeRole[] = [];
  for (const [name, raw] of Object.entries(services)) {
    const service = interpolate(raw, `compose ${name}`) as ComposeService;
    const kind = composeKind(name);
    const argv = argvOf(service.command);
    if (kind === "etcd") {
      roles.push({ name, kind, service, argv, port: etcdClientPort(argv) });
    } else if (kind === "nats") {
      roles.push({ name, kind, service, argv, port: natsPorts(argv).client });
    } else {
      const configPath = flagValue(argv, "-c", "--config");
      expect(configPath, `compose ${name}: -c FILE`).to.be.a("string");
      const mount = (service.volumes ?? []).map(bindMount).find((m) => m?.target === configPath);
      expect(mount, `compose ${name}: a bind mount at ${configPath}`).to.not.equal(undefined);
      const loaded = await loadRole(kind, mount!.source, composeEnv(service));
      roles.push({ name, kind, service, argv, port: splitHostPort(loaded.config.listen).port, loaded, configFile: mount!.source });
    }
  }
  return roles;
}

describe("deploy: the whole stack in Compose (deploy/compose)", () => {
  let roles: ComposeRole[];
  before(async function () {
    this.timeout(60_000);
    roles = await composeRoles();
  });
  const mmgateRoles = () => roles.filter((r) => r.loaded !== undefined);
  const byName = (name: string) => roles.find((r) => r.name === name);

  it("compose.yaml parses (merge keys and all) and every config file in config/ is YAML", () => {
    for (const doc of parseAllDocuments(composeText(), { merge: true })) {
      expect(doc.errors.map((e) => e.message)).to.deep.equal([]);
      expect(doc.warnings.map((e) => e.message)).to.deep.equal([]);
    }
    for (const file of readdirSync(join(composeDir, "config"))) {
      expect(file, "config/ holds only role config files").to.match(/^[a-z0-9-]+\.yaml$/);
      for (const doc of parseAllDocuments(readFileSync(join(composeDir, "config", file), "utf8"))) {
        expect(doc.errors.map((e) => e.message), file).to.deep.equal([]);
        expect(doc.warnings.map((e) => e.message), file).to.deep.equal([]);
      }
    }
  });

  it("runs every role of the stack, and nothing else: the Encode workers as encoder-1..N", () => {
    expect([...new Set(roles.map((r) => r.kind))].sort()).to.deep.equal([...ROLE_KINDS].sort());
    const encoders = roles.filter((r) => r.kind === "encoder").map((r) => r.name);
    expect(encoders.length).to.be.within(MIN_WORKERS, MAX_WORKERS);
    expect(encoders).to.deep.equal(encoders.map((_, i) => `encoder-${i + 1}`));
  });

  it("pins every image; every mmgate role runs the one image the repository's Dockerfile builds", () => {
    for (const role of roles) expectPinned(`compose ${role.name}`, role.service.image);
    const mmgate = mmgateRoles();
    expect(new Set(mmgate.map((r) => r.service.image)).size, "one image for every mmgate role").to.equal(1);
    for (const role of mmgate) {
      const build = role.service.build;
      expect(build, `compose ${role.name}: build`).to.not.equal(undefined);
      const context = resolve(composeDir, typeof build === "string" ? build : build!.context);
      const dockerfile = typeof build === "string" ? "Dockerfile" : (build!.dockerfile ?? "Dockerfile");
      expect(relative(repoRoot, context), `compose ${role.name}: the build context is the repository`).to.equal("");
      expect(existsSync(join(context, dockerfile)), `compose ${role.name}: ${dockerfile}`).to.equal(true);
    }
  });

  it("each mmgate role runs `node bin/mmgate.js <its subcommand> -c FILE` in exec form, FILE mounted read-only from config/", async () => {
    const used = new Set<string>();
    for (const role of mmgateRoles()) {
      const label = `compose ${role.name}`;
      expect(role.argv.slice(0, 2), `${label}: node runs the executable itself (not npm, which does not pass SIGTERM on)`).to.deep.equal(["node", "bin/mmgate.js"]);
      expect(role.argv[2], `${label}: the stack's subcommand for ${role.kind}`).to.equal(roleSubcommand(role.kind));
      await parseCli(label, role.argv.slice(2));
      const mount = (role.service.volumes ?? []).map(bindMount).find((m) => m?.source === role.configFile);
      expect(mount?.readOnly, `${label}: the config is mounted read-only`).to.equal(true);
      expect(relative(join(composeDir, "config"), role.configFile!), `${label}: the config file is in deploy/compose/config`).to.not.match(/^\.\.|\//);
      expect(existsSync(role.configFile!), `${label}: ${role.configFile}`).to.equal(true);
      used.add(basename(role.configFile!));
    }
    expect([...used].sort(), "every file in config/ is some role's").to.deep.equal(readdirSync(join(composeDir, "config")).sort());
  });

  it("every role's config loads through the real config loader, without warnings, with the modules the role names", () => {
    for (const role of mmgateRoles()) {
      const { config, modules, warnings } = role.loaded!;
      expect(warnings, `compose ${role.name}: warnings (unknown variables, old names)`).to.deep.equal([]);
      const known = modules.map((m) => m.name);
      for (const name of config.modules) expect(known, `compose ${role.name}: module ${name}`).to.include(name);
      const fileModules = (parseYaml(readFileSync(role.configFile!, "utf8")) as Obj).modules;
      for (const name of (fileModules as string[] | undefined) ?? []) expect(known, `compose ${role.name}: module ${name}`).to.include(name);
      expect(config.auth.token, `compose ${role.name}: the token is on`).to.equal(TOKEN);
      // Reached from other containers and from the health check on 127.0.0.1.
      expect(splitHostPort(config.listen).host, `compose ${role.name}: listen`).to.equal("0.0.0.0");
    }
  });

  it("the token comes from MMGATE_AUTH_TOKEN, which Compose requires", () => {
    const { services } = composeRaw();
    for (const role of mmgateRoles()) {
      const env = services[role.name]!.environment as Record<string, string> | undefined;
      expect(env?.MMGATE_AUTH_TOKEN, `compose ${role.name}: MMGATE_AUTH_TOKEN`).to.match(/^\$\{MMGATE_AUTH_TOKEN:\?[^}]+\}$/);
      const file = parseYaml(readFileSync(role.configFile!, "utf8")) as { auth?: { token?: unknown } };
      expect(file.auth?.token, `compose ${role.name}: no token in the config file`).to.equal(undefined);
    }
  });

  it("every role's config has the keys and values `mmgate stack up` writes for it", () => {
    for (const role of mmgateRoles()) {
      const index = role.kind === "encoder" ? Number(/\d+$/.exec(role.name)![0]) : undefined;
      expectStackShape(`compose ${role.name} (${relative(repoRoot, role.configFile!)})`, role.kind, role.loaded!.raw, { encoderIndex: index });
    }
  });

  it("every address a role gives for another names that role's service and port, and the role waits for it to be healthy", () => {
    for (const role of mmgateRoles()) {
      const label = `compose ${role.name}`;
      const peers = expectStackShape(label, role.kind, role.loaded!.raw, { encoderIndex: role.kind === "encoder" ? Number(/\d+$/.exec(role.name)![0]) : undefined });
      const dependsOn = role.service.depends_on;
      expect(Array.isArray(dependsOn), `${label}: depends_on in the long form (with a condition)`).to.equal(false);
      for (const peer of peers) {
        for (const address of peer.addresses) {
          const { host, port } = hostPortOf(address);
          const target = byName(host);
          expect(target, `${label}: ${peer.path} ${address} names a service`).to.not.equal(undefined);
          expect(target!.kind, `${label}: ${peer.path} ${address}`).to.equal(peer.kind);
          expect(port, `${label}: ${peer.path} ${address}: the port ${host} listens on`).to.equal(target!.port);
          expect((dependsOn as Record<string, { condition?: string }> | undefined)?.[host]?.condition, `${label}: depends_on ${host}`).to.equal("service_healthy");
        }
      }
      const advertised = role.loaded!.config.advertiseAddress;
      if (advertised !== "") {
        expect(hostPortOf(advertised), `${label}: advertiseAddress names the service itself`).to.deep.equal({ host: role.name, port: role.port });
      }
    }
  });

  it("every depends_on waits for a healthy service that has a health check", () => {
    for (const role of roles) {
      const dependsOn = role.service.depends_on ?? {};
      expect(Array.isArray(dependsOn), `compose ${role.name}: depends_on in the long form`).to.equal(false);
      for (const [name, dep] of Object.entries(dependsOn as Record<string, { condition?: string }>)) {
        expect(dep.condition, `compose ${role.name}: depends_on ${name}`).to.equal("service_healthy");
        expect(byName(name)?.service.healthcheck?.test, `compose ${name}: a health check`).to.not.equal(undefined);
      }
    }
  });

  it("mmgate health checks run `mmgate health` on the port the role listens on", async () => {
    for (const role of mmgateRoles()) {
      const label = `compose ${role.name}: healthcheck`;
      const test = role.service.healthcheck?.test;
      expect(test, label).to.be.an("array");
      const [form, ...argv] = test as string[];
      expect(form, `${label}: exec form`).to.equal("CMD");
      expect(argv.slice(0, 2)).to.deep.equal(["node", "bin/mmgate.js"]);
      expect(argv[2], label).to.equal("health");
      const command = await parseCli(label, argv.slice(2));
      const opts = command.opts<{ addr: string; timeout: number; service: string }>();
      expect(splitHostPort(opts.addr), `${label}: --addr`).to.deep.equal({ host: "127.0.0.1", port: role.port });
      expect(opts.service, `${label}: the whole server ("")`).to.equal("");
      // The check's own deadline ends before Docker gives up on it (node's start-up comes on top).
      expect(opts.timeout, `${label}: --timeout`).to.be.above(0);
      expect(opts.timeout, `${label}: --timeout within the healthcheck's timeout`).to.be.below(durationMs(role.service.healthcheck!.timeout ?? "30s"));
    }
  });

  it("etcd's and nats-server's health checks ask their own client and monitoring ports", () => {
    const etcd = roles.find((r) => r.kind === "etcd")!;
    const etcdTest = (etcd.service.healthcheck?.test as string[]).join(" ");
    expect(etcdTest).to.include(`http://127.0.0.1:${etcd.port}`);
    expect(etcdTest).to.match(/etcdctl .*endpoint health/);
    const nats = roles.find((r) => r.kind === "nats")!;
    expect((nats.service.healthcheck?.test as string[]).join(" ")).to.include(`http://127.0.0.1:${natsPorts(nats.argv).monitor}/healthz`);
    // JetStream on, as the stack runs nats-server.
    expect(nats.argv.some((a) => a === "--jetstream" || a === "-js")).to.equal(true);
  });

  it("publishes only on 127.0.0.1, and only ports a role listens on", () => {
    for (const role of roles) {
      for (const port of role.service.ports ?? []) {
        expect(port, `compose ${role.name}: ports in the short form`).to.be.a("string");
        const [ip, , target] = (port as string).split(":");
        expect(ip, `compose ${role.name}: ${String(port)} binds loopback`).to.equal("127.0.0.1");
        const listening = role.loaded ? [role.port, splitHostPort(role.loaded.config.adminListen).port] : [role.port];
        expect(listening, `compose ${role.name}: ${String(port)} targets a port the role listens on`).to.include(Number(target));
      }
    }
  });

  it("gives every mmgate role a stop_grace_period above its drain, on a read-only root with a /tmp", () => {
    for (const role of mmgateRoles()) {
      const label = `compose ${role.name}`;
      expect(role.service.stop_grace_period, `${label}: stop_grace_period`).to.be.a("string");
      const drain = drainMs(role.loaded!.config);
      expect(durationMs(role.service.stop_grace_period!), `${label}: stop_grace_period against shutdown.delayMs + graceMs ${drain} ms`).to.be.at.least(drain + STOP_MARGIN_MS);
      expect(role.service.read_only, `${label}: read_only`).to.equal(true);
      expect([role.service.tmpfs].flat(), `${label}: a tmpfs at /tmp`).to.include("/tmp");
      // The image's USER (node) stays.
      expect(role.service.user ?? "", `${label}: user`).to.not.match(/^(root|0)(:|$)/);
    }
  });
});

// ------------------------------------------------------------- Kubernetes

interface KubeRole {
  readonly kind: RoleKind;
  readonly workload: Workload;
  readonly container: Container;
  /** command and args together. */
  readonly argv: readonly string[];
  /** The name the first pod gets. */
  readonly podName: string;
  readonly env: Readonly<Record<string, string>>;
  /** The container port its clients use: gRPC for mmgate, etcd's and nats-server's client ports. */
  readonly port: number;
  readonly loaded?: LoadedRole;
  readonly configFile?: string;
}

function kustomization(): Kustomization {
  return parseYaml(readFileSync(join(kubeDir, "kustomization.yaml"), "utf8")) as Kustomization;
}

/** Every document of the resources kustomization.yaml lists. */
function kubeObjects(): Obj[] {
  return kustomization().resources.flatMap((file) =>
    parseAllDocuments(readFileSync(join(kubeDir, file), "utf8"))
      .filter((doc) => doc.contents !== null)
      .map((doc) => doc.toJS() as Obj),
  );
}

const ofKind = <T>(kind: string): T[] => kubeObjects().filter((o) => o.kind === kind) as T[];
const workloads = (): Workload[] => kubeObjects().filter((o) => o.kind === "Deployment" || o.kind === "StatefulSet") as unknown as Workload[];
const selects = (selector: Record<string, string>, labels: Record<string, string>) => Object.entries(selector).every(([k, v]) => labels[k] === v);
const componentOf = (w: Workload) => w.spec.template.metadata.labels["app.kubernetes.io/component"] as RoleKind;

/** A container's environment as the kubelet sets it: $(VAR) expanded, the pod name; no Secret (keys and certificates are mounted files). */
function kubeEnv(label: string, container: Container, podName: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const e of container.env ?? []) {
    if (e.value !== undefined) {
      env[e.name] = e.value.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (whole, name: string) => env[name] ?? whole);
      expect(env[e.name], `${label}: ${e.name} expands every $(VAR) from a variable set before it`).to.not.include("$(");
    } else if (e.valueFrom?.fieldRef?.fieldPath === "metadata.name") {
      env[e.name] = podName;
    } else if (e.valueFrom?.secretKeyRef !== undefined) {
      throw new Error(`${label}: env ${e.name} comes from the Secret ${e.valueFrom.secretKeyRef.name}: keys and certificates are mounted files, no token is in the environment`);
    } else {
      throw new Error(`${label}: env ${e.name} comes from somewhere this test does not know`);
    }
  }
  return env;
}

/** A container port by name or number. */
function containerPort(container: Container, port: string | number): number | undefined {
  return typeof port === "number" ? port : container.ports?.find((p) => p.name === port)?.containerPort;
}

/** How a role's config compares with the stack's: TLS on at the recipe's paths (its channels trusting the CA its listener checks clients against), access control in place of the token. */
function kubeShape(role: KubeRole): ShapeOptions {
  const { tls } = role.loaded!.config;
  return { exempt: ["encodeWorker.register.instanceId"], tls: { certFile: tls.certFile, keyFile: tls.keyFile, caFile: tls.clientCaFile }, access: true };
}

let kubeRolesOnce: Promise<KubeRole[]> | undefined;

/** The recipe's roles, read and loaded once for every suite below. */
function loadKubeRoles(): Promise<KubeRole[]> {
  kubeRolesOnce ??= kubeRoles();
  return kubeRolesOnce;
}

async function kubeRoles(): Promise<KubeRole[]> {
  const generators = new Map((kustomization().configMapGenerator ?? []).map((g) => [g.name, g.files ?? []]));
  const roles: KubeRole[] = [];
  for (const workload of workloads()) {
    const kind = componentOf(workload);
    const label = `${workload.kind} ${workload.metadata.name}`;
    expect(ROLE_KINDS, `${label}: app.kubernetes.io/component is a role of the stack`).to.include(kind);
    expect(workload.spec.template.spec.containers, `${label}: one container`).to.have.length(1);
    const container = workload.spec.template.spec.containers[0]!;
    const argv = [...(container.command ?? []), ...(container.args ?? [])];
    const podName = workload.kind === "StatefulSet" ? `${workload.metadata.name}-0` : `${workload.metadata.name}-5d8f7c9b4-x2x7q`;
    const env = kubeEnv(label, container, podName);
    if (kind === "etcd") {
      roles.push({ kind, workload, container, argv, podName, env, port: etcdClientPort(argv) });
    } else if (kind === "nats") {
      roles.push({ kind, workload, container, argv, podName, env, port: natsPorts(argv).client });
    } else {
      const configPath = flagValue(argv, "-c", "--config");
      expect(configPath, `${label}: -c FILE`).to.be.a("string");
      const mount = container.volumeMounts?.find((m) => configPath!.startsWith(`${m.mountPath}/`));
      expect(mount, `${label}: a volume mounted over ${configPath}`).to.not.equal(undefined);
      const volume = workload.spec.template.spec.volumes?.find((v) => v.name === mount!.name);
      const files = generators.get(volume?.configMap?.name ?? "");
      expect(files, `${label}: the volume is a ConfigMap kustomization.yaml generates`).to.not.equal(undefined);
      const key = configPath!.slice(mount!.mountPath.length + 1);
      const source = files!.map((f) => (f.includes("=") ? f.split("=") : [basename(f), f])).find(([k]) => k === key)?.[1];
      expect(source, `${label}: the ConfigMap has ${key}`).to.be.a("string");
      const file = join(kubeDir, source!);
      const loaded = await loadRole(kind, file, env);
      roles.push({ kind, workload, container, argv, podName, env, port: splitHostPort(loaded.config.listen).port, loaded, configFile: file });
    }
  }
  return roles;
}

describe("deploy: the whole stack in Kubernetes (deploy/kubernetes/stack)", () => {
  let roles: KubeRole[];
  before(async function () {
    this.timeout(60_000);
    roles = await loadKubeRoles();
  });
  const mmgateRoles = () => roles.filter((r) => r.loaded !== undefined);
  const services = () => ofKind<Service>("Service");
  /** The one workload a Service selects. */
  const selected = (service: Service) => {
    const found = roles.filter((r) => selects(service.spec.selector, r.workload.spec.template.metadata.labels));
    expect(found, `Service ${service.metadata.name} selects one workload`).to.have.length(1);
    return found[0]!;
  };

  /** Where an address in a role's config leads: its Service (or a pod under a headless one), the workload, the container port. */
  const resolveAddress = (label: string, address: string): { role: KubeRole; port: number } => {
    const { host, port } = hostPortOf(address);
    const names = host.split(".");
    expect(names.length, `${label}: ${address} names a Service (or a pod under a headless one) in the same namespace`).to.be.within(1, 2);
    const service = services().find((s) => s.metadata.name === names[names.length - 1]);
    expect(service, `${label}: ${address} names a Service`).to.not.equal(undefined);
    const role = selected(service!);
    if (names.length === 2) {
      expect(service!.spec.clusterIP, `${label}: ${address}: pod names exist under a headless Service`).to.equal("None");
      expect(role.workload.kind).to.equal("StatefulSet");
      expect(role.workload.spec.serviceName, `${label}: ${address}: the StatefulSet's serviceName`).to.equal(service!.metadata.name);
      expect(names[0], `${label}: ${address}: a pod of ${role.workload.metadata.name}`).to.match(new RegExp(`^${role.workload.metadata.name}-\\d+$`));
    }
    const servicePort = service!.spec.ports.find((p) => p.port === port);
    expect(servicePort, `${label}: ${address}: a port of Service ${service!.metadata.name}`).to.not.equal(undefined);
    const target = containerPort(role.container, servicePort!.targetPort);
    // A headless Service's port is the pod's: nothing translates it.
    if (service!.spec.clusterIP === "None") expect(port, `${label}: ${address}: headless, so the container port`).to.equal(target);
    return { role, port: target! };
  };

  it("a kustomization lists every manifest beside it and generates every role's ConfigMap from config/", () => {
    const k = kustomization();
    const manifests = readdirSync(kubeDir).filter((f) => /\.ya?ml$/.test(f) && statSync(join(kubeDir, f)).isFile() && f !== "kustomization.yaml");
    expect([...k.resources].sort()).to.deep.equal(manifests.sort());
    // The config files name the Services: a prefix or suffix would break every address in them.
    expect(k.namePrefix ?? "").to.equal("");
    expect(k.nameSuffix ?? "").to.equal("");
    const generated = (k.configMapGenerator ?? []).flatMap((g) => (g.files ?? []).map((f) => (f.includes("=") ? f.split("=")[1]! : f)));
    for (const file of generated) expect(existsSync(join(kubeDir, file)), file).to.equal(true);
    expect(generated.map((f) => relative("config", f)).sort(), "every file in config/ becomes a ConfigMap").to.deep.equal(readdirSync(join(kubeDir, "config")).sort());
    for (const doc of parseAllDocuments(readFileSync(join(kubeDir, "kustomization.yaml"), "utf8"))) expect(doc.errors).to.deep.equal([]);
    for (const object of kubeObjects()) {
      expect(object.apiVersion).to.be.a("string");
      expect((object.metadata as Obj | undefined)?.name, `${String(object.kind)}: metadata.name`).to.be.a("string");
    }
  });

  it("runs every role of the stack as one workload; the Encode workers as a StatefulSet behind a headless Service", () => {
    expect(roles.map((r) => r.kind).sort()).to.deep.equal([...ROLE_KINDS].sort());
    const encoder = roles.find((r) => r.kind === "encoder")!.workload;
    expect(encoder.kind, "stable ids: a StatefulSet").to.equal("StatefulSet");
    expect(encoder.spec.replicas ?? 1).to.be.within(MIN_WORKERS, MAX_WORKERS);
    const governing = services().find((s) => s.metadata.name === encoder.spec.serviceName);
    expect(governing?.spec.clusterIP, "the Encode workers' Service is headless").to.equal("None");
    expect(selected(governing!).workload).to.equal(encoder);
    for (const role of roles) expect(role.workload.spec.template.metadata.labels, role.workload.metadata.name).to.include(role.workload.spec.selector.matchLabels);
  });

  it("a PodDisruptionBudget keeps most Encode workers up", () => {
    const encoder = roles.find((r) => r.kind === "encoder")!.workload;
    const replicas = encoder.spec.replicas ?? 1;
    const pdbs = ofKind<Pdb>("PodDisruptionBudget").filter((p) => selects(p.spec.selector.matchLabels, encoder.spec.template.metadata.labels));
    expect(pdbs, "a PodDisruptionBudget selecting the Encode workers").to.have.length(1);
    const { maxUnavailable, minAvailable } = pdbs[0]!.spec;
    if (maxUnavailable !== undefined) expect(Number(maxUnavailable)).to.be.within(1, replicas - 1);
    else expect(Number(minAvailable)).to.be.within(1, replicas - 1);
  });

  it("pins every image, the same ones Compose runs", async () => {
    for (const role of roles) expectPinned(`${role.workload.metadata.name}`, role.container.image);
    const compose = await composeRoles();
    for (const kind of ROLE_KINDS) {
      const images = new Set([...roles.filter((r) => r.kind === kind).map((r) => r.container.image), ...compose.filter((r) => r.kind === kind).map((r) => r.service.image)]);
      expect(images.size, `${kind}: one image in both recipes (${[...images].join(", ")})`).to.equal(1);
    }
    expect(new Set(mmgateRoles().map((r) => r.container.image)).size, "one image for every mmgate role").to.equal(1);
  });

  it("each mmgate role runs `node bin/mmgate.js <its subcommand> -c FILE` in exec form", async () => {
    for (const role of mmgateRoles()) {
      const label = role.workload.metadata.name;
      expect(role.container.command, `${label}: node runs the executable itself`).to.deep.equal(["node", "bin/mmgate.js", roleSubcommand(role.kind)]);
      await parseCli(label, role.argv.slice(2));
    }
  });

  it("every role's config loads through the real config loader, without warnings, with the modules the role names", () => {
    for (const role of mmgateRoles()) {
      const label = `${role.workload.metadata.name} (${relative(repoRoot, role.configFile!)})`;
      const { config, modules, warnings } = role.loaded!;
      expect(warnings, `${label}: warnings (MMGATE_* variables that are no key, old names)`).to.deep.equal([]);
      const known = modules.map((m) => m.name);
      for (const name of config.modules) expect(known, `${label}: module ${name}`).to.include(name);
      const fileModules = (parseYaml(readFileSync(role.configFile!, "utf8")) as Obj).modules;
      for (const name of (fileModules as string[] | undefined) ?? []) expect(known, `${label}: module ${name}`).to.include(name);
      expect(config.auth.token, `${label}: no token: named keys and certificates instead`).to.equal("");
      expect(config.auth.keysFile, `${label}: auth.keysFile`).to.not.equal("");
      expect(config.tls.certFile, `${label}: TLS on`).to.not.equal("");
      expect(splitHostPort(config.listen).host, `${label}: listen`).to.equal("0.0.0.0");
    }
  });

  it("every role's config has the keys and values `mmgate stack up` writes for it (with TLS on), and access control for the token", () => {
    for (const role of mmgateRoles()) {
      // Each Encode worker's instance id is its pod's name.
      expectStackShape(`${role.workload.metadata.name} (${relative(repoRoot, role.configFile!)})`, role.kind, role.loaded!.raw, kubeShape(role));
      if (role.kind === "encoder") expect(role.loaded!.config.sections.encodeWorker).to.have.nested.property("register.instanceId", role.podName);
    }
  });

  it("every address a role gives for another names that role's Service and a port leading to where it listens", () => {
    for (const role of mmgateRoles()) {
      const label = role.workload.metadata.name;
      const peers = expectStackShape(label, role.kind, role.loaded!.raw, kubeShape(role));
      for (const peer of peers) {
        for (const address of peer.addresses) {
          const target = resolveAddress(`${label}: ${peer.path}`, address);
          expect(target.role.kind, `${label}: ${peer.path} ${address}`).to.equal(peer.kind);
          expect(target.port, `${label}: ${peer.path} ${address}: the port ${peer.kind} listens on`).to.equal(target.role.port);
        }
      }
      const advertised = role.loaded!.config.advertiseAddress;
      if (advertised !== "") {
        const target = resolveAddress(`${label}: advertiseAddress`, advertised);
        expect(target.role, `${label}: advertiseAddress names the pod itself`).to.equal(role);
        expect(hostPortOf(advertised).host.split(".")[0], `${label}: advertiseAddress names this pod`).to.equal(role.podName);
        expect(target.port).to.equal(role.port);
      }
    }
  });

  it("container ports, Service ports and probes lead to the ports each config listens on", () => {
    for (const role of roles) {
      const label = role.workload.metadata.name;
      const c = role.container;
      const named = (name: string) => containerPort(c, name);
      let probes: { readiness: [number, string[]]; liveness: [number, string[]] };
      if (role.loaded) {
        const admin = splitHostPort(role.loaded.config.adminListen).port;
        expect(named("grpc"), `${label}: container port grpc`).to.equal(role.port);
        expect(named("admin"), `${label}: container port admin`).to.equal(admin);
        expect(c.ports, `${label}: no other container port`).to.have.length(2);
        // /readyz follows the whole server's health; /healthz only the process (liveness must not restart a role waiting for a peer).
        probes = { readiness: [admin, ["/readyz"]], liveness: [admin, ["/healthz"]] };
        if (c.startupProbe) expect(["/healthz", "/readyz"], `${label}: startupProbe`).to.include(c.startupProbe.httpGet?.path);
      } else if (role.kind === "etcd") {
        expect(named("client"), `${label}: container port client`).to.equal(role.port);
        probes = { readiness: [role.port, ["/health"]], liveness: [role.port, ["/health", "/health?serializable=true"]] };
      } else {
        const { client, monitor } = natsPorts(role.argv);
        expect(named("client"), `${label}: container port client`).to.equal(client);
        expect(named("monitor"), `${label}: container port monitor`).to.equal(monitor);
        probes = { readiness: [monitor, ["/healthz"]], liveness: [monitor, ["/healthz", "/healthz?js-enabled-only=true"]] };
      }
      for (const [which, [port, paths]] of Object.entries(probes)) {
        const probe = which === "readiness" ? c.readinessProbe : c.livenessProbe;
        expect(probe?.httpGet, `${label}: ${which}Probe (httpGet)`).to.not.equal(undefined);
        // The admin listener is plain HTTP/1.1 whatever the gRPC listener's TLS and client certificates.
        expect(probe!.httpGet!.scheme ?? "HTTP", `${label}: ${which}Probe scheme`).to.equal("HTTP");
        expect(containerPort(c, probe!.httpGet!.port), `${label}: ${which}Probe port`).to.equal(port);
        expect(paths, `${label}: ${which}Probe path`).to.include(probe!.httpGet!.path);
      }
      if (c.startupProbe?.httpGet) expect(containerPort(c, c.startupProbe.httpGet.port), `${label}: startupProbe port`).to.equal(probes.liveness[0]);
      if (c.startupProbe?.httpGet) expect(c.startupProbe.httpGet.scheme ?? "HTTP", `${label}: startupProbe scheme`).to.equal("HTTP");
      if (role.loaded) expect(probes.liveness[0], `${label}: the admin port is not the gRPC port`).to.not.equal(role.port);
    }
    for (const service of services()) {
      const role = selected(service);
      for (const port of service.spec.ports) {
        expect(containerPort(role.container, port.targetPort), `Service ${service.metadata.name}: ${port.name} targets a container port`).to.be.a("number");
        // TLS on the gRPC port: https (HTTP/2 by ALPN), never h2c, which would have a gateway speak cleartext to it.
        if (role.loaded && port.name === "grpc") {
          const want = role.loaded.config.tls.certFile === "" ? "kubernetes.io/h2c" : "https";
          expect(port.appProtocol, `Service ${service.metadata.name}: grpc`).to.equal(want);
        }
      }
    }
  });

  it("the grace period covers each role's drain", () => {
    for (const role of mmgateRoles()) {
      const seconds = role.workload.spec.template.spec.terminationGracePeriodSeconds ?? 30;
      const drain = drainMs(role.loaded!.config);
      expect(seconds * 1000, `${role.workload.metadata.name}: terminationGracePeriodSeconds against shutdown.delayMs + graceMs ${drain} ms`).to.be.at.least(drain + STOP_MARGIN_MS);
    }
  });

  it("requests CPU and memory and limits memory; an Encode worker's limit holds the media module's peak", () => {
    for (const role of roles) {
      const label = role.workload.metadata.name;
      const { requests, limits } = role.container.resources ?? {};
      expect(requests?.cpu, `${label}: requests.cpu`).to.not.equal(undefined);
      expect(quantityBytes(requests?.memory), `${label}: requests.memory within limits.memory`).to.be.at.most(quantityBytes(limits?.memory));
      if (role.loaded?.config.modules.includes("media")) {
        const peak = peakMemoryBytes(role.loaded.config.sections.media as MediaConfig);
        expect(quantityBytes(limits?.memory), `${label}: limits.memory against peakMemoryBytes ${peak}`).to.be.at.least(peak + 512 * MiB);
      }
    }
  });

  it("runs as non-root on a read-only root filesystem, with a writable /tmp for mmgate", () => {
    for (const role of roles) {
      const label = role.workload.metadata.name;
      const spec = role.workload.spec.template.spec;
      const sc = role.container.securityContext;
      expect(spec.securityContext?.runAsNonRoot, `${label}: runAsNonRoot`).to.equal(true);
      expect(spec.securityContext?.runAsUser, `${label}: runAsUser`).to.be.above(0);
      expect(spec.automountServiceAccountToken, `${label}: no service account token`).to.equal(false);
      expect(sc?.allowPrivilegeEscalation, `${label}: allowPrivilegeEscalation`).to.equal(false);
      expect(sc?.readOnlyRootFilesystem, `${label}: readOnlyRootFilesystem`).to.equal(true);
      expect(sc?.capabilities?.drop, `${label}: capabilities`).to.include("ALL");
      // Every path it writes is a volume; ConfigMaps and Secrets are mounted read-only.
      for (const mount of role.container.volumeMounts ?? []) {
        const volume = spec.volumes?.find((v) => v.name === mount.name);
        const readOnly = (volume?.configMap !== undefined || volume?.secret !== undefined) && mount.readOnly === true;
        expect(volume?.emptyDir !== undefined || readOnly, `${label}: ${mount.mountPath}`).to.equal(true);
        if (volume?.secret === undefined) continue;
        // A Secret's files belong to root: the process reads them through their mode, for others or (with fsGroup) for its group.
        const mode = volume.secret.defaultMode ?? 0o644;
        const readable = (mode & 0o004) !== 0 || ((mode & 0o040) !== 0 && spec.securityContext?.fsGroup !== undefined);
        expect(readable, `${label}: ${mount.mountPath}: defaultMode ${mode.toString(8)} lets uid ${spec.securityContext?.runAsUser} read the files`).to.equal(true);
        expect(mode & 0o222, `${label}: ${mount.mountPath}: defaultMode ${mode.toString(8)} writes nothing`).to.equal(0);
      }
      if (role.loaded) {
        const tmp = role.container.volumeMounts?.find((m) => m.mountPath === "/tmp");
        expect(spec.volumes?.find((v) => v.name === tmp?.name)?.emptyDir, `${label}: an emptyDir at /tmp`).to.not.equal(undefined);
      }
    }
  });
});

// ------------------------------------------- Kubernetes: access control

const certManagerDir = join(kubeDir, "cert-manager");
const keysSecretFile = join(kubeDir, "examples", "keys-secret.yaml");

/** The documents of a YAML file, comment-only ones left out. */
function yamlDocuments(file: string): Obj[] {
  return parseAllDocuments(readFileSync(file, "utf8"))
    .filter((doc) => doc.contents !== null)
    .map((doc) => doc.toJS() as Obj);
}

/** Every .yaml file under a folder, recursively. */
function yamlFilesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return yamlFilesUnder(path);
    return /\.ya?ml$/.test(name) ? [path] : [];
  });
}

/** The cert-manager objects cert-manager/'s kustomization makes. */
function certManagerObjects(): Obj[] {
  const k = parseYaml(readFileSync(join(certManagerDir, "kustomization.yaml"), "utf8")) as Kustomization;
  return k.resources.flatMap((file) => yamlDocuments(join(certManagerDir, file))).filter((o) => String(o.apiVersion).startsWith("cert-manager.io/"));
}

const certificates = (): Certificate[] => certManagerObjects().filter((o) => o.kind === "Certificate") as unknown as Certificate[];

/** The example of the keys Secret (examples/keys-secret.yaml). */
function keysSecretExample(): Secret {
  const secrets = yamlDocuments(keysSecretFile).filter((o) => o.kind === "Secret");
  expect(secrets, `${relative(repoRoot, keysSecretFile)}: one Secret`).to.have.length(1);
  return secrets[0] as unknown as Secret;
}

/** A Secret's files as the kubelet writes them: data decoded, stringData as it is. */
function secretFiles(secret: Secret): Record<string, string> {
  const data = Object.fromEntries(Object.entries(secret.data ?? {}).map(([k, v]) => [k, Buffer.from(v, "base64").toString("utf8")]));
  return { ...data, ...secret.stringData };
}

/** The example keys file's keys, validated as the server reads a keys file. */
function exampleKeys(): KeyEntry[] {
  const secret = keysSecretExample();
  const files = Object.entries(secretFiles(secret));
  expect(files, `Secret ${secret.metadata.name}: one file, the keys file`).to.have.length(1);
  return validateKeys(parseYaml(files[0]![1]), `${relative(repoRoot, keysSecretFile)}: ${files[0]![0]}`);
}

/** The files a Secret holds: the keys Secret as its example writes it, a TLS Secret as cert-manager writes it for a Certificate; undefined for any other. */
function secretKeys(name: string): string[] | undefined {
  const example = keysSecretExample();
  if (example.metadata.name === name) return Object.keys(secretFiles(example));
  // The certificate with its chain, its key, and (from a CA Issuer) the CA's certificate.
  if (certificates().some((c) => c.spec.secretName === name)) return ["tls.crt", "tls.key", "ca.crt"];
  return undefined;
}

/** Every file a loaded config names (a non-empty `…File` setting of the host or an enabled module), by dotted path. */
function fileSettings(config: MmgateConfig): Map<string, string> {
  const { sections, ...host } = config;
  const enabled = Object.fromEntries(Object.entries(sections).filter(([name]) => config.modules.includes(name)));
  const out = new Map<string, string>();
  for (const [path, value] of leaves({ ...host, ...enabled })) if (/File$/.test(path) && typeof value === "string" && value !== "") out.set(path, value);
  return out;
}

/** The mount whose directory holds `file` directly, and its volume. */
function mountOf(role: KubeRole, file: string): { mount?: NonNullable<Container["volumeMounts"]>[number]; volume?: Volume } {
  const mount = role.container.volumeMounts?.find((m) => posix.dirname(file) === m.mountPath);
  const volume = role.workload.spec.template.spec.volumes?.find((v) => v.name === mount?.name);
  return { mount, volume };
}

/** The Certificate whose Secret a role serves TLS from (the one tls.certFile is in). */
function certificateOf(role: KubeRole): Certificate {
  const secretName = mountOf(role, role.loaded!.config.tls.certFile).volume?.secret?.secretName;
  const found = certificates().find((c) => c.spec.secretName === secretName);
  expect(found, `${role.workload.metadata.name}: a Certificate in cert-manager/ writes the Secret ${secretName} its tls.certFile is in`).to.not.equal(undefined);
  return found!;
}

/** A verified peer certificate as Node hands it to the server (subject, subjectaltname), with what a Certificate asks for. */
function peerCertificate(cert: Certificate): PeerCertificate {
  const names = [
    ...(cert.spec.dnsNames ?? []).map((n) => `DNS:${n}`),
    ...(cert.spec.uris ?? []).map((u) => `URI:${u}`),
    ...(cert.spec.ipAddresses ?? []).map((ip) => `IP Address:${ip}`),
  ];
  return { subject: cert.spec.commonName === undefined ? {} : { CN: cert.spec.commonName }, subjectaltname: names.join(", ") } as unknown as PeerCertificate;
}

/** A server's access control for a config: its certificate rules as it compiles them (the keys file is a mounted Secret, not here). */
function accessControl(config: MmgateConfig): AccessControl {
  return new AccessControl({ auth: { ...config.auth, keysFile: "" }, logger: pino({ level: "silent" }), registry: new Registry() });
}

/** A setting of a config by dotted path, module sections by their name. */
function settingAt(config: MmgateConfig, path: string): unknown {
  const [first, ...rest] = path.split(".");
  let node: unknown = first! in config.sections ? config.sections[first!] : (config as unknown as Obj)[first!];
  for (const key of rest) node = node === undefined || node === null ? undefined : (node as Obj)[key];
  return node;
}

/** One kind of call one role makes to another. */
interface Outbound {
  readonly from: RoleKind;
  readonly to: RoleKind;
  /** The caller's channel setting these calls go through; the first one set. */
  readonly channel: readonly string[];
  /** The caller's setting with the callee's address, or "advertised": the address the callee registers (an Encode worker's). */
  readonly address: string;
  readonly methods: readonly DescMethod[];
}

/** Every call a role of the stack makes to another (OUTBOUND_SOURCES holds it to the code). */
const OUTBOUND: readonly Outbound[] = [
  // Encode for each multimodal request; each worker's health, for outlier ejection.
  { from: "hop", to: "encoder", channel: ["encodeHop.channel"], address: "advertised", methods: [EncodeWorkerService.method.encode, Health.method.check] },
  // Generate for every request; the downstream's health, for the hop's readiness.
  {
    from: "hop",
    to: "token-worker",
    channel: ["encodeHop.downstreamChannel", "encodeHop.channel"],
    address: "encodeHop.downstream",
    methods: [TokenWorkerService.method.generate, Health.method.check],
  },
  // The tensors an encoder result hands it, at the address the result names: the worker's advertised one.
  { from: "token-worker", to: "encoder", channel: ["tokenWorker.receiver.channel"], address: "advertised", methods: [MediaService.method.readTensor, MediaService.method.releaseTensor] },
  // The relay's pools, mirrored: the catalog, each pool's filter stream, readiness and load.
  {
    from: "router",
    to: "relay",
    channel: ["router.channel"],
    address: "router.relays",
    methods: [KvEventRelay.method.watchKvPoolCatalog, KvEventRelay.method.subscribeKvPool, KvEventRelay.method.subscribeServingReadiness, KvEventRelay.method.subscribeKvPoolLoad],
  },
];

/** Where each role's calls to other roles are made: the code OUTBOUND is read against. */
const OUTBOUND_SOURCES: Readonly<Partial<Record<RoleKind, readonly string[]>>> = {
  hop: ["src/encode/hop.ts", "src/encode/router.ts"],
  "token-worker": ["src/encode/receiver.ts"],
  router: ["src/relay/router/relay-state.ts", "src/relay/consumer/consumer.ts"],
};

/** The services those files make clients of, by the name they import them under. */
const CLIENT_SERVICES: Readonly<Record<string, DescService>> = { EncodeWorkerService, TokenWorkerService, MediaService, KvEventRelay, Health };

const methodName = (m: DescMethod) => `${m.parent.typeName}/${m.name}`;

/**
 * The methods a source file calls on clients it makes: `createClient(S, …).m(`,
 * `x = createClient(S, …)` then `x.m(`, and `S.method.m` (a transport's
 * own call). A client of a service CLIENT_SERVICES does not know fails.
 */
function clientCalls(file: string): Set<string> {
  const text = readFileSync(join(repoRoot, file), "utf8");
  const calls = new Set<string>();
  const add = (service: DescService, local: string) => {
    const method = service.methods.find((m) => m.localName === local);
    if (method) calls.add(methodName(method));
  };
  for (const match of text.matchAll(/createClient\(\s*(\w+)\s*,/g)) {
    const service = CLIENT_SERVICES[match[1]!];
    expect(service, `${file}: a client of ${match[1]}, a service OUTBOUND does not know`).to.not.equal(undefined);
    // The call right after the createClient(…) expression, past its balanced parentheses.
    let depth = 0;
    let at = match.index + "createClient".length;
    for (; at < text.length; at++) {
      if (text[at] === "(") depth++;
      else if (text[at] === ")" && --depth === 0) break;
    }
    const direct = /^\s*\.(\w+)\(/.exec(text.slice(at + 1));
    if (direct) add(service!, direct[1]!);
    // Or the name it is kept under.
    const kept = /(?:(?:const|let)\s+|this\.)(\w+)\s*=\s*$/.exec(text.slice(0, match.index));
    if (kept) for (const call of text.matchAll(new RegExp(`\\b${kept[1]}\\.(\\w+)\\(`, "g"))) add(service!, call[1]!);
  }
  for (const match of text.matchAll(/\b(\w+)\.method\.(\w+)\b/g)) {
    const service = CLIENT_SERVICES[match[1]!];
    if (service) add(service, match[2]!);
  }
  return calls;
}

/** The README's section under the level-3 heading `title`, up to the next heading. */
function readmeSubsection(title: string): string {
  const readme = readFileSync(join(repoRoot, "README.md"), "utf8");
  const start = readme.indexOf(`\n### ${title}\n`);
  expect(start, `README has a "### ${title}" section`).to.be.above(-1);
  const end = readme.slice(start + 1).search(/\n##+ /);
  return end === -1 ? readme.slice(start) : readme.slice(start, start + 1 + end);
}

/** The lines of a section's sh blocks, `\`-continued lines joined, comments dropped. */
function shellLines(section: string): string[] {
  return [...section.matchAll(/```sh\n([\s\S]*?)```/g)]
    .map((m) => m[1]!)
    .join("\n")
    .replace(/\\\n\s*/g, "")
    .split("\n")
    .map((line) => line.replace(/\s+#.*$/, "").trim())
    .filter((line) => line !== "" && !line.startsWith("#"));
}

/** `mmgate keys add NAME …`, parsed as the executable parses it: the name and the options. */
async function parseKeysAdd(line: string): Promise<{ name: string; scope: string[]; file: string; requestsPerSecond?: number; imagesPerMinute?: number }> {
  const argv = line.replace(/^npx mmgate /, "").split(/\s+/);
  expect(argv.slice(0, 2), line).to.deep.equal(["keys", "add"]);
  const root = await program(argv);
  const add = root.commands.find((c) => c.name() === "keys")!.commands.find((c) => c.name() === "add")!;
  add.exitOverride();
  add.configureOutput({ writeOut: () => undefined, writeErr: () => undefined });
  const { operands, unknown } = add.parseOptions(argv.slice(2));
  expect(unknown, `${line}: options \`mmgate keys add\` does not know`).to.deep.equal([]);
  expect(operands, `${line}: one name`).to.have.length(1);
  return { name: operands[0]!, ...add.opts<{ scope: string[]; file: string; requestsPerSecond?: number; imagesPerMinute?: number }>() };
}

describe("deploy: the Kubernetes stack's access control (keys, mutual TLS)", () => {
  let roles: KubeRole[];
  before(async function () {
    this.timeout(60_000);
    roles = await loadKubeRoles();
  });
  const mmgateRoles = () => roles.filter((r) => r.loaded !== undefined);
  const roleOf = (kind: RoleKind) => {
    const found = roles.find((r) => r.kind === kind && r.loaded !== undefined);
    expect(found, `an mmgate workload of role ${kind}`).to.not.equal(undefined);
    return found!;
  };
  const label = (role: KubeRole) => `${role.workload.metadata.name} (${relative(repoRoot, role.configFile!)})`;

  it("keeps every key, token and private key out of its files: the keys Secret's example holds digests only", () => {
    const keyPattern = new RegExp(`${KEY_PREFIX}[A-Za-z0-9_-]{16,}`);
    for (const file of yamlFilesUnder(kubeDir)) {
      const name = relative(repoRoot, file);
      const text = readFileSync(file, "utf8");
      expect(text, `${name}: a key made by mmgate keys add`).to.not.match(keyPattern);
      expect(text, `${name}: a private key`).to.not.include("PRIVATE KEY");
      expect(text, `${name}: a token from the environment`).to.not.include("MMGATE_AUTH_TOKEN");
      expect(text, `${name}: a Secret made from a literal`).to.not.include("--from-literal");
      for (const doc of yamlDocuments(file)) {
        if (doc.kind !== "Secret") continue;
        // Only a keys file, which the schema holds to digests: a key itself does not validate.
        for (const [key, content] of Object.entries(secretFiles(doc as unknown as Secret))) validateKeys(parseYaml(content), `${name}: ${key}`);
      }
    }
    expect(exampleKeys().length, "the example has keys").to.be.above(0);
    for (const role of mmgateRoles()) {
      const tokens = [...leaves(role.loaded!.raw).keys()].filter((path) => /(^|\.)(token|tokenFile)$/.test(path));
      expect(tokens, `${label(role)}: no token, no token file`).to.deep.equal([]);
    }
    const readme = readmeSubsection("Kubernetes (whole stack)");
    expect(readme, "README: a key").to.not.match(keyPattern);
    expect(readme, "README: a Secret made from a literal").to.not.include("--from-literal");
  });

  it("mounts every file a config names from a Secret: a whole Secret as a directory (no subPath), read-only, holding that file", () => {
    const keysSecret = keysSecretExample().metadata.name;
    for (const role of mmgateRoles()) {
      const { config } = role.loaded!;
      const files = fileSettings(config);
      expect([...files.keys()], `${label(role)}: the files of its access control`).to.include.members(["tls.certFile", "tls.keyFile", "tls.clientCaFile", "auth.keysFile"]);
      for (const [setting, file] of files) {
        const what = `${label(role)}: ${setting} ${file}`;
        const { mount, volume } = mountOf(role, file);
        expect(mount, `${what}: directly in a mounted directory`).to.not.equal(undefined);
        // A subPath mount is a copy made when the container starts: a renewed certificate or a new key never reaches it.
        expect(mount!.subPath, `${what}: no subPath`).to.equal(undefined);
        expect(mount!.readOnly, `${what}: read-only`).to.equal(true);
        expect(volume?.secret, `${what}: a Secret`).to.not.equal(undefined);
        expect(volume!.secret!.items, `${what}: the whole Secret`).to.equal(undefined);
        expect(volume!.secret!.optional ?? false, `${what}: required`).to.equal(false);
        const name = volume!.secret!.secretName;
        const keys = secretKeys(name);
        expect(keys, `${what}: the Secret ${name} is the keys Secret (examples/keys-secret.yaml) or one a Certificate of cert-manager/ writes`).to.not.equal(undefined);
        expect(keys, `${what}: a file of the Secret ${name}`).to.include(posix.basename(file));
        // What each setting holds, from the Secret that holds it.
        const want = setting === "auth.keysFile" ? [keysSecret, undefined] : /(^|\.)certFile$/.test(setting) ? [undefined, "tls.crt"] : /(^|\.)keyFile$/.test(setting) ? [undefined, "tls.key"] : [undefined, "ca.crt"];
        if (want[0] !== undefined) expect(name, what).to.equal(want[0]);
        else expect([name === keysSecret, posix.basename(file)], what).to.deep.equal([false, want[1]]);
      }
      // One pair: the certificate and its key from one Secret.
      expect(mountOf(role, config.tls.keyFile).volume, `${label(role)}: tls.keyFile beside tls.certFile`).to.equal(mountOf(role, config.tls.certFile).volume);
    }
  });

  it("gives each role a certificate of its own from the stack's CA, naming its Service and an identity", () => {
    const services = kubeObjects().filter((o) => o.kind === "Service") as unknown as Service[];
    const secrets = new Set<string>();
    const issuers = new Set<string>();
    for (const role of mmgateRoles()) {
      const cert = certificateOf(role);
      const what = `${label(role)}: Certificate ${cert.metadata.name}`;
      expect(secrets.has(cert.spec.secretName), `${what}: no other role's`).to.equal(false);
      secrets.add(cert.spec.secretName);
      issuers.add(cert.spec.issuerRef.name);
      expect(cert.spec.usages, `${what}: usages`).to.include("server auth");
      expect(cert.spec.uris ?? [], `${what}: a URI SAN, the identity the certificate rules match`).to.have.length.above(0);
      // The names the other roles dial it by: its Services.
      for (const service of services.filter((s) => selects(s.spec.selector, role.workload.spec.template.metadata.labels))) {
        expect(cert.spec.dnsNames, `${what}: names the Service`).to.include(service.metadata.name);
      }
      // The CA its peers check it against is the one it checks its clients against.
      expect(posix.basename(role.loaded!.config.tls.clientCaFile), `${label(role)}: tls.clientCaFile`).to.equal("ca.crt");
    }
    expect([...issuers], "one Issuer signs every role's certificate").to.have.length(1);
    const k = parseYaml(readFileSync(join(certManagerDir, "kustomization.yaml"), "utf8")) as Kustomization;
    const beside = readdirSync(certManagerDir).filter((f) => /\.ya?ml$/.test(f) && f !== "kustomization.yaml");
    expect([...k.resources].sort(), "cert-manager/kustomization.yaml lists every file beside it").to.deep.equal(beside.sort());
    expect(kustomization().resources.filter((r) => r.startsWith("cert-manager") || r.startsWith("examples")), "the stack's own resources leave the certificates and the example Secret out").to.deep.equal([]);
    const issuer = certManagerObjects().find((o) => o.kind === "Issuer" && (o.metadata as Obj).name === [...issuers][0]) as { spec?: { ca?: { secretName: string } } } | undefined;
    expect(issuer?.spec?.ca?.secretName, "a CA Issuer (its Secrets carry ca.crt)").to.be.a("string");
    const ca = certificates().find((c) => c.spec.secretName === issuer!.spec!.ca!.secretName);
    expect(ca?.spec.isCA, "the CA's own Certificate").to.equal(true);
  });

  it("requires a client certificate on the roles other roles call, and asks for one where applications call with keys alone", () => {
    const called = new Set(OUTBOUND.map((e) => e.to));
    for (const role of mmgateRoles()) {
      expect(role.loaded!.config.tls.clientAuth, label(role)).to.equal(called.has(role.kind) ? "require" : "request");
    }
  });

  it("each call one role makes to another checks the callee's certificate against the CA and presents the caller's own", () => {
    for (const edge of OUTBOUND) {
      const caller = roleOf(edge.from);
      const callee = roleOf(edge.to);
      const what = `${edge.from} → ${edge.to}`;
      const path = edge.channel.find((p) => settingAt(caller.loaded!.config, p) !== undefined);
      expect(path, `${what}: ${edge.channel.join(" or ")}`).to.not.equal(undefined);
      const channel = settingAt(caller.loaded!.config, path!) as { tls: boolean; caFile: string; certFile: string; keyFile: string; serverName: string; token: string; tokenFile: string };
      const { tls } = caller.loaded!.config;
      expect(channel.tls, `${what}: ${path}.tls`).to.equal(true);
      expect(channel.caFile, `${what}: ${path}.caFile, the stack's CA`).to.equal(tls.clientCaFile);
      expect([channel.certFile, channel.keyFile], `${what}: ${path} presents the caller's certificate`).to.deep.equal([tls.certFile, tls.keyFile]);
      expect([channel.token, channel.tokenFile], `${what}: ${path}: no service token`).to.deep.equal(["", ""]);
      expect(certificateOf(caller).spec.usages, `${what}: the caller's certificate is a client certificate too`).to.include("client auth");
      const given = edge.address === "advertised" ? callee.loaded!.config.advertiseAddress : settingAt(caller.loaded!.config, edge.address);
      const addresses = (Array.isArray(given) ? given : [given]).map(String);
      expect(addresses.length, `${what}: ${edge.address}`).to.be.above(0);
      for (const address of addresses) {
        const name = channel.serverName !== "" ? channel.serverName : hostPortOf(address).host;
        expect(certificateOf(callee).spec.dnsNames, `${what}: ${address} is checked as ${name}`).to.include(name);
      }
      // A bearer header wins over the certificate: the hop keeps its callers' keys to itself.
      const section = settingAt(caller.loaded!.config, path!.split(".")[0]!) as { passAuthorization?: boolean };
      if (section.passAuthorization !== undefined) expect(section.passAuthorization, `${what}: passAuthorization`).to.equal(false);
    }
  });

  it("the roles each role calls know it by its certificate, with the scopes of the methods it calls, and no other role's certificate", () => {
    const byCallee = new Map<RoleKind, Outbound[]>();
    for (const edge of OUTBOUND) byCallee.set(edge.to, [...(byCallee.get(edge.to) ?? []), edge]);
    for (const [to, edges] of byCallee) {
      const control = accessControl(roleOf(to).loaded!.config);
      for (const edge of edges) {
        const cert = peerCertificate(certificateOf(roleOf(edge.from)));
        for (const method of edge.methods) {
          const verdict = control.authorize(method, null, cert);
          const what = `${edge.from} → ${edge.to}: ${methodName(method)}`;
          expect(verdict.refusal?.message, `${what}: refused`).to.equal(undefined);
          expect([verdict.caller?.name, verdict.caller?.via], `${what}: the caller its certificate rule names`).to.deep.equal([edge.from, "certificate"]);
        }
      }
      // Every other role's certificate is refused what these callers are granted (public methods are open to anyone).
      for (const method of new Set(edges.flatMap((e) => e.methods))) {
        if (methodAccess(method) === Access.PUBLIC) continue;
        const callers = new Set(edges.filter((e) => e.methods.includes(method)).map((e) => e.from));
        for (const other of mmgateRoles().filter((r) => !callers.has(r.kind))) {
          const verdict = control.authorize(method, null, peerCertificate(certificateOf(other)));
          expect(verdict.refusal, `${to}: ${methodName(method)} with ${other.kind}'s certificate`).to.not.equal(undefined);
        }
      }
    }
  });

  it("every scope of the certificate rules and of the example keys names a level, service or method (the access module's catalog)", async () => {
    const catalog = await scopeCatalog();
    expect(catalog.size, "the catalog knows proto/'s services (npm run generate)").to.be.above(0);
    const check = (what: string, scopes: readonly string[]) => {
      for (const scope of scopes) expect(catalog.has(scope), `${what}: ${catalog.describeUnknown(scope)}`).to.equal(true);
    };
    for (const role of mmgateRoles()) for (const rule of role.loaded!.config.auth.certificates) check(`${label(role)}: auth.certificates ${rule.name}`, rule.scopes);
    for (const key of exampleKeys()) check(`${relative(repoRoot, keysSecretFile)}: ${key.name}`, key.scopes);
  });

  it("the README's commands make the keys Secret the roles mount, with the example's keys, and apply the certificates", async () => {
    const lines = shellLines(readmeSubsection("Kubernetes (whole stack)"));
    const adds = await Promise.all(lines.filter((l) => /^(npx )?mmgate keys add /.test(l)).map(parseKeysAdd));
    const example = exampleKeys();
    expect(
      adds.map((a) => ({ name: a.name, scopes: a.scope, limits: { requestsPerSecond: a.requestsPerSecond, imagesPerMinute: a.imagesPerMinute } })),
      "README: `mmgate keys add` makes the keys of examples/keys-secret.yaml",
    ).to.deep.equal(example.map((k) => ({ name: k.name, scopes: k.scopes, limits: { requestsPerSecond: k.limits?.requestsPerSecond, imagesPerMinute: k.limits?.imagesPerMinute } })));
    const create = lines.map((l) => /^kubectl create secret generic (\S+) --from-file=(\S+)$/.exec(l)).find((m) => m !== null);
    expect(create, "README: kubectl create secret generic NAME --from-file=FILE").to.not.equal(undefined);
    const [, secretName, fromFile] = create!;
    const [key, path] = fromFile!.includes("=") ? fromFile!.split("=") : [posix.basename(fromFile!), fromFile!];
    for (const add of adds) expect(add.file, `README: keys add ${add.name} --file`).to.equal(path);
    expect(secretName, "README: the Secret the example shows").to.equal(keysSecretExample().metadata.name);
    for (const role of mmgateRoles()) {
      const { volume } = mountOf(role, role.loaded!.config.auth.keysFile);
      expect([volume?.secret?.secretName, posix.basename(role.loaded!.config.auth.keysFile)], `${label(role)}: the README's Secret and file`).to.deep.equal([secretName, key]);
    }
    expect(lines, "README: the certificates first").to.include("kubectl apply -k deploy/kubernetes/stack/cert-manager");
  });

  it("the calls each role makes (OUTBOUND) are those its code makes", () => {
    for (const kind of new Set(OUTBOUND.map((e) => e.from))) expect(OUTBOUND_SOURCES, `OUTBOUND_SOURCES names where ${kind} calls from`).to.have.property(kind);
    for (const [kind, files] of Object.entries(OUTBOUND_SOURCES)) {
      const found = new Set(files!.flatMap((f) => [...clientCalls(f)]));
      const listed = new Set(OUTBOUND.filter((e) => e.from === kind).flatMap((e) => e.methods.map(methodName)));
      expect([...found].sort(), `${kind}: the calls of ${files!.join(", ")}`).to.deep.equal([...listed].sort());
    }
  });
});

/**
 * A CA, and certificates it signs as cert-manager signs a Certificate of
 * cert-manager/ (subject, SANs, key usages), with the system's openssl,
 * each written as the Secret cert-manager writes: a directory holding
 * tls.crt, tls.key and ca.crt.
 */
class CertificateMaker {
  private readonly caDir: string;

  constructor(private readonly dir: string) {
    this.caDir = join(dir, "ca");
    mkdirSync(this.caDir);
    openssl([
      "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", "/CN=mmgate-stack CA",
      "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
      "-keyout", join(this.caDir, "ca.key"), "-out", join(this.caDir, "ca.crt"),
    ]);
  }

  /** The Secret of `cert`, made once: its directory. */
  secret(cert: Certificate): string {
    const out = join(this.dir, cert.spec.secretName);
    if (existsSync(out)) return out;
    mkdirSync(out);
    const usages = cert.spec.usages ?? ["digital signature", "key encipherment"];
    const keyUsage = usages.filter((u) => u === "digital signature" || u === "key encipherment").map((u) => (u === "digital signature" ? "digitalSignature" : "keyEncipherment"));
    const extended = usages.filter((u) => u === "server auth" || u === "client auth").map((u) => (u === "server auth" ? "serverAuth" : "clientAuth"));
    const sans = [...(cert.spec.dnsNames ?? []).map((n) => `DNS:${n}`), ...(cert.spec.uris ?? []).map((u) => `URI:${u}`), ...(cert.spec.ipAddresses ?? []).map((ip) => `IP:${ip}`)];
    const ext = join(out, "ext.cnf");
    writeFileSync(
      ext,
      [
        "basicConstraints=critical,CA:FALSE",
        `keyUsage=critical,${keyUsage.join(",")}`,
        ...(extended.length > 0 ? [`extendedKeyUsage=${extended.join(",")}`] : []),
        `subjectAltName=${sans.join(",")}`,
        "",
      ].join("\n"),
    );
    const subject = cert.spec.commonName === undefined ? "/" : `/CN=${cert.spec.commonName}`;
    openssl(["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", subject, "-keyout", join(out, "tls.key"), "-out", join(out, "tls.csr")]);
    openssl([
      "x509", "-req", "-in", join(out, "tls.csr"), "-CA", join(this.caDir, "ca.crt"), "-CAkey", join(this.caDir, "ca.key"), "-CAcreateserial",
      "-days", "1", "-extfile", ext, "-out", join(out, "tls.crt"),
    ]);
    copyFileSync(join(this.caDir, "ca.crt"), join(out, "ca.crt"));
    return out;
  }
}

function openssl(args: readonly string[]): void {
  execFileSync("openssl", [...args], { stdio: ["ignore", "ignore", "pipe"] });
}

describe("deploy: the Kubernetes stack's mutual TLS at work (certificates as cert-manager/ makes them)", function () {
  this.timeout(60_000);
  let roles: KubeRole[];
  let dir: string;
  let maker: CertificateMaker;
  let tokenWorker: InProcessServer | undefined;
  const pools: ChannelPool[] = [];

  before(async function () {
    if (!opensslAvailable()) {
      console.warn("    no openssl: skipping the recipe's certificates at work");
      this.skip();
    }
    roles = await loadKubeRoles();
    dir = mkdtempSync(join(tmpdir(), "mmgate-kube-mtls-"));
    maker = new CertificateMaker(dir);
  });
  after(async () => {
    for (const pool of pools) pool.abort();
    await tokenWorker?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });
  const roleOf = (kind: RoleKind) => roles.find((r) => r.kind === kind && r.loaded !== undefined)!;

  /** A file the role's config names, where its Secret is here: the TLS Secrets made by `maker`, the keys Secret from its example. */
  const localFile = (role: KubeRole, file: string): string => {
    const secret = mountOf(role, file).volume!.secret!.secretName;
    const cert = certificates().find((c) => c.spec.secretName === secret);
    let at: string;
    if (cert !== undefined) {
      at = maker.secret(cert);
    } else {
      at = join(dir, secret);
      mkdirSync(at, { recursive: true });
      for (const [name, content] of Object.entries(secretFiles(keysSecretExample()))) writeFileSync(join(at, name), content);
    }
    return join(at, posix.basename(file));
  };

  /** A value with every file the role's config names replaced by its local copy. */
  const localized = <T>(role: KubeRole, value: T): T => {
    const files = new Set(fileSettings(role.loaded!.config).values());
    const walk = (v: unknown): unknown => {
      if (typeof v === "string") return files.has(v) ? localFile(role, v) : v;
      if (Array.isArray(v)) return v.map(walk);
      if (v !== null && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, walk(x)]));
      return v;
    };
    return walk(value) as T;
  };

  /** The caller's channel to the token worker, as its config has it, dialing the test's address under the Service's name (as DNS would). */
  const channelTo = (caller: KubeRole, path: string, address: string): Transport => {
    const options = localized(caller, settingAt(caller.loaded!.config, path) as ChannelOptions);
    const pool = new ChannelPool({ ...options, serverName: hostPortOf(String(settingAt(roleOf("hop").loaded!.config, "encodeHop.downstream"))).host });
    pools.push(pool);
    return pool.get(address);
  };

  it("a role that requires client certificates answers its probes over plain HTTP, turns away a client without one, and knows the hop by its certificate", async () => {
    const worker = roleOf("token-worker");
    expect(worker.loaded!.config.tls.clientAuth, "the token worker requires client certificates").to.equal("require");
    const raw = localized(worker, worker.loaded!.raw);
    // On loopback, but answering to any host as the recipe's wildcard listener does (its callers name its Service).
    tokenWorker = await startServer({
      modules: builtinModules,
      config: { ...raw, listen: "127.0.0.1:0", adminListen: "127.0.0.1:0", server: { allowedHosts: ["*"] }, shutdown: { delayMs: 0, graceMs: 1000 } },
    });

    // The probes: plain HTTP on the admin listener, no certificate asked for.
    await eventually(async () => expect((await fetch(`http://${tokenWorker!.adminAddr}/readyz`)).status).to.equal(200));
    expect((await fetch(`http://${tokenWorker.adminAddr}/healthz`)).status).to.equal(200);

    // gRPC without a certificate: turned away at the handshake.
    const ca = readFileSync(localFile(worker, worker.loaded!.config.tls.clientCaFile));
    const anonymous = createGrpcTransport({ baseUrl: `https://${tokenWorker.addr}`, nodeOptions: { ca, servername: "mmgate-token-worker" } });
    const refused = await createClient(Health, anonymous)
      .check({ service: "" }, { timeoutMs: 5000 })
      .then(
        () => undefined,
        (err: unknown) => ConnectError.from(err),
      );
    expect(refused, "a call without a client certificate").to.not.equal(undefined);

    // The hop's channel to it (the certificate cert-manager/ makes for the hop): Generate, as the caller "hop".
    const request = { request: { tokenIds: [1, 2, 3], stopConditions: { maxTokens: 2 } } };
    const hop = channelTo(roleOf("hop"), "encodeHop.downstreamChannel", tokenWorker.addr);
    const outputs = [];
    for await (const response of createClient(TokenWorkerService, hop).generate(request, { timeoutMs: 5000 })) outputs.push(response);
    expect(outputs.length, "the hop's Generate streams outputs").to.be.above(0);
    const metrics = await (await fetch(`http://${tokenWorker.adminAddr}/metrics`)).text();
    expect(metrics, "the call is the hop's").to.match(/grpc_server_handled_total\{[^}]*caller="hop"/);

    // Another role's certificate (the router's, a client certificate too) matches no rule: refused.
    const router = channelTo(roleOf("router"), "router.channel", tokenWorker.addr);
    const denied = await (async () => {
      for await (const _ of createClient(TokenWorkerService, router).generate(request, { timeoutMs: 5000 })) void _;
    })().then(
      () => undefined,
      (err: unknown) => ConnectError.from(err),
    );
    expect(denied?.code, `the router's certificate: ${denied?.rawMessage}`).to.equal(Code.Unauthenticated);
  });
});
