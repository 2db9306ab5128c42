/**
 * Outlier ejection and active health checks of the hop's Encode pool
 * (src/encode/members.ts): members that fail are taken out of rotation,
 * never more than maxEjectionPercent of the pool at once, probed with
 * grpc.health.v1 and admitted again once SERVING; an operator's
 * NOT_SERVING takes a member out without failures.
 *
 * No assertion here is about speed: the tests count requests, fallbacks and
 * ejections and wait (generously) for states to converge.
 */
import * as http2 from "node:http2";
import { createServer, type AddressInfo, type Server, type Socket } from "node:net";
import { expect } from "chai";
import { createClient, type Client } from "@connectrpc/connect";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { EncodeHopService, EncodeWorkerService, Lifecycle, MemberState, type GetStatusResponse, type Member } from "../../gen/mmgate/encode/v1/encode_pb.js";
import { encodeHopModule, encodeWorkerModule, tokenWorkerModule } from "../../src/encode/index.js";
import { mediaModule } from "../../src/media/index.js";
import { connectPathOnly, eventually, startChildServer, startServer, type ChildServer, type InProcessServer } from "../support/index.js";
import { freePort } from "../support/process.js";
import { encodeRaw, pattern } from "../media/fixtures.js";

type Hop = Client<typeof EncodeHopService>;

const WORKER_SERVICE = EncodeWorkerService.typeName;
/** Outbound channels on the same path as the servers: lean unless MMGATE_TEST_RPC_PATH=connect. */
const channel = { leanPath: !connectPathOnly };

/** The token worker's final report, from the last output's extra_args: was the request encoded? */
function encodedOf(outputs: { output?: { data?: { extraArgs?: unknown } } }[]): { encoded: boolean; mediaItems: number } {
  const extra = outputs.at(-1)?.output?.data?.extraArgs as { kind?: { case?: string; value?: unknown } } | undefined;
  const value = extra?.kind?.value as { fields?: Record<string, { kind: { value: unknown } }> } | undefined;
  if (!value?.fields) throw new Error("no report in the last output");
  return { encoded: value.fields["encoder_result_present"]?.kind.value === true, mediaItems: Number(value.fields["media_items"]?.kind.value) };
}

let png: Buffer;
const multimodal = () => ({
  tokenIds: [1, 2, 3],
  stopConditions: { maxTokens: 1 },
  multiModalData: { image: { items: [{ data: { case: "url" as const, value: `data:image/png;base64,${png.toString("base64")}` } }] } },
});

/** One multimodal request through the hop; it must succeed. True when it reached the token worker encoded. */
async function send(hop: Hop): Promise<boolean> {
  const outputs = [];
  for await (const res of hop.generate({ request: multimodal() }, { timeoutMs: 30_000 })) outputs.push(res);
  const report = encodedOf(outputs);
  expect(report.mediaItems, "the media reach the token worker either way").to.equal(1);
  return report.encoded;
}

interface LoadOptions {
  /** Clients sending at once. */
  readonly concurrency: number;
  /** Requests to send in all. */
  readonly count: number;
}

/** Sends `count` requests from `concurrency` clients; the outcomes (true: encoded) in completion order. */
async function load(hop: Hop, { concurrency, count }: LoadOptions): Promise<boolean[]> {
  const outcomes: boolean[] = [];
  let started = 0;
  const client = async () => {
    while (started < count) {
      started++;
      outcomes.push(await send(hop));
    }
  };
  await Promise.all(Array.from({ length: concurrency }, client));
  return outcomes;
}

const fallbacksIn = (outcomes: readonly boolean[]) => outcomes.filter((encoded) => !encoded).length;

function memberOf(status: GetStatusResponse, id: string): Member {
  const member = status.members.find((m) => m.id === id);
  if (member === undefined) throw new Error(`no member ${id} in GetStatus (${status.members.map((m) => m.id).join(", ")})`);
  return member;
}

const statesOf = (status: GetStatusResponse) => Object.fromEntries(status.members.map((m) => [m.id, MemberState[m.state]]));

