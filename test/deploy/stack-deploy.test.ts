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
 * stack fails here until both recipes have it.
 */
import { expect } from "chai";
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { basename, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import type { Command } from "commander";
import { parse as parseYaml, parseAllDocuments } from "yaml";
import { program, subcommands } from "../../src/cli/main.js";
import { serveRoles } from "../../src/cli/serve.js";
import { peakMemoryBytes, type MediaConfig } from "../../src/media/index.js";
import { builtinModules } from "../../src/modules.js";
import { gatherRawConfig } from "../../src/server/config/index.js";
import { loadConfig, splitHostPort, type MmgateConfig, type ServiceModule } from "../../src/server/index.js";
import { MAX_WORKERS, MIN_WORKERS, ROLE_GRACE_MS, ROLE_KINDS, roleConfig, roleSubcommand, type RoleKind } from "../../src/stack/index.js";
import type { Container, Kustomization, Pdb, Service, Workload } from "../support/k8s.js";

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

/** The stack's config for a role, with TLS off (as both recipes run by default). */
function stackConfig(kind: RoleKind, encoderIndex = 1): Obj {
  return roleConfig(kind, { token: TOKEN, logLevel: "info", graceMs: ROLE_GRACE_MS }, { ...PEERS, encoderIndex });
}

/** Values a recipe sets its own way: where it listens, and how long it drains. */
const RECIPE_PATHS = new Set(["listen", "adminListen", "shutdown.graceMs", "shutdown.delayMs"]);

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

/**
 * Checks a recipe's role config against the stack's for that role: the same
 * keys (an Encode worker may add advertiseAddress), the same values but for
 * RECIPE_PATHS, `exempt` and peer addresses; returns the peer addresses, by
 * path, with the kind each must name.
 */
function expectStackShape(label: string, kind: RoleKind, raw: Obj, options: { encoderIndex?: number; exempt?: readonly string[] } = {}) {
  const stack = leaves(stackConfig(kind, options.encoderIndex));
  const recipe = leaves(raw);
  const extra = kind === "encoder" ? ["advertiseAddress"] : [];
  expect(
    [...recipe.keys()].filter((k) => !extra.includes(k)).sort(),
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

/** A container's environment as the kubelet sets it: $(VAR) expanded, the pod name, the Secret's token. */
function kubeEnv(label: string, container: Container, podName: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const e of container.env ?? []) {
    if (e.value !== undefined) {
      env[e.name] = e.value.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (whole, name: string) => env[name] ?? whole);
      expect(env[e.name], `${label}: ${e.name} expands every $(VAR) from a variable set before it`).to.not.include("$(");
    } else if (e.valueFrom?.fieldRef?.fieldPath === "metadata.name") {
      env[e.name] = podName;
    } else if (e.valueFrom?.secretKeyRef !== undefined) {
      const ref = e.valueFrom.secretKeyRef;
      expect({ name: e.name, secret: ref.name, key: ref.key }, `${label}: the one Secret`).to.deep.equal({ name: "MMGATE_AUTH_TOKEN", secret: "mmgate-auth", key: "token" });
      expect(ref.optional ?? false, `${label}: the token is required`).to.equal(false);
      env[e.name] = TOKEN;
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
    roles = await kubeRoles();
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
      expect(config.auth.token, `${label}: the token is on`).to.equal(TOKEN);
      expect(splitHostPort(config.listen).host, `${label}: listen`).to.equal("0.0.0.0");
    }
  });

  it("every role's config has the keys and values `mmgate stack up` writes for it", () => {
    for (const role of mmgateRoles()) {
      // Each Encode worker's instance id is its pod's name.
      expectStackShape(`${role.workload.metadata.name} (${relative(repoRoot, role.configFile!)})`, role.kind, role.loaded!.raw, { exempt: ["encodeWorker.register.instanceId"] });
      if (role.kind === "encoder") expect(role.loaded!.config.sections.encodeWorker).to.have.nested.property("register.instanceId", role.podName);
    }
  });

  it("every address a role gives for another names that role's Service and a port leading to where it listens", () => {
    for (const role of mmgateRoles()) {
      const label = role.workload.metadata.name;
      const peers = expectStackShape(label, role.kind, role.loaded!.raw, { exempt: ["encodeWorker.register.instanceId"] });
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
        expect(containerPort(c, probe!.httpGet!.port), `${label}: ${which}Probe port`).to.equal(port);
        expect(paths, `${label}: ${which}Probe path`).to.include(probe!.httpGet!.path);
      }
      if (c.startupProbe?.httpGet) expect(containerPort(c, c.startupProbe.httpGet.port), `${label}: startupProbe port`).to.equal(probes.liveness[0]);
    }
    for (const service of services()) {
      const role = selected(service);
      for (const port of service.spec.ports) {
        expect(containerPort(role.container, port.targetPort), `Service ${service.metadata.name}: ${port.name} targets a container port`).to.be.a("number");
        if (role.loaded && port.name === "grpc") expect(port.appProtocol, `Service ${service.metadata.name}: grpc is h2c`).to.equal("kubernetes.io/h2c");
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
      // Every path it writes is a volume.
      for (const mount of role.container.volumeMounts ?? []) {
        const volume = spec.volumes?.find((v) => v.name === mount.name);
        expect(volume?.emptyDir !== undefined || (volume?.configMap !== undefined && mount.readOnly === true), `${label}: ${mount.mountPath}`).to.equal(true);
      }
      if (role.loaded) {
        const tmp = role.container.volumeMounts?.find((m) => m.mountPath === "/tmp");
        expect(spec.volumes?.find((v) => v.name === tmp?.name)?.emptyDir, `${label}: an emptyDir at /tmp`).to.not.equal(undefined);
      }
    }
  });
});
