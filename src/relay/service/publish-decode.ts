/**
 * A direct binary decoder for `mmgate.kvevents.v1.PublishRequest`: bytes
 * straight into the RouterEvent objects the filter state takes, with no
 * protobuf-es message objects in between (the ingest path's hot loop).
 *
 * It reads every valid encoding as protobuf-es's `fromBinary` followed by
 * `routerEventFromWire` does: unknown fields of any wire type are skipped,
 * a scalar given twice keeps the last value, a message field given twice is
 * merged (Stored: blocks appended, parent_hash and start_position last wins;
 * Removed: hashes appended), a later oneof case replaces an earlier one,
 * block_hashes is read packed and unpacked, uint32 keeps the varint's low 32
 * bits, and strings must be valid UTF-8 (proto3 strings: protobuf-es decodes
 * them with a fatal TextDecoder). Malformed input throws the ConnectError
 * that connect gives when its own parse fails (Code.Internal, "parse binary:
 * ..."); it is stricter than protobuf-es in a few places protobuf-es
 * tolerates: a known field with another wire type, a value running past the
 * end of its enclosing message, a skipped varint over 10 bytes.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { CkfError, joinU64, type KvCacheEventData, type RouterEvent, type StorageTier, type StoredBlock } from "../../kv/index.js";

/** A decoded PublishRequest: the pool, and each event as `routerEventFromWire` makes it. */
export interface DecodedPublishRequest {
  readonly pool: string;
  readonly events: (RouterEvent | CkfError)[];
}

const VARINT = 0;
const I64 = 1;
const LEN = 2;
const SGROUP = 3;
const EGROUP = 4;
const I32 = 5;

/** protobuf-es's default recursion limit; a group skipped in a message at depth d may nest 100 - d deep. */
const RECURSION_LIMIT = 100;

/** proto3 strings are validated UTF-8 (fatal); a leading U+FEFF is text, not a byte-order mark. */
const UTF8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Strings this short and ASCII are built without TextDecoder, as protobuf-es does. */
const ASCII_MAX_LENGTH = 32;

function malformed(what: string): never {
  throw new ConnectError(`parse binary: ${what}`, Code.Internal);
}

/**
 * A cursor over the message bytes. `end` is the end of the message being
 * read: nothing is read past it, so a value cannot run out of its enclosing
 * message, and a length is checked against it before anything is sliced.
 */
class WireReader {
  pos = 0;
  end: number;
  /** The high 32 bits of the last varint read (its low bits are what `varint` returns). */
  hi = 0;

  constructor(private readonly buf: Uint8Array) {
    this.end = buf.length;
  }

  /** Reads a varint of at most 10 bytes: returns its low 32 bits (unsigned) and leaves the next 32 in `hi`; bits past 64 are dropped. */
  varint(): number {
    const buf = this.buf;
    const end = this.end;
    let pos = this.pos;
    let lo = 0;
    let b: number;
    for (let shift = 0; shift < 28; shift += 7) {
      if (pos >= end) malformed(`truncated varint at byte ${this.pos}`);
      b = buf[pos++]!;
      lo |= (b & 0x7f) << shift;
      if (b < 0x80) {
        this.pos = pos;
        this.hi = 0;
        return lo >>> 0;
      }
    }
    // The fifth byte holds bits 28-31 of the low half and 0-2 of the high one.
    if (pos >= end) malformed(`truncated varint at byte ${this.pos}`);
    b = buf[pos++]!;
    lo |= (b & 0x0f) << 28;
    let hi = (b & 0x70) >> 4;
    if (b >= 0x80) {
      for (let shift = 3; ; shift += 7) {
        if (shift > 31) malformed(`varint over 10 bytes at byte ${this.pos}`);
        if (pos >= end) malformed(`truncated varint at byte ${this.pos}`);
        b = buf[pos++]!;
        hi |= (b & 0x7f) << shift;
        if (b < 0x80) break;
      }
    }
    this.pos = pos;
    this.hi = hi >>> 0;
    return lo >>> 0;
  }

  u32(): number {
    return this.varint();
  }

  u64(): bigint {
    const lo = this.varint();
    return joinU64(this.hi, lo);
  }

  /** A tag: a varint of at most 5 bytes that fits 32 bits, with a field number above 0 and wire type 0-5. */
  tag(): number {
    const at = this.pos;
    const tag = this.varint();
    if (this.pos - at > 5 || this.hi !== 0) malformed(`tag over 5 bytes or 32 bits at byte ${at}`);
    if (tag >>> 3 === 0) malformed(`field number 0 at byte ${at}`);
    if ((tag & 7) > 5) malformed(`bad wire type ${tag & 7} at byte ${at}`);
    return tag;
  }

