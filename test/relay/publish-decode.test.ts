/**
 * The direct PublishRequest decoder against protobuf-es: on random messages
 * protobuf-es writes, on random wire encodings it never writes but reads
 * (unknown fields, repeats, packed and unpacked hashes, padded varints), on
 * hand-built cases with their expected values, and on malformed and
 * truncated bytes, which it refuses with connect's own parse error.
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { expect } from "chai";
import fc from "fast-check";
import { PublishRequestSchema } from "../../gen/mmgate/kvevents/v1/kvevents_pb.js";
import { CkfError, type RouterEvent } from "../../src/kv/index.js";
import { decodePublishRequest, scanPublishRequest } from "../../src/relay/service/publish-decode.js";
import { routerEventFromWire } from "../../src/relay/service/ingest.js";

const U64_MAX = (1n << 64n) - 1n;

// --- comparison ----------------------------------------------------------------

/** The fields a consumer reads, as plain values (protobuf-es's StoredBlocks are messages). */
function plainEvent(event: RouterEvent | CkfError): unknown {
  if (event instanceof CkfError) return { error: event.code, message: event.message };
  const data = event.data;
  let body: unknown;
  switch (data.kind) {
    case "stored":
      body = { kind: "stored", parentHash: data.parentHash, startPosition: data.startPosition, blocks: data.blocks.map((b) => ({ blockHash: b.blockHash, tokensHash: b.tokensHash })) };
      break;
    case "removed":
      body = { kind: "removed", blockHashes: [...data.blockHashes] };
      break;
    case "cleared":
      body = { kind: "cleared" };
      break;
  }
  return { workerId: event.workerId, dpRank: event.dpRank, eventId: event.eventId, data: body, storageTier: event.storageTier, residencyDomain: event.residencyDomain };
}

function plain(decoded: { pool: string; events: readonly (RouterEvent | CkfError)[] }): unknown {
  return { pool: decoded.pool, events: decoded.events.map(plainEvent) };
}

type Outcome = { ok: true; value: unknown } | { ok: false; error: unknown };

function attempt(decode: () => { pool: string; events: readonly (RouterEvent | CkfError)[] }): Outcome {
  try {
    return { ok: true, value: plain(decode()) };
  } catch (error) {
    return { ok: false, error };
  }
}

/** Today's path: protobuf-es parses, routerEventFromWire converts. */
function viaProtobufEs(bytes: Uint8Array): Outcome {
  return attempt(() => {
    const request = fromBinary(PublishRequestSchema, bytes);
    return { pool: request.pool, events: request.events.map(routerEventFromWire) };
  });
}

function viaDecoder(bytes: Uint8Array): Outcome {
  return attempt(() => decodePublishRequest(bytes));
}

function expectParseError(error: unknown, fragment?: string): void {
  expect(error, String(error)).to.be.instanceOf(ConnectError);
  const e = error as ConnectError;
  expect(e.code).to.equal(Code.Internal);
  expect(e.rawMessage).to.match(/^parse binary: /);
  if (fragment !== undefined) expect(e.rawMessage).to.contain(fragment);
}

/**
 * The decoder is never more lenient than protobuf-es: what it decodes,
 * protobuf-es decodes to the same events; what protobuf-es refuses, it
 * refuses with a parse ConnectError; it throws nothing else.
 */
function expectNoLaxer(bytes: Uint8Array): Outcome {
  const ours = viaDecoder(bytes);
  const theirs = viaProtobufEs(bytes);
  if (ours.ok) {
    expect(theirs.ok, `protobuf-es refuses what the decoder reads: ${theirs.ok ? "" : String(theirs.error)}`).to.equal(true);
    expect(ours.value).to.deep.equal(theirs.ok ? theirs.value : undefined);
  } else {
    expectParseError(ours.error);
  }
  return theirs;
}

