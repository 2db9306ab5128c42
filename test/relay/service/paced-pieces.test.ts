/**
 * The writes of a pool stream as HTTP/2 gets them (server/paced-writes.ts):
 * one piece in Node's queue at a time, and what is written meanwhile joined
 * into the next, so that deltas fanned out to a client that reads slowly
 * go out as one write each time its previous write was taken, rather than
 * one write per delta. Checked on a stand-in stream whose writes complete
 * when the test says.
 */
import { expect } from "chai";
import type { ServerHttp2Stream } from "node:http2";
import { Writable } from "node:stream";
import { PacedWrites, PIECE_BYTES } from "../../../src/server/paced-writes.js";

/** A stream that records what reaches its own `_write` (Node's, on a real stream) and completes each write on `complete()`. */
class RecordingStream extends Writable {
  readonly pieces: Buffer[] = [];
  private callbacks: ((error?: Error | null) => void)[] = [];

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    this.pieces.push(Buffer.from(chunk));
    this.callbacks.push(callback);
  }

  override _final(callback: (error?: Error | null) => void): void {
    callback();
  }

  /** Completes the oldest write still pending; false when none is. */
  complete(): boolean {
    const callback = this.callbacks.shift();
    callback?.();
    return callback !== undefined;
  }

  get pending(): number {
    return this.callbacks.length;
  }
}

/** One turn of the event loop: PacedWrites hands a turn's writes over in its check phase. */
const turn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

const message = (byte: number, length = 200): Buffer => Buffer.alloc(length, byte);

/** A step: write these messages directly, let a turn pass, then complete this many pending writes. */
interface Step {
  readonly write: readonly Buffer[];
  readonly complete?: number;
}

interface Case {
  readonly name: string;
  readonly steps: readonly Step[];
  /** The pieces Node got, by their messages' fill bytes and lengths. */
  readonly pieces: readonly { readonly bytes: number; readonly fills: readonly number[] }[];
}

const fillsOf = (piece: Buffer): number[] => {
  const fills: number[] = [];
  for (const byte of piece) if (fills.at(-1) !== byte) fills.push(byte);
  return fills;
};

const CASES: readonly Case[] = [
  {
    name: "messages written in one turn are one piece",
    steps: [{ write: [message(1), message(2), message(3)] }],
    pieces: [{ bytes: 600, fills: [1, 2, 3] }],
  },
  {
    name: "messages written while a piece is in flight wait for it, then go out together",
    steps: [{ write: [message(1)] }, { write: [message(2)] }, { write: [message(3)], complete: 1 }],
    pieces: [
      { bytes: 200, fills: [1] },
      { bytes: 400, fills: [2, 3] },
    ],
  },
  {
    name: "a piece taken before the next turn's messages leaves them a piece of their own",
    steps: [
      { write: [message(1)], complete: 1 },
      { write: [message(2)], complete: 1 },
      { write: [message(3)], complete: 1 },
    ],
    pieces: [
      { bytes: 200, fills: [1] },
      { bytes: 200, fills: [2] },
      { bytes: 200, fills: [3] },
    ],
  },
  {
    name: "a message larger than a piece goes out a piece at a time, the next message joining its last part",
    steps: [{ write: [message(1, PIECE_BYTES + 100), message(2)] }, { write: [], complete: 1 }],
    pieces: [
      { bytes: PIECE_BYTES, fills: [1] },
      { bytes: 300, fills: [1, 2] },
    ],
  },
];

describe("paced writes of a pool stream: one piece in flight, what comes meanwhile joined into the next", () => {
  for (const c of CASES) {
    it(c.name, async () => {
      const stream = new RecordingStream();
      const paced = PacedWrites.of(stream as unknown as ServerHttp2Stream);
      let written = 0;
      for (const step of c.steps) {
        for (const bytes of step.write) {
          expect(paced.writeDirect(bytes)).to.equal(true);
          written += bytes.byteLength;
        }
        await turn();
        // Never more than one piece in Node's queue.
        expect(stream.pending).to.be.at.most(1);
        for (let i = 0; i < (step.complete ?? 0); i++) expect(stream.complete()).to.equal(true);
      }
      // The rest, each piece as the one before it is taken.
      while (stream.complete()) await turn();
      expect(stream.pieces.map((piece) => ({ bytes: piece.byteLength, fills: fillsOf(piece) }))).to.deep.equal(c.pieces);
      expect(paced.taken).to.equal(written);
      expect(paced.backlog).to.equal(0);
      expect(paced.idle).to.equal(true);
    });
  }

  it("counts what waits and the piece in flight as backlog, and wakes a waiter once it is below its size", async () => {
    const stream = new RecordingStream();
    const paced = PacedWrites.of(stream as unknown as ServerHttp2Stream);
    paced.writeDirect(message(1, 1000));
    await turn();
    paced.writeDirect(message(2, 500));
    expect(paced.backlog).to.equal(1500);
    let woken = false;
    void paced.whenBelow(1000).then(() => (woken = true));
    await turn();
    expect(woken).to.equal(false);
    // The first piece taken: the second goes to Node, and 500 bytes are left in flight.
    stream.complete();
    await turn();
    expect(paced.backlog).to.equal(500);
    expect(woken).to.equal(true);
  });

  it("drops what waits once the stream closes: nothing more reaches Node", async () => {
    const stream = new RecordingStream();
    const paced = PacedWrites.of(stream as unknown as ServerHttp2Stream);
    paced.writeDirect(message(1));
    await turn();
    paced.writeDirect(message(2));
    stream.destroy();
    await turn();
    stream.complete();
    await turn();
    expect(stream.pieces.map(fillsOf)).to.deep.equal([[1]]);
    expect(paced.backlog).to.equal(0);
    expect(paced.writeDirect(message(3))).to.equal(false);
  });
});
