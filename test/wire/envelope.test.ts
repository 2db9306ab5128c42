import { Writable } from "node:stream";
import { Code, type ConnectError } from "@connectrpc/connect";
import { expect } from "chai";
import { encodeEnvelope, EnvelopeReader, writeEnvelope, type EnvelopeSink } from "../../src/wire/index.js";
import { splitAtEveryBoundary } from "../support/index.js";

function envelope(flags: number, payload: Uint8Array): Uint8Array {
  const out = encodeEnvelope(payload);
  out[0] = flags;
  return out;
}

const bytes = (...values: number[]) => Uint8Array.from(values);
const join = (...parts: Uint8Array[]) => Buffer.concat(parts);

/** A sink that records what the reader hands it. */
class Recorder implements EnvelopeSink {
  readonly messages: { flags: number; payload: number[]; inPlace: boolean; framed: boolean }[] = [];
  readonly refused: ConnectError[] = [];
  chunk: Uint8Array | undefined;
  constructor(
    private readonly stopAfter = Number.POSITIVE_INFINITY,
    private readonly wanted?: (flags: number, length: number) => boolean,
  ) {}
  get wantsMessage() {
    return this.wanted;
  }
  onMessage(flags: number, payload: Uint8Array, framed: boolean): boolean {
    const inPlace = payload.buffer === this.chunk?.buffer;
    if (framed) {
      // Said to be framed in place: the message's own header is right before it in the chunk.
      const header = new Uint8Array(payload.buffer, payload.byteOffset - 5, 5);
      expect(inPlace).to.equal(true);
      expect([...header]).to.deep.equal([flags, ...encodeEnvelope(payload).subarray(1, 5)]);
    }
    this.messages.push({ flags, payload: [...payload], inPlace, framed });
    return this.messages.length < this.stopAfter;
  }
  onOversize(error: ConnectError): void {
    this.refused.push(error);
  }
}

function feed(reader: EnvelopeReader, sink: Recorder, parts: Uint8Array[]): void {
  for (const part of parts) {
    sink.chunk = part;
    reader.push(part);
  }
}

describe("wire: the envelope codec", () => {
  const body = join(envelope(0, bytes(1, 2, 3)), envelope(1, bytes()), envelope(0x80, bytes(9, 8, 7, 6, 5, 4)));

  it("splits a body cut anywhere into the same messages, each whole one in place", () => {
    for (const parts of splitAtEveryBoundary(body, { parts: 3 })) {
      const sink = new Recorder();
      const reader = new EnvelopeReader(sink);
      feed(reader, sink, parts);
      expect(sink.messages.map(({ flags, payload }) => ({ flags, payload }))).to.deep.equal([
        { flags: 0, payload: [1, 2, 3] },
        { flags: 1, payload: [] },
        { flags: 0x80, payload: [9, 8, 7, 6, 5, 4] },
      ]);
      expect(reader.partial).to.equal(false);
      // Framed in place exactly when the header and the message came in one part.
      const ends = parts.map((_, i) => parts.slice(0, i + 1).reduce((n, p) => n + p.length, 0));
      const starts = [0, 3 + 5, 8 + 5];
      const lengths = [3, 0, 6];
      sink.messages.forEach((m, i) => {
        const headerAt = starts[i]!;
        const part = ends.findIndex((end) => end > headerAt);
        const partStart = part === 0 ? 0 : ends[part - 1]!;
        expect(m.framed, `message ${i}, parts ${parts.map((p) => p.length).join("+")}`).to.equal(headerAt >= partStart && headerAt + 5 + lengths[i]! <= ends[part]!);
      });
    }
    const sink = new Recorder();
    feed(new EnvelopeReader(sink), sink, [body]);
    expect(sink.messages.every((m) => m.inPlace && m.framed)).to.equal(true);
  });

  it("refuses a message over readMaxBytes from its header, and reads nothing more", () => {
    const big = join(envelope(0, bytes(1)), envelope(0, new Uint8Array(11)), envelope(0, bytes(2)));
    for (const parts of splitAtEveryBoundary(big.subarray(0, 6 + 5), { parts: 3 })) {
      const sink = new Recorder();
      const reader = new EnvelopeReader(sink, 10);
      feed(reader, sink, [...parts, big.subarray(11)]);
      expect(sink.messages.map((m) => m.payload)).to.deep.equal([[1]]);
      expect(sink.refused).to.have.length(1);
      expect(sink.refused[0]!.code).to.equal(Code.ResourceExhausted);
      expect(sink.refused[0]!.rawMessage).to.equal("message size 11 is larger than configured readMaxBytes 10");
    }
  });

  it("says when the body ends inside a header or a message", () => {
    for (let cut = 1; cut < 8; cut++) {
      const reader = new EnvelopeReader(new Recorder());
      reader.push(envelope(0, bytes(1, 2, 3)).subarray(0, cut));
      expect(reader.partial, `cut after ${cut} bytes`).to.equal(true);
    }
  });

  it("skips the messages the sink does not want without buffering them, and stops when it says so", () => {
    for (const parts of splitAtEveryBoundary(body, { parts: 3 })) {
      const sink = new Recorder(Number.POSITIVE_INFINITY, (flags) => (flags & 0x80) !== 0);
      feed(new EnvelopeReader(sink), sink, parts);
      expect(sink.messages.map((m) => m.payload)).to.deep.equal([[9, 8, 7, 6, 5, 4]]);
    }
    const sink = new Recorder(1);
    feed(new EnvelopeReader(sink), sink, [body]);
    expect(sink.messages).to.have.length(1);
  });

  it("writes a small message as one buffer and a chunked one as its parts, uncopied", async () => {
    const written: Buffer[] = [];
    let ended = false;
    const sink = new Writable({
      writev(chunks, callback) {
        for (const { chunk } of chunks) written.push(chunk as Buffer);
        callback();
      },
      write(chunk: Buffer, _encoding, callback) {
        written.push(chunk);
        callback();
      },
      final(callback) {
        ended = true;
        callback();
      },
    });
    expect(writeEnvelope(sink, bytes(1, 2, 3), false)).to.equal(true);
    expect(written).to.have.length(1);
    expect([...written[0]!]).to.deep.equal([0, 0, 0, 0, 3, 1, 2, 3]);
    const big = Buffer.alloc(20 * 1024, 7);
    const parts = [bytes(1), big, bytes(2)];
    writeEnvelope(sink, parts, true);
    expect(written.slice(1).map((w) => w.byteLength)).to.deep.equal([5, 1, big.byteLength, 1]);
    expect(written[3]!.buffer).to.equal(big.buffer);
    expect(Buffer.concat(written.slice(1)).equals(encodeEnvelope(join(...parts)))).to.equal(true);
    await new Promise((resolve) => setImmediate(resolve));
    expect(ended).to.equal(true);
  });
});