/** Both decoders agree: the same events, or both refuse (the decoder with a parse ConnectError). */
function expectSame(bytes: Uint8Array): void {
  const ours = viaDecoder(bytes);
  const theirs = viaProtobufEs(bytes);
  if (theirs.ok) {
    expect(ours.ok, `the decoder refuses what protobuf-es reads: ${ours.ok ? "" : String(ours.error)}`).to.equal(true);
    expect(ours.ok ? ours.value : undefined).to.deep.equal(theirs.value);
    expect(scanPublishRequest(bytes)).to.deep.equal({ pool: fromBinary(PublishRequestSchema, bytes).pool, events: fromBinary(PublishRequestSchema, bytes).events.length });
  } else {
    expect(ours.ok, `the decoder reads what protobuf-es refuses (${String(theirs.error)})`).to.equal(false);
    if (!ours.ok) expectParseError(ours.error);
  }
}

// --- hand encoding ---------------------------------------------------------------

type Bytes = number[];

/** A varint of `value`'s low 64 bits, padded with continuation bytes to at least `min` bytes. */
function varint(value: bigint | number, min = 1): Bytes {
  let v = BigInt.asUintN(64, BigInt(value));
  const out: Bytes = [];
  do {
    const b = Number(v & 0x7fn);
    v >>= 7n;
    out.push(b);
  } while (v !== 0n);
  while (out.length < min) out.push(0);
  for (let i = 0; i < out.length - 1; i++) out[i]! |= 0x80;
  return out;
}

const tag = (field: number, wireType: number): Bytes => varint(BigInt(field) * 8n + BigInt(wireType));
const vf = (field: number, value: bigint | number, min = 1): Bytes => [...tag(field, 0), ...varint(value, min)];
const lf = (field: number, ...body: Bytes[]): Bytes => {
  const flat = body.flat();
  return [...tag(field, 2), ...varint(flat.length), ...flat];
};
const sf = (field: number, text: string): Bytes => lf(field, [...new TextEncoder().encode(text)]);
const f64 = (field: number): Bytes => [...tag(field, 1), 1, 2, 3, 4, 5, 6, 7, 8];
const f32 = (field: number): Bytes => [...tag(field, 5), 9, 9, 9, 9];
const group = (field: number, ...inner: Bytes[]): Bytes => [...tag(field, 3), ...inner.flat(), ...tag(field, 4)];
const bytes = (...parts: Bytes[]): Uint8Array => Uint8Array.from(parts.flat());

/** One unknown field of each wire type, with numbers no message here defines. */
const UNKNOWNS: Bytes[] = [vf(9, U64_MAX), f64(10), lf(11, [0xff, 0x00, 0x80]), group(12, vf(1, 7), group(13, sf(2, "x")), f32(3)), f32(536870911)];
const allUnknowns = (): Bytes => UNKNOWNS.flat();

const block = (blockHash: bigint, tokensHash: bigint): Bytes => lf(2, vf(1, blockHash), vf(2, tokensHash));

// --- random messages -------------------------------------------------------------

const u64 = fc.bigInt({ min: 0n, max: U64_MAX });
const u32 = fc.integer({ min: 0, max: 0xffff_ffff });
const text = fc.oneof(fc.constantFrom("", "device", "host_pinned", "primary", "cache_owner", "\u{feff}bom", "é"), fc.string({ unit: "binary", maxLength: 40 }));

/** PublishRequests as protobuf-es's writer makes them. */
const publishRequest = fc
  .record({
    pool: text,
    events: fc.array(
      fc.record({
        workerId: u64,
        dpRank: u32,
        eventId: u64,
        data: fc.oneof(
          fc
            .record({
              parentHash: fc.option(u64, { nil: undefined }),
              startPosition: fc.option(u32, { nil: undefined }),
              blocks: fc.array(fc.record({ blockHash: u64, tokensHash: u64 }), { maxLength: 6 }),
            })
            .map((value) => ({ case: "stored" as const, value })),
          fc.array(u64, { maxLength: 8 }).map((blockHashes) => ({ case: "removed" as const, value: { blockHashes } })),
          fc.constant({ case: "cleared" as const, value: {} }),
          fc.constant({ case: undefined }),
        ),
        storageTier: text,
        residencyDomain: text,
      }),
      { maxLength: 10 },
    ),
  })
  .map((init) => toBinary(PublishRequestSchema, create(PublishRequestSchema, init)));

