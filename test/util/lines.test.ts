import { createInterface } from "node:readline";
import { Readable } from "node:stream";
import { expect } from "chai";
import fc from "fast-check";
import { boundedLines, LineTooLongError } from "../../src/util/index.js";

async function collect(lines: AsyncIterable<string>): Promise<string[]> {
  const out: string[] = [];
  for await (const line of lines) out.push(line);
  return out;
}

describe("util: boundedLines", () => {
  it("splits lines as readline (crlfDelay Infinity) does, however the bytes are chunked", async () => {
    const piece = fc.constantFrom("a", "bc", "\n", "\r", "\r\n", " ", "é", "€", "\u{1f600}", "{}");
    await fc.assert(
      fc.asyncProperty(fc.array(piece, { maxLength: 24 }), fc.array(fc.integer({ min: 1, max: 5 }), { minLength: 1, maxLength: 8 }), async (pieces, sizes) => {
        const bytes = Buffer.from(pieces.join(""));
        const chunks: Buffer[] = [];
        for (let at = 0, i = 0; at < bytes.length; i++) {
          const n = sizes[i % sizes.length]!;
          chunks.push(Buffer.from(bytes.subarray(at, at + n)));
          at += n;
        }
        const expected = await collect(createInterface({ input: Readable.from(chunks), crlfDelay: Infinity }));
        expect(await collect(boundedLines(Readable.from(chunks), 1024))).to.deep.equal(expected);
      }),
      { numRuns: 300 },
    );
  });

  it("takes a line of exactly the limit; one byte more fails with its line number, without reading further", async () => {
    expect(await collect(boundedLines(Readable.from([Buffer.from("ab\nabcd\r\n")]), 4))).to.deep.equal(["ab", "abcd"]);
    let pulled = 0;
    // One byte per chunk, forever: the reader must stop at the fifth byte of line 2.
    async function* endless(): AsyncGenerator<Uint8Array> {
      yield Buffer.from("ok\n");
      for (;;) {
        pulled += 1;
        yield Buffer.from("x");
      }
    }
    const seen: string[] = [];
    let error: unknown;
    try {
      for await (const line of boundedLines(endless(), 4)) seen.push(line);
    } catch (e) {
      error = e;
    }
    expect(seen).to.deep.equal(["ok"]);
    expect(error).to.be.instanceOf(LineTooLongError);
    expect(error).to.include({ line: 2, maxBytes: 4 });
    expect(pulled).to.equal(5);
  });

  it("counts bytes, not characters, and takes strings as their UTF-8 bytes", async () => {
    // "€" is three bytes: two of them are six.
    expect(await collect(boundedLines(["€€\n"], 6))).to.deep.equal(["€€"]);
    let error: unknown;
    try {
      await collect(boundedLines(["a\n", "€€", "x\n"], 6));
    } catch (e) {
      error = e;
    }
    expect(error).to.include({ line: 2 });
  });
});
