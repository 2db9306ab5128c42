import { expect } from "chai";
import { cbi1Command } from "../../src/relay/index.js";
import { runMmgate } from "../support/index.js";
import { build, recipe } from "./cbi1-helpers.js";

/**
 * Runs `mmgate cbi1 ARGS` in process, with `stdin` as its standard input; its
 * output, error output and exit code. Without stdin it runs as the executable
 * does (usage errors and all); with it, the command alone reads the pieces.
 */
async function cbi1(args: string[], stdin: string[] = []): Promise<{ out: string; err: string; code: number }> {
  if (stdin.length === 0) {
    const { stdout, stderr, code } = await runMmgate(["cbi1", ...args]);
    return { out: stdout, err: stderr, code };
  }
  let out = "";
  let err = "";
  const saved = process.exitCode;
  process.exitCode = 0;
  const command = cbi1Command({ out: { write: (t: string) => (out += t) }, err: { write: (t: string) => (err += t) }, in: stdin });
  for (const sub of [command, ...command.commands]) sub.exitOverride().configureOutput({ writeErr: (t) => (err += t), writeOut: (t) => (out += t) });
  let code: number;
  try {
    await command.parseAsync(args, { from: "user" });
    code = Number(process.exitCode ?? 0);
  } catch (e) {
    code = (e as { exitCode?: number }).exitCode ?? 1;
  } finally {
    process.exitCode = saved;
  }
  return { out, err, code };
}

const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex");

/** The spec's delta vector as the decoder prints it: the protobuf JSON of Cbi1Frame (format 0x5EED/1024, dc 7, base 4, epoch 5). */
const VECTOR = {
  wireVersion: 1,
  flags: "CBI1_FLAGS_DELTA",
  fingerprintBits: 16,
  slotsPerBucket: 4,
  formatVersion: 1,
  seed: String(0x5eed),
  bucketCount: "1024",
  dcId: "7",
  epoch: "5",
  delta: {
    baseEpoch: "4",
    images: [
      { bucket: 3, value: String(0xaaaa_bbbb_cccc_ddddn) },
      { bucket: 1000, value: "42" },
    ],
  },
};
const DELTA_ARGS = ["encode-delta", "--seed", "0x5EED", "--buckets", "1024", "--dc", "7", "--base", "4", "--epoch", "5", "3:0xAAAABBBBCCCCDDDD", "1000:42"];

/** The decoded JSON without the header's checksum (checked separately where it matters). */
function withoutChecksum(out: string): unknown {
  const { checksum: _checksum, ...rest } = JSON.parse(out) as Record<string, unknown>;
  return rest;
}

