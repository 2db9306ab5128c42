/**
 * Idempotency keys across replicas, as deployed: two `mmgate serve`
 * processes with the images module share a NATS JetStream bucket
 * (`images.idempotency.store: nats`) behind a round-robin TCP load
 * balancer, and generate through an OpenAI-compatible upstream this test
 * runs, which counts the generations. A retry with the same key reaches
 * the other replica and is answered from the bucket; stopping nats-server
 * leaves each replica with its own keys, said in its log and its metrics,
 * until it is back. Clients call over the network with @grpc/grpc-js and
 * with connect.
 */
import { createServer, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import * as grpc from "@grpc/grpc-js";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { expect } from "chai";
import sharp from "sharp";
import { ImageService } from "../../gen/mmgate/images/v1/image_service_pb.js";
import { eventually, expectRejection, grpcJsClient, requireNats, startChildServer, startNats, type ChildServer, type NatsServer } from "../support/index.js";
import { startRoundRobinProxy, type RoundRobinProxy } from "../support/round-robin-proxy.js";

const PROTO = "mmgate/images/v1/image_service.proto";
const SERVICE = "mmgate.images.v1.ImageService";
const API_KEY = "sk-test-replicas-0123456789";

/** An OpenAI-compatible image endpoint that counts generations and can hold its answers. */
class Upstream {
  generations = 0;
  private holding = false;
  private readonly held: (() => void)[] = [];
  private server!: Server;
  baseUrl = "";

  async start(): Promise<void> {
    const png = (await sharp({ create: { width: 8, height: 8, channels: 3, background: { r: 200, g: 40, b: 0 } } }).png().toBuffer()).toString("base64");
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (chunk: Buffer) => chunks.push(chunk));
      req.on("end", () => {
        if (req.method !== "POST" || req.url !== "/v1/images/generations") {
          res.writeHead(404).end();
          return;
        }
        this.generations += 1;
        const n = (JSON.parse(Buffer.concat(chunks).toString("utf8")) as { n?: number }).n ?? 1;
        const answer = () => this.json(res, { created: 1, data: Array.from({ length: n }, () => ({ b64_json: png })), usage: { total_tokens: n } });
        if (this.holding) this.held.push(answer);
        else answer();
      });
    });
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    this.baseUrl = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  hold(): void {
    this.holding = true;
  }

  get waiting(): number {
    return this.held.length;
  }

  release(): void {
    this.holding = false;
    for (const answer of this.held.splice(0)) answer();
  }

  close(): Promise<void> {
    return new Promise((resolve) => this.server.close(() => resolve()));
  }

  private json(res: ServerResponse, body: unknown): void {
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(body));
  }
}

interface Answer {
  readonly id: string;
  readonly image: Buffer;
  readonly replayed: boolean;
}

const grpcRequest = (prompt: string) => ({ request: { prompt, generate: {}, parameters: { n: 1 } } });
const connectRequest = (prompt: string) => ({ request: { prompt, operation: { case: "generate" as const, value: {} }, parameters: { n: 1 } } });

/** Generate with @grpc/grpc-js over a connection of its own (so the balancer picks the next replica). */
function grpcGenerate(addr: string, key: string, prompt: string): Promise<Answer> {
  const client = grpcJsClient(addr, PROTO, SERVICE, { "grpc.use_local_subchannel_pool": 1 });
  const metadata = new grpc.Metadata();
  metadata.set("idempotency-key", key);
  return new Promise<Answer>((resolve, reject) => {
    let replayed = false;
    const call = (client["Generate"] as (...args: unknown[]) => grpc.ClientUnaryCall)(
      grpcRequest(prompt),
      metadata,
      { deadline: new Date(Date.now() + 20_000) },
      (error: grpc.ServiceError | null, answer: { response: { id: string; data: { image: Buffer }[] } }) => {
        client.close();
        if (error) reject(error);
        else resolve({ id: answer.response.id, image: answer.response.data[0]!.image, replayed });
      },
    );
    call.on("metadata", (received: grpc.Metadata) => (replayed = received.get("idempotency-replayed")[0] === "true"));
  });
}

