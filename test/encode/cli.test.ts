import { expect } from "chai";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { encodeHopModule, encodeWorkerModule, hopCommand, tokenWorkerModule } from "../../src/encode/index.js";
import { agentMetadataBytes, buildDescriptor, descriptorToJson, encodeNixlMetadata, mediaModule, newTransferAgent } from "../../src/media/index.js";
import { runMmgate, startServer, type InProcessServer } from "../support/index.js";
import { freePort } from "../support/process.js";
import { encodeRaw, pattern } from "../media/fixtures.js";

class Text {
  text = "";
  write(chunk: string): boolean {
    this.text += chunk;
    return true;
  }
}

describe("encode: mmgate hop", function () {
  this.timeout(30_000);
  let server: InProcessServer;
  let dir: string;

  before(async () => {
    server = await startServer({ modules: [mediaModule, encodeWorkerModule, tokenWorkerModule, encodeHopModule] });
    dir = await mkdtemp(join(tmpdir(), "mmgate-hop-cli-"));
  });
  after(async () => {
    await server?.close();
    await rm(dir, { recursive: true, force: true });
    process.exitCode = 0;
  });

  async function run(args: string[], stdin?: string) {
    const out = new Text();
    const err = new Text();
    process.exitCode = 0;
    await hopCommand({ out, err, ...(stdin !== undefined ? { stdin: async () => stdin } : {}) }).parseAsync(args, { from: "user" });
    const code = process.exitCode;
    process.exitCode = 0;
    return { out: out.text, err: err.text, code };
  }

  it("generate: sends a request in the reference's JSON shape and prints each output as a JSON line", async () => {
    const png = await encodeRaw(pattern(8 * 8 * 3), 8, 8, 3, "png");
    const request = {
      model: "demo",
      token_ids: [1, 2, 3],
      multi_modal_data: { image: [{ Url: `data:image/png;base64,${png.toString("base64")}` }] },
      stop_conditions: { max_tokens: 3 },
    };
    const file = join(dir, "request.json");
    await writeFile(file, JSON.stringify(request));
    const result = await run(["generate", file, "--addr", server.addr]);
    expect(result.code).to.equal(0);
    const lines = result.out.trimEnd().split("\n").map((l) => JSON.parse(l) as { data: { finish_reason: unknown; extra_args?: Record<string, unknown> } });
    expect(lines).to.have.length(4);
    expect(lines.at(-1)!.data.finish_reason).to.equal("length");
    expect(lines.at(-1)!.data.extra_args).to.deep.include({ encoder_result_present: true, encoder_items: 1 });
    // The token worker's receipt, as text on stderr.
    const hash = (lines.at(-1)!.data.extra_args!["receipts"] as { content_hash: string }[])[0]!.content_hash;
    expect(hash).to.match(/^[0-9a-f]{16}$/);
    expect(result.err).to.equal(`receipt image[0] ${hash} [8, 8, 3] verified; released\n`);
  });

  it("generate --json: the receipts as one last JSON line on stdout; an item not verified is exit 3", async () => {
    const png = await encodeRaw(pattern(4 * 4 * 3), 4, 4, 3, "png");
    const file = join(dir, "receipts.json");
    await writeFile(file, JSON.stringify({ token_ids: [1], multi_modal_data: { image: [{ Url: `data:image/png;base64,${png.toString("base64")}` }] } }));
    const good = await run(["generate", file, "--addr", server.addr, "--json"]);
    expect(good.code).to.equal(0);
    expect(good.err).to.equal("");
    const last = JSON.parse(good.out.trimEnd().split("\n").at(-1)!) as { receipts: Record<string, unknown>[] };
    expect(last.receipts).to.have.length(1);
    expect(last.receipts[0]).to.deep.include({ modality: "image", index: 0, shape: [4, 4, 3], verified: true, released: true });

    // A decoded item whose descriptor names a tensor store nobody serves.
    const agent = encodeNixlMetadata(agentMetadataBytes(newTransferAgent(`127.0.0.1:${await freePort()}`)));
    const descriptor = JSON.parse(
      descriptorToJson(buildDescriptor(agent, 5n, 12, { shape: [2, 2, 3], dtype: "UINT8", metadata: { Image: { format: "Png", color_type: "Rgb8", layout: "HWC" } } }, 1n)),
    ) as unknown;
    await writeFile(file, JSON.stringify({ token_ids: [1], multi_modal_data: { image: [{ Decoded: descriptor }] } }));
    const text = await run(["generate", file, "--addr", server.addr]);
    expect(text.code).to.equal(3);
    expect(text.err).to.match(/^receipt image\[0\] 0000000000000001 \[2, 2, 3\] not verified: unreachable: cannot reach the tensor store at [^;]*; not released: unreachable: .*\n$/);
    const json = await run(["generate", file, "--addr", server.addr, "--json"]);
    expect(json.code).to.equal(3);
    expect(JSON.parse(json.out.trimEnd().split("\n").at(-1)!)).to.have.nested.property("receipts[0].verified", false);
  });

  it("generate: reads the request from standard input with -", async () => {
    const result = await run(["generate", "-", "--addr", server.addr], await readFile(join("test", "llm", "fixtures", "request-text.json"), "utf8"));
    expect(result.code).to.equal(0);
    const last = JSON.parse(result.out.trimEnd().split("\n").at(-1)!) as { data: { extra_args: Record<string, unknown> } };
    expect(last.data.extra_args).to.deep.include({ encoder_result_present: false });
  });

  it("generate: an invalid request is exit 1 with the JSON path, before any call", async () => {
    const file = join(dir, "bad.json");
    await writeFile(file, JSON.stringify({ token_ids: [1, "two"] }));
    const result = await run(["generate", file, "--addr", server.addr]);
    expect(result.code).to.equal(1);
    expect(result.err).to.match(/^mmgate hop generate: \[invalid_argument\] .*bad\.json: .*token_ids\[1\]/);
    const missing = await run(["generate", join(dir, "nope.json"), "--addr", server.addr]);
    expect(missing.code).to.equal(1);
    expect(missing.err).to.match(/^mmgate hop generate: \[io\] cannot read .*nope\.json/);
  });

  it("generate: an unreachable hop is exit 1 with one line", async () => {
    const file = join(dir, "text.json");
    await writeFile(file, JSON.stringify({ token_ids: [1] }));
    const result = await run(["generate", file, "--addr", "127.0.0.1:1", "--timeout", "2000"]);
    expect(result.code).to.equal(1);
    expect(result.err).to.match(/^mmgate hop generate: \[unavailable\] [^\n]*\n$/);
  });

  it("status: prints the lifecycle, target, members and counters", async () => {
    const result = await run(["status", "--addr", server.addr]);
    expect(result.code).to.equal(0);
    const status = JSON.parse(result.out) as { lifecycle: string; target_id: string; members: { id: string; state: string }[] };
    expect(status.lifecycle).to.equal("active");
    expect(status.target_id).to.equal("local");
    expect(status.members.map((m) => [m.id, m.state])).to.deep.equal([["local", "admitted"]]);
  });
});

describe("encode: the worker roles of the executable", () => {
  for (const [role, modules] of [
    ["encode-worker", ["media", "encodeWorker"]],
    ["token-worker", ["tokenWorker"]],
  ] as const) {
    it(`mmgate ${role} serves exactly ${modules.join(" and ")}, whatever --modules says`, async () => {
      const result = await runMmgate([role, "--print-config", "--modules", "images"]);
      expect(result.code).to.equal(0);
      expect((JSON.parse(result.stdout) as { modules: string[] }).modules).to.deep.equal([...modules]);
    });
  }
});