/** A varint's bytes: canonical, padded, or 10 bytes with bits past 64 set (dropped by the reader). */
const varintBytes = fc.oneof(
  { weight: 4, arbitrary: u64.map((v) => varint(v)) },
  { weight: 1, arbitrary: fc.tuple(u64, fc.integer({ min: 1, max: 10 })).map(([v, min]) => varint(v, min)) },
  { weight: 1, arbitrary: fc.tuple(fc.array(fc.integer({ min: 0, max: 0x7f }), { minLength: 9, maxLength: 9 }), fc.integer({ min: 0, max: 0x7f })).map(([low, last]) => [...low.map((b) => b | 0x80), last]) },
);

const unknownNumber = fc.oneof(fc.integer({ min: 9, max: 40 }), fc.constant(536870911), fc.integer({ min: 1000, max: 1 << 20 }));

/** An unknown field of any wire type; in a group, any field number (a group's content is skipped whole). */
function unknownField(depth: number, number: fc.Arbitrary<number> = unknownNumber): fc.Arbitrary<Bytes> {
  const kinds: fc.Arbitrary<Bytes>[] = [
    fc.tuple(number, varintBytes).map(([n, v]) => [...tag(n, 0), ...v]),
    fc.tuple(number, fc.array(fc.integer({ min: 0, max: 255 }), { minLength: 8, maxLength: 8 })).map(([n, b]) => [...tag(n, 1), ...b]),
    fc.tuple(number, fc.array(fc.integer({ min: 0, max: 255 }), { maxLength: 12 })).map(([n, b]) => lf(n, b)),
    fc.tuple(number, fc.array(fc.integer({ min: 0, max: 255 }), { minLength: 4, maxLength: 4 })).map(([n, b]) => [...tag(n, 5), ...b]),
  ];
  if (depth > 0) kinds.push(fc.tuple(number, fc.array(unknownField(depth - 1, fc.integer({ min: 1, max: 40 })), { maxLength: 3 })).map(([n, inner]) => group(n, ...inner)));
  return fc.oneof(...kinds);
}

const unknown = unknownField(2);
const varintField = (field: number): fc.Arbitrary<Bytes> => varintBytes.map((v) => [...tag(field, 0), ...v]);
const lenField = (field: number, body: fc.Arbitrary<Bytes>): fc.Arbitrary<Bytes> => body.map((b) => lf(field, b));
const fields = (maxLength: number, ...kinds: fc.Arbitrary<Bytes>[]): fc.Arbitrary<Bytes> => fc.array(fc.oneof(...kinds), { maxLength }).map((parts) => parts.flat());
/** A string field: UTF-8 text, now and then bytes that are not UTF-8 (which protobuf-es refuses). */
const stringField = (field: number): fc.Arbitrary<Bytes> =>
  fc.oneof({ weight: 9, arbitrary: text.map((s) => sf(field, s)) }, { weight: 1, arbitrary: fc.array(fc.integer({ min: 0x80, max: 0xff }), { minLength: 1, maxLength: 4 }).map((b) => lf(field, b)) });

const storedBlockWire = fields(4, varintField(1), varintField(2), unknown);
const storedWire = fields(6, varintField(1), lenField(2, storedBlockWire), varintField(3), unknown);
const removedWire = fields(6, varintField(1), lenField(1, fc.array(varintBytes, { maxLength: 5 }).map((vs) => vs.flat())), unknown);
const clearedWire = fields(2, unknown);
const eventWire = fields(9, varintField(1), varintField(2), varintField(3), lenField(4, storedWire), lenField(5, removedWire), lenField(6, clearedWire), stringField(7), stringField(8), unknown);
/** Any well-formed wire encoding of a PublishRequest: fields in any order and number, unknown fields anywhere. */
const publishWire = fields(8, stringField(1), lenField(2, eventWire), unknown).map((b) => Uint8Array.from(b));

// --- tests -----------------------------------------------------------------------

