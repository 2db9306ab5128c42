import { expect } from "chai";
import * as zlib from "node:zlib";
import {
  agentMetadataBytes,
  buildDescriptor,
  decodeNixlMetadata,
  descriptorToJson,
  encodeNixlMetadata,
  newTransferAgent,
  parseDescriptorJson,
} from "../../src/media/descriptor.js";
import { TensorStore } from "../../src/media/tensor-store.js";
import { expectRejection, FakeClock } from "../support/index.js";
import { MediaError } from "../../src/media/errors.js";
import type { MediaTensorInfo } from "../../src/media/tensor.js";

const IMAGE_INFO: MediaTensorInfo = { shape: [1, 2, 3], dtype: "UINT8", metadata: { Image: { format: "Png", color_type: "Rgb8", layout: "HWC" } } };

describe("media descriptor", () => {
  it("encodes agent metadata as b64: + base64(zlib level 6) and round-trips it", () => {
    const agent = newTransferAgent("127.0.0.1:50051");
    expect(agent.name).to.match(/^media-loader-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    const bytes = agentMetadataBytes(agent);
    const encoded = encodeNixlMetadata(bytes);
    expect(encoded.startsWith("b64:")).to.equal(true);
    // Byte-equal to node:zlib at level 6 (RFC 1950 framing: 0x78 header).
    const expected = zlib.deflateSync(Buffer.from(bytes), { level: 6 }).toString("base64");
    expect(encoded).to.equal(`b64:${expected}`);
    expect(Buffer.from(decodeNixlMetadata(encoded)).equals(Buffer.from(bytes))).to.equal(true);
    expect(JSON.parse(Buffer.from(decodeNixlMetadata(encoded)).toString())).to.deep.include({
      name: agent.name,
      endpoint: "127.0.0.1:50051",
    });
    expect(() => decodeNixlMetadata(expected)).to.throw('must start with "b64:"');
    expect(() => decodeNixlMetadata("b64:!!!")).to.throw("not base64");
  });

  it("serializes the reference's field order with tensor info flattened", () => {
    const d = buildDescriptor("b64:eJwDAAAAAAE=", 12345n, 6, IMAGE_INFO, 0x7a9bbcb11a898630n);
    expect(descriptorToJson(d)).to.equal(
      '{"nixl_metadata":"b64:eJwDAAAAAAE=","nixl_descriptor":{"addr":12345,"size":6,"mem_type":"Dram","device_id":0},' +
        '"shape":[1,2,3],"dtype":"UINT8","metadata":{"Image":{"format":"Png","color_type":"Rgb8","layout":"HWC"}},' +
        '"content_hash":"7a9bbcb11a898630"}',
    );
    const parsed = parseDescriptorJson(descriptorToJson(d));
    expect(parsed).to.deep.equal(d);
  });

  it("omits content_hash when absent and writes null metadata", () => {
    const d = buildDescriptor("b64:", 1n, 0, { shape: [0], dtype: "UINT8", metadata: null }, null);
    const json = descriptorToJson(d);
    expect(json).not.to.include("content_hash");
    expect(json).to.include('"metadata":null');
    expect(parseDescriptorJson(json).content_hash).to.equal(null);
  });

  it("serializes video metadata with serde_json floats", () => {
    const info: MediaTensorInfo = {
      shape: [2, 1, 2, 3],
      dtype: "UINT8",
      metadata: { Video: { source_fps: 24, source_duration: 10, sampled_timestamps: [0, 5] } },
    };
    expect(descriptorToJson(buildDescriptor("b64:", 7n, 12, info, 1n))).to.include(
      '"metadata":{"Video":{"source_fps":24.0,"source_duration":10.0,"sampled_timestamps":[0.0,5.0]}},"content_hash":"0000000000000001"',
    );
  });
});

describe("tensor store", () => {
  it("stores under distinct nonzero handles and releases once", () => {
    const store = new TensorStore({ maxBytes: 100, ttlMs: 60_000 });
    const a = store.put(new Uint8Array(10), IMAGE_INFO, 1n);
    const b = store.put(new Uint8Array(10), IMAGE_INFO, 2n);
    expect(a).not.to.equal(b);
    expect(a > 0n && a < 2n ** 53n).to.equal(true);
    expect(store.get(a)?.contentHash).to.equal(1n);
    expect(store.bytes).to.equal(20);
    expect(store.release(a)).to.equal(true);
    expect(store.release(a)).to.equal(false);
    expect(store.get(a)).to.equal(undefined);
    expect(store.bytes).to.equal(10);
  });

  it("evicts the least recently used tensors to stay within its byte budget", () => {
    const evicted: string[] = [];
    const store = new TensorStore({ maxBytes: 30, ttlMs: 60_000, onEvict: (t, why) => evicted.push(`${t.contentHash}:${why}`) });
    const a = store.put(new Uint8Array(10), IMAGE_INFO, 1n);
    const b = store.put(new Uint8Array(10), IMAGE_INFO, 2n);
    store.put(new Uint8Array(10), IMAGE_INFO, 3n);
    store.get(a); // a is now more recent than b
    store.put(new Uint8Array(10), IMAGE_INFO, 4n);
    expect(store.get(b)).to.equal(undefined);
    expect(store.get(a)).not.to.equal(undefined);
    expect(store.bytes).to.equal(30);
    expect(evicted).to.deep.equal(["2:evicted"]);
  });

  it("refuses a tensor larger than the whole budget", async () => {
    const store = new TensorStore({ maxBytes: 30, ttlMs: 60_000 });
    const kept = store.put(new Uint8Array(30), IMAGE_INFO, 1n);
    await expectRejection(() => store.put(new Uint8Array(31), IMAGE_INFO, 2n), { type: MediaError, code: "TENSOR_TOO_LARGE_FOR_STORE" });
    expect(store.get(kept)).not.to.equal(undefined);
  });

  it("expires tensors after their TTL, counted from when they were stored", () => {
    const clock = new FakeClock(1_000);
    const store = new TensorStore({ maxBytes: 100, ttlMs: 1_000, clock });
    const a = store.put(new Uint8Array(5), IMAGE_INFO, 1n);
    clock.advance(600);
    const b = store.put(new Uint8Array(5), IMAGE_INFO, 2n);
    expect(store.get(a)).not.to.equal(undefined);
    clock.advance(500);
    expect(store.get(a)).to.equal(undefined);
    expect(store.get(b)).not.to.equal(undefined);
    clock.advance(600);
    expect(store.get(b)).to.equal(undefined);
    expect(store.count).to.equal(0);
  });
});