  /** A length prefix, checked against the bytes left in the enclosing message. */
  length(): number {
    const at = this.pos;
    const length = this.varint();
    if (this.hi !== 0) malformed(`length over 32 bits at byte ${at}`);
    if (length > this.end - this.pos) malformed(`length ${length} at byte ${at} past the end`);
    return length;
  }

  /** Starts reading a length-delimited message: returns the enclosing end, for `leave`. */
  enter(): number {
    const length = this.length();
    const outer = this.end;
    this.end = this.pos + length;
    return outer;
  }

  leave(outer: number): void {
    this.end = outer;
  }

  skipBytes(count: number): void {
    if (count > this.end - this.pos) malformed(`${count} bytes at byte ${this.pos} past the end`);
    this.pos += count;
  }

  string(): string {
    const length = this.length();
    const start = this.pos;
    const buf = this.buf;
    this.pos += length;
    if (length <= ASCII_MAX_LENGTH) {
      let s = "";
      for (let i = start; i < this.pos; i++) {
        const b = buf[i]!;
        if (b >= 0x80) return this.utf8(start);
        s += String.fromCharCode(b);
      }
      return s;
    }
    return this.utf8(start);
  }

  private utf8(start: number): string {
    try {
      return UTF8.decode(this.buf.subarray(start, this.pos));
    } catch {
      return malformed(`invalid UTF-8 in the string at byte ${start}`);
    }
  }

  /**
   * Skips a field this decoder does not read. `known` has bit n set for each
   * field number n the message defines: one of those with an unexpected wire
   * type is malformed, not unknown.
   */
  skipField(tag: number, known: number, depth: number): void {
    const fieldNo = tag >>> 3;
    if (fieldNo < 32 && (known & (1 << fieldNo)) !== 0) malformed(`field ${fieldNo} with wire type ${tag & 7} at byte ${this.pos}`);
    this.skip(tag & 7, fieldNo, RECURSION_LIMIT - depth);
  }

  private skip(wireType: number, fieldNo: number, groupsLeft: number): void {
    switch (wireType) {
      case VARINT:
        this.varint();
        return;
      case I64:
        return this.skipBytes(8);
      case LEN:
        return this.skipBytes(this.length());
      case I32:
        return this.skipBytes(4);
      case SGROUP:
        if (groupsLeft <= 0) malformed(`groups nested too deep at byte ${this.pos}`);
        for (;;) {
          if (this.pos >= this.end) malformed(`unterminated group (field ${fieldNo})`);
          const tag = this.tag();
          if ((tag & 7) === EGROUP) {
            if (tag >>> 3 !== fieldNo) malformed(`group of field ${fieldNo} ended by field ${tag >>> 3}`);
            return;
          }
          this.skip(tag & 7, tag >>> 3, groupsLeft - 1);
        }
      default:
        return malformed(`end-group tag of field ${fieldNo} outside a group at byte ${this.pos}`);
    }
  }
}

// Tags (field number << 3 | wire type) of the fields each message defines, and their field-number masks.
const PUBLISH_KNOWN = (1 << 1) | (1 << 2);
const EVENT_KNOWN = 0b1_1111_1110;
const STORED_KNOWN = (1 << 1) | (1 << 2) | (1 << 3);
const BLOCK_KNOWN = (1 << 1) | (1 << 2);
const REMOVED_KNOWN = 1 << 1;
const CLEARED_KNOWN = 0;

// Depths as protobuf-es counts them (the request is 1), for its group-nesting limit.
const PUBLISH_DEPTH = 1;
const EVENT_DEPTH = 2;
const BODY_DEPTH = 3;
const BLOCK_DEPTH = 4;

/** An event body while it is read; a repeated Stored or Removed merges into the one before it. */
interface StoredBody {
  kind: "stored";
  parentHash: bigint | undefined;
  startPosition: number | undefined;
  blocks: StoredBlock[];
}
interface RemovedBody {
  kind: "removed";
  blockHashes: bigint[];
}
type Body = StoredBody | RemovedBody | { kind: "cleared" };

/** What a PublishRequest's top-level fields say: its pool and how many events it carries. */
export interface PublishRequestHead {
  readonly pool: string;
  readonly events: number;
}

/**
 * The pool and the number of events of a PublishRequest, reading only its
 * top-level fields (whose tags, varints and lengths it checks): a message
 * for the wrong pool, or over the event limit, is refused before any event
 * is built.
 */