/** The sum of every series of metric `name` whose labels include `labels`. */
async function metricSum(server: InProcessServer, name: string, labels: Record<string, string> = {}): Promise<number> {
  const metric = server.host.metrics.registry.getSingleMetric(name);
  if (!metric) return 0;
  const { values } = await metric.get();
  return values.filter((v) => Object.entries(labels).every(([k, want]) => v.labels[k] === want)).reduce((n, v) => n + v.value, 0);
}

interface HopOptions {
  readonly members: readonly { id: string; address: string }[];
  readonly encodeTimeoutMs: number;
  readonly outlier: Record<string, number>;
}

/** The hop (and its token worker) in this process over a static pool. */
async function startHop({ members, encodeTimeoutMs, outlier }: HopOptions): Promise<{ server: InProcessServer; hop: Hop }> {
  const server = await startServer({
    modules: [tokenWorkerModule, encodeHopModule],
    config: {
      encodeHop: { encoders: { discovery: "static", members }, encodeTimeoutMs, outlier, channel },
      // Reads from a worker that died fail at once; the reads of concurrent requests do not queue behind each other.
      tokenWorker: { receiver: { timeoutMs: 5000, maxConcurrentReads: 32, channel } },
    },
  });
  const hop = createClient(EncodeHopService, server.transport);
  await eventually(async () => expect((await hop.getStatus({})).lifecycle).to.equal(Lifecycle.ACTIVE), { timeoutMs: 10_000 });
  return { server, hop };
}

/** An Encode worker (modules media and encodeWorker) in this process. */
const startWorker = () => startServer({ modules: [mediaModule, encodeWorkerModule] });

/**
 * An Encode worker process (`mmgate serve --modules media,encodeWorker`).
 * The machine is shared: a start that misses the harness's 20 s is tried
 * once more (that child is killed by the harness first).
 */
async function startWorkerProcess(args: string[] = []): Promise<ChildServer> {
  const start = () => startChildServer(["--modules", "media,encodeWorker", ...args]);
  try {
    return await start();
  } catch (err) {
    if (!String(err).includes("did not start within")) throw err;
    return start();
  }
}

/** An address where nothing listens: connections to it are refused. */
const deadAddress = async () => `127.0.0.1:${await freePort()}`;

