/**
 * The deployment files: the Dockerfile, the Kubernetes manifests under
 * deploy/ and the example config under examples/. They are checked against
 * the code they describe (the real config loader, the listeners the
 * executable binds, the media module's peak memory), so that a change on
 * either side that breaks the other fails here rather than in a cluster.
 * With docker or podman on PATH and its engine reachable, the image is also
 * built and run; without one that test is skipped.
 */
import { expect } from "chai";
import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments, parse as parseYaml } from "yaml";
import { builtinModules } from "../../src/modules.js";
import { peakMemoryBytes, type MediaConfig } from "../../src/media/index.js";
import { loadConfig, redactedConfig, splitHostPort, type MmgateConfig } from "../../src/server/index.js";
import type { ConfigMap, Probe, Service, Workload as Deployment } from "../support/k8s.js";

const repoRoot = fileURLToPath(new URL("../../", import.meta.url));
const examplePath = join(repoRoot, "examples", "mmgate.yaml");

type Obj = Record<string, unknown>;

/** Every .yaml / .yml file under a folder, recursively. */
function yamlFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return yamlFiles(path);
    return /\.ya?ml$/.test(name) ? [path] : [];
  });
}

/** The .yaml / .yml files directly in a folder (not in its subfolders). */
function topLevelYamlFiles(dir: string): string[] {
  return readdirSync(dir)
    .map((name) => join(dir, name))
    .filter((path) => /\.ya?ml$/.test(path) && statSync(path).isFile());
}

/**
 * Every document of the single server's Kubernetes manifests (the files
 * directly in deploy/kubernetes/), parsed, with the file it came from. The
 * whole stack's (deploy/kubernetes/stack/) is a kustomization of its own,
 * checked by stack-deploy.test.ts.
 */
function manifests(): { file: string; doc: Obj }[] {
  return topLevelYamlFiles(join(repoRoot, "deploy", "kubernetes")).flatMap((file) =>
    parseAllDocuments(readFileSync(file, "utf8"))
      .filter((doc) => doc.contents !== null)
      .map((doc) => ({ file: relative(repoRoot, file), doc: doc.toJS() as Obj })),
  );
}

function one<T>(kind: string): T {
  const found = manifests().filter((m) => m.doc.kind === kind);
  expect(found, `exactly one ${kind} under deploy/`).to.have.length(1);
  return found[0]!.doc as T;
}

/** A Kubernetes memory quantity ("4Gi", "512M", "1073741824") in bytes. */
function quantityBytes(q: unknown): number {
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(String(q));
  if (!m) throw new Error(`not a memory quantity: ${String(q)}`);
  const unit = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, k: 1e3, M: 1e6, G: 1e9, T: 1e12 }[m[2] ?? ""] ?? 1;
  return Number(m[1]) * unit;
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

/** Leaf key paths of a plain object (arrays are leaves). */
function leafPaths(value: unknown, prefix = ""): string[] {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return [prefix];
  return Object.entries(value as Obj).flatMap(([key, v]) => leafPaths(v, prefix ? `${prefix}.${key}` : key));
}

function hasPath(value: unknown, path: string): boolean {
  let node = value;
  for (const key of path.split(".")) {
    if (node === null || typeof node !== "object" || !(key in (node as Obj))) return false;
    node = (node as Obj)[key];
  }
  return true;
}

function loadExample(): MmgateConfig {
  return loadConfig({ file: examplePath }, builtinModules);
}

describe("deploy: examples/mmgate.yaml", () => {
  it("loads through the real config loader", () => {
    const warnings: string[] = [];
    loadConfig({ file: examplePath, onWarning: (w) => warnings.push(w) }, builtinModules);
    expect(warnings).to.deep.equal([]);
  });

  it("shows the defaults: its effective config is the one without a file", () => {
    expect(redactedConfig(loadExample()), "an example value differs from the code's default; update examples/mmgate.yaml (and deploy/kubernetes/configmap.yaml)").to.deep.equal(
      redactedConfig(loadConfig({}, builtinModules)),
    );
  });

  it("writes out every key of every section", () => {
    const written = parseYaml(readFileSync(examplePath, "utf8")) as Obj;
    const missing = leafPaths(redactedConfig(loadConfig({}, builtinModules))).filter((path) => !hasPath(written, path));
    expect(missing, "config keys absent from examples/mmgate.yaml").to.deep.equal([]);
  });
});

