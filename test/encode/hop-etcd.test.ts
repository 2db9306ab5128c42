import { expect } from "chai";
import { createClient } from "@connectrpc/connect";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { EncodeHopService, Lifecycle, MemberState } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { Health, HealthCheckResponse_ServingStatus as S } from "../../gen/grpc/health/v1/health_pb.js";
import { EtcdRegistration } from "../../src/discovery/index.js";
import { ENCODE_LIFECYCLE_HEALTH, ENCODE_WORKER_CARD, encodeHopModule, encodeWorkerModule, tokenWorkerModule } from "../../src/encode/index.js";
import { mediaModule } from "../../src/media/index.js";
import { eventually, metricValue, requireEtcd, startEtcd, startServer, type EtcdServer, type InProcessServer } from "../support/index.js";
import { freePort } from "../support/process.js";
import { encodeRaw, pattern } from "../media/fixtures.js";

describe("encode: the hop over etcd discovery", function () {
  this.timeout(30_000);
  let etcd: EtcdServer;
  let worker: InProcessServer;
  let hopServer: InProcessServer;
  let png: Buffer;
  const pool = { namespace: "default", component: "encode", endpoint: "encode" };

  before(async function () {
    requireEtcd(this);
    etcd = await startEtcd();
    png = await encodeRaw(pattern(8 * 8 * 3), 8, 8, 3, "png");
    worker = await startServer({ modules: [mediaModule, encodeWorkerModule] });
    hopServer = await startServer({
      modules: [tokenWorkerModule, encodeHopModule],
      config: { encodeHop: { encoders: { discovery: "etcd", etcd: { endpoints: [etcd.endpoint], ...pool } }, outlier: { intervalMs: 200 } } },
    });
  });
  after(async () => {
    await hopServer?.close();
    await worker?.close();
    await etcd?.stop();
  });

  async function report(request: object) {
    const outputs = [];
    for await (const res of createClient(EncodeHopService, hopServer.transport).generate({ request })) outputs.push(res);
    const extra = outputs.at(-1)?.output?.data?.extraArgs?.kind;
    const fields = (extra?.value as { fields: Record<string, { kind: { value: unknown } }> }).fields;
    return { present: fields["encoder_result_present"]!.kind.value, items: fields["encoder_items"]!.kind.value };
  }
  const multimodal = () => ({
    tokenIds: [1],
    multiModalData: { image: { items: [{ data: { case: "url" as const, value: `data:image/png;base64,${png.toString("base64")}` } }] } },
  });

  /** A registration as an Encode worker makes it: under the pool, with the Encode worker card. */
  const register = (instanceId: string, address: string, metadata: Record<string, string> = ENCODE_WORKER_CARD) =>
    EtcdRegistration.create({ endpoints: [etcd.endpoint], ...pool, instanceId, address, metadata });
  const admittedIds = async () =>
    (await createClient(EncodeHopService, hopServer.transport).getStatus({})).members.filter((m) => m.state === MemberState.ADMITTED).map((m) => m.id);

  it("routes to a worker once it registers, and passes through silently while the pool is empty", async () => {
    const hop = createClient(EncodeHopService, hopServer.transport);
    const health = createClient(Health, hopServer.transport);
    // No worker yet: bound to an empty pool, the hop is Unavailable (the reference's None target), yet ready: it passes traffic.
    await eventually(async () => expect((await hop.getStatus({})).lifecycle).to.equal(Lifecycle.UNAVAILABLE));
    expect((await health.check({ service: "" })).status).to.equal(S.SERVING);
    expect((await health.check({ service: ENCODE_LIFECYCLE_HEALTH })).status).to.equal(S.NOT_SERVING);
    const unavailableBefore = await metricValue(hopServer.host.metrics.registry, "encode_unavailable_passthrough_total");
    expect(await report(multimodal())).to.deep.equal({ present: false, items: 0 });
    // Not a fallback (nothing failed): a passthrough, counted as such.
    expect((await hop.getStatus({})).fallbacks["no_member"]).to.equal(undefined);
    expect(await metricValue(hopServer.host.metrics.registry, "encode_unavailable_passthrough_total")).to.equal(unavailableBefore + 1);

    const registration = await register("w1", worker.addr);
    try {
      await registration.register();
      // Admitted from the watch (a health check as it joins), not on a first pick: the first request after is encoded.
      await eventually(async () => expect(await admittedIds()).to.deep.equal(["w1"]));
      expect((await hop.getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE);
      expect((await health.check({ service: ENCODE_LIFECYCLE_HEALTH })).status).to.equal(S.SERVING);
      expect(await report(multimodal())).to.deep.equal({ present: true, items: 1 });
      const status = await hop.getStatus({});
      expect(status.targetId).to.equal("etcd:/mmgate/default/encode/encode/");
      expect(status.members[0]!.address).to.equal(worker.addr);
      expect(status.generation >= 2n).to.equal(true);

      await registration.revoke();
      await eventually(async () => expect((await hop.getStatus({})).members).to.deep.equal([]));
      expect((await hop.getStatus({})).lifecycle).to.equal(Lifecycle.UNAVAILABLE);
      expect(await report(multimodal())).to.deep.equal({ present: false, items: 0 });
    } finally {
      await registration.close();
    }
  });

  it("a worker configured to register does so once serving, and revokes on drain so the hop stops picking it", async () => {
    const hop = createClient(EncodeHopService, hopServer.transport);
    const registering = await startServer({
      modules: [mediaModule, encodeWorkerModule],
      config: { encodeWorker: { register: { endpoints: [etcd.endpoint], ...pool, instanceId: "w2" } } },
    });
    let closed = false;
    try {
      await eventually(async () =>
        expect((await hop.getStatus({})).members.map((m) => [m.id, m.address, m.state])).to.deep.equal([["w2", registering.addr, MemberState.ADMITTED]]),
      );
      expect(await report(multimodal())).to.deep.equal({ present: true, items: 1 });
      await registering.close();
      closed = true;
      // Revoked in the drain, not left to expire with the lease.
      await eventually(async () => expect((await hop.getStatus({})).members).to.deep.equal([]), { timeoutMs: 3000 });
    } finally {
      if (!closed) await registering.close();
    }
  });

  it("admits a registered worker only once its health says SERVING", async () => {
    const hop = createClient(EncodeHopService, hopServer.transport);
    const admin = createClient(AdminService, worker.transport);
    await admin.setServingStatus({ service: "mmgate.encode.v1.EncodeWorkerService", serving: false });
    const registration = await register("w3", worker.addr);
    try {
      await registration.register();
      // Registered but not serving: listed as checking, never admitted, so the request passes through.
      await eventually(async () => expect((await hop.getStatus({})).members.map((m) => [m.id, m.state])).to.deep.equal([["w3", MemberState.CHECKING]]));
      expect(await report(multimodal())).to.deep.equal({ present: false, items: 0 });
      expect((await hop.getStatus({})).members[0]!.reason).to.match(/NOT_SERVING/);

      await admin.setServingStatus({ service: "mmgate.encode.v1.EncodeWorkerService", serving: true });
      await eventually(async () => expect(await admittedIds()).to.deep.equal(["w3"]));
      expect(await report(multimodal())).to.deep.equal({ present: true, items: 1 });
    } finally {
      await registration.close();
    }
  });

  it("a worker that re-registers under its id at a new address is called there within 3 s; the old address leaves at once", async () => {
    const hop = createClient(EncodeHopService, hopServer.transport);
    // The first incarnation registers at a port where nothing will answer once it is gone (a restarted pod's old IP).
    const oldAddress = `127.0.0.1:${await freePort()}`;
    const first = await register("pod-0", oldAddress);
    const second = await register("pod-0", worker.addr);
    try {
      await first.register();
      await eventually(async () => expect((await hop.getStatus({})).members.map((m) => m.address)).to.deep.equal([oldAddress]));
      await first.revoke();
      await second.register();
      const started = Date.now();
      await eventually(async () => expect(await admittedIds()).to.deep.equal(["pod-0"]), { timeoutMs: 3000 });
      const status = await hop.getStatus({});
      expect(status.members.map((m) => m.address)).to.deep.equal([worker.addr]);
      expect(Date.now() - started).to.be.below(3000);
      expect(await report(multimodal())).to.deep.equal({ present: true, items: 1 });
    } finally {
      await first.close();
      await second.close();
    }
  });

  it("ignores, and counts, registrations under the prefix that are not Encode worker cards", async () => {
    const hop = createClient(EncodeHopService, hopServer.transport);
    const plain = await register("no-card", worker.addr, {});
    const other = await register("prefill", worker.addr, { worker_type: "prefill", model_input: "tokens" });
    const embeds = await register("embeds", worker.addr, { ...ENCODE_WORKER_CARD, model_input: "text" });
    try {
      for (const r of [plain, other, embeds]) await r.register();
      await eventually(async () => expect(await metricValue(hopServer.host.metrics.registry, "encode_members_ignored")).to.equal(3));
      expect((await hop.getStatus({})).members).to.deep.equal([]);
      expect(await report(multimodal())).to.deep.equal({ present: false, items: 0 });
    } finally {
      for (const r of [plain, other, embeds]) await r.close();
    }
    await eventually(async () => expect(await metricValue(hopServer.host.metrics.registry, "encode_members_ignored")).to.equal(0));
  });

  it("a hop whose etcd is down at boot is ready and serves text-only and passthrough traffic", async () => {
    const down = `http://127.0.0.1:${await freePort()}`;
    const lonely = await startServer({
      modules: [tokenWorkerModule, encodeHopModule],
      config: { encodeHop: { encoders: { discovery: "etcd", etcd: { endpoints: [down], ...pool } } } },
    });
    try {
      const health = createClient(Health, lonely.transport);
      expect((await health.check({ service: "" })).status).to.equal(S.SERVING);
      expect((await health.check({ service: ENCODE_LIFECYCLE_HEALTH })).status).to.equal(S.NOT_SERVING);
      const hop = createClient(EncodeHopService, lonely.transport);
      expect((await hop.getStatus({})).lifecycle).to.equal(Lifecycle.PENDING);
      for (const request of [{ tokenIds: [1, 2] }, multimodal()]) {
        const outputs = [];
        for await (const res of hop.generate({ request })) outputs.push(res);
        expect(outputs.at(-1)?.output?.data?.finishReason).to.not.equal(undefined);
      }
    } finally {
      await lonely.close();
    }
  });
});
