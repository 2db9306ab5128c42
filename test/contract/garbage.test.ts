/**
 * Contract: nothing a client sends may crash the server.
 *
 * Every method of every service the server lists through reflection (resolved
 * with the descriptors reflection returns) gets a fixed batch of payloads from
 * a seeded PRNG: random bytes, truncated protobuf, deeply nested fields and
 * groups, huge length prefixes, and well-formed messages with random values,
 * over raw gRPC; random and mistyped JSON over the Connect protocol; and
 * protobuf garbage over gRPC-Web. Every request must get a complete,
 * well-formed answer carrying a status within a bounded time, the server must
 * still report SERVING after each method's batch, must close every connection
 * its client has closed, and must not grow its memory without bound.
 */
import * as http2 from "node:http2";
import { create, createFileRegistry, fromBinary, ScalarType } from "@bufbuild/protobuf";
import type { DescField, DescMessage, DescMethod, DescService, MessageInitShape } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import type { FileDescriptorProto } from "@bufbuild/protobuf/wkt";
import { Code, createClient } from "@connectrpc/connect";
import { expect } from "chai";
import { ServerReflection, ServerReflectionRequestSchema } from "../../gen/grpc/reflection/v1/reflection_pb.js";
import { AdminService } from "../../gen/mmgate/admin/v1/admin_pb.js";
import { builtinModules } from "../../src/modules.js";
import type { InProcessServer } from "../support/index.js";
import { eventually, grpcUnary, startServer } from "../support/index.js";

/** Raw gRPC requests per method. */
const GRPC_PER_METHOD = 40;
/** Connect-protocol (JSON) requests per method. */
const CONNECT_PER_METHOD = 6;
/** gRPC-Web requests per method. */
const WEB_PER_METHOD = 6;
/** Requests of one batch in flight at once. */
const PARALLEL = 16;
/**
 * Deadline sent with every request, so streams that never end on their own (Health/Watch) end with a status;
 * DEADLINE_EXCEEDED is as good an answer as any other for a request that takes longer.
 */
const SERVER_DEADLINE_MS = 1000;
/** Longest wait for a complete response. */
const RESPONSE_BOUND_MS = 10_000;
/** Allowed growth of the resident set over the whole run. */
const RSS_GROWTH_BOUND = 1.5 * 1024 ** 3;
/**
 * Statuses that a well-behaved server never sends for bad input: UNKNOWN is
 * what connect answers when a handler throws something that is not a
 * ConnectError; UNAVAILABLE means the server considers itself shut down.
 */
const FORBIDDEN_CODES = new Set<Code>([Code.Unknown, Code.Unavailable]);

// ---------------------------------------------------------------------------
// Deterministic randomness
// ---------------------------------------------------------------------------

class Rng {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  /** mulberry32 */
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  /** 0 ≤ n < max */
  int(max: number): number {
    return Math.floor(this.next() * max);
  }
  bool(): boolean {
    return this.next() < 0.5;
  }
  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)]!;
  }
  bytes(n: number): Uint8Array {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = this.int(256);
    return out;
  }
  ascii(n: number): string {
    let s = "";
    for (let i = 0; i < n; i++) s += String.fromCharCode(32 + this.int(95));
    return s;
  }
  /** A uniformly random 64-bit unsigned value. */
  u64(): bigint {
    return (BigInt(this.int(2 ** 32)) << 32n) | BigInt(this.int(2 ** 32));
  }
}