describe("deploy: Kubernetes manifests", () => {
  it("every YAML document under deploy/ and examples/ parses, and every Kubernetes manifest names its kind", () => {
    const files = [...yamlFiles(join(repoRoot, "deploy")), ...yamlFiles(join(repoRoot, "examples"))];
    expect(files.length).to.be.greaterThan(0);
    for (const file of files) {
      for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
        expect(doc.errors.map((e) => e.message), relative(repoRoot, file)).to.deep.equal([]);
        expect(doc.warnings.map((e) => e.message), relative(repoRoot, file)).to.deep.equal([]);
      }
    }
    for (const { file, doc } of manifests()) {
      expect(doc.apiVersion, `${file}: apiVersion`).to.be.a("string");
      expect(doc.kind, `${file}: kind`).to.be.a("string");
      if (doc.kind !== "Kustomization") expect((doc.metadata as Obj | undefined)?.name, `${file}: metadata.name`).to.be.a("string");
    }
  });

  it("a kustomization lists every manifest file beside it", () => {
    const dir = join(repoRoot, "deploy", "kubernetes");
    const kustomization = parseYaml(readFileSync(join(dir, "kustomization.yaml"), "utf8")) as { resources: string[] };
    const others = topLevelYamlFiles(dir).map((f) => relative(dir, f)).filter((f) => f !== "kustomization.yaml");
    expect([...kustomization.resources].sort()).to.deep.equal(others.sort());
  });

  it("the Deployment runs `node bin/mmgate.js serve` in exec form, listening on its container ports", () => {
    const deployment = one<Deployment>("Deployment");
    const [container] = deployment.spec.template.spec.containers;
    expect(container, "one container").to.not.equal(undefined);
    expect(container!.command).to.deep.equal(["node", "bin/mmgate.js", "serve"]);
    const args = container!.args ?? [];
    expect(args.every((a) => typeof a === "string")).to.equal(true);
    const listen = flagValue(args, "--listen");
    const adminListen = flagValue(args, "--admin-listen");
    expect(listen, "--listen").to.match(/^(0\.0\.0\.0|\[::\]):\d+$/);
    expect(adminListen, "--admin-listen").to.match(/^(0\.0\.0\.0|\[::\]):\d+$/);
    const ports = new Map((container!.ports ?? []).map((p) => [p.name, p.containerPort]));
    expect(ports.get("grpc")).to.equal(splitHostPort(listen!).port);
    expect(ports.get("admin")).to.equal(splitHostPort(adminListen!).port);
    expect(deployment.spec.template.metadata.labels).to.include(deployment.spec.selector.matchLabels);
  });

  it("the Deployment's config, env and flags load through the real config loader", () => {
    const deployment = one<Deployment>("Deployment");
    const container = deployment.spec.template.spec.containers[0]!;
    const args = container.args ?? [];
    const configFile = flagValue(args, "--config", "-c") ?? container.env?.find((e) => e.name === "MMGATE_CONFIG")?.value;
    expect(configFile, "the config file (--config or MMGATE_CONFIG)").to.be.a("string");
    const configMap = one<ConfigMap>("ConfigMap");
    // The file comes from the ConfigMap, mounted where --config points.
    const mount = container.volumeMounts?.find((m) => configFile!.startsWith(`${m.mountPath}/`));
    expect(mount, `a volume mounted over ${configFile}`).to.not.equal(undefined);
    const volume = deployment.spec.template.spec.volumes?.find((v) => v.name === mount!.name);
    expect(volume?.configMap?.name).to.equal(configMap.metadata.name);
    expect(configMap.data).to.have.property(configFile!.slice(mount!.mountPath.length + 1));

    // Literal env values (and a stand-in for the Secret's token) as the kubelet would set them.
    const env: Record<string, string> = {};
    for (const e of container.env ?? []) {
      if (e.value !== undefined) env[e.name] = e.value.replace(/\$\(POD_IP\)/g, "10.0.0.7");
      else if (e.name === "MMGATE_AUTH_TOKEN") env[e.name] = "0123456789abcdef0123";
    }
    const warnings: string[] = [];
    const config = loadConfig(
      {
        file: examplePath,
        env,
        overrides: { listen: flagValue(args, "--listen"), adminListen: flagValue(args, "--admin-listen") },
        onWarning: (w) => warnings.push(w),
      },
      builtinModules,
    );
    expect(warnings, "MMGATE_* variables that are no config key").to.deep.equal([]);
    expect(config.listen).to.equal(flagValue(args, "--listen"));
    expect(config.advertiseAddress).to.equal("10.0.0.7:50051");
  });

  it("probes point at the admin listener's /readyz and /healthz (or the gRPC port)", () => {
    const container = one<Deployment>("Deployment").spec.template.spec.containers[0]!;
    const args = container.args ?? [];
    const grpcPort = splitHostPort(flagValue(args, "--listen")!).port;
    const adminPort = splitHostPort(flagValue(args, "--admin-listen")!).port;
    const portNumber = (port: string | number) => (typeof port === "number" ? port : container.ports?.find((p) => p.name === port)?.containerPort);
    const check = (probe: Probe | undefined, what: string, httpPaths: string[]) => {
      expect(probe, what).to.not.equal(undefined);
      if (probe!.grpc) {
        expect(probe!.grpc.port, `${what}: grpc port`).to.equal(grpcPort);
      } else {
        expect(probe!.httpGet, `${what}: httpGet or grpc`).to.not.equal(undefined);
        expect(portNumber(probe!.httpGet!.port), `${what}: port`).to.equal(adminPort);
        expect(httpPaths, `${what}: path`).to.include(probe!.httpGet!.path);
      }
    };
    check(container.readinessProbe, "readinessProbe", ["/readyz"]);
    // Liveness must not be readiness: a module waiting for etcd is not ready, but restarting it does not help.
    check(container.livenessProbe, "livenessProbe", ["/healthz"]);
    if (container.startupProbe) check(container.startupProbe, "startupProbe", ["/healthz", "/readyz"]);
  });

  it("the grace period covers the preStop pause and the server's drain", () => {
    const spec = one<Deployment>("Deployment").spec.template.spec;
    const container = spec.containers[0]!;
    const preStop = container.lifecycle?.preStop;
    const pauseMs = preStop?.sleep ? preStop.sleep.seconds * 1000 : preStop?.exec?.command[0] === "sleep" ? Number(preStop.exec.command[1]) * 1000 : 0;
    const config = loadExample();
    const images = config.sections.images as { shutdownGraceMs: number };
    const drainMs = Math.max(config.shutdown.graceMs, images.shutdownGraceMs);
    const graceMs = (spec.terminationGracePeriodSeconds ?? 30) * 1000;
    expect(graceMs, "terminationGracePeriodSeconds").to.be.greaterThan(pauseMs + drainMs + 5000);
  });

  it("the memory limit holds the media module's configured peak", () => {
    const container = one<Deployment>("Deployment").spec.template.spec.containers[0]!;
    const limit = quantityBytes(container.resources?.limits?.memory);
    const peak = peakMemoryBytes(loadExample().sections.media as MediaConfig);
    // The peak counts the module's own tensors; Node, libvips and encoded inputs come on top.
    expect(limit, `limits.memory against peakMemoryBytes ${peak}`).to.be.at.least(peak + 512 * 2 ** 20);
    expect(quantityBytes(container.resources?.requests?.memory)).to.be.at.most(limit);
  });

  it("runs as non-root on a read-only root filesystem with a writable /tmp", () => {
    const spec = one<Deployment>("Deployment").spec.template.spec;
    const container = spec.containers[0]!;
    expect(spec.securityContext?.runAsNonRoot ?? container.securityContext?.runAsNonRoot).to.equal(true);
    expect(spec.securityContext?.runAsUser).to.not.equal(0);
    expect(container.securityContext?.allowPrivilegeEscalation).to.equal(false);
    if (container.securityContext?.readOnlyRootFilesystem) {
      // tsx's cache and the video decoder's staged inputs go to os.tmpdir().
      const tmp = container.volumeMounts?.find((m) => m.mountPath === "/tmp");
      expect(tmp, "a volume at /tmp").to.not.equal(undefined);
      expect(spec.volumes?.find((v) => v.name === tmp!.name)?.emptyDir).to.not.equal(undefined);
    }
  });

  it("the Service selects the pods and exposes gRPC as h2c and the admin port", () => {
    const service = one<Service>("Service");
    const deployment = one<Deployment>("Deployment");
    const container = deployment.spec.template.spec.containers[0]!;
    expect(deployment.spec.template.metadata.labels).to.include(service.spec.selector);
    const target = (port: string | number) => (typeof port === "number" ? port : container.ports?.find((p) => p.name === port)?.containerPort);
    const grpc = service.spec.ports.find((p) => p.name === "grpc");
    const admin = service.spec.ports.find((p) => p.name === "admin");
    expect(grpc?.appProtocol).to.equal("kubernetes.io/h2c");
    expect(target(grpc!.targetPort)).to.equal(splitHostPort(flagValue(container.args ?? [], "--listen")!).port);
    expect(target(admin!.targetPort)).to.equal(splitHostPort(flagValue(container.args ?? [], "--admin-listen")!).port);
  });

  it("the ConfigMap embeds examples/mmgate.yaml verbatim", () => {
    const configMap = one<ConfigMap>("ConfigMap");
    expect(
      configMap.data["mmgate.yaml"] === readFileSync(examplePath, "utf8"),
      "deploy/kubernetes/configmap.yaml has drifted from examples/mmgate.yaml: run node scripts/sync-configmap.mjs",
    ).to.equal(true);
  });
});

