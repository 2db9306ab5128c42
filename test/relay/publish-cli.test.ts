import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { expect } from "chai";
import { computeSeqHashForBlock, MAX_ROUTER_EVENT_JSON_BYTES } from "../../src/kv/index.js";
import { LaneProbe } from "../../src/relay/index.js";
import { kvPublishCommand } from "../../src/relay/publish-cli.js";
import { runMmgate } from "../support/index.js";
import { startRelay, type RelayServer } from "./service/support.js";

// The issue's own lines: a u64 above 2^53 that JSON.parse would round, a decimal string, removed and cleared.
const LINES = [
  '{"worker_id":1,"event":{"event_id":1,"dp_rank":0,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":900000,"tokens_hash":9143094415614847814}]}}}}',
  '{"worker_id":1,"event":{"event_id":2,"dp_rank":0,"data":{"stored":{"parent_hash":900000,"blocks":[{"block_hash":900001,"tokens_hash":"18446744073709551615"}]}}}}',
  '{"worker_id":2,"event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":7,"tokens_hash":70}]}}}}',
  '{"worker_id":2,"event":{"event_id":2,"data":{"removed":{"block_hashes":[7]}}}}',
  '{"worker_id":3,"event":{"event_id":1,"data":"cleared"}}',
];

/**
 * Runs `mmgate kv publish ARGS` in this process with `stdin` as its standard
 * input (FILE "-"): its output, error output and exit code.
 */
async function publishFromStdin(args: string[], stdin: Readable): Promise<{ out: string; err: string; code: number }> {
  let out = "";
  let err = "";
  const saved = process.exitCode;
  process.exitCode = 0;
  const command = kvPublishCommand({ out: { write: (t: string) => (out += t) }, err: { write: (t: string) => (err += t) }, stdin });
  command.exitOverride().configureOutput({ writeErr: (t) => (err += t), writeOut: (t) => (out += t) });
  let code: number;
  try {
    await command.parseAsync([...args, "-"], { from: "user" });
    code = Number(process.exitCode ?? 0);
  } catch (e) {
    code = (e as { exitCode?: number }).exitCode ?? 1;
  } finally {
    process.exitCode = saved;
  }
  return { out, err, code };
}

