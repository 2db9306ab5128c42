import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { expect } from "chai";
import sharp from "sharp";
import { imagesCommand } from "../../src/images/cli.js";
import { imagesModule } from "../../src/images/index.js";
import { startServer, type InProcessServer } from "../support/server.js";

class Capture extends Writable {
  text = "";
  override _write(chunk: Buffer, _enc: BufferEncoding, done: () => void): void {
    this.text += chunk.toString();
    done();
  }
}

describe("images: CLI", function () {
  this.timeout(30_000);
  let server: InProcessServer;
  let dir: string;

  before(async () => {
    server = await startServer({
      modules: [imagesModule],
      config: { images: { reference: { latencyMs: 10, defaultSize: "32x32", failure: { outputIndices: [2] } } } },
    });
    dir = await mkdtemp(join(tmpdir(), "mmgate-images-cli-"));
  });
  after(async () => {
    await server?.close();
    await rm(dir, { recursive: true, force: true });
    process.exitCode = 0;
  });

  async function run(args: string[], progress = false) {
    const out = new Capture();
    const err = new Capture();
    process.exitCode = 0;
    await imagesCommand({ out, err, progress }).parseAsync(args, { from: "user" });
    const code = process.exitCode;
    process.exitCode = 0;
    return { out: out.text, err: err.text, code };
  }

  it("writes n streamed images in order with progress bars", async () => {
    const target = join(dir, "streamed");
    const result = await run(["generate", "a cat", "-n", "2", "--out", target, "--addr", server.addr, "--stream", "--format", "jpeg"], true);
    expect(result.code).to.equal(0);
    expect(await readdir(target)).to.deep.equal(["image-0.jpg", "image-1.jpg"]);
    expect((await sharp(join(target, "image-1.jpg")).metadata()).format).to.equal("jpeg");
    expect(result.out).to.match(/^0\t.*image-0\.jpg\t32x32\t\d+ bytes\tsha256:[0-9a-f]{64}$/m);
    expect(result.err).to.include("output  1");
    expect(result.err).to.match(/output {2}1 \[█+\] done/);
    expect(result.err).to.include("warning: emulated_multi_image_fanout");
  });

  it("reports best-effort failures and exits with 2", async () => {
    const target = join(dir, "partial");
    const result = await run(["generate", "a dog", "-n", "4", "--out", target, "--addr", server.addr, "--best-effort"]);
    expect(result.code).to.equal(2);
    expect(await readdir(target)).to.deep.equal(["image-0.png", "image-1.png", "image-3.png"]);
    expect(result.out).to.include("2\tFAILED\tupstream: injected reference provider failure");
    expect(result.err).to.include("warning: partial_output_failure");
  });

  it("prints typed errors with hints and exits with 1", async () => {
    const result = await run(["generate", "x", "-n", "4", "--out", join(dir, "failed"), "--addr", server.addr]);
    expect(result.code).to.equal(1);
    expect(result.err).to.match(/^error: upstream: injected reference provider failure/m);
    expect(result.err).to.include('"outcome":"unknown"');
    expect(result.err).to.include("hint: ");
  });

  it("lists providers and prints capabilities", async () => {
    const providers = await run(["providers", "--addr", server.addr]);
    expect(providers.out).to.match(/^reference \(default\)\t/);
    const caps = await run(["capabilities", "--addr", server.addr]);
    const json = JSON.parse(caps.out) as { batching: { mode: string; nativeCount: { max: number } } };
    expect(json.batching.mode).to.equal("BATCH_MODE_FAN_OUT");
    expect(json.batching.nativeCount.max).to.equal(1);
  });
});
