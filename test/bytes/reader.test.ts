import { expect } from "chai";
import { ByteReader, ByteReaderError, ByteWriter, U64_MAX } from "../../src/bytes/index.js";

/** One field of a small record: its size, how to read it, and the value it holds. */
interface Field {
  name: string;
  size: number;
  read: (r: ByteReader) => unknown;
  value: unknown;
}

const PAYLOAD = Uint8Array.of(0xaa, 0xbb, 0xcc);
const PREFIXED = Uint8Array.of(9, 8);

/** A record of every kind of field, and its bytes written with node's Buffer (independently of ByteWriter). */
const FIELDS: Field[] = [
  { name: "u8", size: 1, read: (r) => r.u8(), value: 0xfe },
  { name: "u16", size: 2, read: (r) => r.u16(), value: 0xbeef },
  { name: "u32", size: 4, read: (r) => r.u32(), value: 0xdead_beef },
  { name: "i32", size: 4, read: (r) => r.i32(), value: -123_456_789 },
  { name: "u64", size: 8, read: (r) => r.u64(), value: 0x0123_4567_89ab_cdefn },
  { name: "bytes", size: 3, read: (r) => Array.from(r.bytes(3)), value: Array.from(PAYLOAD) },
  { name: "lengthPrefixed", size: 10, read: (r) => Array.from(r.lengthPrefixed()), value: Array.from(PREFIXED) },
];

function recordBytes(): Uint8Array {
  const b = Buffer.alloc(FIELDS.reduce((n, f) => n + f.size, 0));
  let at = b.writeUInt8(0xfe, 0);
  at = b.writeUInt16LE(0xbeef, at);
  at = b.writeUInt32LE(0xdead_beef, at);
  at = b.writeInt32LE(-123_456_789, at);
  at = b.writeBigUInt64LE(0x0123_4567_89ab_cdefn, at);
  b.set(PAYLOAD, at);
  at += PAYLOAD.length;
  at = b.writeBigUInt64LE(BigInt(PREFIXED.length), at);
  b.set(PREFIXED, at);
  return new Uint8Array(b.buffer, b.byteOffset, b.length);
}

function thrown(f: () => unknown): ByteReaderError {
  try {
    f();
  } catch (error) {
    expect(error).to.be.instanceOf(ByteReaderError);
    return error as ByteReaderError;
  }
  expect.fail("expected a ByteReaderError");
}

