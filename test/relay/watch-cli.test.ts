import { createServer } from "node:net";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { expect } from "chai";
import { KvEventService, PublishRequestSchema } from "../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { poolKey } from "../../src/relay/index.js";
import { runMmgate } from "../support/index.js";
import { chain, startRelay, stored, type RelayServer } from "./service/support.js";

type Line = Record<string, unknown> & { type: string };

/** An address nothing listens on: a port the kernel handed out and took back. */
async function closedAddress(): Promise<string> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return `127.0.0.1:${port}`;
}

describe("mmgate relay watch", function () {
  this.timeout(10_000);
  let relay: RelayServer;
  let keys: { small: string; large: string };

  before(async () => {
    relay = await startRelay({
      pools: [
        { name: "small", dcId: 1, expectedBlocks: 64, blockSize: 4, models: [{ model: "demo-model", aliases: ["friendly"] }] },
        // 2^20 buckets: a two-chunk snapshot.
        { name: "large", dcId: 2, expectedBlocks: 2_097_152, endpoint: { component: "prefill" } },
      ],
    });
    keys = { small: poolKey(relay.relay.pool("small")!.producer.poolId), large: poolKey(relay.relay.pool("large")!.producer.poolId) };
    const client = createClient(KvEventService, relay.connectTransport);
    async function* requests() {
      yield create(PublishRequestSchema, { pool: "small", events: [chain(1n, 100n, 5), stored(2n, [[7n, 8n]])] });
    }
    await client.publish(requests());
  });
  after(() => relay?.close());

  it("--decoded --once prints each accepted snapshot chunk as the protobuf JSON of Cbi1Frame, the pool's words as its non-zero buckets", async () => {
    const res = await runMmgate(["relay", "watch", relay.addr, "--once", "--decoded", "--timeout", "5000"]);
    expect(res.code, res.stderr).to.equal(0);
    const lines = res.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { pool: string; kind: string; sequence: string; frame: { flags: string; snapshotChunk: { chunkCount: number; nonzero: { bucket: number; value: string }[] } } });
    const small = lines.filter((l) => l.pool === keys.small);
    const large = lines.filter((l) => l.pool === keys.large);
    expect(small.map((l) => l.kind)).to.deep.equal(["FILTER_UPDATE_KIND_SNAPSHOT_CHUNK"]);
    expect(large.map((l) => l.frame.snapshotChunk.chunkCount)).to.deep.equal([2, 2]);
    expect(small[0]!.frame.flags).to.equal("CBI1_FLAGS_SNAPSHOT_CHUNK");
    // The chunk's non-zero words are the producer's: every one of them, nothing else.
    const words = relay.relay.pool("small")!.words();
    const nonzero = [...words.entries()].filter(([, w]) => w !== 0n).map(([bucket, w]) => ({ bucket, value: w.toString() }));
    expect(nonzero.length).to.be.greaterThan(0);
    expect(small[0]!.frame.snapshotChunk.nonzero).to.deep.equal(nonzero);
  });

  it("--once --json prints the catalog, snapshot progress and ready events as JSON lines, and exits 0 once every pool is ready", async () => {
    const res = await runMmgate(["relay", "watch", relay.addr, "--once", "--json", "--timeout", "5000"]);
    expect(res.code, res.stderr).to.equal(0);
    expect(res.stderr).to.equal("");
    const lines = res.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Line);
    const catalog = lines[0]!;
    expect(catalog).to.include({ type: "catalog", pools: 2 });
    expect(typeof catalog.revision).to.equal("string");
    const pools = catalog.catalog as Record<string, unknown>[];
    expect(pools.map((p) => p.key)).to.have.members([keys.small, keys.large]);
    const small = pools.find((p) => p.key === keys.small)!;
    expect(small).to.deep.include({
      dcId: "1",
      endpoint: "mmgate.backend.generate",
      models: [{ model: "demo-model", aliases: ["friendly"] }],
      blockSize: 4,
      hashFormat: "DYNAMO_STANDARD_V1",
      bucketCount: relay.relay.pool("small")!.producer.format.bucketCount,
    });
    // u64s are decimal strings.
    expect(small.seed).to.equal(String(relay.relay.pool("small")!.producer.format.seed));
    expect(pools.find((p) => p.key === keys.large)).to.deep.include({ dcId: "2", endpoint: "mmgate.prefill.generate", bucketCount: 1_048_576 });

    const progress = lines.filter((l) => l.type === "snapshot-progress" && l.pool === keys.large);
    expect(progress.map((l) => [l.chunksReceived, l.chunksExpected])).to.deep.include.members([
      [1, 2],
      [2, 2],
    ]);
    const ready = lines.filter((l) => l.type === "ready");
    expect(ready.map((l) => l.pool)).to.have.members([keys.small, keys.large]);
    for (const l of ready) expect(l.sequence).to.be.a("string").and.match(/^[0-9]+$/);
    // --once ends at the last ready event.
    expect(lines.at(-1)!.type).to.equal("ready");
  });

  it("--once prints the catalog, one line per pool, and the ready lines", async () => {
    const res = await runMmgate(["relay", "watch", relay.addr, "--once", "--timeout", "5000"]);
    expect(res.code, res.stderr).to.equal(0);
    expect(res.stdout).to.match(new RegExp(`relay ${relay.addr.replace(/\./g, "\\.")} catalog revision [0-9]+: 2 pools\\n`));
    expect(res.stdout).to.match(/\[\d\] dc 1 {2}endpoint mmgate\.backend\.generate {2}models demo-model \(aliases friendly\) {2}block 4 {2}DYNAMO_STANDARD_V1 {2}\d+ buckets/);
    expect(res.stdout).to.match(/\[\d\] dc 2 {2}endpoint mmgate\.prefill\.generate {2}models mmgate-demo {2}block 16 {2}DYNAMO_STANDARD_V1 {2}1048576 buckets/);
    expect(res.stdout.match(/\[\d\] ready at sequence \d+\n/g)).to.have.length(2);
  });

  it("exits 1 naming the failure when the relay cannot be reached within --timeout", async () => {
    const addr = await closedAddress();
    const res = await runMmgate(["relay", "watch", addr, "--json", "--timeout", "300"]);
    expect(res.code).to.equal(1);
    expect(res.stderr).to.match(new RegExp(`could not reach relay ${addr.replace(/\./g, "\\.")} within 300 ms: Unavailable`));
    // The JSON lines are the consumer's catalog errors.
    const lines = res.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Line);
    expect(lines.length).to.be.greaterThan(0);
    expect(lines.every((l) => l.type === "catalog-error")).to.equal(true);

    const once = await runMmgate(["relay", "watch", addr, "--once", "--timeout", "200"]);
    expect(once.code).to.equal(1);
    expect(once.stderr).to.include(`catalog stream: Unavailable`);
    expect(once.stderr).to.include(`could not reach relay ${addr} within 200 ms`);
  });

  it("refuses a malformed address as a usage error", async () => {
    const res = await runMmgate(["relay", "watch", "not-an-address"]);
    expect(res.code).to.equal(2);
    expect(res.stderr).to.include("expected HOST:PORT");
  });
});