/** FNV-1a, to give each method its own seed independent of the order methods run in. */
function seedOf(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

// ---------------------------------------------------------------------------
// Protobuf wire building
// ---------------------------------------------------------------------------

const WT_VARINT = 0;
const WT_I64 = 1;
const WT_LEN = 2;
const WT_SGROUP = 3;
const WT_EGROUP = 4;
const WT_I32 = 5;

function varint(value: bigint | number): number[] {
  let v = BigInt(value) & 0xffffffffffffffffn;
  const out: number[] = [];
  while (v >= 0x80n) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
  return out;
}

function tag(fieldNo: number, wireType: number): number[] {
  return varint((BigInt(fieldNo) << 3n) | BigInt(wireType));
}

function concat(parts: readonly (Uint8Array | number[])[]): Uint8Array {
  const total = parts.reduce((n, p) => n + p.length, 0);
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** A gRPC / gRPC-Web / Connect-streaming envelope: flags, 32-bit big-endian length, message. */
function envelope(payload: Uint8Array, flags = 0): Uint8Array {
  const out = new Uint8Array(5 + payload.length);
  out[0] = flags;
  new DataView(out.buffer).setUint32(1, payload.length);
  out.set(payload, 5);
  return out;
}

interface WireField {
  no: number;
  wireType: number;
  message?: DescMessage;
}

function scalarWireType(t: ScalarType): number {
  switch (t) {
    case ScalarType.DOUBLE:
    case ScalarType.FIXED64:
    case ScalarType.SFIXED64:
      return WT_I64;
    case ScalarType.FLOAT:
    case ScalarType.FIXED32:
    case ScalarType.SFIXED32:
      return WT_I32;
    case ScalarType.STRING:
    case ScalarType.BYTES:
      return WT_LEN;
    default:
      return WT_VARINT;
  }
}

function wireField(field: DescField): WireField {
  switch (field.fieldKind) {
    case "scalar":
      return { no: field.number, wireType: scalarWireType(field.scalar) };
    case "enum":
      return { no: field.number, wireType: WT_VARINT };
    case "message":
      return { no: field.number, wireType: WT_LEN, message: field.message };
    case "map":
      return { no: field.number, wireType: WT_LEN };
    case "list":
      if (field.listKind === "message") return { no: field.number, wireType: WT_LEN, message: field.message };
      if (field.listKind === "enum") return { no: field.number, wireType: WT_VARINT };
      return { no: field.number, wireType: scalarWireType(field.scalar) };
  }
}

function wireFields(message: DescMessage | undefined): WireField[] {
  return message ? message.fields.map(wireField) : [];
}

/** A field of `message` most of the time, else an arbitrary field number and wire type. */
function someField(rng: Rng, message: DescMessage | undefined): WireField {
  const known = wireFields(message);
  if (known.length > 0 && rng.next() < 0.8) return rng.pick(known);
  return { no: 1 + rng.int(rng.bool() ? 32 : 2 ** 29 - 1), wireType: rng.pick([WT_VARINT, WT_I64, WT_LEN, WT_I32]) };
}

/** uint64 values at and near the edges, where request arithmetic overflows. */
const U64_EDGES = [0n, 1n, 2n ** 32n - 1n, 2n ** 32n, 2n ** 53n + 1n, 2n ** 63n - 1n, 2n ** 63n, 2n ** 64n - 2n, 2n ** 64n - 1n];

function someVarint(rng: Rng): number[] {
  switch (rng.int(5)) {
    case 4:
      return varint(rng.pick(U64_EDGES));
    case 0:
      return varint(rng.int(300));
    case 1:
      return varint(rng.u64());
    case 2:
      return varint(-1 - rng.int(1000)); // a negative int32/int64: ten bytes
    default:
      return varint(rng.int(2 ** 31));
  }
}

/** A message made of the fields of `message` with random values; mostly well-formed protobuf. */
function plausibleMessage(rng: Rng, message: DescMessage | undefined, depth = 0): Uint8Array {
  const parts: number[][] = [];
  const count = rng.int(6);
  for (let i = 0; i < count; i++) {
    const f = someField(rng, message);
    parts.push(tag(f.no, f.wireType));
    if (f.wireType === WT_VARINT) parts.push(someVarint(rng));
    else if (f.wireType === WT_I64) parts.push([...rng.bytes(8)]);
    else if (f.wireType === WT_I32) parts.push([...rng.bytes(4)]);
    else {
      const body = f.message && depth < 4 ? plausibleMessage(rng, f.message, depth + 1) : rng.bool() ? new TextEncoder().encode(rng.ascii(rng.int(40))) : rng.bytes(rng.int(64));
      parts.push(varint(body.length), [...body]);
    }
  }
  return concat(parts);
}

type PayloadKind = "random-bytes" | "plausible" | "truncated" | "past-end-length" | "deep-nesting" | "deep-groups" | "huge-length";
const PAYLOAD_KINDS: readonly PayloadKind[] = ["random-bytes", "plausible", "truncated", "past-end-length", "deep-nesting", "deep-groups", "huge-length"];

function payload(rng: Rng, kind: PayloadKind, input: DescMessage): Uint8Array {
  switch (kind) {
    case "random-bytes":
      return rng.bytes(rng.int(2049));
    case "plausible":
      return plausibleMessage(rng, input);
    case "truncated": {
      const whole = plausibleMessage(rng, input);
      return whole.subarray(0, rng.int(whole.length + 1));
    }
    case "past-end-length": {
      // A length-delimited field whose length runs past the end of the message.
      const f = someField(rng, input);
      const body = rng.bytes(rng.int(32));
      return concat([plausibleMessage(rng, input), tag(f.no, WT_LEN), varint(body.length + 1 + rng.int(4096)), body]);
    }
    case "deep-nesting": {
      // Length-delimited fields inside each other, following message-typed fields where the schema has them.
      const depth = 50 + rng.int(3000);
      const numbers: number[] = [];
      let current: DescMessage | undefined = input;
      for (let i = 0; i < depth; i++) {
        const nested: WireField[] = wireFields(current).filter((f) => f.message);
        const f: { no: number; message?: DescMessage } = nested.length > 0 ? rng.pick(nested) : { no: 1 + rng.int(64), message: undefined };
        numbers.push(f.no);
        current = f.message;
      }
      let inner: Uint8Array = rng.bool() ? new Uint8Array() : rng.bytes(rng.int(16));
      for (let i = numbers.length - 1; i >= 0; i--) inner = concat([tag(numbers[i]!, WT_LEN), varint(inner.length), inner]);
      return inner;
    }
    case "deep-groups": {
      // Start-group tags nested thousands deep, closed in order or left open.
      const depth = 100 + rng.int(20_000);
      const no = 1 + rng.int(2 ** 12);
      const open = tag(no, WT_SGROUP);
      const parts: number[][] = [];
      for (let i = 0; i < depth; i++) parts.push(open);
      if (rng.bool()) for (let i = 0; i < depth; i++) parts.push(tag(no, WT_EGROUP));
      return concat(parts);
    }
    case "huge-length": {
      const f = someField(rng, input);
      const huge = rng.pick([2n ** 31n - 1n, 2n ** 32n, 2n ** 32n + 5n, 2n ** 53n + 1n, 2n ** 63n, 2n ** 64n - 1n]);
      // Sometimes an over-long varint: eleven continuation bytes.
      const length = rng.int(4) === 0 ? [...new Array<number>(11).fill(0xff), 0x01] : varint(huge);
      return concat([plausibleMessage(rng, input), tag(f.no, WT_LEN), length, rng.bytes(rng.int(16))]);
    }
  }
}

// ---------------------------------------------------------------------------
// Connect JSON bodies
// ---------------------------------------------------------------------------

/** Stands for the JSON number 1e400, which no double holds; replaced in the serialized text. */
const OVERFLOW = "\u0000overflow\u0000";

function wrongTypedValue(rng: Rng, field: DescField): unknown {
  const anything = [42, -1.5, 1e308, "text", "", true, null, [], [1, "a"], {}, { x: 1 }];
  switch (field.fieldKind) {
    case "scalar":
      if (field.scalar === ScalarType.STRING) return rng.pick([7, true, [], { s: "x" }]);
      if (field.scalar === ScalarType.BYTES) return rng.pick(["!!!not base64!!!", 12, [255], { b: 1 }]);
      if (field.scalar === ScalarType.BOOL) return rng.pick(["yes", 2, [], {}]);
      return rng.pick(["abc", "1e999", "-0x10", 1.5, OVERFLOW, "18446744073709551616", [], {}, true]);
    case "enum":
      return rng.pick(["NOT_A_VALUE", 2 ** 31, -7, 1.5, [], {}]);
    case "message":
      return rng.pick([5, "x", [], true]);
    case "list":
      return rng.pick([{}, "x", 3, [null, {}, "x", OVERFLOW]]);
    case "map":
      return rng.pick([[], "x", 3, { "": [] }, { k: { deep: [1] } }]);
  }
  return rng.pick(anything);
}

function connectBody(rng: Rng, input: DescMessage, i: number): string | Uint8Array {
  if (i % 2 === 0) {
    // Not JSON, or JSON that is not an object.
    switch (rng.int(8)) {
      case 0:
        return rng.bytes(rng.int(512));
      case 1:
        return "";
      case 2:
        return `{"${input.fields[0]?.jsonName ?? "a"}":`;
      case 3:
        return rng.ascii(rng.int(200));
      case 4:
        return "[".repeat(5000 + rng.int(5000));
      case 5:
        return `{"a":${"[".repeat(3000)}${"]".repeat(3000)}}`;
      case 6:
        return rng.pick(["[]", "5", '"s"', "null", "true", "{}{}", '{"a":1,}']);
      default:
        return `{"\\ud800":"\\uZZZZ"}`;
    }
  }
  const body: Record<string, unknown> = {};
  for (const field of input.fields) if (rng.next() < 0.7) body[rng.bool() ? field.jsonName : field.name] = wrongTypedValue(rng, field);
  if (rng.bool()) body[rng.ascii(1 + rng.int(12))] = rng.ascii(rng.int(20));
  return JSON.stringify(body).replaceAll(JSON.stringify(OVERFLOW), "1e400");
}

// ---------------------------------------------------------------------------
// Raw HTTP/2
// ---------------------------------------------------------------------------

interface RawResponse {
  status: number;
  headers: http2.IncomingHttpHeaders;
  trailers: http2.IncomingHttpHeaders;
  body: Buffer;
}

/** The connection of one probe: closed once its socket has closed on both ends. */
interface Connection {
  label: string;
  body: Uint8Array | string;
  closed: boolean;
}

/** Every connection `post` opened. */
const connections: Connection[] = [];

/** One POST on its own connection; rejects when no complete response arrives within the bound. */
function post(addr: string, label: string, path: string, headers: http2.OutgoingHttpHeaders, body: Uint8Array | string): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(`http://${addr}`);
    const connection: Connection = { label, body, closed: false };
    connections.push(connection);
    session.once("close", () => (connection.closed = true));
    let settled = false;
    let responseHeaders: http2.IncomingHttpHeaders | undefined;
    let trailers: http2.IncomingHttpHeaders = {};
    const chunks: Buffer[] = [];
    const finish = (err: Error | undefined) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (err || !responseHeaders) {
        session.destroy();
        reject(err ?? new Error("stream ended without response headers"));
        return;
      }
      // The response is complete. Like gRPC clients, stop sending what the server no longer reads: a streaming
      // method may answer before it has read the whole request, and the server leaves the stream open meanwhile.
      if (!req.closed) req.close(http2.constants.NGHTTP2_CANCEL);
      session.close();
      resolve({ status: Number(responseHeaders[":status"]), headers: responseHeaders, trailers, body: Buffer.concat(chunks) });
    };
    const timer = setTimeout(() => finish(new Error(`no complete response within ${RESPONSE_BOUND_MS} ms`)), RESPONSE_BOUND_MS);
    session.on("error", (err) => finish(new Error(`connection error: ${err.message}`)));
    session.on("goaway", (code) => {
      if (code !== http2.constants.NGHTTP2_NO_ERROR) finish(new Error(`GOAWAY ${code}`));
    });
    const req = session.request({ ":method": "POST", ":path": path, ...headers });
    req.on("response", (h) => (responseHeaders = h));
    req.on("trailers", (t) => (trailers = t));
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => finish(undefined));
    // A reset after the complete response (the server no longer wants the rest of the request) is fine;
    // a reset before it is not.
    req.on("close", () => finish(new Error(`stream closed before the response ended (RST_STREAM ${req.rstCode})`)));
    req.on("error", (err) => finish(new Error(`stream error: ${err.message}`)));
    req.end(body);
  });
}