describe("ByteReader", () => {
  const record = recordBytes();

  it("reads every field of the record in order and ends with nothing left", () => {
    const r = new ByteReader(record);
    for (const f of FIELDS) expect(f.read(r), f.name).to.deep.equal(f.value);
    expect(r.remaining).to.equal(0);
    expect(r.offset).to.equal(record.length);
  });

  for (const [mode, code] of [["truncated data", "TRUNCATED"], ["a read limit", "LIMIT_EXCEEDED"]] as const) {
    it(`fails with ${code} at every cut point under ${mode}, leaving the offset in place`, () => {
      for (let cut = 0; cut < record.length; cut++) {
        const r = mode === "truncated data" ? new ByteReader(record.subarray(0, cut)) : new ByteReader(record, { limit: cut });
        let start = 0;
        let failed = false;
        for (const f of FIELDS) {
          if (start + f.size <= cut) {
            expect(f.read(r), `${f.name} with cut ${cut}`).to.deep.equal(f.value);
            start += f.size;
            continue;
          }
          const e = thrown(() => f.read(r));
          expect(e.code, `cut ${cut}`).to.equal(code);
          expect(e.offset, `cut ${cut}`).to.equal(start);
          // A cut inside a length prefix fails on the prefix itself.
          const needed = f.name === "lengthPrefixed" && cut - start < 8 ? 8 : f.size;
          expect(e.needed, `cut ${cut}`).to.equal(needed);
          expect(e.available, `cut ${cut}`).to.equal(cut - start);
          expect(r.offset, `cut ${cut}`).to.equal(start);
          expect(r.remaining, `cut ${cut}`).to.equal(cut - start);
          failed = true;
          break;
        }
        expect(failed, `cut ${cut}`).to.equal(true);
      }
    });
  }

  it("reports TRUNCATED when the data ends before a larger limit", () => {
    const r = new ByteReader(record.subarray(0, 2), { limit: 100 });
    expect(r.remaining).to.equal(2);
    expect(thrown(() => r.u32()).code).to.equal("TRUNCATED");
  });

  it("reads a view at an offset in a larger buffer and never past its end", () => {
    const backing = new Uint8Array(32).fill(0xff);
    backing.set([1, 0, 2, 0, 0, 0], 10);
    const r = new ByteReader(backing.subarray(10, 16));
    expect(r.u16()).to.equal(1);
    expect(r.u32()).to.equal(2);
    expect(thrown(() => r.u8()).code).to.equal("TRUNCATED");
  });

  it("returns bytes as views sharing memory with the input", () => {
    const data = Uint8Array.of(1, 2, 3, 4, 5);
    const r = new ByteReader(data);
    r.skip(1);
    const view = r.bytes(3);
    expect(view.buffer).to.equal(data.buffer);
    expect(view.byteOffset).to.equal(1);
    data[2] = 42;
    expect(Array.from(view)).to.deep.equal([2, 42, 4]);
    expect(r.bytes(0).length).to.equal(0);
  });

  const u64Cases: [string, bigint][] = [
    ["0", 0n],
    ["2^53+1", 2n ** 53n + 1n],
    ["2^63", 2n ** 63n],
    ["2^64-1", U64_MAX],
  ];
  for (const [name, value] of u64Cases) {
    it(`reads u64 ${name} exactly, as written by Buffer and by ByteWriter`, () => {
      const b = Buffer.alloc(8);
      b.writeBigUInt64LE(value);
      expect(new ByteReader(b).u64()).to.equal(value);
      const written = new ByteWriter(8).u64(value).finish();
      expect(Buffer.from(written).equals(b)).to.equal(true);
      expect(new ByteReader(written).u64()).to.equal(value);
    });
  }

  it("checks a length prefix against what remains before using it", () => {
    for (const length of [3n, 2n ** 53n + 1n, U64_MAX]) {
      const data = new ByteWriter(10).u64(length).u16(7).finish();
      const r = new ByteReader(data);
      const e = thrown(() => r.lengthPrefixed());
      expect(e.code).to.equal("TRUNCATED");
      expect(e.offset).to.equal(0);
      expect(e.available).to.equal(10);
      expect(r.offset).to.equal(0);
    }
  });

  it("refuses lengths that are not non-negative safe integers", () => {
    const r = new ByteReader(new Uint8Array(8));
    for (const n of [-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 53]) {
      expect(thrown(() => r.bytes(n)).code, `bytes(${n})`).to.equal("INVALID_LENGTH");
      expect(thrown(() => r.skip(n)).code, `skip(${n})`).to.equal("INVALID_LENGTH");
      expect(thrown(() => r.ensure(n)).code, `ensure(${n})`).to.equal("INVALID_LENGTH");
    }
    expect(r.offset).to.equal(0);
  });

  it("ensure and skip check the remaining length without reading", () => {
    const r = new ByteReader(new Uint8Array(5));
    r.ensure(5);
    expect(r.offset).to.equal(0);
    expect(thrown(() => r.ensure(6)).needed).to.equal(6);
    r.skip(4);
    expect(r.remaining).to.equal(1);
    expect(thrown(() => r.skip(2)).code).to.equal("TRUNCATED");
    expect(r.offset).to.equal(4);
  });

  it("refuses an invalid limit", () => {
    for (const limit of [-1, 0.5, Number.NaN]) expect(() => new ByteReader(new Uint8Array(1), { limit })).to.throw(RangeError);
  });
});