describe("mmgate cbi1", () => {
  it("encode-delta prints one line of hex that decode turns back into the same header and images", async () => {
    const encoded = await cbi1(DELTA_ARGS);
    expect(encoded.code).to.equal(0);
    expect(encoded.out).to.match(/^[0-9a-f]+\n$/);
    // The frame is byte for byte the one built from the spec's layout, independently of the encoder.
    expect(encoded.out.trim()).to.equal(hex(build(recipe())));
    const decoded = await cbi1(["decode", encoded.out.trim()]);
    expect(decoded.code).to.equal(0);
    expect(withoutChecksum(decoded.out)).to.deep.equal(VECTOR);
  });

  it("decodes the spec's delta vector, built field by field, with and without --seed/--buckets, from an argument or stdin", async () => {
    const frame = hex(build(recipe()));
    const fromArg = await cbi1(["decode", frame]);
    expect(fromArg.code).to.equal(0);
    expect(withoutChecksum(fromArg.out)).to.deep.equal(VECTOR);
    const checked = await cbi1(["decode", "--seed", String(0x5eed), "--buckets", "0x400", frame]);
    expect(checked.out).to.equal(fromArg.out);
    // stdin, in pieces, with whitespace and upper case anywhere: "-" and no argument alike.
    const pieces = [`  ${frame.slice(0, 33).toUpperCase()}\n`, `${frame.slice(33, 90)} \t`, `\n${frame.slice(90)}\n`];
    expect((await cbi1(["decode", "-"], pieces)).out).to.equal(fromArg.out);
    expect((await cbi1(["decode"], pieces)).out).to.equal(fromArg.out);
  });

  it("encode-snapshot with a small bucket count prints one chunk line that decodes to the words", async () => {
    const encoded = await cbi1(["encode-snapshot", "--seed", "9", "--buckets", "4", "--dc", "1", "--epoch", "2", "11", "0x16", "0", "18446744073709551615"]);
    expect(encoded.code).to.equal(0);
    const lines = encoded.out.trimEnd().split("\n");
    expect(lines).to.have.length(1);
    const decoded = await cbi1(["decode", "--seed", "9", "--buckets", "4", lines[0]!]);
    expect(decoded.code).to.equal(0);
    const parsed = JSON.parse(decoded.out) as Record<string, unknown>;
    expect(parsed.snapshotChunk).to.deep.equal({
      chunkIndex: 0,
      chunkCount: 1,
      bucketOffset: "0",
      wordCount: 4,
      words: ["11", "22", "0", "18446744073709551615"],
      nonzero: [],
      sparse: false,
    });
    expect(parsed).to.deep.include({ flags: "CBI1_FLAGS_SNAPSHOT_CHUNK", seed: "9", bucketCount: "4", dcId: "1", epoch: "2" });
    // --sparse lists the non-zero words by bucket.
    const sparse = JSON.parse((await cbi1(["decode", "--sparse", lines[0]!])).out) as { snapshotChunk: { nonzero: unknown[]; words: unknown[] } };
    expect(sparse.snapshotChunk.nonzero).to.deep.equal([
      { bucket: 0, value: "11" },
      { bucket: 1, value: "22" },
      { bucket: 3, value: "18446744073709551615" },
    ]);
    expect(sparse.snapshotChunk.words).to.deep.equal([]);
  });

  it("a corrupted byte prints the Checksum error as JSON and as a line, and exits 1", async () => {
    const frame = build(recipe());
    frame[60] = frame[60]! ^ 0x01;
    const { out, err, code } = await cbi1(["decode", hex(frame)]);
    expect(code).to.equal(1);
    const { error } = JSON.parse(out) as { error: { code: string; message: string; details: Record<string, number> } };
    expect(error.code).to.equal("Checksum");
    expect(error.details.expected).to.equal(new DataView(frame.buffer).getUint32(44, true));
    expect(error.details.actual).to.be.a("number").and.not.equal(error.details.expected);
    expect(err).to.match(/^mmgate cbi1 decode: \[invalid_argument\] Checksum: body checksum \d+ is not the header's \d+\n$/);
  });

  it("a wrong --seed on decode is a Format (Mismatch) error with the u64s as decimal strings", async () => {
    const { out, err, code } = await cbi1(["decode", "--seed", "1", "--buckets", "1024", hex(build(recipe()))]);
    expect(code).to.equal(1);
    const { error } = JSON.parse(out) as { error: { code: string; formatKind: string; details: Record<string, unknown> } };
    expect(error).to.deep.include({ code: "Format", formatKind: "Mismatch" });
    expect(error.details).to.deep.include({ expectedSeed: "1", seed: String(0x5eed) });
    expect(err).to.match(/Format \(Mismatch\)/);
  });

  it("a frame that is not CBI1 at all is the codec's typed error, even without --seed/--buckets", async () => {
    const truncated = await cbi1(["decode", "00".repeat(47)]);
    expect(truncated.code).to.equal(1);
    expect((JSON.parse(truncated.out) as { error: { code: string } }).error.code).to.equal("Truncated");
    const magic = await cbi1(["decode", "00".repeat(48)]);
    expect((JSON.parse(magic.out) as { error: { code: string } }).error.code).to.equal("Magic");
  });

  it("encode-delta with no images is an empty delta", async () => {
    const { out, code } = await cbi1(["encode-delta", "--seed", "1", "--buckets", "2", "--dc", "0", "--base", "0", "--epoch", "1"]);
    expect(code).to.equal(0);
    const decoded = JSON.parse((await cbi1(["decode", "--json", out.trim()])).out) as { delta: unknown };
    expect(decoded.delta).to.deep.equal({ baseEpoch: "0", images: [] });
  });

  // Malformed or inconsistent options and operands are usage errors (2); input that is no frame is invalid_argument (1).
  const base = ["--seed", "1", "--buckets", "8", "--dc", "0", "--epoch", "1"];
  for (const [name, args, stdin, exit, message] of [
    ["a bucket past the count", ["encode-delta", ...base, "--base", "0", "8:1"], [], 2, /bucket 8 is outside 0\.\.7 \(--buckets 8\)/],
    ["a value past u64", ["encode-delta", ...base, "--base", "0", "1:18446744073709551616"], [], 2, /the value 18446744073709551616 is past 2\^64 - 1/],
    ["an image without a colon", ["encode-delta", ...base, "--base", "0", "17"], [], 2, /image "17" is not BUCKET:VALUE/],
    ["a bucket that is no u32", ["encode-delta", ...base, "--base", "0", "x:1"], [], 2, /bucket "x" is not a u32/],
    ["a bucket count that is no power of two", ["encode-delta", "--seed", "1", "--buckets", "1000", "--dc", "0", "--base", "0", "--epoch", "1"], [], 2, /--buckets must be a power of two/],
    ["a missing --epoch", ["encode-delta", "--seed", "1", "--buckets", "8", "--dc", "0", "--base", "0"], [], 2, /--epoch/],
    ["too few words", ["encode-snapshot", ...base, "1", "2", "3"], [], 2, /--buckets 8 needs exactly 8 words \(buckets 0\.\.7 in order\), got 3/],
    ["too many words", ["encode-snapshot", "--seed", "1", "--buckets", "2", "--dc", "0", "--epoch", "1", "1", "2", "3"], [], 2, /needs exactly 2 words .*got 3/],
    ["a word past u64", ["encode-snapshot", "--seed", "1", "--buckets", "2", "--dc", "0", "--epoch", "1", "1", "0x10000000000000000"], [], 2, /word 1 must be a u64/],
    ["--seed without --buckets", ["decode", "--seed", "1", "00"], [], 2, /--seed and --buckets go together/],
    ["odd-length hex", ["decode", "abc"], [], 1, /odd number of digits \(3\)/],
    ["a non-hex character", ["decode", "43 42 4g"], [], 1, /non-hex character "g" at digit 5/],
    ["empty stdin", ["decode", "-"], [" \n"], 1, /no hex to decode/],
  ] as const) {
    it(`refuses ${name} with exit ${exit} and one error line`, async () => {
      const { out, err, code } = await cbi1([...args], [...stdin]);
      expect(code).to.equal(exit);
      expect(err).to.match(exit === 2 ? /^mmgate cbi1 [a-z-]+: \[usage\] / : /^mmgate cbi1 decode: \[invalid_argument\] [^\n]*\n$/);
      expect(err).to.match(message);
      expect(out).to.equal("");
    });
  }
});