describe("mmgate kv publish", function () {
  this.timeout(20_000);
  let server: RelayServer;
  let dir: string;
  before(async () => {
    server = await startRelay({ pools: [{ name: "default", expectedBlocks: 1024 }] });
    dir = mkdtempSync(join(tmpdir(), "mmgate-kv-publish-"));
  });
  after(async () => {
    rmSync(dir, { recursive: true, force: true });
    await server.close();
  });

  const file = (name: string, lines: readonly string[]): string => {
    const path = join(dir, name);
    writeFileSync(path, `${lines.join("\n")}\n`);
    return path;
  };

  it("replays the reference's JSON lines exactly (u64s above 2^53 included) and prints the relay's summary", async () => {
    const res = await runMmgate(["kv", "publish", "--addr", server.addr, "--pool", "default", "--batch", "2", file("events.jsonl", LINES)]);
    expect(res.stderr).to.equal("");
    expect(res.code).to.equal(0);
    const summary = JSON.parse(res.stdout) as Record<string, unknown>;
    expect(summary).to.include({ pool: "default", sent: 5, applied: "5", rejected: "0" });
    const pool = server.relay.pool("default")!;
    expect(pool.occupancy()).to.deep.equal({ uniqueBlocks: 2, ranks: 1 });
    // The filter holds the chain of the exact tokens hashes, not of what a double would have made of them.
    const probe = new LaneProbe(pool.producer.format, pool.words());
    const [first, second] = computeSeqHashForBlock([9143094415614847814n, 18446744073709551615n]);
    expect(probe.contains(first!)).to.equal(true);
    expect(probe.contains(second!)).to.equal(true);
    expect(probe.contains(computeSeqHashForBlock([9143094415614847000n])[0]!)).to.equal(false);
  });

  it("exits 3 (partly done) with the rejections when the relay refuses some events", async () => {
    const res = await runMmgate([
      "kv",
      "publish",
      "--addr",
      server.addr,
      "--pool",
      "default",
      file("orphan.jsonl", ['{"worker_id":5,"event":{"event_id":1,"data":{"stored":{"parent_hash":12345,"blocks":[{"block_hash":1,"tokens_hash":2}]}}}}']),
    ]);
    expect(res.code).to.equal(3); // partly done: the relay rejected some events
    const summary = JSON.parse(res.stdout) as { rejected: string; rejections: { index: string; code: string }[] };
    expect(summary.rejected).to.equal("1");
    expect(summary.rejections[0]).to.include({ index: "0", code: "ParentBlockNotFound" });
  });

  it("exits 1 naming the line and JSON path of a bad event, after publishing the lines before it", async () => {
    const before = server.relay.pool("default")!.stats().eventsApplied;
    const res = await runMmgate([
      "kv",
      "publish",
      "--addr",
      server.addr,
      "--pool",
      "default",
      file("bad.jsonl", [LINES[4]!, '{"worker_id":-1,"event":{"event_id":1,"data":"cleared"}}', LINES[4]!]),
    ]);
    expect(res.code).to.equal(1);
    expect(res.stderr).to.match(/line 2: \$\.worker_id: .*the 1 events before it were published/);
    expect(server.relay.pool("default")!.stats().eventsApplied).to.equal(before + 1);
  });

  it("refuses a line over the event limit once it passes the limit, without reading the rest of it (an input that never ends)", async () => {
    const CHUNK = 64 * 1024;
    const head = Buffer.from(`${LINES[0]}\n${LINES[4]}\n{"worker_id":9,"event":{"event_id":1,"data":{"removed":{"block_hashes":[`);
    const filler = Buffer.from("1,".repeat(CHUNK / 2));
    // Asked for chunk after chunk of one line that never ends (cut at 64 MiB, so that a reader that reads it all still finishes).
    let served = 0;
    let reads = 0;
    const stdin = new Readable({
      read() {
        reads += 1;
        if (served >= 64 * 1024 * 1024) return void this.push(null);
        const chunk = served === 0 ? head : filler;
        served += chunk.length;
        this.push(chunk);
      },
    });
    const before = server.relay.pool("default")!.stats().eventsApplied;
    const res = await publishFromStdin(["--addr", server.addr, "--pool", "default"], stdin);
    expect(res.code).to.equal(1);
    // The message routerEventFromJson gives a line over the limit, with its line number.
    expect(res.err).to.equal(
      `mmgate kv publish: [invalid_argument] line 3: $: input is larger than ${MAX_ROUTER_EVENT_JSON_BYTES} bytes; the 2 events before it were published, the rest were not sent\n`,
    );
    expect(server.relay.pool("default")!.stats().eventsApplied).to.equal(before + 2);
    // Read up to the limit, and no further than the chunks the stream had buffered ahead.
    expect(served).to.be.greaterThan(MAX_ROUTER_EVENT_JSON_BYTES);
    expect(served, `${served} bytes read in ${reads} reads`).to.be.at.most(head.length + MAX_ROUTER_EVENT_JSON_BYTES + 4 * CHUNK);
    // And nothing more is asked for afterwards: standard input is left unread, not drained.
    const after = served;
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(served).to.equal(after);
    stdin.destroy();
  });

  it("takes a line of exactly the limit and refuses one byte more, as before", async () => {
    const event = LINES[4]!;
    const exact = event.replace("{", `{${" ".repeat(MAX_ROUTER_EVENT_JSON_BYTES - Buffer.byteLength(event))}`);
    expect(Buffer.byteLength(exact)).to.equal(MAX_ROUTER_EVENT_JSON_BYTES);
    const ok = await runMmgate(["kv", "publish", "--addr", server.addr, "--pool", "default", file("exact.jsonl", [exact])]);
    expect(ok.stderr).to.equal("");
    expect(ok.code).to.equal(0);
    const over = await runMmgate(["kv", "publish", "--addr", server.addr, "--pool", "default", file("over.jsonl", [LINES[4]!, ` ${exact}`, LINES[4]!])]);
    expect(over.code).to.equal(1);
    expect(over.stderr).to.equal(
      `mmgate kv publish: [invalid_argument] line 2: $: input is larger than ${MAX_ROUTER_EVENT_JSON_BYTES} bytes; the 1 events before it were published, the rest were not sent\n`,
    );
  });

  it("exits 1 for an unknown pool and for an unreadable file", async () => {
    const unknown = await runMmgate(["kv", "publish", "--addr", server.addr, "--pool", "nope", file("one.jsonl", [LINES[4]!])]);
    expect(unknown.code).to.equal(1);
    expect(unknown.stderr).to.match(/not_found.*no pool named "nope"/);
    const missing = await runMmgate(["kv", "publish", "--addr", server.addr, "--pool", "default", join(dir, "absent.jsonl")]);
    expect(missing.code).to.equal(1);
    expect(missing.stderr).to.match(/cannot read .*absent\.jsonl: ENOENT/);
  });

  it("mmgate serve's embedded defaults run the relay with one pool named default", async () => {
    const res = await runMmgate(["serve", "--print-config"]);
    expect(res.code).to.equal(0);
    const config = JSON.parse(res.stdout) as { modules: string[]; relay: { pools: { name: string; expectedBlocks: number; blockSize: number }[]; dcId: string } };
    expect(config.modules).to.include("relay");
    expect(config.relay.pools.map((p) => [p.name, p.expectedBlocks, p.blockSize])).to.deep.equal([["default", 1_048_576, 16]]);
    expect(config.relay.dcId).to.equal("1");
  });
});