/** Splits an enveloped body into its frames; throws when a frame is incomplete. */
function frames(body: Buffer): { flags: number; data: Buffer }[] {
  const out: { flags: number; data: Buffer }[] = [];
  let at = 0;
  while (at < body.length) {
    if (body.length - at < 5) throw new Error(`incomplete frame header at byte ${at}`);
    const flags = body[at]!;
    const length = body.readUInt32BE(at + 1);
    if (body.length - at - 5 < length) throw new Error(`frame at byte ${at} declares ${length} bytes, ${body.length - at - 5} follow`);
    out.push({ flags, data: body.subarray(at + 5, at + 5 + length) });
    at += 5 + length;
  }
  return out;
}

function codeName(code: number): string {
  if (!Number.isInteger(code) || code < 0 || code > 16) throw new Error(`not a gRPC status code: ${code}`);
  return code === 0 ? "OK" : (Code[code] as string);
}

function checkCode(code: number): string {
  const name = codeName(code);
  if (FORBIDDEN_CODES.has(code)) throw new Error(`status ${name}`);
  return name;
}

/** The status of a gRPC response: trailers, or a trailers-only response's headers. */
function grpcOutcome(res: RawResponse): string {
  if (res.status !== 200) throw new Error(`HTTP ${res.status}`);
  if (!/^application\/grpc(\+proto)?$/.test(String(res.headers["content-type"]))) throw new Error(`content-type ${res.headers["content-type"]}`);
  for (const f of frames(res.body)) if (f.flags !== 0) throw new Error(`data frame flags ${f.flags}`);
  const raw = res.trailers["grpc-status"] ?? (res.body.length === 0 ? res.headers["grpc-status"] : undefined);
  if (raw === undefined) throw new Error("no grpc-status");
  return checkCode(Number(raw));
}

