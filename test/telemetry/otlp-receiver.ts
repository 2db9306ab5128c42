/**
 * An OTLP/HTTP trace receiver for tests: a node:http server taking the
 * export requests mmgate's SDK posts to /v1/traces, in either encoding,
 * decoded here without the SDK's own code: http/json parsed as JSON (hex
 * ids, as OTLP/JSON writes them), http/protobuf by a small decoder of the
 * opentelemetry-proto trace messages (ExportTraceServiceRequest and what it
 * holds; fields it does not need are skipped by wire type).
 */
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { randomBytes } from "node:crypto";
import { gunzipSync } from "node:zlib";

export type AttributeValue = string | number | boolean | null;

/** One span as the receiver got it, with its process's service.name. */
export interface ReceivedSpan {
  readonly service: string;
  readonly traceId: string;
  readonly spanId: string;
  /** "" for a root span. */
  readonly parentSpanId: string;
  readonly name: string;
  /** OTLP's SpanKind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer. */
  readonly kind: number;
  readonly attributes: Readonly<Record<string, AttributeValue>>;
  /** OTLP's status code: 0 unset, 1 ok, 2 error. */
  readonly status: { readonly code: number; readonly message: string };
}

export const SERVER = 2;
export const CLIENT = 3;

export interface OtlpReceiver {
  /** Base URL for OTEL_EXPORTER_OTLP_ENDPOINT. */
  readonly endpoint: string;
  readonly spans: ReceivedSpan[];
  /** Export requests received, by content type. */
  readonly requests: string[];
  close(): Promise<void>;
}

// ---- protobuf wire format ----

class Reader {
  at = 0;
  constructor(readonly bytes: Uint8Array) {}
  get done(): boolean {
    return this.at >= this.bytes.length;
  }
  varint(): bigint {
    let result = 0n;
    let shift = 0n;
    for (;;) {
      if (this.at >= this.bytes.length) throw new Error("truncated varint");
      const byte = this.bytes[this.at++]!;
      result |= BigInt(byte & 0x7f) << shift;
      if ((byte & 0x80) === 0) return result;
      shift += 7n;
    }
  }
  take(length: number): Uint8Array {
    if (this.at + length > this.bytes.length) throw new Error("truncated field");
    const out = this.bytes.subarray(this.at, this.at + length);
    this.at += length;
    return out;
  }
  /** Each field of the message: its number, and its value (a varint, or the raw bytes of the others). */
  *fields(): Generator<{ field: number; varint?: bigint; bytes?: Uint8Array }> {
    while (!this.done) {
      const key = Number(this.varint());
      const field = key >>> 3;
      switch (key & 7) {
        case 0:
          yield { field, varint: this.varint() };
          break;
        case 1:
          yield { field, bytes: this.take(8) };
          break;
        case 2:
          yield { field, bytes: this.take(Number(this.varint())) };
          break;
        case 5:
          yield { field, bytes: this.take(4) };
          break;
        default:
          throw new Error(`unsupported wire type ${key & 7}`);
      }
    }
  }
}

const text = (bytes: Uint8Array | undefined) => Buffer.from(bytes ?? []).toString("utf8");
const hex = (bytes: Uint8Array | undefined) => Buffer.from(bytes ?? []).toString("hex");

/** AnyValue: string 1, bool 2, int64 3, double 4 (arrays, maps and bytes are not used by mmgate's spans). */
function anyValue(bytes: Uint8Array): AttributeValue {
  for (const f of new Reader(bytes).fields()) {
    if (f.field === 1) return text(f.bytes);
    if (f.field === 2) return f.varint === 1n;
    if (f.field === 3) return Number(BigInt.asIntN(64, f.varint!));
    if (f.field === 4) return Buffer.from(f.bytes!).readDoubleLE(0);
  }
  return null;
}

/** KeyValue: key 1, value 2. */
function keyValue(bytes: Uint8Array, into: Record<string, AttributeValue>): void {
  let key = "";
  let value: AttributeValue = null;
  for (const f of new Reader(bytes).fields()) {
    if (f.field === 1) key = text(f.bytes);
    else if (f.field === 2) value = anyValue(f.bytes!);
  }
  into[key] = value;
}

/** Span: trace_id 1, span_id 2, parent_span_id 4, name 5, kind 6, attributes 9, status 15 (message 2, code 3). */
function span(bytes: Uint8Array, service: string): ReceivedSpan {
  const out = { service, traceId: "", spanId: "", parentSpanId: "", name: "", kind: 0, attributes: {} as Record<string, AttributeValue>, status: { code: 0, message: "" } };
  for (const f of new Reader(bytes).fields()) {
    if (f.field === 1) out.traceId = hex(f.bytes);
    else if (f.field === 2) out.spanId = hex(f.bytes);
    else if (f.field === 4) out.parentSpanId = hex(f.bytes);
    else if (f.field === 5) out.name = text(f.bytes);
    else if (f.field === 6) out.kind = Number(f.varint);
    else if (f.field === 9) keyValue(f.bytes!, out.attributes);
    else if (f.field === 15) {
      for (const s of new Reader(f.bytes!).fields()) {
        if (s.field === 2) out.status.message = text(s.bytes);
        else if (s.field === 3) out.status.code = Number(s.varint);
      }
    }
  }
  return out;
}

