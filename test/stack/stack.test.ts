import { expect } from "chai";
import { mkdtempSync, readFileSync, rmSync, statSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { toJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Health, HealthCheckResponse_ServingStatus as S } from "../../gen/grpc/health/v1/health_pb.js";
import { EncodeHopService } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { preprocessedRequestFromJson } from "../../src/llm/index.js";
import { pidAlive, portInUse, startStack, type Stack, type StopReport } from "../../src/stack/index.js";
import { connectPathOnly, requireEtcd, requireNats, runMmgate } from "../support/index.js";

/** Whether signal 0 to `pid` fails with ESRCH: no such process. */
function gone(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return false;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "ESRCH";
  }
}

describe("stack: the whole stack on one machine", function () {
  // Ten processes on two cores: each mmgate role starts in 1-4 s (the sources through tsx while dist/ is stale).
  this.timeout(90_000);
  let dir: string;
  let stack: Stack | undefined;
  let ca: Buffer;

  before(async function () {
    requireEtcd(this);
    requireNats(this);
    dir = mkdtempSync(join(tmpdir(), "mmgate-stack-"));
    stack = await startStack({ dir, workers: 2, tls: true, env: connectPathOnly ? { MMGATE_RPC__LEAN_PATH: "false" } : {} });
    ca = readFileSync(stack.caFile);
  });
  after(async () => {
    await stack?.stop();
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  });

  const mmgateRoles = () => stack!.roles.filter((r) => r.kind !== "etcd" && r.kind !== "nats");
  const transport = (address: string) => createGrpcTransport({ baseUrl: `https://${address}`, nodeOptions: { ca } });

  it("runs every role as its own process, with a fresh CA, certificate and token (0600)", () => {
    const s = stack!;
    expect(s.roles.map((r) => r.name)).to.deep.equal(["etcd", "nats", "relay", "router", "encoder-1", "encoder-2", "token-worker", "hop", "images"]);
    expect(new Set(s.roles.map((r) => r.pid)).size).to.equal(9);
    for (const role of s.roles) {
      expect(role.running, role.name).to.equal(true);
      expect(pidAlive(role.pid), role.name).to.equal(true);
      expect(role.address, role.name).to.match(/^127\.0\.0\.1:\d+$/);
      expect(existsSync(role.logFile), role.name).to.equal(true);
    }
    for (const role of mmgateRoles()) {
      expect(role.configFile).to.equal(join(s.dir, `${role.name}.yaml`));
      expect(statSync(role.configFile).mode & 0o777, role.configFile).to.equal(0o600);
      expect(role.adminAddress, role.name).to.match(/^127\.0\.0\.1:\d+$/);
    }
    expect(s.token).to.match(/^[0-9a-f]{64}$/);
    expect(readFileSync(s.tokenFile, "utf8").trim()).to.equal(s.token);
    for (const file of [s.tokenFile, join(s.dir, "tls", "server.key"), join(s.dir, "tls", "ca.key")]) expect(statSync(file).mode & 0o777, file).to.equal(0o600);
    expect(s.address("hop")).to.equal(s.role("hop").address);
  });

  it("every mmgate role answers grpc.health.v1 over TLS with the stack's CA", async () => {
    for (const role of mmgateRoles()) {
      const res = await createClient(Health, transport(role.address)).check({ service: "" }, { timeoutMs: 5000 });
      expect(res.status, role.name).to.equal(S.SERVING);
    }
  });

  it("a multimodal request through the hop is encoded by a worker and verified by the token worker", async () => {
    const request = preprocessedRequestFromJson(readFileSync(stack!.requestFile, "utf8"));
    const hop = createClient(EncodeHopService, transport(stack!.address("hop")));
    const outputs = [];
    for await (const res of hop.generate({ request }, { headers: { authorization: `Bearer ${stack!.token}` }, timeoutMs: 20_000 })) outputs.push(res);
    const extra = outputs.at(-1)?.output?.data?.extraArgs;
    expect(extra, "the final output's extra_args").to.not.equal(undefined);
    const args = toJson(ValueSchema, extra!) as { encoder_result_present: boolean; receipts: { verified: boolean; released: boolean; shape: number[] }[] };
    expect(args.encoder_result_present).to.equal(true);
    expect(args.receipts).to.have.length(1);
    expect(args.receipts[0]).to.deep.include({ verified: true, released: true, shape: [16, 16, 3] });
  });

  it("kill and start one role: an Encode worker back on its port", async () => {
    const s = stack!;
    const before = s.role("encoder-2");
    await s.kill("encoder-2");
    expect(gone(before.pid)).to.equal(true);
    expect(s.role("encoder-2").running).to.equal(false);
    const after = await s.start("encoder-2");
    expect(after.running).to.equal(true);
    expect(after.pid).to.not.equal(before.pid);
    expect(after.address).to.equal(before.address);
  });

  it("stop() drains in order, leaves no process and no port behind, and is idempotent", async () => {
    const s = stack!;
    const roles = s.roles;
    const report: StopReport = await s.stop();
    expect(report.clean).to.equal(true);
    const order = report.roles.map((r) => r.name);
    const at = (name: string) => order.indexOf(name);
    expect(Math.max(at("hop"), at("images"))).to.be.below(at("router"));
    expect(at("router")).to.be.below(at("token-worker"));
    expect(at("token-worker")).to.be.below(Math.min(at("encoder-1"), at("encoder-2")));
    expect(Math.max(at("encoder-1"), at("encoder-2"))).to.be.below(at("relay"));
    expect(at("relay")).to.be.below(at("nats"));
    expect(at("nats")).to.be.below(at("etcd"));
    for (const role of roles) {
      expect(gone(role.pid), `${role.name} (pid ${role.pid})`).to.equal(true);
      for (const address of [role.address, role.adminAddress].filter((a) => a !== "")) {
        expect(await portInUse(Number(address.split(":")[1])), `${role.name} ${address}`).to.equal(false);
      }
    }
    expect(existsSync(join(s.dir, "stack.pid"))).to.equal(false);
    expect(await s.stop()).to.equal(report);
  });
});

describe("stack: mmgate stack up", () => {
  it("--workers 0 is a usage error: exit 2, nothing started", async () => {
    const result = await runMmgate(["stack", "up", "--workers", "0", "--dir", join(tmpdir(), "mmgate-stack-never")]);
    expect(result.code).to.equal(2);
    expect(result.stderr).to.match(/^mmgate stack up: \[usage\] .*--workers must be an integer from 1 to 16/);
    expect(existsSync(join(tmpdir(), "mmgate-stack-never"))).to.equal(false);
  });

  it("--help documents the options, the roles and the exit codes", async () => {
    const result = await runMmgate(["stack", "--help"]);
    expect(result.code).to.equal(0);
    for (const text of ["--workers N", "--no-tls", "--dir DIR", "--log-level L", "nats-server", "token-worker", "stack.pid", "130 interrupted"]) expect(result.stdout).to.include(text);
  });
});