describe("deploy: Dockerfile", () => {
  const dockerfile = () => readFileSync(join(repoRoot, "Dockerfile"), "utf8").replace(/\\\n/g, " ");
  /** The instructions of the last stage (the image that runs). */
  const finalStage = () => {
    const lines = dockerfile().split("\n").map((l) => l.trim()).filter((l) => l !== "" && !l.startsWith("#"));
    const from = lines.map((l, i) => (/^FROM\s/i.test(l) ? i : -1)).filter((i) => i >= 0);
    return lines.slice(from[from.length - 1]);
  };
  const instruction = (name: string) => finalStage().filter((l) => l.toUpperCase().startsWith(`${name} `));

  it("starts the server in exec form on every interface, never through npm", () => {
    const cmd = instruction("CMD");
    expect(cmd).to.have.length(1);
    const argv = JSON.parse(cmd[0]!.slice(4)) as string[];
    expect(argv.slice(0, 3)).to.deep.equal(["node", "bin/mmgate.js", "serve"]);
    expect(flagValue(argv, "--listen")).to.equal("0.0.0.0:50051");
    expect(flagValue(argv, "--admin-listen")).to.equal("0.0.0.0:9464");
    expect(instruction("ENTRYPOINT")).to.deep.equal([]);
    expect(dockerfile()).to.not.match(/^(CMD|ENTRYPOINT).*npm/m);
  });

  it("exposes both ports, runs as a non-root user and checks health on the gRPC port", () => {
    expect(instruction("EXPOSE").join(" ").split(/\s+/).slice(1).sort()).to.deep.equal(["50051", "9464"]);
    const user = instruction("USER");
    expect(user).to.have.length.greaterThan(0);
    expect(user[user.length - 1]).to.not.match(/^USER\s+(root|0)(:|$)/);
    const healthcheck = instruction("HEALTHCHECK").join(" ");
    expect(healthcheck).to.include('"node", "bin/mmgate.js", "health", "--addr", "127.0.0.1:50051"');
  });

  it("copies only what .dockerignore lets into the context, and what the runtime needs", () => {
    const ignore = readFileSync(join(repoRoot, ".dockerignore"), "utf8").split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
    expect(ignore[0], ".dockerignore starts by excluding everything").to.equal("*");
    const allowed = new Set(ignore.filter((l) => l.startsWith("!")).map((l) => l.slice(1).replace(/\/$/, "")));
    for (const never of ["node_modules", ".git", "test", "bench", "coverage", ".bench-out"]) expect(allowed.has(never), never).to.equal(false);
    const copied = instruction("COPY")
      .filter((l) => !/--from=/.test(l))
      .flatMap((l) => l.split(/\s+/).slice(1, -1).filter((a) => !a.startsWith("--")));
    for (const source of copied) expect(allowed.has(source.replace(/\/$/, "")), `${source} is allowed into the build context`).to.equal(true);
    // What bin/mmgate.js reaches at run time.
    for (const needed of ["bin", "src", "gen", "package.json"]) expect(copied.map((s) => s.replace(/\/$/, "")), needed).to.include(needed);
  });
});