/** The status of a gRPC-Web response: the trailer frame that ends the body. */
function webOutcome(res: RawResponse): string {
  if (res.status !== 200) throw new Error(`HTTP ${res.status}`);
  if (!/^application\/grpc-web(\+proto)?$/.test(String(res.headers["content-type"]))) throw new Error(`content-type ${res.headers["content-type"]}`);
  const all = frames(res.body);
  if (all.length === 0) {
    // Trailers-only: the status in the headers.
    if (res.headers["grpc-status"] === undefined) throw new Error("neither a trailer frame nor grpc-status");
    return checkCode(Number(res.headers["grpc-status"]));
  }
  const last = all[all.length - 1]!;
  if (all.slice(0, -1).some((f) => f.flags !== 0)) throw new Error("a trailer frame before the last frame");
  if (last.flags !== 0x80) throw new Error(`the last frame is not a trailer frame (flags ${last.flags})`);
  const status = /^grpc-status:\s*(\d+)\s*$/im.exec(last.data.toString("latin1"));
  if (!status) throw new Error(`trailer frame without grpc-status: ${JSON.stringify(last.data.toString("latin1"))}`);
  return checkCode(Number(status[1]));
}

function connectCode(value: unknown): string {
  if (typeof value !== "string") throw new Error(`error code ${JSON.stringify(value)}`);
  const camel = value.replace(/(^|_)([a-z])/g, (_m, _s: string, c: string) => c.toUpperCase());
  const code = (Code as unknown as Record<string, number>)[camel];
  if (code === undefined) throw new Error(`unknown error code ${value}`);
  return checkCode(code);
}