/** A TCP black hole: accepts connections and never writes a byte. */
async function startBlackHole(): Promise<{ address: string; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  const server: Server = createServer((socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => undefined);
    socket.resume();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    address: `127.0.0.1:${(server.address() as AddressInfo).port}`,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

before(async () => {
  png = await encodeRaw(pattern(16 * 16 * 3), 16, 16, 3, "png");
});

describe("encode outlier ejection: three Encode worker processes under load, one killed and restarted", function () {
  this.timeout(120_000);
  const ids = ["w0", "w1", "w2"];
  const CONSECUTIVE = 3;
  const CONCURRENCY = 8;
  let workers: ChildServer[] = [];
  let restarted: ChildServer | undefined;
  let server: InProcessServer;
  let hop: Hop;

  before(async () => {
    workers = await Promise.all(ids.map(() => startWorkerProcess()));
    ({ server, hop } = await startHop({
      members: ids.map((id, i) => ({ id, address: workers[i]!.addr })),
      encodeTimeoutMs: 5000,
      // A generous check timeout: the machine is shared, and a slow check of a healthy worker counts as a failure.
      outlier: { intervalMs: 200, checkTimeoutMs: 2000, baseEjectionMs: 500, consecutiveFailures: CONSECUTIVE },
    }));
  });
  after(async () => {
    await server?.close();
    await Promise.all([...workers.map((w) => w.close()), restarted?.close()]);
  });

  it("spreads the load over all three", async () => {
    const outcomes = await load(hop, { concurrency: CONCURRENCY, count: 24 });
    expect(fallbacksIn(outcomes)).to.equal(0);
    const status = await hop.getStatus({});
    expect(statesOf(status)).to.deep.equal({ w0: "ADMITTED", w1: "ADMITTED", w2: "ADMITTED" });
    for (const id of ids) expect(Number(memberOf(status, id).requests), id).to.be.greaterThan(0);
  });

  it("a killed worker: at most consecutiveFailures plus the requests in flight fall back, then none; it is ejected with a reason", async () => {
    const victim = workers[1]!;
    const before = await hop.getStatus({});
    // The kill lands while the load runs; the load goes on well past the process's end.
    const outcomes: boolean[] = [];
    let started = 0;
    let afterExit = -1;
    const killed = (async () => {
      while (outcomes.length < 12) await new Promise((r) => setTimeout(r, 5));
      victim.process.kill("SIGKILL");
      await victim.exited;
      afterExit = 0;
    })();
    const client = async () => {
      while (afterExit < 48) {
        started++;
        if (afterExit >= 0) afterExit++;
        outcomes.push(await send(hop));
      }
    };
    await Promise.all([killed, ...Array.from({ length: CONCURRENCY }, client)]);
    const fellBack = fallbacksIn(outcomes);
    expect(fellBack, `fallbacks among ${started} requests`).to.be.at.most(CONSECUTIVE + CONCURRENCY);

    const status = await eventually(async () => {
      const s = await hop.getStatus({});
      expect(MemberState[memberOf(s, "w1").state]).to.equal("EJECTED");
      return s;
    });
    const w1 = memberOf(status, "w1");
    expect(w1.reason).to.match(/connection refused|consecutive failures/);
    expect(w1.ejections).to.equal(1);
    expect(Number(w1.ejectedUntilUnixMs)).to.be.greaterThan(0);
    expect(statesOf(status)).to.deep.equal({ w0: "ADMITTED", w1: "EJECTED", w2: "ADMITTED" });
    // Every fallback is a failed call to the dead worker, counted against it.
    expect(Number(w1.failures - memberOf(before, "w1").failures)).to.equal(fellBack);
    expect(Number(status.members.reduce((n, m) => n + m.failures, 0n))).to.equal(fellBack);
    expect(await metricSum(server, "encode_member_ejections_total", { member: "w1" })).to.equal(1);
    expect(await metricSum(server, "encode_members", { state: "ejected" })).to.equal(1);
    expect(await metricSum(server, "encode_members", { state: "admitted" })).to.equal(2);

    // From now on nothing goes to it, and nothing falls back.
    const w1Requests = w1.requests;
    const next = await load(hop, { concurrency: CONCURRENCY, count: 32 });
    expect(fallbacksIn(next)).to.equal(0);
    const after = await hop.getStatus({});
    expect(memberOf(after, "w1").requests).to.equal(w1Requests);
    expect(MemberState[memberOf(after, "w1").state]).to.equal("EJECTED");
  });

  it("a worker restarted on the dead one's address is admitted again and gets encodes again", async () => {
    const address = workers[1]!.addr;
    restarted = await startWorkerProcess(["--listen", address]);
    expect(restarted.addr).to.equal(address);
    const admitted = await eventually(
      async () => {
        const s = await hop.getStatus({});
        expect(MemberState[memberOf(s, "w1").state]).to.equal("ADMITTED");
        return s;
      },
      { timeoutMs: 15_000 },
    );
    expect(memberOf(admitted, "w1").reason).to.equal("");
    expect(memberOf(admitted, "w1").ejectedUntilUnixMs).to.equal(0n);
    const requestsBefore = memberOf(admitted, "w1").requests;
    const metricBefore = await metricSum(server, "encode_member_requests_total", { member: "w1" });

    const outcomes = await load(hop, { concurrency: CONCURRENCY, count: 24 });
    expect(fallbacksIn(outcomes)).to.equal(0);
    const status = await hop.getStatus({});
    expect(memberOf(status, "w1").requests > requestsBefore, "the restarted worker encodes again").to.equal(true);
    expect(await metricSum(server, "encode_member_requests_total", { member: "w1" })).to.be.greaterThan(metricBefore);
    // Having served again, it starts its count of ejections in a row over.
    expect(memberOf(status, "w1").ejections).to.equal(0);
    expect(statesOf(status)).to.deep.equal({ w0: "ADMITTED", w1: "ADMITTED", w2: "ADMITTED" });
    expect(await metricSum(server, "encode_members", { state: "admitted" })).to.equal(3);
  });
});

describe("encode outlier ejection: a worker that accepts connections and never answers", function () {
  this.timeout(60_000);
  let worker: InProcessServer;
  let hole: Awaited<ReturnType<typeof startBlackHole>>;

  beforeEach(async () => {
    [worker, hole] = await Promise.all([startWorker(), startBlackHole()]);
  });
  afterEach(async () => {
    await Promise.all([worker?.close(), hole?.close()]);
  });

  it("is ejected after consecutiveFailures encode timeouts (passive only), and every later request is encoded", async () => {
    // No health checks and a long ejection: only the encode calls' timeouts eject it, and it stays out.
    const { server, hop } = await startHop({
      members: [
        { id: "hole", address: hole.address },
        { id: "real", address: worker.addr },
      ],
      encodeTimeoutMs: 1000,
      outlier: { intervalMs: 0, baseEjectionMs: 120_000, consecutiveFailures: 3 },
    });
    try {
      // One at a time, so the rotation alternates: exactly three calls reach the black hole before it is out.
      const outcomes = await load(hop, { concurrency: 1, count: 12 });
      expect(fallbacksIn(outcomes)).to.equal(3);
      expect(outcomes.slice(-6), "after the ejection every request is encoded").to.deep.equal([true, true, true, true, true, true]);
      const status = await hop.getStatus({});
      const h = memberOf(status, "hole");
      expect([MemberState[h.state], h.reason, h.consecutiveFailures, h.ejections]).to.deep.equal(["EJECTED", "3 consecutive failures (last: timeout)", 3, 1]);
      expect([h.requests, h.failures]).to.deep.equal([3n, 3n]);
      expect(MemberState[memberOf(status, "real").state]).to.equal("ADMITTED");
      expect(memberOf(status, "real").failures).to.equal(0n);
      expect(status.fallbacks).to.deep.equal({ transport: 3n });
      expect(await metricSum(server, "encode_member_ejections_total", { member: "hole", reason: "consecutive_failures" })).to.equal(1);
    } finally {
      await server.close();
    }
  });

  it("with health checks on too, it ends ejected and the load is all encoded afterwards", async () => {
    const { server, hop } = await startHop({
      members: [
        { id: "hole", address: hole.address },
        { id: "real", address: worker.addr },
      ],
      encodeTimeoutMs: 1000,
      outlier: { intervalMs: 200, checkTimeoutMs: 1000, baseEjectionMs: 500, consecutiveFailures: 3 },
    });
    try {
      const first = await load(hop, { concurrency: 4, count: 16 });
      // At most the calls that went to it before it was out fell back.
      expect(fallbacksIn(first)).to.be.at.most(3 + 4);
      await eventually(async () => expect(MemberState[memberOf(await hop.getStatus({}), "hole").state]).to.equal("EJECTED"), { timeoutMs: 10_000 });
      const holeRequests = memberOf(await hop.getStatus({}), "hole").requests;
      const next = await load(hop, { concurrency: 4, count: 16 });
      expect(fallbacksIn(next)).to.equal(0);
      const status = await hop.getStatus({});
      // Its checks keep timing out: it is never admitted again.
      expect(MemberState[memberOf(status, "hole").state]).to.equal("EJECTED");
      expect(memberOf(status, "hole").requests).to.equal(holeRequests);
      expect(memberOf(status, "hole").reason).to.match(/consecutive failures|health check failed/);
    } finally {
      await server.close();
    }
  });
});

describe("encode outlier ejection: a refused connection", function () {
  this.timeout(60_000);
  let worker: InProcessServer;

  before(async () => {
    worker = await startWorker();
  });
  after(async () => {
    await worker?.close();
  });

  it("ejects the member at the first refused call, whatever consecutiveFailures says; the next requests go elsewhere", async () => {
    // No health checks, a threshold never reached, a long ejection: only the refused call can eject it, and it stays out.
    const { server, hop } = await startHop({
      members: [
        { id: "dead", address: await deadAddress() },
        { id: "real", address: worker.addr },
      ],
      encodeTimeoutMs: 5000,
      outlier: { intervalMs: 0, baseEjectionMs: 120_000, consecutiveFailures: 100 },
    });
    try {
      const outcomes = await load(hop, { concurrency: 1, count: 8 });
      expect(fallbacksIn(outcomes)).to.equal(1);
      const status = await hop.getStatus({});
      const dead = memberOf(status, "dead");
      expect([MemberState[dead.state], dead.reason, dead.requests, dead.failures, dead.ejections]).to.deep.equal(["EJECTED", "connection refused", 1n, 1n, 1]);
      expect(memberOf(status, "real").requests).to.equal(7n);
      expect(status.fallbacks).to.deep.equal({ transport: 1n });
      expect(await metricSum(server, "encode_member_ejections_total", { member: "dead", reason: "refused" })).to.equal(1);
    } finally {
      await server.close();
    }
  });

  it("the health checks eject a refusing member without any traffic", async () => {
    const { server, hop } = await startHop({
      members: [
        { id: "dead", address: await deadAddress() },
        { id: "real", address: worker.addr },
      ],
      encodeTimeoutMs: 5000,
      outlier: { intervalMs: 100, checkTimeoutMs: 2000, baseEjectionMs: 500, consecutiveFailures: 100 },
    });
    try {
      const status = await eventually(async () => {
        const s = await hop.getStatus({});
        expect(MemberState[memberOf(s, "dead").state]).to.equal("EJECTED");
        return s;
      });
      const dead = memberOf(status, "dead");
      expect(dead.reason).to.match(/^connection refused/);
      expect([dead.requests, dead.ejections]).to.deep.equal([0n, 1]);
      expect(fallbacksIn(await load(hop, { concurrency: 2, count: 6 }))).to.equal(0);
      expect(memberOf(await hop.getStatus({}), "dead").requests).to.equal(0n);
    } finally {
      await server.close();
    }
  });
});

describe("encode outlier ejection: every worker dead", function () {
  this.timeout(60_000);

  it("every request passes through unencoded, one encode attempt each; at most half the pool is ejected", async () => {
    const ids = ["d0", "d1", "d2"];
    const members = await Promise.all(ids.map(async (id) => ({ id, address: await deadAddress() })));
    const { server, hop } = await startHop({
      members,
      encodeTimeoutMs: 5000,
      outlier: { intervalMs: 200, checkTimeoutMs: 300, baseEjectionMs: 500, consecutiveFailures: 3 },
    });
    try {
      const N = 40;
      const outcomes = await load(hop, { concurrency: 8, count: N });
      expect(fallbacksIn(outcomes)).to.equal(N);
      const status = await hop.getStatus({});
      expect(status.lifecycle).to.equal(Lifecycle.ACTIVE);
      const states = Object.values(statesOf(status));
      expect(states.filter((s) => s === "EJECTED"), "50% of three: one").to.have.length(1);
      expect(states.filter((s) => s === "ADMITTED")).to.have.length(2);
      const ejected = status.members.find((m) => m.state === MemberState.EJECTED)!;
      expect(ejected.reason).to.match(/^connection refused/);
      // No retry across members: each request made one encode call, which failed.
      expect(Number(status.members.reduce((n, m) => n + m.failures, 0n))).to.equal(N);
      expect(Number(status.members.reduce((n, m) => n + m.requests, 0n))).to.equal(N);
      expect(status.fallbacks).to.deep.equal({ transport: BigInt(N) });
      expect(status.encoded).to.equal(0n);
      expect(await metricSum(server, "encode_fallbacks_total", { cause: "transport" })).to.equal(N);
      expect(await metricSum(server, "encode_attempts_total")).to.equal(N);
      expect(await metricSum(server, "encode_member_ejections_total", { reason: "refused" })).to.equal(1);
      expect(await metricSum(server, "encode_member_ejections_total")).to.equal(1);
      expect(await metricSum(server, "encode_members", { state: "ejected" })).to.equal(1);
      expect(await metricSum(server, "encode_members", { state: "admitted" })).to.equal(2);
    } finally {
      await server.close();
    }
  });
});

describe("encode outlier ejection: maxEjectionPercent", function () {
  this.timeout(60_000);

  for (const [percent, ejected] of [
    [0, 0],
    [50, 1],
    [100, 2],
  ] as const) {
    it(`two refusing members, maxEjectionPercent ${percent}: ${ejected} ejected`, async () => {
      const members = [
        { id: "a", address: await deadAddress() },
        { id: "b", address: await deadAddress() },
      ];
      const { server, hop } = await startHop({
        members,
        encodeTimeoutMs: 5000,
        outlier: { intervalMs: 100, checkTimeoutMs: 300, baseEjectionMs: 500, consecutiveFailures: 3, maxEjectionPercent: percent },
      });
      try {
        const outcomes = await load(hop, { concurrency: 2, count: 8 });
        expect(fallbacksIn(outcomes)).to.equal(8);
        // The health checks are refused too: let them run a few rounds, the count must not move past the cap.
        await new Promise((r) => setTimeout(r, 500));
        await eventually(async () => {
          const status = await hop.getStatus({});
          expect(status.members.filter((m) => m.state === MemberState.EJECTED)).to.have.length(ejected);
          expect(status.members.filter((m) => m.state === MemberState.ADMITTED)).to.have.length(2 - ejected);
        });
        expect(await metricSum(server, "encode_member_ejections_total")).to.equal(ejected);
        const before = await hop.getStatus({});
        const more = await load(hop, { concurrency: 2, count: 6 });
        expect(fallbacksIn(more)).to.equal(6);
        const after = await hop.getStatus({});
        const failures = (s: GetStatusResponse) => Number(s.members.reduce((n, m) => n + m.failures, 0n));
        if (ejected === 2) {
          // Nobody left: the hop is Unavailable and passes multimodal requests through without trying.
          expect(after.lifecycle).to.equal(Lifecycle.UNAVAILABLE);
          expect(failures(after)).to.equal(failures(before));
          expect(await metricSum(server, "encode_unavailable_passthrough_total")).to.be.at.least(6);
        } else {
          // The members over the cap stay in rotation; their calls keep falling back.
          expect(after.lifecycle).to.equal(Lifecycle.ACTIVE);
          expect(failures(after)).to.equal(failures(before) + 6);
          expect(after.members.filter((m) => m.state === MemberState.EJECTED)).to.have.length(ejected);
        }
      } finally {
        await server.close();
      }
    });
  }
});

describe("encode outlier ejection: a member its operator sets NOT_SERVING", function () {
  this.timeout(60_000);
  let a: InProcessServer;
  let b: InProcessServer;

  before(async () => {
    [a, b] = await Promise.all([startWorker(), startWorker()]);
  });
  after(async () => {
    await Promise.all([a?.close(), b?.close()]);
  });

  it("goes out of rotation without failures, and comes back when SERVING again", async () => {
    const { server, hop } = await startHop({
      members: [
        { id: "a", address: a.addr },
        { id: "b", address: b.addr },
      ],
      encodeTimeoutMs: 5000,
      outlier: { intervalMs: 100, checkTimeoutMs: 2000, baseEjectionMs: 500, consecutiveFailures: 3 },
    });
    try {
      expect(fallbacksIn(await load(hop, { concurrency: 2, count: 8 }))).to.equal(0);
      expect(Number(memberOf(await hop.getStatus({}), "a").requests)).to.be.greaterThan(0);

      const admin = createClient(AdminService, a.transport);
      await admin.setServingStatus({ service: WORKER_SERVICE, serving: false });
      const out = await eventually(
        async () => {
          const s = await hop.getStatus({});
          expect(MemberState[memberOf(s, "a").state]).to.equal("CHECKING");
          return s;
        },
        { timeoutMs: 10_000 },
      );
      const member = memberOf(out, "a");
      expect(member.reason).to.contain("NOT_SERVING");
      expect([member.failures, member.consecutiveFailures, member.ejections]).to.deep.equal([0n, 0, 0]);
      expect(await metricSum(server, "encode_members", { state: "checking" })).to.equal(1);
      expect(await metricSum(server, "encode_member_ejections_total")).to.equal(0);

      // All the traffic goes to b, none falls back.
      const aRequests = member.requests;
      const bRequests = memberOf(out, "b").requests;
      expect(fallbacksIn(await load(hop, { concurrency: 2, count: 10 }))).to.equal(0);
      const during = await hop.getStatus({});
      expect(memberOf(during, "a").requests).to.equal(aRequests);
      expect(memberOf(during, "b").requests).to.equal(bRequests + 10n);
      expect(during.fallbacks).to.deep.equal({});

      await admin.setServingStatus({ service: WORKER_SERVICE, serving: true });
      const back = await eventually(
        async () => {
          const s = await hop.getStatus({});
          expect(MemberState[memberOf(s, "a").state]).to.equal("ADMITTED");
          return s;
        },
        { timeoutMs: 10_000 },
      );
      expect(memberOf(back, "a").reason).to.equal("");
      expect(fallbacksIn(await load(hop, { concurrency: 2, count: 8 }))).to.equal(0);
      expect(memberOf(await hop.getStatus({}), "a").requests > aRequests, "a takes traffic again").to.equal(true);
    } finally {
      await server.close();
    }
  });
});

describe("encode outlier ejection: ejections in a row grow, up to the cap; an ejected member comes back once SERVING", function () {
  this.timeout(60_000);

  /**
   * A worker whose health check says SERVING and whose every Encode call
   * fails with a reset stream: it is ejected, admitted again by its check
   * when its time is up, and ejected again.
   */
  async function startFlaky(): Promise<{ address: string; close(): Promise<void> }> {
    const server = http2.createServer();
    server.on("stream", (stream, headers) => {
      stream.on("error", () => undefined);
      stream.resume();
      if (headers[":path"] === "/grpc.health.v1.Health/Check") {
        stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
        stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
        // HealthCheckResponse { status: SERVING }
        stream.end(Buffer.from([0, 0, 0, 0, 2, 0x08, 0x01]));
      } else {
        stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
      }
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return {
      address: `127.0.0.1:${(server.address() as AddressInfo).port}`,
      close: () => new Promise<void>((resolve) => server.close(() => resolve())),
    };
  }

  it("each ejection lasts baseEjectionMs times its number in a row, capped at maxEjectionMs", async () => {
    const [worker, flaky] = await Promise.all([startWorker(), startFlaky()]);
    const base = 300;
    const cap = 500;
    const { server, hop } = await startHop({
      members: [
        { id: "flaky", address: flaky.address },
        { id: "real", address: worker.addr },
      ],
      encodeTimeoutMs: 5000,
      outlier: { intervalMs: 50, checkTimeoutMs: 2000, baseEjectionMs: base, maxEjectionMs: cap, consecutiveFailures: 2 },
    });
    try {
      const lengths: number[] = [];
      let seen = 0;
      /** When the last ejection seen ends: no status read before then may show the member back. */
      let until = 0;
      // A plain loop, not `eventually`: every round's assertions must hold, not just the last one's.
      const deadline = performance.now() + 30_000;
      while (seen < 3) {
        expect(performance.now(), `three ejections within 30 s (${seen} so far)`).to.be.below(deadline);
        // One request at a time: the ejection that shows after it happened during it.
        const before = Date.now();
        await send(hop);
        const status = await hop.getStatus({});
        const after = Date.now();
        const f = memberOf(status, "flaky");
        if (f.ejections > seen) {
          expect(f.ejections).to.equal(seen + 1);
          expect(MemberState[f.state]).to.equal("EJECTED");
          expect(f.reason).to.equal("2 consecutive failures (last: transport)");
          until = Number(f.ejectedUntilUnixMs);
          const length = Math.min(base * f.ejections, cap);
          expect(until, `ejection ${f.ejections} ends ${length} ms after it began`).to.be.within(before + length, after + length);
          lengths.push(length);
          seen = f.ejections;
        }
        // A status answered before the ejection's end shows it still out (SERVING checks alone do not bring it back).
        if (after < until) expect(MemberState[f.state], "back before its ejection ended").to.equal("EJECTED");
      }
      // Only an admitted member is ejected: between the ejections its (SERVING) checks admitted it again, without a successful call.
      expect(lengths).to.deep.equal([300, 500, 500]);
      const status = await hop.getStatus({});
      expect(memberOf(status, "real").failures).to.equal(0n);
      expect(await metricSum(server, "encode_member_ejections_total", { member: "flaky", reason: "consecutive_failures" })).to.equal(seen);
    } finally {
      await server.close();
      await Promise.all([worker.close(), flaky.close()]);
    }
  });
});