describe("deploy: container image", function () {
  this.timeout(20 * 60_000);
  // `info` answers only when the engine is reachable (a docker CLI without a daemon is no runtime).
  const runtime = ["docker", "podman"].find((tool) => spawnSync(tool, ["info"], { stdio: "ignore", timeout: 20_000 }).status === 0);

  it("builds, and `mmgate version` runs in it", function () {
    if (runtime === undefined) {
      console.warn("    no container runtime (docker or podman with a reachable engine): skipping the image build");
      this.skip();
    }
    const tag = `mmgate-test:${process.pid}`;
    const build = spawnSync(runtime!, ["build", "--build-arg", "WITH_FFMPEG=false", "-t", tag, repoRoot], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    expect(build.status, `${runtime} build: ${build.stderr.slice(-4000)}`).to.equal(0);
    try {
      const run = spawnSync(runtime!, ["run", "--rm", tag, "node", "bin/mmgate.js", "version"], { encoding: "utf8" });
      expect(run.status, run.stderr).to.equal(0);
      const { version } = JSON.parse(readFileSync(join(repoRoot, "package.json"), "utf8")) as { version: string };
      expect(run.stdout).to.include(`mmgate ${version}`);
    } finally {
      spawnSync(runtime!, ["rmi", "-f", tag], { stdio: "ignore" });
    }
  });
});