/** Generate with a connect client over a connection of its own. */
async function connectGenerate(addr: string, key: string, prompt: string): Promise<Answer> {
  const baseUrl = `http://${addr}`;
  const sessionManager = new Http2SessionManager(baseUrl);
  try {
    let replayed = false;
    const images = createClient(ImageService, createGrpcTransport({ baseUrl, sessionManager }));
    const answer = await images.generate(connectRequest(prompt), {
      headers: { "idempotency-key": key },
      timeoutMs: 20_000,
      onHeader: (headers) => (replayed = headers.get("idempotency-replayed") === "true"),
    });
    const payload = answer.response!.data[0]!.payload;
    if (payload.case !== "image") throw new Error(`expected the image's bytes, got ${payload.case ?? "none"}`);
    return { id: answer.response!.id, image: Buffer.from(payload.value), replayed };
  } finally {
    sessionManager.abort();
  }
}

async function metrics(replica: ChildServer): Promise<string> {
  return (await fetch(`http://${replica.adminAddr}/metrics`)).text();
}

function sample(text: string, series: string): number {
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  if (line === undefined) throw new Error(`no series ${series}`);
  return Number(line.slice(series.length + 1));
}

const answered = (result: string) => `mmgate_images_idempotency_requests_total{result="${result}"}`;
const DEGRADED = "mmgate_images_idempotency_store_degraded";