function connectError(res: RawResponse): string {
  if (!/^application\/json/.test(String(res.headers["content-type"]))) throw new Error(`HTTP ${res.status}, content-type ${res.headers["content-type"]}`);
  const err = JSON.parse(res.body.toString("utf8")) as { code?: unknown };
  return connectCode(err.code);
}

/** The outcome of a Connect unary call: 200 with a JSON message, or an HTTP error with a JSON error. */
function connectUnaryOutcome(res: RawResponse): string {
  if (res.status === 200) {
    if (!/^application\/json/.test(String(res.headers["content-type"]))) throw new Error(`content-type ${res.headers["content-type"]}`);
    JSON.parse(res.body.toString("utf8"));
    return "OK";
  }
  return connectError(res);
}

/** The outcome of a Connect streaming call: the end-stream frame's error, if any. */
function connectStreamOutcome(res: RawResponse): string {
  if (res.status !== 200) return connectError(res);
  if (!/^application\/connect\+json/.test(String(res.headers["content-type"]))) throw new Error(`content-type ${res.headers["content-type"]}`);
  const all = frames(res.body);
  const last = all[all.length - 1];
  if (!last || (last.flags & 0x02) === 0) throw new Error("no end-stream frame");
  for (const f of all.slice(0, -1)) {
    if (f.flags !== 0) throw new Error(`message frame flags ${f.flags}`);
    JSON.parse(f.data.toString("utf8"));
  }
  const end = JSON.parse(last.data.toString("utf8")) as { error?: { code?: unknown } };
  return end.error ? connectCode(end.error.code) : "OK";
}