export function scanPublishRequest(bytes: Uint8Array): PublishRequestHead {
  const r = new WireReader(bytes);
  let pool = "";
  let events = 0;
  while (r.pos < r.end) {
    const tag = r.tag();
    if (tag === 0x12) {
      r.skipBytes(r.length());
      events++;
    } else if (tag === 0x0a) {
      pool = r.string();
    } else {
      r.skipField(tag, PUBLISH_KNOWN, PUBLISH_DEPTH);
    }
  }
  return { pool, events };
}

/**
 * Decodes a PublishRequest into its pool and its events, each what
 * `routerEventFromWire` makes of protobuf-es's parse (a CkfError
 * InvalidEvent for an event without data). Throws a ConnectError
 * (Code.Internal) for malformed bytes.
 */
export function decodePublishRequest(bytes: Uint8Array): DecodedPublishRequest {
  const r = new WireReader(bytes);
  let pool = "";
  const events: (RouterEvent | CkfError)[] = [];
  while (r.pos < r.end) {
    const tag = r.tag();
    if (tag === 0x12) events.push(readEvent(r));
    else if (tag === 0x0a) pool = r.string();
    else r.skipField(tag, PUBLISH_KNOWN, PUBLISH_DEPTH);
  }
  return { pool, events };
}

function readEvent(r: WireReader): RouterEvent | CkfError {
  const outer = r.enter();
  let workerId = 0n;
  let dpRank = 0;
  let eventId = 0n;
  let body: Body | undefined;
  let storageTier = "";
  let residencyDomain = "";
  while (r.pos < r.end) {
    const tag = r.tag();
    switch (tag) {
      case 0x08:
        workerId = r.u64();
        break;
      case 0x10:
        dpRank = r.u32();
        break;
      case 0x18:
        eventId = r.u64();
        break;
      case 0x22:
        body = readStored(r, body?.kind === "stored" ? body : undefined);
        break;
      case 0x2a:
        body = readRemoved(r, body?.kind === "removed" ? body : undefined);
        break;
      case 0x32:
        readCleared(r);
        body = { kind: "cleared" };
        break;
      case 0x3a:
        storageTier = r.string();
        break;
      case 0x42:
        residencyDomain = r.string();
        break;
      default:
        r.skipField(tag, EVENT_KNOWN, EVENT_DEPTH);
    }
  }
  r.leave(outer);
  if (body === undefined) return new CkfError("InvalidEvent", "the event has no data (stored, removed or cleared)");
  return {
    workerId,
    dpRank,
    eventId,
    data: body as KvCacheEventData,
    storageTier: storageTier === "" ? undefined : (storageTier as StorageTier),
    residencyDomain: residencyDomain === "" ? undefined : residencyDomain,
  };
}

function readStored(r: WireReader, into: StoredBody | undefined): StoredBody {
  const outer = r.enter();
  const body: StoredBody = into ?? { kind: "stored", parentHash: undefined, startPosition: undefined, blocks: [] };
  while (r.pos < r.end) {
    const tag = r.tag();
    if (tag === 0x12) body.blocks.push(readBlock(r));
    else if (tag === 0x08) body.parentHash = r.u64();
    else if (tag === 0x18) body.startPosition = r.u32();
    else r.skipField(tag, STORED_KNOWN, BODY_DEPTH);
  }
  r.leave(outer);
  return body;
}

function readBlock(r: WireReader): StoredBlock {
  const outer = r.enter();
  let blockHash = 0n;
  let tokensHash = 0n;
  while (r.pos < r.end) {
    const tag = r.tag();
    if (tag === 0x08) blockHash = r.u64();
    else if (tag === 0x10) tokensHash = r.u64();
    else r.skipField(tag, BLOCK_KNOWN, BLOCK_DEPTH);
  }
  r.leave(outer);
  return { blockHash, tokensHash };
}

function readRemoved(r: WireReader, into: RemovedBody | undefined): RemovedBody {
  const outer = r.enter();
  const body: RemovedBody = into ?? { kind: "removed", blockHashes: [] };
  while (r.pos < r.end) {
    const tag = r.tag();
    if (tag === 0x08) {
      body.blockHashes.push(r.u64());
    } else if (tag === 0x0a) {
      // Packed: a run of varints, which must end exactly at the run's end.
      const packedOuter = r.enter();
      while (r.pos < r.end) body.blockHashes.push(r.u64());
      r.leave(packedOuter);
    } else {
      r.skipField(tag, REMOVED_KNOWN, BODY_DEPTH);
    }
  }
  r.leave(outer);
  return body;
}

function readCleared(r: WireReader): void {
  const outer = r.enter();
  while (r.pos < r.end) r.skipField(r.tag(), CLEARED_KNOWN, BODY_DEPTH);
  r.leave(outer);
}
