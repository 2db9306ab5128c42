import { Code } from "@connectrpc/connect";
import { expect } from "chai";
import { StatusSniffer, bodyStatusFormat } from "../../src/server/status-sniffer.js";
import { splitAtEveryBoundary } from "../support/index.js";

const text = (s: string) => new TextEncoder().encode(s);

function frame(flags: number, payload: Uint8Array): Uint8Array {
  const out = new Uint8Array(5 + payload.length);
  out[0] = flags;
  new DataView(out.buffer).setUint32(1, payload.length);
  out.set(payload, 5);
  return out;
}

const join = (...parts: Uint8Array[]) => Uint8Array.from(parts.flatMap((p) => [...p]));

/** Feeds `body` split into three parts in every way and returns each result. */
function everySplit(format: ReturnType<typeof bodyStatusFormat>, body: Uint8Array, httpStatus = 200): (Code | 0 | undefined)[] {
  const results: (Code | 0 | undefined)[] = [];
  for (const parts of splitAtEveryBoundary(body, { parts: 3 })) {
    const sniffer = new StatusSniffer(format);
    for (const part of parts) sniffer.write(part);
    results.push(sniffer.status(httpStatus));
  }
  return results;
}

describe("status sniffer", () => {
  it("picks the format from the request content type", () => {
    const table: [string | undefined, string][] = [
      ["application/grpc", "none"],
      ["application/grpc+proto", "none"],
      ["application/grpc-web+proto", "grpc-web"],
      ["application/grpc-web-text", "grpc-web"],
      ["application/connect+json", "connect-stream"],
      ["application/json", "connect-unary"],
      ["application/proto", "connect-unary"],
      [undefined, "connect-unary"], // Connect GET
    ];
    for (const [type, format] of table) expect(bodyStatusFormat(type), String(type)).to.equal(format);
  });

  it("reads the gRPC-Web trailer frame after data frames, split anywhere", () => {
    const body = join(frame(0, new Uint8Array([8, 1])), frame(0x80, text("grpc-status: 8\r\ngrpc-message: too%20big\r\n")));
    expect(new Set(everySplit("grpc-web", body))).to.deep.equal(new Set([Code.ResourceExhausted]));
    const ok = join(frame(0, new Uint8Array([8, 1])), frame(0x80, text("grpc-status: 0\r\n")));
    expect(new Set(everySplit("grpc-web", ok))).to.deep.equal(new Set([0]));
  });

  it("reads the Connect end-stream message, split anywhere", () => {
    const failed = join(frame(0, text('{"status":"SERVING"}')), frame(2, text('{"error":{"code":"invalid_argument","message":"m"}}')));
    expect(new Set(everySplit("connect-stream", failed))).to.deep.equal(new Set([Code.InvalidArgument]));
    const ok = join(frame(0, text("{}")), frame(2, text("{}")));
    expect(new Set(everySplit("connect-stream", ok))).to.deep.equal(new Set([0]));
  });

  it("reads a Connect unary error body, and takes 200 as OK", () => {
    const body = text('{"code":"resource_exhausted","message":"too big"}');
    expect(new Set(everySplit("connect-unary", body, 429))).to.deep.equal(new Set([Code.ResourceExhausted]));
    expect(new StatusSniffer("connect-unary").status(200)).to.equal(0);
  });

  it("knows nothing when the body carries no readable status", () => {
    expect(new StatusSniffer("grpc-web").status(200)).to.equal(undefined);
    const compressed = frame(0x81, text("grpc-status: 3\r\n"));
    const sniffer = new StatusSniffer("grpc-web");
    sniffer.write(compressed);
    expect(sniffer.status(200)).to.equal(undefined);
    const notJson = new StatusSniffer("connect-unary");
    notJson.write(text("<html>"));
    expect(notJson.status(502)).to.equal(undefined);
  });
});