describe("PublishRequest direct decoder", () => {
  describe("against protobuf-es", () => {
    it("decodes random messages protobuf-es writes to the same events, and counts them", () => {
      fc.assert(
        fc.property(publishRequest, (encoded) => {
          const theirs = viaProtobufEs(encoded);
          expect(theirs.ok).to.equal(true);
          expect(viaDecoder(encoded)).to.deep.equal(theirs);
          expect(scanPublishRequest(encoded).events).to.equal(fromBinary(PublishRequestSchema, encoded).events.length);
        }),
        { numRuns: 300 },
      );
    });

    it("decodes random wire encodings (unknown fields, repeats, packed and unpacked, padded varints) as protobuf-es does", () => {
      let decoded = 0;
      let events = 0;
      fc.assert(
        fc.property(publishWire, (encoded) => {
          expectSame(encoded);
          const ours = viaDecoder(encoded);
          if (ours.ok) {
            decoded += 1;
            events += scanPublishRequest(encoded).events;
          }
        }),
        { numRuns: 1000 },
      );
      // Most inputs decode (the rest carry a string that is not UTF-8), and carry events.
      expect(decoded).to.be.greaterThan(500);
      expect(events).to.be.greaterThan(decoded);
    });

    it("decodes a view into a larger buffer without reading outside it", () => {
      fc.assert(
        fc.property(publishRequest, fc.uint8Array({ maxLength: 8 }), fc.uint8Array({ maxLength: 8 }), (encoded, before, after) => {
          const buffer = Uint8Array.from([...before, ...encoded, ...after]);
          const view = buffer.subarray(before.length, before.length + encoded.length);
          expect(viaDecoder(view)).to.deep.equal(viaProtobufEs(encoded));
          expect(scanPublishRequest(view).events).to.equal(scanPublishRequest(encoded).events);
        }),
        { numRuns: 100 },
      );
    });

    it("is never laxer than protobuf-es on mutated encodings and random bytes, and throws only parse ConnectErrors", () => {
      const mutated = fc
        .tuple(publishWire, fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 }), fc.constantFrom("set", "insert", "delete")), { minLength: 1, maxLength: 3 }))
        .map(([encoded, edits]) => {
          const b = [...encoded];
          for (const [at, value, op] of edits) {
            if (b.length === 0) break;
            const i = at % b.length;
            if (op === "set") b[i] = value;
            else if (op === "insert") b.splice(i, 0, value);
            else b.splice(i, 1);
          }
          return Uint8Array.from(b);
        });
      fc.assert(
        fc.property(fc.oneof(mutated, fc.uint8Array({ maxLength: 64 })), (input) => {
          expectNoLaxer(input);
          try {
            scanPublishRequest(input).events;
          } catch (error) {
            expectParseError(error);
          }
        }),
        { numRuns: 2000 },
      );
    });
  });

  describe("hand-built encodings", () => {
    const stored = (workerId: bigint, blocks: [bigint, bigint][], extra: { parentHash?: bigint; startPosition?: number } = {}) => ({
      workerId,
      dpRank: 0,
      eventId: 0n,
      data: { kind: "stored", parentHash: extra.parentHash, startPosition: extra.startPosition, blocks: blocks.map(([blockHash, tokensHash]) => ({ blockHash, tokensHash })) },
      storageTier: undefined,
      residencyDomain: undefined,
    });
    const NO_DATA = { error: "InvalidEvent", message: "the event has no data (stored, removed or cleared)" };

    const cases: { name: string; bytes: Uint8Array; expected: unknown }[] = [
      { name: "an empty message", bytes: bytes(), expected: { pool: "", events: [] } },
      {
        name: "unknown fields of every wire type before, between and after known ones, at every level",
        bytes: bytes(
          allUnknowns(),
          sf(1, "p"),
          allUnknowns(),
          lf(2, allUnknowns(), vf(1, 5n), allUnknowns(), lf(4, allUnknowns(), lf(2, allUnknowns(), vf(1, 1n), allUnknowns(), vf(2, 2n), allUnknowns()), allUnknowns(), vf(1, 9n)), allUnknowns()),
          allUnknowns(),
          lf(2, lf(5, allUnknowns(), vf(1, 3n), allUnknowns()), lf(6, allUnknowns())),
          allUnknowns(),
        ),
        expected: {
          pool: "p",
          events: [stored(5n, [[1n, 2n]], { parentHash: 9n }), { workerId: 0n, dpRank: 0, eventId: 0n, data: { kind: "cleared" }, storageTier: undefined, residencyDomain: undefined }],
        },
      },
      {
        name: "fields out of order",
        bytes: bytes(lf(2, sf(8, "primary"), lf(4, vf(3, 2), lf(2, vf(2, 20n), vf(1, 10n)), vf(1, 7n)), sf(7, "device"), vf(3, 4n), vf(2, 3), vf(1, 1n)), sf(1, "late")),
        expected: { pool: "late", events: [{ workerId: 1n, dpRank: 3, eventId: 4n, data: { kind: "stored", parentHash: 7n, startPosition: 2, blocks: [{ blockHash: 10n, tokensHash: 20n }] }, storageTier: "device", residencyDomain: "primary" }] },
      },
      {
        name: "scalars given twice (last wins), Stored given twice (merged)",
        bytes: bytes(sf(1, "a"), sf(1, "b"), lf(2, vf(1, 1n), vf(1, 2n), lf(4, vf(1, 100n), vf(3, 5), block(1n, 11n)), sf(7, "disk"), sf(7, ""), lf(4, block(2n, 22n), vf(3, 6)), lf(4, vf(1, 101n), block(3n, 33n)))),
        expected: { pool: "b", events: [stored(2n, [[1n, 11n], [2n, 22n], [3n, 33n]], { parentHash: 101n, startPosition: 6 })] },
      },
      {
        name: "a Stored given twice keeps the first's parent and position when the second has none",
        bytes: bytes(lf(2, lf(4, vf(1, 100n), vf(3, 5), block(1n, 11n)), lf(4, block(2n, 22n)))),
        expected: { pool: "", events: [stored(0n, [[1n, 11n], [2n, 22n]], { parentHash: 100n, startPosition: 5 })] },
      },
      {
        name: "a oneof case replaced by a later one, and a case given again after another starts afresh",
        bytes: bytes(lf(2, lf(4, block(1n, 1n)), lf(5, vf(1, 8n))), lf(2, lf(5, vf(1, 1n)), lf(4, block(2n, 2n)), lf(5, vf(1, 3n))), lf(2, lf(5, vf(1, 1n)), lf(6))),
        expected: {
          pool: "",
          events: [
            { workerId: 0n, dpRank: 0, eventId: 0n, data: { kind: "removed", blockHashes: [8n] }, storageTier: undefined, residencyDomain: undefined },
            { workerId: 0n, dpRank: 0, eventId: 0n, data: { kind: "removed", blockHashes: [3n] }, storageTier: undefined, residencyDomain: undefined },
            { workerId: 0n, dpRank: 0, eventId: 0n, data: { kind: "cleared" }, storageTier: undefined, residencyDomain: undefined },
          ],
        },
      },
      {
        name: "block_hashes packed and unpacked in one event, across two Removed",
        bytes: bytes(lf(2, lf(5, vf(1, 1n), lf(1, varint(2n), varint(U64_MAX), varint(3n)), vf(1, 4n), lf(1)), lf(5, lf(1, varint(5n)), vf(1, 6n)))),
        expected: { pool: "", events: [{ workerId: 0n, dpRank: 0, eventId: 0n, data: { kind: "removed", blockHashes: [1n, 2n, U64_MAX, 3n, 4n, 5n, 6n] }, storageTier: undefined, residencyDomain: undefined }] },
      },
      {
        name: "an empty Cleared, an event with no data, an empty event",
        bytes: bytes(lf(2, vf(1, 1n), lf(6)), lf(2, vf(1, 2n), sf(7, "device")), lf(2)),
        expected: { pool: "", events: [{ workerId: 1n, dpRank: 0, eventId: 0n, data: { kind: "cleared" }, storageTier: undefined, residencyDomain: undefined }, NO_DATA, NO_DATA] },
      },
      {
        name: "max u64 values, and varints padded to 10 bytes or carrying bits past 64",
        bytes: bytes(lf(2, vf(1, U64_MAX), vf(3, 1n, 10), lf(4, vf(1, U64_MAX), block(U64_MAX, U64_MAX), lf(2, vf(1, 0n, 10), [...tag(2, 0), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f])))),
        expected: { pool: "", events: [stored(U64_MAX, [[U64_MAX, U64_MAX], [0n, U64_MAX]], { parentHash: U64_MAX })].map((e) => ({ ...e, eventId: 1n })) },
      },
      {
        name: "uint32 varints over 2^32 keep their low 32 bits",
        bytes: bytes(lf(2, vf(2, (1n << 32n) + 5n), lf(4, vf(3, -1n))), lf(2, vf(2, U64_MAX - 0xffn), lf(4, vf(3, 0x1_8000_0000n)))),
        expected: {
          pool: "",
          events: [
            { ...stored(0n, [], { startPosition: 0xffff_ffff }), dpRank: 5 },
            { ...stored(0n, [], { startPosition: 0x8000_0000 }), dpRank: 0xffff_ff00 },
          ],
        },
      },
      {
        name: "strings: multi-byte UTF-8, a leading U+FEFF kept, long ASCII",
        bytes: bytes(sf(1, "\u{feff}pööl-😀"), lf(2, lf(6), sf(7, "x".repeat(40)), sf(8, "é"))),
        expected: { pool: "\u{feff}pööl-😀", events: [{ workerId: 0n, dpRank: 0, eventId: 0n, data: { kind: "cleared" }, storageTier: "x".repeat(40), residencyDomain: "é" }] },
      },
      {
        name: "an unknown group nested as deep as protobuf-es allows at the top level (99)",
        bytes: bytes(Array.from({ length: 99 }, () => tag(9, 3)).flat(), Array.from({ length: 99 }, () => tag(9, 4)).flat(), lf(2, lf(6))),
        expected: { pool: "", events: [{ workerId: 0n, dpRank: 0, eventId: 0n, data: { kind: "cleared" }, storageTier: undefined, residencyDomain: undefined }] },
      },
      {
        name: "unknown field numbers up to 2^29 - 1, tags padded to 5 bytes",
        bytes: bytes(vf(536870911, 1n), [0x8a, 0x80, 0x80, 0x80, 0x00, 1, 0x61], lf(2, [0x88, 0x80, 0x80, 0x80, 0x00, 7], lf(6))),
        expected: { pool: "a", events: [{ workerId: 7n, dpRank: 0, eventId: 0n, data: { kind: "cleared" }, storageTier: undefined, residencyDomain: undefined }] },
      },
    ];

    for (const { name, bytes: encoded, expected } of cases) {
      it(name, () => {
        const ours = viaDecoder(encoded);
        expect(ours.ok ? undefined : String(ours.error)).to.equal(undefined);
        expect(ours.ok ? ours.value : undefined).to.deep.equal(expected);
        expectSame(encoded);
      });
    }

    it("builds plain objects of the types the filter state reads", () => {
      const { events } = decodePublishRequest(bytes(lf(2, vf(1, 1n), vf(2, 2), vf(3, 3n), lf(4, block(4n, 5n)))));
      const event = events[0] as RouterEvent;
      expect(event).to.not.be.instanceOf(CkfError);
      expect(Object.keys(event)).to.deep.equal(["workerId", "dpRank", "eventId", "data", "storageTier", "residencyDomain"]);
      expect(Object.keys(event.data)).to.deep.equal(["kind", "parentHash", "startPosition", "blocks"]);
      expect([typeof event.workerId, typeof event.dpRank, typeof event.eventId]).to.deep.equal(["bigint", "number", "bigint"]);
      expect(event.data.kind === "stored" && event.data.blocks[0]).to.deep.equal({ blockHash: 4n, tokensHash: 5n });
    });

    it("every truncation decodes as protobuf-es does or is refused as protobuf-es refuses it", () => {
      for (const { bytes: encoded } of cases) {
        for (let cut = 0; cut <= encoded.length; cut++) {
          const head = encoded.subarray(0, cut);
          expectSame(head);
          const theirs = viaProtobufEs(head);
          // A cut inside a top-level field is refused by the cheap pass too.
          let counted: number | undefined;
          try {
            counted = scanPublishRequest(head).events;
          } catch (error) {
            expectParseError(error);
          }
          expect(counted !== undefined, `count of ${cut} bytes`).to.equal(theirs.ok);
        }
      }
    });

    it("every truncation of random messages likewise", () => {
      fc.assert(
        fc.property(fc.oneof(publishRequest, publishWire), (encoded) => {
          for (let cut = 0; cut < encoded.length; cut++) expectSame(encoded.subarray(0, cut));
        }),
        { numRuns: 100 },
      );
    });
  });

  describe("malformed input", () => {
    const deepGroup = (depth: number): Bytes => [...Array.from({ length: depth }, () => tag(9, 3)).flat(), ...Array.from({ length: depth }, () => tag(9, 4)).flat()];
    // protobufEs: whether protobuf-es refuses the bytes too ("accepts": the decoder is stricter there);
    // count: the event count scanPublishRequest gives (malformed only inside an event), or undefined: it refuses them too.
    const rows: { name: string; bytes: Uint8Array; error: string; protobufEs: "refuses" | "accepts"; count?: number }[] = [
      { name: "truncated tag", bytes: bytes([0x80]), error: "truncated varint at byte 0", protobufEs: "refuses" },
      { name: "a tag without its value", bytes: bytes(lf(2, [0x08])), error: "truncated varint at byte 3", protobufEs: "refuses", count: 1 },
      { name: "truncated varint inside an event", bytes: bytes(lf(2, [0x08, 0x80])), error: "truncated varint at byte 3", protobufEs: "refuses", count: 1 },
      { name: "varint over 10 bytes", bytes: bytes(lf(2, [0x08], Array(10).fill(0xff), [0x01])), error: "varint over 10 bytes at byte 3", protobufEs: "refuses", count: 1 },
      { name: "unknown varint over 10 bytes", bytes: bytes([0x48], Array(10).fill(0xff), [0x01]), error: "varint over 10 bytes at byte 1", protobufEs: "accepts" },
      { name: "length past the end", bytes: bytes([0x12, 0x05, 0x08, 0x01]), error: "length 5 at byte 1 past the end", protobufEs: "refuses" },
      { name: "string length past the end", bytes: bytes([0x0a, 0x03, 0x61]), error: "length 3 at byte 1 past the end", protobufEs: "refuses" },
      { name: "length past the end of the enclosing message", bytes: bytes(lf(2, [0x22, 0x05, 0x08, 0x01]), vf(9, 0), vf(9, 0)), error: "length 5 at byte 3 past the end", protobufEs: "accepts", count: 1 },
      { name: "length over 32 bits", bytes: bytes([0x12], varint(1n << 32n)), error: "length over 32 bits at byte 1", protobufEs: "accepts" },
      { name: "packed run past the end of its Removed", bytes: bytes(lf(2, lf(5, [0x0a, 0x04, 0x01]))), error: "length 4 at byte 5 past the end", protobufEs: "refuses", count: 1 },
      { name: "a varint running out of its event", bytes: bytes([0x12, 0x02, 0x08, 0x80, 0x01]), error: "truncated varint at byte 3", protobufEs: "accepts" },
      { name: "a packed varint running out of its run", bytes: bytes(lf(2, lf(5, [0x0a, 0x01, 0x80, 0x01]))), error: "truncated varint at byte 6", protobufEs: "accepts", count: 1 },
      { name: "fixed64 past the end", bytes: bytes([0x49, 1, 2, 3]), error: "8 bytes at byte 1 past the end", protobufEs: "refuses" },
      { name: "fixed32 past the end", bytes: bytes([0x4d, 1, 2, 3]), error: "4 bytes at byte 1 past the end", protobufEs: "refuses" },
      { name: "events with wire type varint", bytes: bytes([0x10, 0x00]), error: "field 2 with wire type 0", protobufEs: "accepts" },
      { name: "pool with wire type fixed32", bytes: bytes([0x0d, 1, 2, 3, 4]), error: "field 1 with wire type 5", protobufEs: "refuses" },
      { name: "worker_id with wire type len", bytes: bytes(lf(2, [0x0a, 0x02, 0x10, 0x05], lf(6))), error: "field 1 with wire type 2", protobufEs: "accepts", count: 1 },
      { name: "stored with wire type varint", bytes: bytes(lf(2, vf(4, 0))), error: "field 4 with wire type 0", protobufEs: "accepts", count: 1 },
      { name: "block_hashes with wire type fixed64", bytes: bytes(lf(2, lf(5, [0x09, 0x05, 0x08, 0x07]))), error: "field 1 with wire type 1", protobufEs: "accepts", count: 1 },
      { name: "end-group tag for a known field", bytes: bytes(lf(2, [0x0c, 0x05])), error: "field 1 with wire type 4", protobufEs: "accepts", count: 1 },
      { name: "wire type 6", bytes: bytes([0x0e]), error: "bad wire type 6 at byte 0", protobufEs: "refuses" },
      { name: "wire type 7 in an event", bytes: bytes(lf(2, [0x3f])), error: "bad wire type 7 at byte 2", protobufEs: "refuses", count: 1 },
      { name: "field number 0", bytes: bytes([0x00, 0x00]), error: "field number 0 at byte 0", protobufEs: "refuses" },
      { name: "field number 0 in a block", bytes: bytes(lf(2, lf(4, lf(2, [0x02, 0x00])))), error: "field number 0 at byte 6", protobufEs: "refuses", count: 1 },
      { name: "tag over 32 bits", bytes: bytes([0x88, 0x80, 0x80, 0x80, 0x10, 0x00]), error: "tag over 5 bytes or 32 bits at byte 0", protobufEs: "refuses" },
      { name: "tag over 5 bytes", bytes: bytes([0x88, 0x80, 0x80, 0x80, 0x80, 0x00, 0x00]), error: "tag over 5 bytes or 32 bits at byte 0", protobufEs: "refuses" },
      { name: "unterminated group", bytes: bytes([0x4b, 0x08, 0x01]), error: "unterminated group (field 9)", protobufEs: "refuses" },
      { name: "group unterminated within its event", bytes: bytes(lf(2, [0x4b]), [0x4c]), error: "unterminated group (field 9)", protobufEs: "accepts" },
      { name: "group ended by another field", bytes: bytes([0x4b, 0x54]), error: "group of field 9 ended by field 10", protobufEs: "refuses" },
      { name: "end-group tag outside a group", bytes: bytes([0x4c]), error: "end-group tag of field 9 outside a group", protobufEs: "refuses" },
      { name: "groups nested past protobuf-es's limit", bytes: bytes(deepGroup(100)), error: "groups nested too deep", protobufEs: "refuses" },
      { name: "groups in an event nested past protobuf-es's limit (98 there)", bytes: bytes(lf(2, deepGroup(99), lf(6))), error: "groups nested too deep", protobufEs: "refuses", count: 1 },
      { name: "invalid UTF-8 in the pool", bytes: bytes([0x0a, 0x02, 0x61, 0xff]), error: "invalid UTF-8 in the string at byte 2", protobufEs: "refuses" },
      { name: "invalid UTF-8 in a storage tier (long)", bytes: bytes(lf(2, lf(6), lf(7, Array(40).fill(0x61), [0xc3]))), error: "invalid UTF-8", protobufEs: "refuses", count: 1 },
      { name: "a lone surrogate's UTF-8 in a residency domain", bytes: bytes(lf(2, lf(6), lf(8, [0xed, 0xa0, 0x80]))), error: "invalid UTF-8", protobufEs: "refuses", count: 1 },
    ];

    for (const row of rows) {
      it(`${row.name}: ${row.error}`, () => {
        const ours = viaDecoder(row.bytes);
        expect(ours.ok, "decoded").to.equal(false);
        if (!ours.ok) expectParseError(ours.error, row.error);
        const theirs = viaProtobufEs(row.bytes);
        expect(theirs.ok ? "accepts" : "refuses", theirs.ok ? "" : String(theirs.error)).to.equal(row.protobufEs);
      });
    }

    it("the cheap top-level pass (pool and event count) refuses top-level malformations, and does not look into events", () => {
      for (const row of rows) {
        let counted: number | undefined;
        try {
          counted = scanPublishRequest(row.bytes).events;
        } catch (error) {
          expectParseError(error);
        }
        expect(counted, row.name).to.equal(row.count);
      }
    });
  });
});