// ---------------------------------------------------------------------------
// The batch for one method
// ---------------------------------------------------------------------------

type Protocol = "grpc" | "connect" | "grpc-web";

interface Probe {
  protocol: Protocol;
  what: string;
  headers: http2.OutgoingHttpHeaders;
  body: Uint8Array | string;
  outcome: (res: RawResponse) => string;
}

const streamingKinds = new Set<DescMethod["methodKind"]>(["server_streaming", "client_streaming", "bidi_streaming"]);
const clientStreams = new Set<DescMethod["methodKind"]>(["client_streaming", "bidi_streaming"]);

function probes(method: DescMethod, path: string): Probe[] {
  const rng = new Rng(seedOf(path));
  const out: Probe[] = [];
  const messages = (kind: PayloadKind) => {
    const count = clientStreams.has(method.methodKind) ? 1 + rng.int(3) : 1;
    return concat(Array.from({ length: count }, () => envelope(payload(rng, kind, method.input))));
  };
  for (let i = 0; i < GRPC_PER_METHOD; i++) {
    const kind = PAYLOAD_KINDS[i % PAYLOAD_KINDS.length]!;
    out.push({
      protocol: "grpc",
      what: `#${i} ${kind}`,
      headers: { "content-type": "application/grpc", te: "trailers", "grpc-timeout": `${SERVER_DEADLINE_MS}m` },
      body: messages(kind),
      outcome: grpcOutcome,
    });
  }
  for (let i = 0; i < CONNECT_PER_METHOD; i++) {
    const json = connectBody(rng, method.input, i);
    const streaming = streamingKinds.has(method.methodKind);
    out.push({
      protocol: "connect",
      what: `#${i} ${i % 2 === 0 ? "invalid JSON" : "mistyped fields"}`,
      headers: {
        "content-type": streaming ? "application/connect+json" : "application/json",
        "connect-protocol-version": "1",
        "connect-timeout-ms": String(SERVER_DEADLINE_MS),
      },
      body: streaming ? envelope(typeof json === "string" ? new TextEncoder().encode(json) : json) : json,
      outcome: streaming ? connectStreamOutcome : connectUnaryOutcome,
    });
  }
  for (let i = 0; i < WEB_PER_METHOD; i++) {
    const kind = PAYLOAD_KINDS[(i * 3 + 1) % PAYLOAD_KINDS.length]!;
    out.push({
      protocol: "grpc-web",
      what: `#${i} ${kind}`,
      headers: { "content-type": "application/grpc-web+proto", "x-grpc-web": "1", "grpc-timeout": `${SERVER_DEADLINE_MS}m` },
      body: messages(kind),
      outcome: webOutcome,
    });
  }
  return out;
}

/** "N messages of a, b bytes" when the body is a sequence of complete envelopes. */
function shape(body: Uint8Array | string): string {
  try {
    const sizes = frames(Buffer.from(body)).map((f) => f.data.length);
    return `${sizes.length} message${sizes.length === 1 ? "" : "s"} of ${sizes.join(", ")} bytes`;
  } catch {
    return `${Buffer.from(body).length} bytes`;
  }
}

