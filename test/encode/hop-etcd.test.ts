import { expect } from "chai";
import { createClient } from "@connectrpc/connect";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { EncodeHopService, Lifecycle } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { Health, HealthCheckResponse_ServingStatus as S } from "../../gen/grpc/health/v1/health_pb.js";
import { EtcdRegistration } from "../../src/discovery/index.js";
import { encodeHopModule, encodeWorkerModule, tokenWorkerModule } from "../../src/encode/index.js";
import { mediaModule } from "../../src/media/index.js";
import { eventually, requireEtcd, startEtcd, startServer, type EtcdServer, type InProcessServer } from "../support/index.js";
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
      config: { encodeHop: { encoders: { discovery: "etcd", etcd: { endpoints: [etcd.endpoint], ...pool } } } },
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

  it("routes to a worker once it registers, and falls back once its registration is revoked", async () => {
    const hop = createClient(EncodeHopService, hopServer.transport);
    await eventually(async () => expect((await hop.getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE));
    expect((await createClient(Health, hopServer.transport).check({ service: "" })).status).to.equal(S.SERVING);
    // No worker yet: the hop is bound to the pool but has no member, so requests fall back.
    expect(await report(multimodal())).to.deep.equal({ present: false, items: 0 });
    expect((await hop.getStatus({})).fallbacks["no_member"]).to.equal(1n);

    const registration = await EtcdRegistration.create({ endpoints: [etcd.endpoint], ...pool, instanceId: "w1", address: worker.addr });
    try {
      await registration.register();
      await eventually(async () => expect((await hop.getStatus({})).members.map((m) => m.id)).to.deep.equal(["w1"]));
      expect(await report(multimodal())).to.deep.equal({ present: true, items: 1 });
      const status = await hop.getStatus({});
      expect(status.targetId).to.equal("etcd:/mmgate/default/encode/encode/");
      expect(status.members[0]!.address).to.equal(worker.addr);
      expect(status.generation >= 2n).to.equal(true);

      await registration.revoke();
      await eventually(async () => expect((await hop.getStatus({})).members).to.deep.equal([]));
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
      await eventually(async () => expect((await hop.getStatus({})).members.map((m) => [m.id, m.address])).to.deep.equal([["w2", registering.addr]]));
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
    const registration = await EtcdRegistration.create({ endpoints: [etcd.endpoint], ...pool, instanceId: "w3", address: worker.addr });
    try {
      await registration.register();
      // Registered but not serving: never admitted, so the request falls back.
      const before = (await hop.getStatus({})).fallbacks["no_member"] ?? 0n;
      expect(await report(multimodal())).to.deep.equal({ present: false, items: 0 });
      const status = await hop.getStatus({});
      expect(status.members).to.deep.equal([]);
      expect(status.fallbacks["no_member"]).to.equal(before + 1n);

      await admin.setServingStatus({ service: "mmgate.encode.v1.EncodeWorkerService", serving: true });
      await eventually(async () => expect((await hop.getStatus({})).members.map((m) => m.id)).to.deep.equal(["w3"]));
      expect(await report(multimodal())).to.deep.equal({ present: true, items: 1 });
    } finally {
      await registration.close();
    }
  });
});
