import { mkdtemp, readFile, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { expect } from "chai";
import { MediaService } from "../../gen/mmgate/media/v1/media_pb.js";
import { parseHandle } from "../../src/media/cli.js";
import { mediaModule } from "../../src/media/index.js";
import { runMmgate, startServer, type InProcessServer } from "../support/index.js";
import { encodeRaw, pattern } from "./fixtures.js";

const TOKEN = "media-cli-test-token-0123456789";

describe("mmgate media read|release", function () {
  this.timeout(30_000);
  let dir: string;
  let server: InProcessServer;

  /** Stores `pixels` (an RGB image of width × height) on the server and returns its handle. */
  async function store(pixels: Uint8Array, width: number, height: number): Promise<bigint> {
    const png = await encodeRaw(pixels, width, height, 3, "png");
    const res = await createClient(MediaService, server.transport).decode({ source: { case: "data", value: png } });
    expect(res.handle).to.not.equal(0n);
    return res.handle;
  }

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), "mmgate-media-read-"));
    // Small chunks, so that a read takes several messages.
    server = await startServer({ modules: [mediaModule], config: { auth: { token: TOKEN }, media: { readChunkBytes: 4096 } } });
  });

  after(async () => {
    await server?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it("read writes a stored tensor's bytes to --out, across chunks", async () => {
    const pixels = pattern(64 * 64 * 3);
    const handle = await store(pixels, 64, 64);
    const out = join(dir, "tensor.bin");
    const res = await runMmgate(["media", "read", String(handle), "--out", out, "--addr", server.addr]);
    expect(res.code, res.stderr).to.equal(0);
    expect(res.stdout).to.equal("");
    expect(res.stderr).to.include(`wrote ${pixels.length} bytes to ${out}`);
    expect(new Uint8Array(await readFile(out))).to.deep.equal(pixels);
  });

  it("read writes the bytes to stdout without --out", async () => {
    // Bytes below 0x80, so that the captured stdout text is the bytes.
    const pixels = pattern(4 * 4 * 3, 1, 32);
    const handle = await store(pixels, 4, 4);
    const res = await runMmgate(["media", "read", String(handle), "--addr", server.addr]);
    expect(res).to.deep.equal({ code: 0, stdout: Buffer.from(pixels).toString("latin1"), stderr: "" });
  });

  it("read of an unknown handle exits 1 and leaves no file", async () => {
    const out = join(dir, "missing.bin");
    const res = await runMmgate(["media", "read", "18446744073709551615", "--out", out, "--addr", server.addr]);
    expect(res.code).to.equal(1);
    expect(res.stderr).to.include("tensor 18446744073709551615 not found");
    const exists = await stat(out).then(() => true, () => false);
    expect(exists).to.equal(false);
  });

  it("release needs the token, drops the tensor and says so; a second release exits 3", async () => {
    const handle = await store(pattern(4 * 4 * 3), 4, 4);
    const denied = await runMmgate(["media", "release", String(handle), "--addr", server.addr]);
    expect(denied.code).to.equal(1);
    expect(denied.stderr).to.match(/^mmgate media release: \[unauthenticated\] /);
    const ok = await runMmgate(["media", "release", String(handle), "--addr", server.addr, "--token", TOKEN, "--json"]);
    expect(ok).to.deep.equal({ code: 0, stdout: `${JSON.stringify({ handle: String(handle), released: true })}\n`, stderr: "" });
    const again = await runMmgate(["media", "release", String(handle), "--addr", server.addr, "--token", TOKEN]);
    expect(again).to.include({ code: 3, stdout: `${handle} unknown (already released or expired)\n` });
    const read = await runMmgate(["media", "read", String(handle), "--addr", server.addr]);
    expect(read.code).to.equal(1);
  });

  it("parses handles as decimal u64 without losing precision", async () => {
    expect(parseHandle("18446744073709551615")).to.equal(18446744073709551615n);
    expect(parseHandle("9007199254740993")).to.equal(9007199254740993n);
    for (const bad of ["18446744073709551616", "-1", "0x10", "1.5", ""]) expect(() => parseHandle(bad), bad).to.throw("expected a decimal u64 handle");
    const res = await runMmgate(["media", "read", "18446744073709551616", "--addr", server.addr]);
    expect(res.code).to.equal(2); // a usage error
    expect(res.stderr).to.include("expected a decimal u64 handle");
  });
});