/** ExportTraceServiceRequest: resource_spans 1 → resource 1 (attributes 1), scope_spans 2 → spans 2. */
export function decodeProtobuf(bytes: Uint8Array): ReceivedSpan[] {
  const spans: ReceivedSpan[] = [];
  for (const rs of new Reader(bytes).fields()) {
    if (rs.field !== 1) continue;
    const resource: Record<string, AttributeValue> = {};
    const scopes: Uint8Array[] = [];
    for (const f of new Reader(rs.bytes!).fields()) {
      if (f.field === 1) for (const a of new Reader(f.bytes!).fields()) if (a.field === 1) keyValue(a.bytes!, resource);
      if (f.field === 2) scopes.push(f.bytes!);
    }
    const service = String(resource["service.name"] ?? "");
    for (const scope of scopes) for (const f of new Reader(scope).fields()) if (f.field === 2) spans.push(span(f.bytes!, service));
  }
  return spans;
}

// ---- OTLP/JSON ----

interface JsonKeyValue {
  key: string;
  value?: { stringValue?: string; boolValue?: boolean; intValue?: number | string; doubleValue?: number };
}

function jsonValue(value: JsonKeyValue["value"]): AttributeValue {
  if (value === undefined) return null;
  if (value.stringValue !== undefined) return value.stringValue;
  if (value.boolValue !== undefined) return value.boolValue;
  if (value.intValue !== undefined) return Number(value.intValue);
  if (value.doubleValue !== undefined) return value.doubleValue;
  return null;
}

const attributesOf = (list: JsonKeyValue[] | undefined) => Object.fromEntries((list ?? []).map((kv) => [kv.key, jsonValue(kv.value)]));

export function decodeJson(body: string): ReceivedSpan[] {
  const request = JSON.parse(body) as {
    resourceSpans?: {
      resource?: { attributes?: JsonKeyValue[] };
      scopeSpans?: {
        spans?: { traceId: string; spanId: string; parentSpanId?: string; name: string; kind: number; attributes?: JsonKeyValue[]; status?: { code?: number; message?: string } }[];
      }[];
    }[];
  };
  const spans: ReceivedSpan[] = [];
  for (const rs of request.resourceSpans ?? []) {
    const service = String(attributesOf(rs.resource?.attributes)["service.name"] ?? "");
    for (const scope of rs.scopeSpans ?? []) {
      for (const s of scope.spans ?? []) {
        spans.push({
          service,
          traceId: s.traceId,
          spanId: s.spanId,
          parentSpanId: s.parentSpanId ?? "",
          name: s.name,
          kind: s.kind,
          attributes: attributesOf(s.attributes),
          status: { code: s.status?.code ?? 0, message: s.status?.message ?? "" },
        });
      }
    }
  }
  return spans;
}

async function bodyOf(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  const body = Buffer.concat(chunks);
  return req.headers["content-encoding"] === "gzip" ? gunzipSync(body) : body;
}

/** Starts a receiver on 127.0.0.1; export requests it cannot decode fail the test that reads `errors`. */
export async function startOtlpReceiver(): Promise<OtlpReceiver & { readonly errors: string[] }> {
  const spans: ReceivedSpan[] = [];
  const requests: string[] = [];
  const errors: string[] = [];
  const server: Server = createServer((req, res) => {
    void (async () => {
      const type = req.headers["content-type"] ?? "";
      try {
        if (req.method !== "POST" || req.url !== "/v1/traces") throw new Error(`unexpected ${req.method} ${req.url}`);
        const body = await bodyOf(req);
        requests.push(type);
        spans.push(...(type.startsWith("application/json") ? decodeJson(body.toString("utf8")) : decodeProtobuf(body)));
        // An empty ExportTraceServiceResponse: full success.
        res.writeHead(200, { "content-type": type.startsWith("application/json") ? "application/json" : "application/x-protobuf" }).end(type.startsWith("application/json") ? "{}" : "");
      } catch (err) {
        errors.push((err as Error).message);
        res.writeHead(400).end();
      }
    })();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    endpoint: `http://127.0.0.1:${port}`,
    spans,
    requests,
    errors,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/** The environment that points a child process's tracing at `receiver`, exporting every 50 ms. */
export function tracingEnv(receiver: OtlpReceiver, service: string, protocol: "http/protobuf" | "http/json" = "http/protobuf"): Record<string, string> {
  return {
    OTEL_EXPORTER_OTLP_ENDPOINT: receiver.endpoint,
    OTEL_EXPORTER_OTLP_PROTOCOL: protocol,
    OTEL_SERVICE_NAME: service,
    OTEL_BSP_SCHEDULE_DELAY: "50",
  };
}

/** A W3C traceparent of a fresh (sampled) trace, and its parts. */
export function newTraceparent(): { header: string; traceId: string; spanId: string } {
  const traceId = randomBytes(16).toString("hex");
  const spanId = randomBytes(8).toString("hex");
  return { header: `00-${traceId}-${spanId}-01`, traceId, spanId };
}
