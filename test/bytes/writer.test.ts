import { expect } from "chai";
import { ByteRangeError, ByteWriter, ByteWriterError, lengthPrefixedSize, U64_MAX } from "../../src/bytes/index.js";

interface Field {
  name: string;
  size: number;
  write: (w: ByteWriter) => unknown;
}

const FIELDS: Field[] = [
  { name: "u8", size: 1, write: (w) => w.u8(0xfe) },
  { name: "u16", size: 2, write: (w) => w.u16(0xbeef) },
  { name: "u32", size: 4, write: (w) => w.u32(0xdead_beef) },
  { name: "i32", size: 4, write: (w) => w.i32(-123_456_789) },
  { name: "u64", size: 8, write: (w) => w.u64(0x0123_4567_89ab_cdefn) },
  { name: "bytes", size: 3, write: (w) => w.bytes(Uint8Array.of(0xaa, 0xbb, 0xcc)) },
  { name: "lengthPrefixed", size: lengthPrefixedSize(2), write: (w) => w.lengthPrefixed(Uint8Array.of(9, 8)) },
];
const TOTAL = FIELDS.reduce((n, f) => n + f.size, 0);

/** The record written with node's Buffer, independently of ByteWriter. */
function expected(): Buffer {
  const b = Buffer.alloc(TOTAL);
  let at = b.writeUInt8(0xfe, 0);
  at = b.writeUInt16LE(0xbeef, at);
  at = b.writeUInt32LE(0xdead_beef, at);
  at = b.writeInt32LE(-123_456_789, at);
  at = b.writeBigUInt64LE(0x0123_4567_89ab_cdefn, at);
  b.set([0xaa, 0xbb, 0xcc], at);
  at = b.writeBigUInt64LE(2n, at + 3);
  b.set([9, 8], at);
  return b;
}

function thrown<E>(type: new (...args: never[]) => E, f: () => unknown): E {
  try {
    f();
  } catch (error) {
    expect(error).to.be.instanceOf(type);
    return error as E;
  }
  expect.fail(`expected a ${type.name}`);
}

describe("ByteWriter", () => {
  it("writes little-endian fields exactly as Buffer does, and finish() is a view of them", () => {
    const w = new ByteWriter(TOTAL);
    for (const f of FIELDS) f.write(w);
    const out = w.finish();
    expect(Buffer.from(out).equals(expected())).to.equal(true);
    expect(w.remaining).to.equal(0);
    expect(w.offset).to.equal(TOTAL);
  });

  it("fails with OVERFLOW at every capacity short of the record, writing nothing of the failed field", () => {
    const full = expected();
    for (let capacity = 0; capacity < TOTAL; capacity++) {
      const w = new ByteWriter(capacity);
      let start = 0;
      let failed = false;
      for (const f of FIELDS) {
        if (start + f.size <= capacity) {
          f.write(w);
          start += f.size;
          continue;
        }
        const e = thrown(ByteWriterError, () => f.write(w));
        expect(e.code, `capacity ${capacity}`).to.equal("OVERFLOW");
        expect(e.offset, `capacity ${capacity}`).to.equal(start);
        expect(e.needed, `capacity ${capacity}`).to.equal(f.size);
        expect(e.available, `capacity ${capacity}`).to.equal(capacity - start);
        expect(w.offset, `capacity ${capacity}`).to.equal(start);
        failed = true;
        break;
      }
      expect(failed, `capacity ${capacity}`).to.equal(true);
      expect(Buffer.from(w.finish()).equals(full.subarray(0, start)), `capacity ${capacity}`).to.equal(true);
    }
  });

  const u64Cases: [string, bigint][] = [["0", 0n], ["2^53+1", 2n ** 53n + 1n], ["2^64-1", U64_MAX]];
  for (const [name, value] of u64Cases) {
    it(`writes u64 ${name} as Buffer does`, () => {
      const b = Buffer.alloc(8);
      b.writeBigUInt64LE(value);
      expect(Buffer.from(new ByteWriter(8).u64(value).finish()).equals(b)).to.equal(true);
    });
  }

  const outOfRange: [string, (w: ByteWriter) => unknown][] = [
    ["u64 -1", (w) => w.u64(-1n)],
    ["u64 2^64", (w) => w.u64(1n << 64n)],
    ["u8 256", (w) => w.u8(256)],
    ["u8 -1", (w) => w.u8(-1)],
    ["u8 1.5", (w) => w.u8(1.5)],
    ["u16 65536", (w) => w.u16(65536)],
    ["u32 2^32", (w) => w.u32(2 ** 32)],
    ["u32 NaN", (w) => w.u32(Number.NaN)],
    ["i32 2^31", (w) => w.i32(2 ** 31)],
    ["i32 -2^31-1", (w) => w.i32(-(2 ** 31) - 1)],
  ];
  for (const [name, write] of outOfRange) {
    it(`refuses ${name} with OUT_OF_RANGE instead of wrapping`, () => {
      const w = new ByteWriter(16);
      const e = thrown(ByteRangeError, () => write(w));
      expect(e.code).to.equal("OUT_OF_RANGE");
      expect(w.offset).to.equal(0);
    });
  }

  it("accepts the extremes of each integer type", () => {
    const w = new ByteWriter(1 + 2 + 4 + 4 + 4);
    w.u8(255).u16(65535).u32(2 ** 32 - 1).i32(-(2 ** 31)).i32(2 ** 31 - 1);
    const b = Buffer.from(w.finish());
    expect([b.readUInt8(0), b.readUInt16LE(1), b.readUInt32LE(3), b.readInt32LE(7), b.readInt32LE(11)]).to.deep.equal([
      255, 65535, 2 ** 32 - 1, -(2 ** 31), 2 ** 31 - 1,
    ]);
  });

  it("checks room for a whole length-prefixed field before writing its prefix", () => {
    const w = new ByteWriter(9);
    const e = thrown(ByteWriterError, () => w.lengthPrefixed(Uint8Array.of(1, 2)));
    expect(e.needed).to.equal(10);
    expect(w.offset).to.equal(0);
  });

  it("writes into a caller's view at an offset, and only inside it", () => {
    const backing = new Uint8Array(12).fill(0xee);
    const w = new ByteWriter(backing.subarray(4, 8));
    w.u32(0x04030201);
    expect(() => w.u8(0)).to.throw(ByteWriterError);
    expect(Array.from(backing)).to.deep.equal([0xee, 0xee, 0xee, 0xee, 1, 2, 3, 4, 0xee, 0xee, 0xee, 0xee]);
    expect(w.finish().buffer).to.equal(backing.buffer);
  });

  it("refuses an invalid capacity", () => {
    for (const capacity of [-1, 1.5, Number.NaN]) {
      expect(thrown(ByteWriterError, () => new ByteWriter(capacity)).code).to.equal("INVALID_LENGTH");
    }
  });
});
