import { expect } from "chai";
import { writeFile, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { mediaCommand } from "../../src/media/cli.js";
import { mediaModule } from "../../src/media/index.js";
import { captureOutput, startServer, type InProcessServer } from "../support/index.js";
import { encodeRaw, pattern } from "./fixtures.js";

/** Runs `mmgate media …` in this process and captures what it prints. */
async function run(args: string[]): Promise<{ out: string; err: string; code: number }> {
  const { stdout, stderr, code } = await captureOutput(() => mediaCommand().exitOverride().parseAsync(args, { from: "user" }));
  return { out: stdout, err: stderr, code };
}

describe("mmgate media CLI", function () {
  this.timeout(30_000);
  let dir: string;
  let server: InProcessServer;
  let file: string;

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), "mmgate-media-"));
    file = join(dir, "img.png");
    await writeFile(file, await encodeRaw(pattern(6 * 5 * 4), 6, 5, 4, "png"));
    server = await startServer({ modules: [mediaModule] });
  });

  after(async () => {
    await server?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it("hash prints the golden vector as text and JSON", async () => {
    const text = await run(["hash", "--shape", "1,2,3", "--hex", "000102030405"]);
    expect(text.out).to.include("content_hash_key 7a9bbcb11a898630");
    expect(text.out).to.include("content_hash     8834862562857813552");
    const json = await run(["hash", "--shape", "1,2,3", "--hex", "000102030405", "--json"]);
    expect(JSON.parse(json.out)).to.deep.equal({
      shape: ["1", "2", "3"],
      dtype: "UINT8",
      content_hash: String(0x7a9bbcb11a898630n),
      content_hash_key: "7a9bbcb11a898630",
    });
  });

  it("hash takes video metadata and prints it as the reference serializes it", async () => {
    const res = await run([
      "hash", "--shape", "2,1,2,3", "--hex", "000102030405060708090a0b",
      "--video-metadata", '{"source_fps":24,"source_duration":10,"sampled_timestamps":[0,5]}', "--json",
    ]);
    expect(res.out).to.include('"metadata":{"Video":{"source_fps":24.0,"source_duration":10.0,"sampled_timestamps":[0.0,5.0]}}');
    expect((JSON.parse(res.out) as { content_hash_key: string }).content_hash_key).to.equal("7e4b54c46acd410c");
  });

  it("hash reports a payload that does not fit the shape", async () => {
    const res = await run(["hash", "--shape", "2,2", "--hex", "0001"]);
    expect(res.code).to.equal(1);
    expect(res.err).to.include("tensor payload has 2 bytes, shape [2, 2] needs 4");
  });

  it("decode prints the same facts locally and through the server", async () => {
    const local = JSON.parse((await run(["decode", file, "--local", "--json"])).out) as Record<string, unknown>;
    const remote = JSON.parse((await run(["decode", file, "--addr", server.addr, "--json"])).out) as Record<string, unknown>;
    expect(local).to.deep.equal(remote);
    expect(local["shape"]).to.deep.equal(["5", "6", "4"]);
    expect(local["metadata"]).to.deep.equal({ Image: { format: "Png", color_type: "Rgba8", layout: "HWC" } });
    const stored = JSON.parse((await run(["decode", file, "--addr", server.addr, "--json", "--store"])).out) as Record<string, string>;
    expect(stored["handle"]).to.match(/^\d+$/);
    expect(JSON.parse(stored["descriptor_json"]!)).to.have.property("content_hash", local["content_hash_key"]);
  });

  it("decode reports a bad file with exit code 1", async () => {
    const bad = join(dir, "bad.png");
    await writeFile(bad, "garbage");
    const res = await run(["decode", bad, "--local"]);
    expect(res.code).to.equal(1);
    expect(res.err).to.include("Unsupported image format");
  });
});