describe("images: idempotency keys across two replicas behind a load balancer", function () {
  this.timeout(120_000);
  let nats: NatsServer;
  const upstream = new Upstream();
  let replicas: ChildServer[] = [];
  let proxy: RoundRobinProxy;

  before(async function () {
    requireNats(this);
    nats = await startNats({ jetstream: true });
    await upstream.start();
    const env = {
      MMGATE_IMAGES__REFERENCE__ENABLED: "false",
      MMGATE_IMAGES__OPENAI: JSON.stringify([{ name: "oai", baseUrl: upstream.baseUrl, apiKeyEnv: "MMGATE_TEST_OAI_KEY", nativeCount: 1 }]),
      MMGATE_TEST_OAI_KEY: API_KEY,
      MMGATE_IMAGES__IDEMPOTENCY__STORE: "nats",
      MMGATE_IMAGES__IDEMPOTENCY__NATS__SERVERS: JSON.stringify([nats.url]),
      MMGATE_IMAGES__IDEMPOTENCY__NATS__BUCKET: `replicas_${process.pid}`,
      MMGATE_IMAGES__IDEMPOTENCY__NATS__HEARTBEAT_MS: "200",
      MMGATE_IMAGES__IDEMPOTENCY__NATS__LEASE_MS: "3000",
      MMGATE_IMAGES__IDEMPOTENCY__NATS__REQUEST_TIMEOUT_MS: "1000",
      MMGATE_IMAGES__IDEMPOTENCY__NATS__RECONNECT_WAIT_MS: "200",
    };
    replicas = await Promise.all([startChildServer(["--modules", "images", "--log-level", "info"], env), startChildServer(["--modules", "images", "--log-level", "info"], env)]);
    proxy = await startRoundRobinProxy(replicas.map((r) => r.addr));
    for (const replica of replicas) {
      await eventually(() => expect(replica.stdout.some((l) => l.includes("idempotency store connected"))).to.equal(true), { timeoutMs: 15_000 });
    }
  });
  after(async () => {
    await proxy?.close();
    await Promise.all(replicas.map((r) => r.close()));
    await upstream.close();
    await nats?.stop();
  });

  /** Which replica the last `count` connections reached. */
  const lastTargets = (count: number) => proxy.targets().slice(-count);

  it("generates a key once: a retry that reaches the other replica is replayed there (grpc-js)", async () => {
    const before = upstream.generations;
    const first = await grpcGenerate(proxy.addr, "order-1", "a red fox");
    const retry = await grpcGenerate(proxy.addr, "order-1", "a red fox");
    const [x, y] = lastTargets(2);
    expect(x, "the retry reached the other replica").to.not.equal(y);
    expect(first.replayed).to.equal(false);
    expect(retry).to.deep.include({ id: first.id, replayed: true });
    expect(retry.image.equals(first.image)).to.equal(true);
    expect(upstream.generations - before).to.equal(1);
    expect(sample(await metrics(replicas[x!]!), answered("executed"))).to.equal(1);
    expect(sample(await metrics(replicas[y!]!), answered("replayed"))).to.equal(1);
  });

  it("a call with the key that reaches the other replica while the first runs joins it (grpc-js, then connect)", async () => {
    const before = upstream.generations;
    upstream.hold();
    const first = grpcGenerate(proxy.addr, "order-2", "a blue heron");
    await eventually(() => expect(upstream.waiting).to.equal(1));
    const [x] = lastTargets(1);
    const joined = connectGenerate(proxy.addr, "order-2", "a blue heron");
    await eventually(async () => expect(sample(await metrics(replicas[1 - x!]!), answered("joined"))).to.equal(1));
    upstream.release();
    const [a, b] = await Promise.all([first, joined]);
    expect(b).to.deep.include({ id: a.id, replayed: true });
    expect(b.image.equals(a.image)).to.equal(true);
    expect(upstream.generations - before).to.equal(1);
  });

  it("the key with another request is refused by both replicas (connect and grpc-js)", async () => {
    const before = upstream.generations;
    for (let i = 0; i < 2; i += 1) {
      const refused = await expectRejection(connectGenerate(proxy.addr, "order-1", "a different fox"), { type: ConnectError });
      expect(refused.code).to.equal(Code.AlreadyExists);
    }
    expect(new Set(lastTargets(2)).size, "both replicas answered").to.equal(2);
    const viaGrpc = await expectRejection<grpc.ServiceError>(grpcGenerate(proxy.addr, "order-1", "a different fox"));
    expect(viaGrpc.code).to.equal(grpc.status.ALREADY_EXISTS);
    expect(upstream.generations).to.equal(before);
  });

  it("stopping nats-server leaves each replica with its own keys, with a warning and the degraded gauge, until it is back", async () => {
    await nats.halt();
    for (const replica of replicas) {
      await eventually(() => expect(replica.stdout.some((l) => l.includes("idempotency keys are process-local until it is back"))).to.equal(true), { timeoutMs: 15_000 });
      await eventually(async () => expect(sample(await metrics(replica), DEGRADED)).to.equal(1));
    }
    const before = upstream.generations;
    const first = await grpcGenerate(proxy.addr, "order-3", "a grey wolf");
    const retry = await connectGenerate(proxy.addr, "order-3", "a grey wolf");
    const again = await grpcGenerate(proxy.addr, "order-3", "a grey wolf");
    const [x, y, z] = lastTargets(3);
    expect([x === y, x === z]).to.deep.equal([false, true]);
    // Per replica: the other replica ran the key again; the first one replays its own.
    expect(retry.replayed).to.equal(false);
    expect(again).to.deep.include({ id: first.id, replayed: true });
    expect(upstream.generations - before).to.equal(2);

    await nats.restart();
    for (const replica of replicas) {
      await eventually(async () => expect(sample(await metrics(replica), DEGRADED)).to.equal(0), { timeoutMs: 20_000 });
      await eventually(() => expect(replica.stdout.some((l) => l.includes("idempotency store reachable again"))).to.equal(true));
    }
    const shared = await connectGenerate(proxy.addr, "order-4", "a white owl");
    const replayed = await grpcGenerate(proxy.addr, "order-4", "a white owl");
    expect(replayed).to.deep.include({ id: shared.id, replayed: true });
    expect(upstream.generations - before).to.equal(3);
  });

  it("each replica closes its store on SIGTERM and exits cleanly", async () => {
    await Promise.all(replicas.map((r) => r.close()));
    expect(await Promise.all(replicas.map((r) => r.exited))).to.deep.equal([0, 0]);
    for (const replica of replicas) expect(replica.stdout.filter((l) => /"level":(50|60)/.test(l))).to.deep.equal([]);
  });
});
