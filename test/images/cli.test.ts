import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { expect } from "chai";
import sharp from "sharp";
import { imagesCommand } from "../../src/images/cli/index.js";
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
    expect(result.err).to.include(
      "warning: the provider makes at most 1 image(s) per call, so the 2 images were made by 2 separate provider calls",
    );
    expect(result.err).to.include("[emulated_multi_image_fanout]");
  });

  it("reports best-effort failures and exits with 3 (partly done)", async () => {
    const target = join(dir, "partial");
    const result = await run(["generate", "a dog", "-n", "4", "--out", target, "--addr", server.addr, "--best-effort"]);
    expect(result.code).to.equal(3);
    expect(await readdir(target)).to.deep.equal(["image-0.png", "image-1.png", "image-3.png"]);
    expect(result.out).to.include("2\tFAILED\tupstream: injected reference provider failure");
    expect(result.err).to.include("mmgate images generate: warning: some images failed; the others were saved (--best-effort) [partial_output_failure]");
  });

  it("prints typed errors with hints and exits with 1", async () => {
    const result = await run(["generate", "x", "-n", "4", "--out", join(dir, "failed"), "--addr", server.addr]);
    expect(result.code).to.equal(1);
    expect(result.err).to.match(/^mmgate images generate: \[unavailable\] upstream: injected reference provider failure/);
    expect(result.err).to.match(/^details: .*"outcome":"unknown"/m);
    expect(result.err).to.match(/^hint: /m);
  });

  it("rejects an --out that is a file before any call (exit 2)", async () => {
    // A listener that only counts connections: any RPC would have to connect.
    let connections = 0;
    const decoy: Server = createServer((socket) => {
      connections += 1;
      socket.destroy();
    });
    await new Promise<void>((resolve) => decoy.listen(0, "127.0.0.1", resolve));
    const { port } = decoy.address() as { port: number };
    try {
      const file = join(dir, "a-file");
      await writeFile(file, "x");
      for (const out of [file, join(file, "below")]) {
        for (const extra of [[], ["--stream"]]) {
          const result = await run(["generate", "a cat", "--out", out, "--addr", `127.0.0.1:${port}`, ...extra]);
          expect(result.code).to.equal(2);
          expect(result.err).to.match(/^mmgate images generate: \[usage\] --out .*a-file.*(not a directory|is a file)/);
          expect(result.out).to.equal("");
        }
      }
      const usage = await run(["generate", "a cat", "--out", join(dir, "sp"), "--addr", `127.0.0.1:${port}`, "--save-partials"]);
      expect(usage.code).to.equal(2);
      expect(usage.err).to.include("--save-partials needs --stream");
      expect(connections).to.equal(0);
    } finally {
      await new Promise<void>((resolve) => decoy.close(() => resolve()));
    }
  });

  it("creates a missing --out with its parents", async () => {
    const target = join(dir, "deep", "er", "out");
    const result = await run(["generate", "a cat", "--out", target, "--addr", server.addr]);
    expect(result.code).to.equal(0);
    expect(await readdir(target)).to.deep.equal(["image-0.png"]);
  });

  it("keeps the images in a temporary directory when writing fails after the call", async () => {
    const target = join(dir, "blocked");
    // A directory where image-1.png must go: the check passes, the write fails (even as root).
    await mkdir(join(target, "image-1.png"), { recursive: true });
    const result = await run(["generate", "a cat", "-n", "2", "--out", target, "--addr", server.addr]);
    expect(result.code).to.equal(1);
    expect(result.err).to.match(/^mmgate images generate: \[io\] could not write .*image-1\.png/m);
    const kept = /^kept the 2 image\(s\) in (.+)$/m.exec(result.err)?.[1];
    expect(kept).to.be.a("string");
    expect(kept!.startsWith(join(tmpdir(), "mmgate-images-"))).to.equal(true);
    try {
      expect(await readdir(kept!)).to.deep.equal(["image-0.png", "image-1.png"]);
      expect(result.out).to.include(`${join(kept!, "image-1.png")}\t32x32`);
      expect((await sharp(join(kept!, "image-0.png")).metadata()).format).to.equal("png");
    } finally {
      await rm(kept!, { recursive: true, force: true });
    }
  });

  it("says so in --json too when the images went to a temporary directory (out, dir, writeError)", async () => {
    const target = join(dir, "blocked-json");
    await mkdir(join(target, "image-1.png"), { recursive: true });
    const result = await run(["generate", "a cat", "-n", "2", "--out", target, "--addr", server.addr, "--json"]);
    expect(result.code).to.equal(1);
    const json = JSON.parse(result.out) as { out: string; dir: string; writeError?: { code: string; message: string }; files: string[] };
    try {
      expect(json.out).to.equal(target);
      expect(json.dir.startsWith(join(tmpdir(), "mmgate-images-"))).to.equal(true);
      expect(json.writeError?.code).to.equal("io");
      expect(json.writeError?.message).to.include("image-1.png");
      expect(json.files).to.deep.equal([join(json.dir, "image-0.png"), join(json.dir, "image-1.png")]);
    } finally {
      await rm(json.dir, { recursive: true, force: true });
    }
  });

  it("names files image-<index> zero-padded to the width of n - 1 (n = 1 and n = 12)", async () => {
    const one = join(dir, "n1");
    expect((await run(["generate", "a cat", "--out", one, "--addr", server.addr])).code).to.equal(0);
    expect(await readdir(one)).to.deep.equal(["image-0.png"]);
    const twelve = join(dir, "n12");
    const result = await run(["generate", "a prompt", "-n", "12", "--out", twelve, "--addr", server.addr, "--best-effort"]);
    expect(result.code).to.equal(3); // output 2 is injected to fail
    const expected = Array.from({ length: 12 }, (_, i) => `image-${String(i).padStart(2, "0")}.png`).filter((n) => n !== "image-02.png");
    expect(await readdir(twelve)).to.deep.equal(expected);
    expect(result.out).to.match(/^11\t.*image-11\.png\t/m);
  });

  it("removes earlier runs' image and preview files that this run did not write", async () => {
    const target = join(dir, "stale");
    const first = await run(["generate", "a prompt", "-n", "12", "--out", target, "--addr", server.addr, "--best-effort"]);
    expect(first.code).to.equal(3);
    await writeFile(join(target, "image-2.png"), "old"); // looks like a result for the failed output
    await writeFile(join(target, "partial-0-0.png"), "old");
    await writeFile(join(target, "notes.txt"), "mine");
    await mkdir(join(target, "image-9.png")); // not a file: left alone
    const second = await run(["generate", "a cat", "-n", "2", "--out", target, "--addr", server.addr]);
    expect(second.code).to.equal(0);
    expect((await readdir(target)).sort()).to.deep.equal(["image-0.png", "image-1.png", "image-9.png", "notes.txt"]);
    expect(second.err).to.match(/^removed 13 file\(s\) from an earlier run: image-00\.png, /m);
  });

  it("--save-partials writes the streamed previews", async () => {
    const target = join(dir, "previews");
    const result = await run(["generate", "a cat", "-n", "2", "--out", target, "--addr", server.addr, "--stream", "--save-partials", "--format", "jpeg"]);
    expect(result.code).to.equal(0);
    expect((await readdir(target)).sort()).to.deep.equal([
      "image-0.jpg",
      "image-1.jpg",
      "partial-0-0.jpg",
      "partial-0-1.jpg",
      "partial-1-0.jpg",
      "partial-1-1.jpg",
    ]);
    expect((await sharp(join(target, "partial-1-0.jpg")).metadata()).format).to.equal("jpeg");
    // Without --save-partials a later stream leaves no previews behind.
    const again = await run(["generate", "a cat", "-n", "2", "--out", target, "--addr", server.addr, "--stream", "--format", "jpeg"]);
    expect(again.code).to.equal(0);
    expect((await readdir(target)).sort()).to.deep.equal(["image-0.jpg", "image-1.jpg"]);
  });

  it("refuses -n above the provider's advertised limit with a usage error naming the limit", async () => {
    const caps = JSON.parse((await run(["capabilities", "--addr", server.addr])).out) as { count: { max: number } };
    const limit = caps.count.max;
    expect(limit).to.be.lessThan(255);
    const target = join(dir, "too-many");
    const result = await run(["generate", "a cat", "-n", String(limit + 1), "--out", target, "--addr", server.addr]);
    expect(result.code).to.equal(2);
    expect(result.err).to.equal(`mmgate images generate: [usage] -n ${limit + 1} is above the limit of reference: at most ${limit} image(s) per request\n`);
    expect(result.out).to.equal("");
    expect(await readdir(target)).to.deep.equal([]);
    // 255 is no longer the bound: a count above it is refused by the same check, not by the parser.
    expect((await run(["generate", "a cat", "-n", "300", "--out", target, "--addr", server.addr])).err).to.include(`at most ${limit} image(s)`);
  });

  it("says size hints in CLI terms: --normalize, the multiple-of-8 rule, and the size before and after", async () => {
    const strict = await run(["generate", "a cat", "--size", "100x100", "--out", join(dir, "size-strict"), "--addr", server.addr]);
    expect(strict.code).to.equal(1);
    expect(strict.err).to.match(/^mmgate images generate: \[failed_precondition\] unsupported_capability: /);
    expect(strict.err).to.include("use --normalize");
    expect(strict.err).to.not.include("policies.compatibility");
    expect(strict.err).to.include("hint: --size for reference must be auto, one of 256x256");
    expect(strict.err).to.include("any WxH with both edges a multiple of 8 from 16 to");

    const target = join(dir, "size-normalized");
    const normalized = await run(["generate", "a cat", "--size", "100x100", "--normalize", "--out", target, "--addr", server.addr]);
    expect(normalized.code).to.equal(0);
    expect(normalized.err).to.match(/^normalized --size: 100x100 -> auto \(the provider does not offer that size\); --size for reference must be .*a multiple of 8.*; the images are 32x32$/m);
    expect(await readdir(target)).to.deep.equal(["image-0.png"]);
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