function hex(body: Uint8Array | string, max = 4096): string {
  const h = Buffer.from(body).toString("hex");
  return h.length <= max ? h : `${h.slice(0, max)}… (${h.length / 2} bytes in all)`;
}

async function inParallel<T>(items: readonly T[], limit: number, run: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < items.length) await run(items[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

type Request = MessageInitShape<typeof ServerReflectionRequestSchema>;

/** The served services, resolved with the file descriptors the server's reflection returns. */
async function servedServices(server: InProcessServer): Promise<DescService[]> {
  const client = createClient(ServerReflection, server.transport);
  const ask = async (requests: Request[]) => {
    const responses = [];
    const stream = (async function* () {
      for (const r of requests) yield create(ServerReflectionRequestSchema, r);
    })();
    for await (const res of client.serverReflectionInfo(stream)) responses.push(res);
    return responses;
  };
  const [listed] = await ask([{ messageRequest: { case: "listServices", value: "" } }]);
  if (listed?.messageResponse.case !== "listServicesResponse") throw new Error("reflection did not list the services");
  const names = listed.messageResponse.value.service.map((s) => s.name).sort();
  const files = new Map<string, FileDescriptorProto>();
  const add = (responses: Awaited<ReturnType<typeof ask>>) => {
    for (const res of responses) {
      if (res.messageResponse.case !== "fileDescriptorResponse") throw new Error(`reflection answered ${res.messageResponse.case}`);
      for (const bytes of res.messageResponse.value.fileDescriptorProto) {
        const file = fromBinary(FileDescriptorProtoSchema, bytes);
        files.set(file.name, file);
      }
    }
  };
  add(await ask(names.map((name) => ({ messageRequest: { case: "fileContainingSymbol", value: name } }))));
  for (;;) {
    const missing = [...new Set([...files.values()].flatMap((f) => f.dependency))].filter((d) => !files.has(d));
    if (missing.length === 0) break;
    add(await ask(missing.map((name) => ({ messageRequest: { case: "fileByFilename", value: name } }))));
  }
  // The registry wants every file after its dependencies.
  const ordered: FileDescriptorProto[] = [];
  const visit = (name: string) => {
    const file = files.get(name);
    if (!file || ordered.includes(file)) return;
    for (const dep of file.dependency) visit(dep);
    ordered.push(file);
  };
  for (const name of [...files.keys()].sort()) visit(name);
  const registry = createFileRegistry(create(FileDescriptorSetSchema, { file: ordered }));
  return names.map((name) => {
    const service = registry.getService(name);
    if (!service) throw new Error(`no descriptor for the listed service ${name}`);
    return service;
  });
}

/** What sending every method its batch found; each test below checks one part of it. */
interface BatchResult {
  /** One entry per probe without a well-formed answer, or health check that failed after a batch. */
  readonly problems: string[];
  /** `path protocol` → outcome → count. */
  readonly histogram: Map<string, Map<string, number>>;
  /** Growth of the resident set over the run. */
  readonly rssGrowth: number;
}

/** Sends each method of `services` its batch, one method after another, and records what came back. */
async function sendEveryBatch(server: InProcessServer, services: readonly DescService[]): Promise<BatchResult> {
  const rssBefore = process.memoryUsage().rss;
  const problems: string[] = [];
  const histogram = new Map<string, Map<string, number>>();
  const health = server.grpcClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
  const admin = createClient(AdminService, server.transport);
  const methods = services
    .flatMap((s) => s.methods)
    // Drain stops the server when its request parses, as it should: garbage that is a valid (empty) DrainRequest would end the run.
    .filter((m) => !(m.parent.typeName === AdminService.typeName && m.name === AdminService.method.drain.name))
    .sort((a, b) => (a.parent.typeName + a.name).localeCompare(b.parent.typeName + b.name));
  for (const method of methods) {
    const path = `/${method.parent.typeName}/${method.name}`;
    await inParallel(probes(method, path), PARALLEL, async (probe) => {
      let outcome: string;
      try {
        outcome = probe.outcome(await post(server.addr, `${path} over ${probe.protocol}, ${probe.what}`, path, probe.headers, probe.body));
      } catch (err) {
        problems.push(`${path} over ${probe.protocol}, ${probe.what}: ${(err as Error).message}\n    headers ${JSON.stringify(probe.headers)}\n    body hex ${hex(probe.body)}`);
        outcome = "FAILED";
      }
      const key = `${path} ${probe.protocol}`;
      const counts = histogram.get(key) ?? new Map<string, number>();
      counts.set(outcome, (counts.get(outcome) ?? 0) + 1);
      histogram.set(key, counts);
    });
    if (method.parent.typeName === AdminService.typeName && method.name === AdminService.method.setServingStatus.name) {
      // SetServingStatus may take services out of rotation, as it should; put them back.
      for (const service of ["", ...services.map((s) => s.typeName)]) await admin.setServingStatus({ service, serving: true }).catch(() => undefined);
    }
    try {
      const res = await grpcUnary(health, "Check", { service: "" }, { deadline: new Date(Date.now() + RESPONSE_BOUND_MS) });
      expect(res).to.deep.equal({ status: "SERVING" });
    } catch (err) {
      problems.push(`health after ${path}'s batch: ${(err as Error).message}`);
    }
  }
  // A stable order, so that runs can be compared.
  for (const [key, counts] of histogram) histogram.set(key, new Map([...counts].sort(([a], [b]) => a.localeCompare(b))));
  return { problems, histogram, rssGrowth: process.memoryUsage().rss - rssBefore };
}

function histogramTable(histogram: BatchResult["histogram"]): string {
  const lines = [...histogram].map(([key, counts]) => `  ${key.padEnd(64)} ${[...counts].map(([c, n]) => `${c}=${n}`).join(" ")}`);
  return `status per method and protocol:\n${lines.join("\n")}`;
}

describe("contract: garbage input", function () {
  this.timeout(120_000);
  let server: InProcessServer;
  let services: DescService[] = [];
  let batch: BatchResult | undefined;
  let failed = false;

  before(async () => {
    server = await startServer({ modules: builtinModules, config: { images: { reference: { latencyMs: 0, defaultSize: "64x64" } } } });
    services = await servedServices(server);
  });

  after(async () => {
    await server?.close();
  });

  it("lists services with methods through reflection", () => {
    expect(services.map((s) => s.typeName)).to.include.members(["grpc.health.v1.Health", AdminService.typeName]);
    for (const s of services) expect(s.methods, s.typeName).to.not.be.empty;
  });

  describe("every method's batch", () => {
    before(async () => {
      batch = await sendEveryBatch(server, services);
    });

    afterEach(function () {
      if (this.currentTest?.state === "failed") failed = true;
    });

    after(() => {
      // The table is for reading a failure (or a run with MMGATE_TEST_VERBOSE=1), not for every run.
      if (batch && (failed || process.env.MMGATE_TEST_VERBOSE === "1")) console.log(histogramTable(batch.histogram));
    });

    it("answers every garbage request to every method with a status and keeps serving", () => {
      expect(batch!.histogram.size).to.be.above(0);
      expect(batch!.problems, batch!.problems.join("\n")).to.be.empty;
    });

    it("closes every connection once its client has closed it", async () => {
      // Every probe ran on its own connection, which the client closed after reading the complete response
      // (cancelling its request stream first when it had not finished sending). A connection that does not
      // close is one the server still holds open.
      expect(connections).to.have.length.above(0);
      await eventually(
        () => {
          const open = connections.filter((c) => !c.closed);
          expect(open.map((c) => c.label), `connections still open:\n${open.map((c) => `${c.label}: ${shape(c.body)}\n    body hex ${hex(c.body, 512)}`).join("\n")}`).to.be.empty;
        },
        { timeoutMs: 10_000, intervalMs: 50 },
      );
    });

    it("keeps the resident set bounded", () => {
      expect(batch!.rssGrowth, `rss grew by ${Math.round(batch!.rssGrowth / 1024 ** 2)} MiB`).to.be.below(RSS_GROWTH_BOUND);
    });
  });
});
